#!/usr/bin/env bash
# tests/check_symbols.sh LIBRARY HEADER — the shared library exports exactly the public API: every defined
# dynamic symbol starts with flashc_ (nothing of the fc_* internals, the kernels' host stubs or the statically
# linked CUDA runtime leaks out, cmake/flashc.map), and every function HEADER declares (its static inline
# helpers aside) is among them, so that a version script that hides too much fails as well.
# Exit 0: as expected; 1: a symbol too many or too few (listed); 2: bad usage or no `nm`.
set -euo pipefail
lib=${1:?usage: check_symbols.sh LIBRARY HEADER}
header=${2:?usage: check_symbols.sh LIBRARY HEADER}
[ -f "$lib" ] || { echo "check_symbols: no library at $lib" >&2; exit 2; }
[ -f "$header" ] || { echo "check_symbols: no header at $header" >&2; exit 2; }
command -v nm >/dev/null 2>&1 || { echo "check_symbols: nm (binutils) not found" >&2; exit 2; }

# nm -D --defined-only: "ADDRESS TYPE NAME" (NAME@VERSION where symbols are versioned).
exported=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }' | sort -u)
[ -n "$exported" ] || { echo "check_symbols: $lib exports no symbol at all" >&2; exit 1; }

# The header's functions: a declaration starts at the beginning of a line with its return type, the name
# is the first flashc_ word followed by "(". static inline functions are compiled into the caller.
declared=$(grep -E '^[A-Za-z_][A-Za-z0-9_ ]*[ *]flashc_[a-z0-9_]+\(' "$header" | grep -v '^static' |
  grep -oE 'flashc_[a-z0-9_]+\(' | tr -d '(' | sort -u)
[ -n "$declared" ] || { echo "check_symbols: found no function declaration in $header" >&2; exit 2; }

status=0
extra=$(grep -v '^flashc_' <<<"$exported" || true)
if [ -n "$extra" ]; then
  echo "check_symbols: $lib exports $(wc -l <<<"$extra") symbol(s) outside the public API (not flashc_*):"
  awk '{ print "  " $0 }' <<<"$extra"
  status=1
fi
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
  echo "check_symbols: $lib does not export $(wc -l <<<"$missing") function(s) that $header declares:"
  awk '{ print "  " $0 }' <<<"$missing"
  status=1
fi
undeclared=$(comm -13 <(echo "$declared") <(grep '^flashc_' <<<"$exported"))
if [ -n "$undeclared" ]; then
  echo "check_symbols: $lib exports flashc_ symbol(s) that $header does not declare:"
  awk '{ print "  " $0 }' <<<"$undeclared"
  status=1
fi
[ "$status" = 0 ] && echo "check_symbols: $lib exports the $(wc -l <<<"$exported") functions of $header, nothing else"
exit "$status"
