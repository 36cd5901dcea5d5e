#!/usr/bin/env bash
# bench/sass_local.sh — the Hopper forward's SASS on the development machine, without device
# time: compiles explicit instantiations of fwd_sm90_kernel (bf16) with nvcc for sm_90a and
# prints, per kernel, ptxas's spills and C75xx warnings (wgmma serialised) and the opcode
# counts of its SASS; the listings go to $SASS_OUT (default /tmp/fa-sass). The tools come from
# bench/sass_tools.sh. For every shipped kernel at once, and a diff between two trees:
# bench/sass_ship.sh.
#
#   KERNELS   "D:tiling:schedule ..." (default "64:C:OVERLAP 128:C:OVERLAP 256:Long:OVERLAP");
#             tiling C or Long (tune_sm90.h's Tiles<D>), schedule OVERLAP or PINGPONG
#   FLAGS     extra nvcc flags (e.g. "-DFA_BRINGUP -DFA_SM90_WATCHDOG")
#
#   KERNELS="64:C:OVERLAP" bash bench/sass_local.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${SASS_OUT:-/tmp/fa-sass}
mkdir -p "$out"
# shellcheck source=bench/sass_tools.sh
. "$here/sass_tools.sh"

src="$out/kernels.cu"
echo '#include "fwd_sm90.cuh"' >"$src"
for k in ${KERNELS:-64:C:OVERLAP 128:C:OVERLAP 256:Long:OVERLAP}; do
  IFS=: read -r d t s <<<"$k"
  echo "template __global__ void fa::sm90::fwd_sm90_kernel<__nv_bfloat16, fa::sm90::Tiles<$d>::$t, fa::sm90::$s>(const __grid_constant__ fa::sm90::Args);" >>"$src"
done
obj="$out/kernels.o"
# shellcheck disable=SC2086
nvcc -std=c++17 -O3 -arch=sm_90a --use_fast_math ${FLAGS:-} \
  -I"$root/src" -I"$root/src/cuda" -I"$root/include" -Xptxas -v -c "$src" -o "$obj" 2>"$out/ptxas.txt"
grep -E "Compiling entry|spill|C75[0-9]+" "$out/ptxas.txt" |
  sed -E "s/.*Compiling entry function '([^']*)'.*/\1/; s/ptxas info *: //"
for f in $("$cuobjdump" -elf "$obj" | grep -oE '_ZN2fa4sm9015fwd_sm90_kernel[A-Za-z0-9_]+ArgsE\b' | sort -u); do
  "$cuobjdump" -sass -fun "$f" "$obj" >"$out/sass-$f.txt"
  n=$(grep -cE '^\s+/\*[0-9a-f]{4,}\*/' "$out/sass-$f.txt")
  echo "--- $f: $n instructions; most frequent opcodes:"
  grep -oE '^\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P[0-9T]\s+)?[A-Z0-9_.]+' "$out/sass-$f.txt" |
    awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -n 12 | tr '\n' ' '
  echo
done
echo "listings: $out/sass-<kernel>.txt"
