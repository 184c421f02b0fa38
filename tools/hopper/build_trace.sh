#!/usr/bin/env bash
# tools/hopper/build_trace.sh BUILD TRACE_BUILD [DEFINES] — a copy of the configured build folder BUILD (e.g. build-gc) with
# src/cuda/hopper/fwd.cu compiled with -DFC_HP_TRACE=1 (hopper/trace.cuh: the persistent forward's timeline) and the
# library relinked; everything else is BUILD's objects as they are. tools/hopper/trace.py reads the result:
#   FLASHC_LIBRARY=TRACE_BUILD/libflashc.so PYTHONPATH=python python3 tools/hopper/trace.py
set -euo pipefail
src=${1:?usage: build_trace.sh BUILD TRACE_BUILD}
dst=${2:?usage: build_trace.sh BUILD TRACE_BUILD}
ninja -C "$src" flashc >/dev/null
rm -rf "$dst"
cp -r "$src" "$dst"
cd "$dst"
obj=CMakeFiles/flashc_objects.dir/src/cuda/hopper/fwd.cu.o
compile=$(ninja -t commands "$obj" | tail -1)
lib=$(basename "$(readlink -f libflashc.so)") # libflashc.so.X.Y.Z, the file the link writes
# Relinked without the version script (cmake/flashc.map), which would hide the trace readers (fc_hopper_trace_*).
link=$(ninja -t commands "$lib" | tail -1 | sed 's/ -Wl,--version-script=[^ ]*//')
eval "${compile/ -c / ${3:--DFC_HP_TRACE=1} -c }"
eval "$link"
echo "trace build: $dst/libflashc.so"
