# shellcheck shell=bash
# tools/profile/ab_common.sh — sourced by one-call device A/B scripts: takes the library
# as $1, exports what flashc's Python package and tools need, enters the repository root, and defines
# run NAME TIMEOUT COMMAND... (the command's output to $OUT/NAME.txt, one line "NAME: rc=... <its last line>").
lib=${1:?usage: $(basename "$0") LIB}
here=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export FLASHC_LIBRARY=$lib PYTHONPATH=$here/python PYTHONUNBUFFERED=1
cd "$here" || exit 1
run() { # name timeout command...
  local name=$1 t=$2
  shift 2
  timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
  echo "$name: rc=$? $(tail -1 "$OUT/$name.txt")"
}
