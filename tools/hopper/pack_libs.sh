#!/usr/bin/env bash
# tools/hopper/pack_libs.sh OUT.tar.xz NAME=BUILD_DIR ... — libflashc builds in one archive for the device tool's carry
# (64 MiB in all), each as NAME.so, for tools/hopper/ab.sh. xz with a dictionary larger than all of them together, so
# that builds differing in one object cost little beyond the first (measured: four 37 MB libraries that differ in
# hopper/fwd.cu, 26 MB; gzip: 26 MB each). Build the variants with tools/hopper/build_trace.sh BUILD COPY "-D...".
set -euo pipefail
out=${1:?usage: pack_libs.sh OUT.tar.xz NAME=BUILD_DIR ...}
shift
[ $# -gt 0 ] || { echo "pack_libs.sh: no NAME=BUILD_DIR given" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for spec in "$@"; do
  name=${spec%%=*} dir=${spec#*=}
  [ "$name" != "$spec" ] || { echo "pack_libs.sh: '$spec' is not NAME=BUILD_DIR" >&2; exit 2; }
  cp -L "$dir/libflashc.so" "$tmp/$name.so"
done
tar cf - -C "$tmp" . | xz -9e -T1 --lzma2=dict=256MiB >"$out"
ls -la "$out"
