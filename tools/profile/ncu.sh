#!/usr/bin/env bash
# tools/profile/ncu.sh — Nsight Compute reads of the tensor-core kernels, one device call (the lent H100):
#
#   bash tools/profile/ncu.sh LIB [CASE ...]
#
# LIB is a libflashc.so built for the GPU (e.g. build-gpu/libflashc.so). A CASE is backend:pass:head_dim:seqlen
# [:causal]; default: cuda-hopper and cuda-mma, fwd and bwd, d128, seqlen 8192, full (issue #7's read). For each
# case, tools/profile/one_call.py runs the call (warm-up outside the profiled range, then 2 calls profiled) under
#   1. ncu with the SpeedOfLight, ComputeWorkloadAnalysis, MemoryWorkloadAnalysis, Occupancy, LaunchStats,
#      WarpStateStats and SourceCounters sections: the full report in $OUT/ncu-CASE.txt (pipe utilisation, memory
#      throughput and hit rates, uncoalesced accesses, spills);
#   2. ncu with a few metrics as CSV: per kernel, duration, the tensor pipes' utilisation (every
#      sm__pipe_tensor*.avg.pct_of_peak_sustained_active this ncu knows), SM throughput, DRAM throughput,
#      achieved occupancy, L1/shared and L2 throughput, local-memory traffic, registers; printed as one table at
#      the end ($OUT/ncu.txt).
# Environment: OUT (default /tmp/out), NCU (default: ncu on PATH, else /usr/local/cuda/bin/ncu).
set -u
LIB=${1:?usage: tools/profile/ncu.sh LIB [backend:pass:head_dim:seqlen[:causal] ...]}
shift
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
export FLASHC_LIBRARY=$PWD/$LIB PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
case $LIB in /*) FLASHC_LIBRARY=$LIB ;; esac
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(cuda-hopper:fwd:128:8192 cuda-mma:fwd:128:8192 cuda-hopper:bwd:128:8192
  cuda-mma:bwd:128:8192)

# The tensor-pipe metrics differ between GPUs and ncu versions: take the ones this ncu lists.
pipes=$("$NCU" --query-metrics 2>/dev/null | awk '{print $1}' | grep -E '^sm__pipe_tensor.*_cycles_active$' |
  sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
metrics="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active"
metrics+=",l1tex__throughput.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
metrics+=",launch__registers_per_thread${pipes:+,$pipes}"
echo "ncu: $("$NCU" --version | tail -1); tensor-pipe metrics: ${pipes:-none found}"

: >"$OUT/ncu.csv"
for c in "${cases[@]}"; do
  IFS=: read -r backend pass d s causal <<<"$c"
  args=(--backend "$backend" --pass "$pass" --head-dim "$d" --seqlen "$s" --warmup 2 --calls 2)
  [ "${causal:-}" = causal ] && args+=(--causal)
  name=${c//:/-}
  timeout 300 "$NCU" --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SourceCounters \
    python3 tools/profile/one_call.py "${args[@]}" >"$OUT/ncu-$name.txt" 2>&1 || echo "ncu sections: $c failed (see $OUT/ncu-$name.txt)"
  grep "^one_call:" "$OUT/ncu-$name.txt"
  timeout 300 "$NCU" --profile-from-start off --csv --metrics "$metrics" \
    python3 tools/profile/one_call.py "${args[@]}" 2>/dev/null | grep '^"' | sed "s/^/\"$name\",/" >>"$OUT/ncu.csv"
done

# One row per (case, kernel): the last profiled launch of each kernel name, metrics as columns.
python3 - "$OUT/ncu.csv" <<'PY' | tee "$OUT/ncu.txt"
import csv, sys, collections
header, table = None, collections.OrderedDict()
for r in csv.reader(open(sys.argv[1])):  # each row: case, then ncu's columns ("ID", ..., "Kernel Name", ...)
    if len(r) > 1 and r[1] == "ID":
        header = {name: i for i, name in enumerate(r)}
        continue
    if not header or len(r) < len(header):
        continue
    kernel = r[header["Kernel Name"]].split("(")[0].replace("void ", "")[:60]
    value = f'{r[header["Metric Value"]]} {r[header["Metric Unit"]]}'.strip()
    table.setdefault((r[0], kernel), {})[r[header["Metric Name"]]] = value  # the last launch of a kernel wins
for (case, kernel), m in table.items():
    print(f"{case}  {kernel}")
    for k in sorted(m):
        print(f"    {k:70s} {m[k]}")
PY
