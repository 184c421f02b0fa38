#!/usr/bin/env bash
# tools/profile/split_ab.sh LIB — on the device, one call: cuda-hopper's split last rounds (FLASHC_HOPPER_SPLIT,
# stream-K in hopper_persistent.cuh) checked and timed. Correctness: pytest's persistent-forward tests (the split
# against SDPA and against whole tiles, determinism), tools/hopper/check.py --quick with the persistent variants,
# compute-sanitizer memcheck on one split call. Timing: tools/profile/power.py's steady state, the same library with
# the split on (default) and off (+split=0), unmasked d128 cells; bench/compare.py's short form, two rounds each.
# Logs to $OUT, a short table last. ~4 min.
set -u
# shellcheck source=tools/profile/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
run pytest 200 python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda.py -k "split_rounds or persistent_walks"
run check 150 python3 tools/hopper/check.py --lib "$lib" --quick --no-bench --variants tmastore,persistent
cat >/tmp/split_one.py <<'PY'
import torch, flashc
q, k, v = (torch.randn(2, 2048, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o, lse = flashc.attention(q, k, v, backend="cuda-hopper", return_lse=True)
torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
print("split call under the sanitizer: max error", (o.float() - ref).abs().max().item())
PY
run memcheck 150 compute-sanitizer --tool memcheck --print-limit 10 python3 /tmp/split_one.py
run power 200 python3 tools/profile/power.py --seconds 1.5 --peers cudnn --cases 128:2048:0,128:4096:0,128:8192:0 \
  --variants 128@default+split=0
C=(--config 8/16/2048/128 --config 4/16/4096/128 --config 2/16/8192/128 --config 1/136/2048/128)
for r in 1 2; do
  for s in 0 1; do
    FLASHC_HOPPER_SPLIT=$s FLASHC_HOPPER_SCHED=stride run "short-s$s-r$r" 120 python3 bench/compare.py "${C[@]}" --dtype bf16 \
      --pass fwd --causal full --backends cuda-hopper --peers cudnn --no-check --csv "$OUT/short-s$s-r$r.csv"
  done
done
echo "== TFLOP/s (steady state): split on (default) vs off"
grep -E "^(hopper|cudnn)" "$OUT/power.txt" | awk '{printf "%-34s %8s %7s\n", $1 " " $2 " " $3 " " $4, $6, $7}'
echo "== short form (bench/compare.py), cuda-hopper ms: split=0 r1, split=1 r1, split=0 r2, split=1 r2; cudnn r1"
python3 - "$OUT" <<'PY'
import csv, os, sys
t = {}
for s in "01":
    for r in "12":
        for row in csv.DictReader(open(os.path.join(sys.argv[1], f"short-s{s}-r{r}.csv"))):
            t[(row["config"], row["impl"], s, r)] = float(row["ms"])
for cfg in sorted({k[0] for k in t}):
    cells = [t.get((cfg, "flashc:cuda-hopper", s, r), float("nan")) for r in "12" for s in "01"]
    print(f"{cfg:16s}", " ".join(f"{x:8.4f}" for x in cells), f"{t.get((cfg, 'torch:cudnn', '0', '1'), float('nan')):8.4f}")
PY
