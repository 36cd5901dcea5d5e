#!/usr/bin/env bash
# bench/trace_sm90.sh — one device call: builds the Hopper forward with its timeline compiled in
# (a bring-up build with -DFA_SM90_TRACE, src/cuda/trace_sm90.cuh; build folder build-trace) and, per shape, runs the
# forward bench on it with FLASHATTN_SM90_TRACE_FILE set, then bench/trace_sm90.py on the last
# call's timeline. The traced build's TFLOP/s are not the kernel's (one thread per role writes
# its events): read the cycles, not the bench figures.
#
#   run(command="SHAPES='128:2048:none 64:4096:causal' bash bench/trace_sm90.sh", carry=[".deps"])
#
# SHAPES: space-separated D:SEQLEN:MASK[:VAR=VALUE,...] (bench sweep shapes: bf16, 16k tokens,
# model dim 2048; the optional bring-up switches of fwd_sm90_bringup.cuh). Files back: trace.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
mkdir -p "$OUT"
export BUILD=build-trace CMAKE_ARGS="-DFLASHATTN_BRINGUP=ON -DCMAKE_CUDA_FLAGS=-DFA_SM90_TRACE ${CMAKE_ARGS:-}"
. bench/device_build.sh
for s in ${SHAPES:-128:2048:none}; do
  IFS=: read -r d n mask envs <<<"$s"
  IFS=, read -r -a vars <<<"${envs:-}"
  echo "=== d $d seqlen $n mask $mask ${envs:-}" >>"$OUT/trace.txt"
  env "${vars[@]}" FLASHATTN_SM90_TRACE_FILE=/tmp/trace.bin "$BUILD/tools/flashattn" bench \
    --backend cuda --sweep --head-dim "$d" --seqlens "$n" --masks "$mask" --op fwd \
    --reps 5 --max-time 1 2>&1 | tail -n 3 >>"$OUT/trace.txt"
  python3 bench/trace_sm90.py /tmp/trace.bin >>"$OUT/trace.txt" 2>&1
  rm -f /tmp/trace.bin
done
cat "$OUT/trace.txt"
