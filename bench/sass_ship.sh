#!/usr/bin/env bash
# bench/sass_ship.sh — the SASS of every Hopper kernel the library ships, one listing per
# kernel, for a diff between two trees: compiles TREE's src/cuda/fwd_sm90.cu and bwd_sm90.cu
# (the translation units themselves, so every instantiation their launchers can reach is in:
# head dims, tilings, schedules, the series kernel, dtypes, the backward's variants; masks and
# varlen are run-time arguments of these kernels) for sm_90a with the library's release flags,
# and writes per kernel its SASS with encodings (sass/<name>.sass, headers dropped) and its
# resource line (res.txt); nvcc's messages go to nvcc-<unit>.txt. Development machine, no GPU
# (bench/sass_tools.sh fetches the tools); about a minute per unit.
#
#   bash bench/sass_ship.sh [TREE [OUT]]   (defaults: this checkout, /tmp/fa-sass-ship)
#   FLAGS     extra nvcc flags (e.g. -DFA_BRINGUP)
#   UNITS     translation units under src/cuda (default "fwd_sm90.cu bwd_sm90.cu")
#
# Proof that two trees ship the same machine code:
#   bash bench/sass_ship.sh /tmp/base /tmp/sass-base && bash bench/sass_ship.sh . /tmp/sass-new
#   diff -r /tmp/sass-base/sass /tmp/sass-new/sass && diff /tmp/sass-{base,new}/res.txt && echo same
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "${1:-$here/..}" && pwd)
out=${2:-/tmp/fa-sass-ship}
# shellcheck source=bench/sass_tools.sh
. "$here/sass_tools.sh"
rm -rf "$out"
mkdir -p "$out/sass" "$out/obj"
: >"$out/res.txt"
for u in ${UNITS:-fwd_sm90.cu bwd_sm90.cu}; do
  obj="$out/obj/${u%.cu}.cubin"
  # the library's flags (CMakeLists.txt: Release, C++17, --use_fast_math -lineinfo)
  # shellcheck disable=SC2086
  nvcc -std=c++17 -O3 -DNDEBUG --use_fast_math -lineinfo -Xcompiler=-fvisibility=hidden \
    -DFLASHATTN_WITH_CUDA -D_POSIX_C_SOURCE=200809L ${FLAGS:-} \
    -I"$tree/include" -I"$tree/src" -gencode arch=compute_90a,code=sm_90a -cubin \
    "$tree/src/cuda/$u" -o "$obj" 2>"$out/nvcc-${u%.cu}.txt" || { cat "$out/nvcc-${u%.cu}.txt"; exit 1; }
  # per kernel: the lines between its "Function :" header and the next, without the
  # dump's framing (the file name, blank lines)
  "$cuobjdump" -sass "$obj" | awk -v dir="$out/sass" '
    /^[ \t]*Function : / { name = $3; f = dir "/" name ".sass"; next }
    /^[ \t]*\.\.\.\.\.\.\.\.\.\./ { next }
    f != "" && NF > 0 { print > f }'
  "$cuobjdump" -res-usage "$obj" | awk '/^ *Function / { n = $2 } /REG:/ { print n, $0 }' |
    sed 's/:$//' >>"$out/res.txt"
done
sort -o "$out/res.txt" "$out/res.txt"
rm -rf "$out/obj"
echo "$(ls "$out/sass" | wc -l) kernels: $out/sass, resources: $out/res.txt"
