#!/usr/bin/env bash
# bench/sass_local.sh — the Hopper forward's SASS on the development machine, without device
# time: compiles explicit instantiations of fwd_sm90_kernel (bf16) with nvcc for sm_90a and
# prints, per kernel, ptxas's spills and C75xx warnings (wgmma serialised) and the opcode
# counts of its SASS; the listings go to $SASS_OUT (default /tmp/fa-sass). cuobjdump and
# nvdisasm are not in this machine's CUDA install: the first run downloads NVIDIA's wheels
# (pip download, no install) into $SASS_TOOLS (default ~/.cache/flashattn-sass-tools; not
# under .deps, which travels to the device).
#
#   KERNELS   "D:tiling:schedule ..." (default "64:C:OVERLAP 128:C:OVERLAP 256:Long:OVERLAP");
#             tiling C or Long (fwd_sm90.cuh's Tiles<D>), schedule OVERLAP or PINGPONG
#   EXPTS     FA_SM90_EXPT values to build (default 0); two or more: compare their counts
#   FLAGS     extra nvcc flags (e.g. -DFA_SM90_WATCHDOG)
#
#   EXPTS="0 43" KERNELS="64:C:OVERLAP" bash bench/sass_local.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools=${SASS_TOOLS:-$HOME/.cache/flashattn-sass-tools}
out=${SASS_OUT:-/tmp/fa-sass}
mkdir -p "$tools" "$out"
for pkg in nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; do
  bin=${pkg#nvidia-cuda-}
  if [ -z "$(find "$tools" -name "$bin" -type f 2>/dev/null | head -n 1)" ]; then
    pip download -q --no-deps "$pkg" -d "$tools/$pkg" >/dev/null
    python3 -m zipfile -e "$tools/$pkg"/*.whl "$tools/$pkg/x"
    chmod +x "$(find "$tools/$pkg/x" -name "$bin" -type f | head -n 1)"
  fi
done
cuobjdump=$(find "$tools" -name cuobjdump -type f | head -n 1)
export PATH="$(dirname "$(find "$tools" -name nvdisasm -type f | head -n 1)"):$PATH"

src="$out/kernels.cu"
echo '#include "fwd_sm90.cuh"' >"$src"
for k in ${KERNELS:-64:C:OVERLAP 128:C:OVERLAP 256:Long:OVERLAP}; do
  IFS=: read -r d t s <<<"$k"
  echo "template __global__ void fa::sm90::fwd_sm90_kernel<__nv_bfloat16, fa::sm90::Tiles<$d>::$t, fa::sm90::$s>(const __grid_constant__ fa::sm90::Args);" >>"$src"
done
for e in ${EXPTS:-0}; do
  obj="$out/expt$e.o"
  # shellcheck disable=SC2086
  nvcc -std=c++17 -O3 -arch=sm_90a --use_fast_math -DFA_SM90_EXPT="$e" ${FLAGS:-} \
    -I"$root/src" -I"$root/src/cuda" -I"$root/include" -Xptxas -v -c "$src" -o "$obj" 2>"$out/ptxas$e.txt"
  echo "=== FA_SM90_EXPT=$e"
  grep -E "Compiling entry|spill|C75[0-9]+" "$out/ptxas$e.txt" |
    sed -E "s/.*Compiling entry function '([^']*)'.*/\1/; s/ptxas info *: //"
  for f in $("$cuobjdump" -elf "$obj" | grep -oE '_ZN2fa4sm9015fwd_sm90_kernel[A-Za-z0-9_]+ArgsE\b' | sort -u); do
    "$cuobjdump" -sass -fun "$f" "$obj" >"$out/sass-$e-$f.txt"
    n=$(grep -cE '^\s+/\*[0-9a-f]{4,}\*/' "$out/sass-$e-$f.txt")
    echo "--- $f: $n instructions; most frequent opcodes:"
    grep -oE '^\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P[0-9T]\s+)?[A-Z0-9_.]+' "$out/sass-$e-$f.txt" |
      awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -n 12 | tr '\n' ' '
    echo
  done
done
echo "listings: $out/sass-<expt>-<kernel>.txt"
