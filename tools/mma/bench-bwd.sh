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
# shellcheck source=tools/run-step.sh
source "$(dirname "$0")/../run-step.sh"
BUILD=build-gpu-mmabwd KERNEL=mma_bwd CSV=mma-bwd.csv LIMITS=(540 540 270) # LIMITS: check, bench, each sanitizer (s)
LIB=$BUILD/libflashc.so
CHECK=(python3 tools/mma/check_bwd.py --lib "$LIB")
RACECHECK_ARGS=(--no-varlen)

step_build() {
  build_sm90a "$BUILD"
  kernel_resources "$LIB" "$KERNEL"
  echo "backward kernels with a stack frame (spills): $(grep -cvE 'STACK:0 ' "$OUT/resources.txt") of $(wc -l <"$OUT/resources.txt")"
  echo "build ok at $(($(date +%s) - T0))s"
}

parse_steps "$@"
run_steps
