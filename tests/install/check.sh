#!/usr/bin/env bash
# tests/install/check.sh BUILD_DIR [SOURCE_DIR] — the install as a user gets it: `cmake --install` into a
# temporary prefix, that prefix moved elsewhere (an install must not depend on where it was made), then
#   1. the installed `flashc list` runs (it finds libflashc through its $ORIGIN-relative run path);
#   2. the README's C snippet (taken from README.md itself, so the two cannot drift apart) compiles and runs
#      through `pkg-config --cflags --libs flashc` (the .pc file locates itself with ${pcfiledir});
#   3. the same snippet through CMake: find_package(flashc) and target_link_libraries(app flashc::flashc).
# The snippet's output is compared with the fp64 oracle cpu-ref. Run by ctest (install_relocatable).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "${2:-$(dirname "$0")/../..}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== cmake --install into a temporary prefix, then moved"
cmake --install "$build" --prefix "$tmp/staged" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
mv "$tmp/staged" "$tmp/moved"
prefix=$tmp/moved

if [ -x "$prefix/bin/flashc" ]; then
  echo "== installed flashc list"
  # An empty LD_LIBRARY_PATH: the binary must find libflashc by itself.
  LD_LIBRARY_PATH= "$prefix/bin/flashc" list >"$tmp/list.txt" 2>&1 || { cat "$tmp/list.txt"; fail "installed flashc list"; }
  grep -q "cpu-ref" "$tmp/list.txt" || { cat "$tmp/list.txt"; fail "flashc list does not show cpu-ref"; }
  echo "ok   $(grep -c . "$tmp/list.txt") lines, cpu-ref listed"
else
  echo "-- no installed flashc (FLASHC_BUILD_CLI=OFF): skipped"
fi

# The first ```c block after "## C" in README.md: its #include lines go to the top of the program, the rest
# into main(), where the buffers it names exist.
awk '/^## C$/ {inside = 1} inside && /^```c$/ {code = 1; next} code && /^```$/ {exit} code {print}' \
  "$src/README.md" >"$tmp/snippet.c"
[ -s "$tmp/snippet.c" ] || fail "no C snippet found under \"## C\" in README.md"
{
  echo "#include <math.h>"
  echo "#include <stdio.h>"
  echo "#include <stdlib.h>"
  grep '^#include' "$tmp/snippet.c"
  cat <<'C'
/* Fills the buffers the README's snippet uses, runs it, and compares its output with cpu-ref's. */
int main(void) {
  const int batch = 2, seqlen = 77, heads = 3, head_dim = 40;
  size_t n = (size_t)batch * seqlen * heads * head_dim;
  float *q_ptr = malloc(n * sizeof(float)), *k_ptr = malloc(n * sizeof(float)), *v_ptr = malloc(n * sizeof(float));
  float *o_ptr = calloc(n, sizeof(float)), *want = calloc(n, sizeof(float));
  float *lse_ptr = calloc((size_t)batch * heads * seqlen, sizeof(float));
  float *lse_want = calloc((size_t)batch * heads * seqlen, sizeof(float));
  if (!q_ptr || !k_ptr || !v_ptr || !o_ptr || !want || !lse_ptr || !lse_want) return 2;
  unsigned s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u; q_ptr[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    s = s * 1664525u + 1013904223u; k_ptr[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    s = s * 1664525u + 1013904223u; v_ptr[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
  }
  { /* ---- the README's snippet ---- */
C
  grep -v '^#include' "$tmp/snippet.c" | sed 's/^/    /'
  cat <<'C'
  }
  flashc_handle ref;
  if (flashc_create(&ref, "cpu-ref") != FLASHC_OK) return fprintf(stderr, "cpu-ref: %s\n", flashc_last_error()), 1;
  flashc_tensor q = flashc_tensor_bshd(q_ptr, FLASHC_F32, batch, seqlen, heads, head_dim);
  flashc_tensor k = flashc_tensor_bshd(k_ptr, FLASHC_F32, batch, seqlen, heads, head_dim);
  flashc_tensor v = flashc_tensor_bshd(v_ptr, FLASHC_F32, batch, seqlen, heads, head_dim);
  flashc_tensor o = flashc_tensor_bshd(want, FLASHC_F32, batch, seqlen, heads, head_dim);
  flashc_params p = flashc_params_default();
  p.causal = 1;
  if (flashc_forward(ref, &p, &q, &k, &v, &o, lse_want) != FLASHC_OK)
    return fprintf(stderr, "cpu-ref: %s\n", flashc_last_error()), 1;
  flashc_destroy(ref);
  double worst = 0;
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)o_ptr[i] - want[i]));
  printf("snippet vs cpu-ref: max |O - O_ref| = %.3g over %zu values\n", worst, n);
  return worst < 1e-4 ? 0 : 1;
}
C
} >"$tmp/app.c"

echo "== README snippet through pkg-config"
export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name flashc.pc | head -1)")
flags=$(pkg-config --cflags --libs flashc) || fail "pkg-config --cflags --libs flashc"
echo "   pkg-config: $flags"
case "$flags" in *"$prefix"*) ;; *) fail "pkg-config flags do not point into the moved prefix $prefix" ;; esac
libdir=$(pkg-config --variable=libdir flashc)
# shellcheck disable=SC2086 # the flags are words
${CC:-cc} -std=c11 -o "$tmp/app_pc" "$tmp/app.c" $flags -lm -Wl,-rpath,"$libdir" || fail "compiling through pkg-config"
"$tmp/app_pc" || fail "the snippet built through pkg-config"

echo "== README snippet through CMake find_package(flashc)"
cmake -S "$src/tests/install/app" -B "$tmp/app_build" -DCMAKE_PREFIX_PATH="$prefix" -DAPP_SOURCE="$tmp/app.c" \
  >"$tmp/app_configure.log" 2>&1 || { cat "$tmp/app_configure.log"; fail "configuring with find_package(flashc)"; }
cmake --build "$tmp/app_build" >"$tmp/app_build.log" 2>&1 || { cat "$tmp/app_build.log"; fail "building with flashc::flashc"; }
"$tmp/app_build/app" || fail "the snippet built through CMake"
echo "== install test passed"
