# shellcheck shell=bash disable=SC2034 # T0 and QUICK are read by the tools that source this file
# tools/run-step.sh — sourced by the one-call GPU tools (tools/fa2/bench-bwd.sh, tools/mma/bench-bwd.sh,
# tools/hopper/gpu.sh): the steps they share. run NAME TIMEOUT COMMAND... runs the command under a time limit with
# its output in $OUT/NAME.log and says how it ended; returns the command's status (124 when the limit stopped it).
# RUN_TIMEOUT_NOTE, if set, is added to the timed-out line (what a hang most likely means for that tool).
# Sourcing it sets OUT (default /tmp/out, created) and T0 (the start time, in seconds).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s)            # the steps say when they ended, from here
export PYTHONUNBUFFERED=1 # the logs show how far a killed step got

run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then echo "== $name: TIMED OUT after ${limit}s${RUN_TIMEOUT_NOTE:-}"; else echo "== $name: rc=$rc"; fi
  return $rc
}

# parse_steps ARGS...: sets QUICK (an array: (--quick) when asked, else empty) and STEPS (the steps named, in
# their order; build check bench when none is).
parse_steps() {
  local a
  QUICK=()
  STEPS=()
  for a in "$@"; do
    case $a in
    --quick) QUICK=(--quick) ;;
    *) STEPS+=("$a") ;;
    esac
  done
  [ ${#STEPS[@]} -eq 0 ] && STEPS=(build check bench)
  return 0
}

# build_sm90a BUILD: the library alone, for sm_90a, in BUILD (incremental), log in $OUT/build.log; exits the
# tool when the build fails (nothing after it can run), and flags ptxas's C75xx warnings (it serialised or ignored
# something), which cost speed without failing the build.
build_sm90a() {
  local build=$1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  cmake -S . -B "$build" -G Ninja -DFLASHC_CUDA=ON -DFLASHC_CUDA_ARCHITECTURES=90a -DFLASHC_BUILD_TESTS=OFF \
    -DFLASHC_BUILD_CLI=OFF >"$OUT/build.log" 2>&1
  cmake --build "$build" --target flashc -j16 >>"$OUT/build.log" 2>&1 || {
    tail -30 "$OUT/build.log"
    exit 1
  }
  grep -E "C75[0-9][0-9]" "$OUT/build.log" && echo "WARNING: ptxas serialised or ignored something (above)"
  return 0
}

# kernel_resources LIB NAME: registers, stack and local memory of every kernel of LIB whose name holds NAME, one
# line each, into $OUT/resources.txt (a stack frame means spills).
kernel_resources() {
  local cuobjdump
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  "$cuobjdump" -res-usage "$1" 2>/dev/null | grep -A1 "$2" |
    grep -oE "Function [^ ]+|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+" |
    paste -sd' ' | sed 's/ Function /\nFunction /g' | c++filt >"$OUT/resources.txt"
}

# The backward tools' steps (tools/fa2/bench-bwd.sh, tools/mma/bench-bwd.sh). A tool sets CHECK (an array: its
# check script and --lib), KERNEL (the substring that names its backward kernels), CSV (the results file's name
# in $OUT), LIMITS (the seconds allowed to check, bench and each sanitizer run) and, optional, RACECHECK_ARGS
# (check-script arguments under racecheck only); it defines step_build, then calls parse_steps and run_steps.
step_check() {
  run check "${LIMITS[0]}" "${CHECK[@]}" --no-bench "${QUICK[@]}"
  grep -E "^FAIL|passed" "$OUT/check.log" | head -40
}
step_bench() {
  run bench "${LIMITS[1]}" "${CHECK[@]}" --no-check "${QUICK[@]}" --csv "$OUT/$CSV"
  sed -n '/compact/,$p' "$OUT/bench.log"
  grep -E "failed|Error|error" "$OUT/bench.log" | head -10
}
# Only the backward kernels are instrumented (kernel-name substring filter): under racecheck every PyTorch
# kernel of the harness (references, poisoning) was instrumented too, and the quick list ran past 250 s.
step_sanitize() {
  local tool args
  for tool in memcheck racecheck; do
    args=()
    [ "$tool" = racecheck ] && args=("${RACECHECK_ARGS[@]}")
    run "san-$tool" "${LIMITS[2]}" compute-sanitizer --tool $tool --kernel-name "kns=$KERNEL" --print-limit 10 \
      "${CHECK[@]}" --quick --no-bench "${args[@]}"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|^FAIL" "$OUT/san-$tool.log" | head -10
  done
}

# run_steps: step_NAME for each NAME in STEPS, in order, each followed by the time it ended at; exits 2 at a
# step the tool lacks.
run_steps() {
  local step
  for step in "${STEPS[@]}"; do
    if ! declare -F "step_$step" >/dev/null; then
      echo "unknown step $step (build check bench sanitize; --quick)"
      exit 2
    fi
    "step_$step"
    echo "-- $step done at $(($(date +%s) - T0))s"
  done
}
