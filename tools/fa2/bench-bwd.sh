#!/bin/bash
# cuda-fa2-fp32's backward on an H100/H200 in one device call (~6 minutes): build (sm_90a only), correctness of its
# kernels (fused at d <= 64 in the atomic mode, the accumulator kernels and the deterministic dQ pass) against fp64,
# then backward TFLOP/s against SDPA efficient (fp32) on b4 h8 d64 seqlen 1024..8192 and b8 h16 s2048 d64, full and
# causal.
#   bash tools/fa2/bench-bwd.sh                     build check bench (the default)
#   bash tools/fa2/bench-bwd.sh --quick             the same on fewer shapes
#   bash tools/fa2/bench-bwd.sh build sanitize      compute-sanitizer memcheck + racecheck, quick shapes
# Steps may be named in any order; --quick applies to check and bench. Logs and the CSV go to $OUT
# (default /tmp/out): build.log, resources.txt (registers and spills of every backward kernel), check.log,
# bench.log, fa2-bwd.csv (the results schema of bench/compare.py, config = fa2bwd).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1
BUILD=build-gpu-fa2bwd
LIB=$BUILD/libflashc.so
QUICK=()
STEPS=()
for a in "$@"; do
  case $a in
  --quick) QUICK=(--quick) ;;
  *) STEPS+=("$a") ;;
  esac
done
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build check bench)
CHECK=(python3 tools/fa2/check_bwd.py --lib "$LIB")

# shellcheck source=tools/run-step.sh
source "$(dirname "$0")/../run-step.sh"

for step in "${STEPS[@]}"; do
  case $step in
  build)
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
    cmake -S . -B $BUILD -G Ninja -DFLASHC_CUDA=ON -DFLASHC_CUDA_ARCHITECTURES=90a -DFLASHC_BUILD_TESTS=OFF \
      -DFLASHC_BUILD_CLI=OFF >"$OUT/build.log" 2>&1
    cmake --build $BUILD --target flashc -j16 >>"$OUT/build.log" 2>&1 || {
      tail -30 "$OUT/build.log"
      exit 1
    }
    CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    $CUOBJDUMP -res-usage "$LIB" 2>/dev/null | grep -A1 "fa2_bwd" | grep -oE "Function [^ ]+|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+" |
      paste -sd' ' | sed 's/ Function /\nFunction /g' | c++filt >"$OUT/resources.txt"
    cat "$OUT/resources.txt"
    echo "build ok at $(($(date +%s) - T0))s"
    ;;
  check)
    run check 300 "${CHECK[@]}" --no-bench "${QUICK[@]}"
    grep -E "^FAIL|passed" "$OUT/check.log" | head -40
    ;;
  bench)
    run bench 400 "${CHECK[@]}" --no-check "${QUICK[@]}" --csv "$OUT/fa2-bwd.csv"
    sed -n '/compact/,$p' "$OUT/bench.log"
    grep -E "failed|Error|error" "$OUT/bench.log" | head -10
    ;;
  sanitize)
    # Only the backward kernels are instrumented (kernel-name substring filter): under racecheck every PyTorch
    # kernel of the harness (references, poisoning) was instrumented too, and the quick list ran past 250 s.
    for tool in memcheck racecheck; do
      run "san-$tool" 250 compute-sanitizer --tool $tool --kernel-name kns=fa2_bwd --print-limit 10 "${CHECK[@]}" \
        --quick --no-bench
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|^FAIL" "$OUT/san-$tool.log" | head -10
    done
    ;;
  *)
    echo "unknown step $step (build check bench sanitize; --quick)"
    exit 2
    ;;
  esac
  echo "-- $step done at $(($(date +%s) - T0))s"
done
