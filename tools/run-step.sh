# shellcheck shell=bash
# tools/run-step.sh — sourced by the one-call GPU tools (tools/fa2/bench-bwd.sh, tools/mma/bench-bwd.sh,
# tools/hopper/gpu.sh): run NAME TIMEOUT COMMAND... runs the command under a time limit with its output in
# $OUT/NAME.log and says how it ended; returns the command's status (124 when the limit stopped it).
# RUN_TIMEOUT_NOTE, if set, is added to the timed-out line (what a hang most likely means for that tool).
run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then echo "== $name: TIMED OUT after ${limit}s${RUN_TIMEOUT_NOTE:-}"; else echo "== $name: rc=$rc"; fi
  return $rc
}
