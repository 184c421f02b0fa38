#!/usr/bin/env bash
# tools/hopper/build_variant.sh OUT_DIR SOURCE "DEFINES" — one source of the library (e.g. src/cuda/hopper/bwd.cu)
# compiled with DEFINES (-DNAME=VALUE ...) and linked with the other objects of the configured Ninja build $BUILD
# (default build, the folder scripts/build makes; brought up to date first) into OUT_DIR/libflashc.so, for A/B runs of compile-time settings
# (tools/hopper/pack_libs.sh, ab.sh). The build folder itself is left as it is.
set -euo pipefail
out=${1:?usage: build_variant.sh OUT_DIR SOURCE DEFINES} src=${2:?source} defs=${3-}
build=$(cd "${BUILD:-build}" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
ninja -C "$build" flashc >/dev/null
cd "$build"
obj=CMakeFiles/flashc_objects.dir/$src.o
compile=$(ninja -t commands "$obj" | tail -1)
[ -n "$compile" ] || { echo "build_variant.sh: no object $obj in $build" >&2; exit 2; }
compile=${compile/ -c / $defs -c }
compile=${compile/-o $obj/-o $out\/variant.o}
compile=${compile/-MF $obj.d/-MF $out\/variant.d}
eval "$compile"
lib=$(basename "$(readlink -f libflashc.so)") # libflashc.so.X.Y.Z, the file the link writes
link=$(ninja -t commands "$lib" | tail -1)
link=${link/$obj/$out\/variant.o}
link=${link/-o $lib/-o $out\/libflashc.so}
link=${link/-Wl,-soname,libflashc.so.0/-Wl,-soname,libflashc.so}
eval "$link"
echo "variant: $out/libflashc.so ($src $defs)"
