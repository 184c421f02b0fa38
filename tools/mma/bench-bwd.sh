#!/bin/bash
# cuda-mma's backward on an H100/H200: build (sm_90a only), correctness of the kernels its plan picks (fa2pb, and
# fa2 in deterministic mode) against fp64, then backward TFLOP/s against SDPA flash and cudnn. The full run may pass
# one device call's 10 minutes: split it (the build stays).
#   bash tools/mma/bench-bwd.sh                     build check bench (the default)
#   bash tools/mma/bench-bwd.sh build check         then, in a second call:  bash tools/mma/bench-bwd.sh bench
#   bash tools/mma/bench-bwd.sh --quick             the same on fewer shapes
#   bash tools/mma/bench-bwd.sh build sanitize      compute-sanitizer memcheck + racecheck, quick shapes
# Steps may be named in any order; --quick applies to check and bench. Logs and the CSV go to $OUT
# (default /tmp/out): build.log, resources.txt (registers and spills of every backward kernel), check.log,
# bench.log, mma-bwd.csv (docs/targets.md's columns + config).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1
BUILD=build-gpu-mmabwd
LIB=$BUILD/libflashc.so
QUICK=
STEPS=()
for a in "$@"; do
  case $a in
  --quick) QUICK=--quick ;;
  *) STEPS+=("$a") ;;
  esac
done
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build check bench)
CHECK="python3 tools/mma/check_bwd.py --lib $LIB"

# shellcheck source=tools/run-step.sh
source "$(dirname "$0")/../run-step.sh"

for step in "${STEPS[@]}"; do
  case $step in
  build)
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
    cmake -S . -B $BUILD -G Ninja -DFLASHC_CUDA=ON -DFLASHC_CUDA_ARCHITECTURES=90a -DFLASHC_BUILD_TESTS=OFF \
      -DFLASHC_BUILD_CLI=OFF >"$OUT/build.log" 2>&1
    cmake --build $BUILD --target flashc -j16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    grep -E "C75[0-9][0-9]" "$OUT/build.log" && echo "WARNING: ptxas serialised or ignored something (above)"
    CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    $CUOBJDUMP -res-usage $LIB 2>/dev/null | grep -A1 "mma_bwd" | grep -oE "Function [^ ]+|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+" |
      paste -sd' ' | sed 's/ Function /\nFunction /g' | c++filt >"$OUT/resources.txt"
    echo "backward kernels with a stack frame (spills): $(grep -cvE 'STACK:0 ' "$OUT/resources.txt") of $(wc -l <"$OUT/resources.txt")"
    echo "build ok at $(($(date +%s) - T0))s"
    ;;
  check)
    run check 540 $CHECK --no-bench $QUICK
    grep -E "^FAIL|passed" "$OUT/check.log" | head -40
    ;;
  bench)
    run bench 540 $CHECK --no-check $QUICK --csv "$OUT/mma-bwd.csv"
    sed -n '/compact/,$p' "$OUT/bench.log"
    grep -E "failed|Error|error" "$OUT/bench.log" | head -10
    ;;
  sanitize)
    # Only the backward kernels are instrumented (kernel-name substring filter): under racecheck every PyTorch
    # kernel of the harness (references, poisoning) was instrumented too, and the quick list ran past 250 s.
    for tool in memcheck racecheck; do
      run "san-$tool" 270 compute-sanitizer --tool $tool --kernel-name kns=mma_bwd --print-limit 10 $CHECK --quick \
        --no-bench $([ "$tool" = racecheck ] && echo --no-varlen)
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|^FAIL" "$OUT/san-$tool.log" | head -10
    done
    ;;
  *) echo "unknown step $step (build check bench sanitize; --quick)"; exit 2 ;;
  esac
  echo "-- $step done at $(($(date +%s) - T0))s"
done
