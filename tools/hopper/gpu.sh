#!/bin/bash
# cuda-hopper's first runs on an H100/H200, in steps that fit the device tool's 10-minute calls:
#   bash tools/hopper/gpu.sh build smoke sanitize     (~4 min: does it run at all, and cleanly)
#   bash tools/hopper/gpu.sh build check              (~4 min: all shapes, masks, layouts)
#   bash tools/hopper/gpu.sh build bench              (~3 min: TFLOP/s against SDPA flash and cudnn)
# and the backward:
#   bash tools/hopper/gpu.sh build bwd-smoke bwd-sanitize   (does it run at all, and cleanly)
#   bash tools/hopper/gpu.sh bwd bwd-bench                  (all shapes; TFLOP/s against SDPA's backward)
# and the head-dim-256 backward alone (check_bwd.py --dims 256):
#   bash tools/hopper/gpu.sh build d256-smoke d256-sanitize d256 d256-bench
# build is incremental in build-gpu (sm_90a only). smoke runs a few shapes under a short timeout: a wrong
# barrier protocol hangs rather than fails. Logs go to $OUT (default /tmp/out).
# shellcheck source=tools/run-step.sh
source "$(dirname "$0")/../run-step.sh"
LIB=build-gpu/libflashc.so
CHECK="python3 tools/hopper/check.py --lib $LIB"
CHECK_BWD="python3 tools/hopper/check_bwd.py --lib $LIB"

RUN_TIMEOUT_NOTE=" (a hang: barrier protocol?)"
run_and_show() { # run, then the interesting lines of its log
  local rc
  run "$@"
  rc=$?
  grep -E "^FAIL|passed|TFLOP|^ *(64|128|256) +[01] |ERROR SUMMARY|RACECHECK SUMMARY|Error|error" "$OUT/$1.log" | head -60
  return $rc
}

for step in "$@"; do
  case $step in
  build)
    build_sm90a build-gpu
    echo "build ok at $(($(date +%s) - T0))s"
    ;;
  smoke)
    run_and_show smoke 120 $CHECK --quick --no-bench || { tail -20 "$OUT/smoke.log"; echo "smoke failed: stopping"; exit 1; }
    ;;
  check)
    run_and_show check 420 $CHECK --no-bench
    ;;
  sanitize)
    for tool in memcheck synccheck; do
      run_and_show "san-$tool" 240 compute-sanitizer --tool $tool --print-limit 10 $CHECK --quick --no-bench
    done
    # racecheck is far slower (it took over 150 s on --quick): two small shapes, every variant
    run_and_show san-racecheck 300 compute-sanitizer --tool racecheck --print-limit 10 $CHECK --tiny --no-bench
    ;;
  bench)
    run_and_show bench 400 $CHECK --no-check
    ;;
  bwd-smoke)
    run_and_show bwd-smoke 150 $CHECK_BWD --quick --no-bench || { tail -20 "$OUT/bwd-smoke.log"; echo "bwd-smoke failed: stopping"; exit 1; }
    ;;
  bwd)
    run_and_show bwd 420 $CHECK_BWD --no-bench
    ;;
  bwd-sanitize)
    for tool in memcheck synccheck; do
      run_and_show "bwd-san-$tool" 200 compute-sanitizer --tool $tool --print-limit 10 $CHECK_BWD --tiny --no-bench \
        --dims 64,128
    done
    run_and_show bwd-san-racecheck 300 compute-sanitizer --tool racecheck --print-limit 10 $CHECK_BWD --tiny --no-bench \
      --dims 64,128
    ;;
  bwd-bench)
    run_and_show bwd-bench 400 $CHECK_BWD --no-check
    ;;
  d256-smoke)
    run_and_show d256-smoke 150 $CHECK_BWD --quick --no-bench --dims 256 ||
      { tail -20 "$OUT/d256-smoke.log"; echo "d256-smoke failed: stopping"; exit 1; }
    ;;
  d256)
    run_and_show d256 420 $CHECK_BWD --no-bench --dims 256
    ;;
  d256-sanitize)
    for tool in memcheck synccheck racecheck; do
      run_and_show "d256-san-$tool" 200 compute-sanitizer --tool $tool --print-limit 10 --kernel-name kns=fc_hopper_bwd_d256 \
        $CHECK_BWD --tiny --no-bench --dims 256
    done
    ;;
  d256-bench)
    run_and_show d256-bench 400 $CHECK_BWD --no-check --bench-d 256
    ;;
  *) echo "unknown step $step (build smoke check sanitize bench bwd-smoke bwd bwd-sanitize bwd-bench d256-smoke d256 d256-sanitize d256-bench)"; exit 2 ;;
  esac
  echo "-- $step done at $(($(date +%s) - T0))s"
done
