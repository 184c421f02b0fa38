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
# shellcheck source=tools/run-step.sh
source "$(dirname "$0")/../run-step.sh"
BUILD=build-gpu-fa2bwd KERNEL=fa2_bwd CSV=fa2-bwd.csv LIMITS=(300 400 250) # LIMITS: check, bench, each sanitizer (s)
LIB=$BUILD/libflashc.so
CHECK=(python3 tools/fa2/check_bwd.py --lib "$LIB")

step_build() {
  build_sm90a "$BUILD"
  kernel_resources "$LIB" "$KERNEL"
  cat "$OUT/resources.txt"
  echo "build ok at $(($(date +%s) - T0))s"
}

parse_steps "$@"
run_steps
