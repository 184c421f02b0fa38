#!/usr/bin/env bash
# tools/profile/tail_ab.sh LIB — on the device, one call: the grids' tail order (src/cuda/tail_order.cuh) checked
# and timed. Correctness: pytest's tile-order tests (bit for bit across FLASHC_FWD_TAIL / FLASHC_BWD_TAIL settings,
# error against SDPA), tools/mma/check_fwd.py --quick (default config), tools/hopper/check.py --quick (the
# library's plan), compute-sanitizer memcheck on both forwards (--tiny / a small causal call). Timing:
# tools/profile/power.py's steady state, the same library with the order off (=0) and on (unset), causal cells.
# Logs to $OUT, a short table last. ~5 min.
set -u
# shellcheck source=tools/profile/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
run pytest 150 python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda.py -k "tile_order"
run check_fwd 120 python3 tools/mma/check_fwd.py --lib "$lib" --quick --no-bench --configs lean
run check_hopper 120 python3 tools/hopper/check.py --lib "$lib" --quick --no-bench
run memcheck 150 compute-sanitizer --tool memcheck --print-limit 10 python3 tools/hopper/check.py --lib "$lib" --tiny \
  --no-bench
C=64:2048:1,128:2048:1,128:4096:1,256:2048:1
H=256:2048:1,256:4096:1,128:16384:1
for t in 0 2; do
  FLASHC_FWD_TAIL=$t run "mma-fwd-tail$t" 90 python3 tools/profile/power.py --backend cuda-mma --seconds 1.5 --peers flash \
    --cases "$C"
  FLASHC_FWD_TAIL=$t run "hopper-fwd-tail$t" 90 python3 tools/profile/power.py --backend cuda-hopper --seconds 1.5 \
    --peers cudnn --cases "$H"
done
echo "== TFLOP/s, order off (FLASHC_FWD_TAIL=0) vs on"
for p in mma-fwd hopper-fwd; do
  paste <(grep -E "^(mma|hop)" "$OUT/$p-tail0.txt" | awk '{print $1, $2, $3, $4, $6}') \
    <(grep -E "^(mma|hop)" "$OUT/$p-tail2.txt" | awk '{print $6}') | awk '{printf "%-6s %s %s %s %7.1f %7.1f %6.3f\n", $1, $2, $3, $4, $5, $6, $6 / $5}'
done
