#!/usr/bin/env bash
# tools/hopper/ab.sh [--cases D:S:C,...] [--rounds N] [--pass fwd|bwd] [--no-bitcmp] PACK.tar.xz REF NAME ... — on the
# device, an A/B of libflashc builds packed by tools/hopper/pack_libs.sh: first tools/hopper/bitcmp.py (the forward of
# every NAME against REF's, bit for bit; skipped with --no-bitcmp or --pass bwd), then tools/profile/power.py's steady
# state (cuda-hopper beside cuDNN, bf16) for each library in turn, --rounds times (alternating, so that drift hits all
# alike), and last a table: TFLOP/s per case and library (the mean of the rounds), cuDNN's mean, each NAME / REF.
# Logs to $OUT. A round of four cases takes ~35 s per library. A NAME may carry settings for its runs after an @:
# new@FLASHC_CPU_KERNELS=avx2 runs new.so with that variable set (VAR=VALUE pairs, comma-separated), for the few
# operational settings the library reads (docs/environment.md); kernel variants are separate builds. Their logs are named with the characters outside [A-Za-z0-9_.-] as _ (file_of).
set -uo pipefail
cases=128:2048:0,128:2048:1,64:2048:0,64:2048:1
rounds=2
pass=fwd
bitcmp=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --cases) cases=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --pass) pass=$2; shift 2 ;;
    --no-bitcmp) bitcmp=0; shift ;;
    *) echo "ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
pack=${1:?usage: ab.sh [options] PACK.tar.xz REF NAME ...}
shift
[ $# -ge 2 ] || { echo "ab.sh: give a reference and at least one other library" >&2; exit 2; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$here/python PYTHONUNBUFFERED=1
libs=$(mktemp -d)
tar xJf "$pack" -C "$libs" || exit 1
# a NAME's library, its settings (after its @, as words for env) and its name in file names
lib_of() { echo "$libs/${1%%@*}.so"; }
settings() { [[ $1 == *@* ]] && echo "${1#*@}" | tr ',' ' '; }
file_of() { echo "${1//[^A-Za-z0-9_.-]/_}"; }
for name in "$@"; do [ -f "$(lib_of "$name")" ] || { echo "ab.sh: ${name%%@*}.so is not in $pack" >&2; exit 2; }; done
rc=0
# shellcheck disable=SC2046  # settings: words on purpose
if [ "$bitcmp" = 1 ] && [ "$pass" = fwd ]; then
  ref=$1
  env $(settings "$ref") FLASHC_LIBRARY="$(lib_of "$ref")" timeout 200 python3 "$here/tools/hopper/bitcmp.py" \
    save "$libs/ref.pt" >"$OUT/bitcmp-$(file_of "$ref").txt" 2>&1 || rc=1
  tail -1 "$OUT/bitcmp-$(file_of "$ref").txt"
  for name in "${@:2}"; do
    env $(settings "$name") FLASHC_LIBRARY="$(lib_of "$name")" timeout 200 python3 "$here/tools/hopper/bitcmp.py" \
      compare "$libs/ref.pt" >"$OUT/bitcmp-$(file_of "$name").txt" 2>&1 || rc=1
    echo "$name: $(tail -1 "$OUT/bitcmp-$(file_of "$name").txt")"
  done
fi
for r in $(seq "$rounds"); do
  for name in "$@"; do
    # shellcheck disable=SC2046
    env $(settings "$name") FLASHC_LIBRARY="$(lib_of "$name")" timeout 300 python3 "$here/tools/profile/power.py" \
      --pass "$pass" --seconds 2 --cases "$cases" >"$OUT/ab-$(file_of "$name")-$r.txt" 2>&1 ||
      { echo "power.py: $name round $r failed"; rc=1; }
  done
done
# each NAME with its logs' name (file_of), so that the table reads the files the runs above wrote
pairs=()
for name in "$@"; do pairs+=("$name" "$(file_of "$name")"); done
python3 - "$OUT" "$rounds" "${pairs[@]}" <<'PY'
import collections, sys
out, rounds, pairs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names, files = pairs[0::2], dict(zip(pairs[0::2], pairs[1::2]))
tf = collections.defaultdict(list)  # (case, impl, name) -> TFLOP/s per round
for name in names:
    for r in range(1, rounds + 1):
        try:
            lines = open(f"{out}/ab-{files[name]}-{r}.txt").read().splitlines()
        except OSError:
            continue
        for line in lines:
            f = line.split()
            impl = f[0].removesuffix("-bwd") if f else ""  # power.py names the backward's rows hopper-bwd, ...
            if len(f) > 6 and impl in ("hopper", "cudnn", "flash", "mma") and f[1].startswith("d"):
                tf[(" ".join(f[1:4]), impl, name)].append(float(f[5]))
cases = sorted({k[0] for k in tf}, key=lambda c: [int("".join(ch for ch in w if ch.isdigit())) for w in c.split()])
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
print(f"TFLOP/s, mean of {rounds} rounds   " + "".join(f"{n:>9s}" for n in names) + "    cudnn"
      + "".join(f"  {n}/{names[0]}" for n in names[1:]))
for c in cases:
    v = [mean([x for k, xs in tf.items() if k[0] == c and k[2] == n and k[1] != "cudnn" for x in xs]) for n in names]
    cd = mean([x for k, xs in tf.items() if k[0] == c and k[1] == "cudnn" for x in xs])
    print(f"{c:30s}   " + "".join(f"{x:9.1f}" for x in v) + f"{cd:9.1f}"
          + "".join(f"  {x / v[0]:{len(n) + len(names[0]) + 1}.3f}" for x, n in zip(v[1:], names[1:])))
PY
rm -rf "$libs"
exit $rc
