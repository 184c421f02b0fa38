#!/bin/bash
# cuda-mma's forward on an H100/H200 in one device call (~8 min): build for sm_90a, ptxas's register/spill table
# of the forward kernels, correctness against fp64 (the plan's split and forced counts), then TFLOP/s against SDPA
# flash and cudnn on docs/targets.md's grid, the ratio table last.
#   bash tools/mma/bench-fwd.sh            everything
#   bash tools/mma/bench-fwd.sh --quick    a few shapes and seqlens (~3 min)
#   FLASHC_MMA_SANITIZE=1 [FLASHC_MMA_SAN_SPLITS=0,3] bash tools/mma/bench-fwd.sh
#                                          compute-sanitizer memcheck and racecheck with these num_splits on the
#                                          quick case list (every compiled head dim), then stop
# Extra arguments go to check_fwd.py (e.g. --splits 0 --no-check). Logs and the CSV go to $OUT
# (default /tmp/out).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1
BUILD=build-mmafwd-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHC_CUDA=ON -DFLASHC_CUDA_ARCHITECTURES=90a \
  -DFLASHC_BUILD_TESTS=OFF -DFLASHC_BUILD_CLI=OFF -DCMAKE_CUDA_FLAGS="-Xptxas -v" >"$OUT/build.log" 2>&1
cmake --build $BUILD --target flashc -j16 >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build ok at $(($(date +%s) - T0))s"
# ptxas -v of mma/fwd.cu: registers and spills of every forward kernel
python3 - "$OUT/build.log" <<'PY' | tee "$OUT/ptxas-fwd.txt"
import re, subprocess, sys
cur, st, rows = None, None, []
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"Compiling entry function '(_Z\d+fc_mma_fwd_(?:lean_)?kernel\w+)'", line)
    if m:
        cur = m.group(1)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur:
        st = m.groups()
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and cur:
        name = subprocess.run(["c++filt", cur], capture_output=True, text=True).stdout.strip()
        rows.append((name.replace("void fc_mma_fwd_", "").replace("(fc_mma_fwd_args)", ""), m.group(1), st))
        cur = None
print("forward kernels <T, D, Bc, stages, MT, Q in regs, CTAs/SM, aligned[, split]>")
for n, r, s in sorted(set(rows)):
    print(f"{n:62s} regs {r:>3} spill st/ld {s[1]}/{s[2]}" + ("   <-- SPILLS" if s[1] != "0" else ""))
PY
grep -E "C75[0-9][0-9]|warning" "$OUT/build.log" | head -5
if [ "${FLASHC_MMA_SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 270 compute-sanitizer --tool $tool --kernel-name kns=mma_fwd --print-limit 10 python3 tools/mma/check_fwd.py \
      --lib $BUILD/libflashc.so --quick --no-bench --splits "${FLASHC_MMA_SAN_SPLITS:-0,3}" >"$OUT/san-$tool.log" 2>&1
    echo "== $tool: rc=$?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^correctness|^FAIL" "$OUT/san-$tool.log" | head -10
  done
  exit 0
fi
timeout 480 python3 tools/mma/check_fwd.py --lib $BUILD/libflashc.so --csv "$OUT/mma-fwd.csv" "$@" >"$OUT/check.log" 2>&1
rc=$?
[ $rc -eq 124 ] && echo "check_fwd.py TIMED OUT (a hang?): partial log in $OUT/check.log"
grep -E "^FAIL|^config |^correctness" "$OUT/check.log" | head -40
sed -n '/^== ratio/,$p' "$OUT/check.log" # the whole TFLOP/s table stays in check.log and mma-fwd.csv
echo "done at $(($(date +%s) - T0))s (rc $rc)"
