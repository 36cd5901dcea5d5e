#!/usr/bin/env bash
# bench/sm90_expt.sh — times the Hopper forward built with FA_SM90_EXPT values (fwd_sm90.cuh:
# 1 V not loaded, 2 neither K nor V, 3 no softmax, 4 no S = Q K^T, 5 no O += P V: wrong
# results, the times say what each part costs; 6, 8, 9 switched variants with right results),
# sampling the SM clock and the power meanwhile.
#
# Experiment 0 is gpu.sh's build ($BUILD, build-gpu: the sources as they are). Every other
# value gets a fresh copy of the tree in /tmp/expt-<n> with the macro's default changed, all
# built at once (the library and the command only). Then ROUNDS rounds each time every
# experiment in the order given, so that the clock's drift falls on all of them alike.
#
#   run(command="EXPTS='0 9' ROUNDS=2 SWEEP_ARGS='--head-dim 64 --seqlens 512,2048 \
#                --masks causal' bash bench/sm90_expt.sh", carry=[".deps"])
#
# EXPT_STAGES (default "build bench"): "build" alone starts nothing else, so the copies can
# compile in the background while the same call runs the tests on build-gpu, e.g.
#   STAGES=build bash bench/gpu.sh      # also unpacks the deps the copies' builds need
#   EXPTS=9 EXPT_STAGES=build bash bench/sm90_expt.sh & STAGES=test bash bench/gpu.sh; wait
#   EXPTS='0 9' EXPT_STAGES=bench bash bench/sm90_expt.sh
# Files back: expt.txt (per experiment and round the bench's rows: d, seqlen, mask, TFLOP/s,
# kernel; then the clock and power under load).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
EXPTS=${EXPTS:-0 3 4 5}
STAGES_E=${EXPT_STAGES:-build bench}
mkdir -p "$OUT"
ROOT=$PWD
# build-gpu as it is and the deps on the paths (gpu.sh's work folder is its: not while
# another gpu.sh runs, hence not in the build stage, which needs only the unpacked deps)
if [[ " $STAGES_E " == *" bench "* ]]; then
  . bench/device_build.sh
else
  LIBDIR=$(dirname "$(find /tmp/deps -name 'libcmocka.so*' | head -n 1)")
fi
expt_dir() { echo "/tmp/expt-$1"; }
tool() { if [ "$1" = 0 ]; then echo "$ROOT/${BUILD:-build-gpu}/tools/flashattn"; else echo "$(expt_dir "$1")/build/tools/flashattn"; fi; }

if [[ " $STAGES_E " == *" build "* ]]; then
  export CMAKE_PREFIX_PATH="/tmp/deps/usr" CMAKE_LIBRARY_PATH="$LIBDIR" CMAKE_INCLUDE_PATH="/tmp/deps/usr/include"
  n=0
  for e in $EXPTS; do [ "$e" = 0 ] || n=$((n + 1)); done
  jobs_each=$(($(nproc) / (n > 0 ? n : 1)))
  [ "$jobs_each" -lt 1 ] && jobs_each=1
  pids=()
  for e in $EXPTS; do
    [ "$e" = 0 ] && continue
    d=$(expt_dir "$e")
    rm -rf "$d" && mkdir -p "$d"
    # a plain copy: new mtimes, so nothing of an earlier call's build is taken for current
    tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$d"
    sed -i "s/^#define FA_SM90_EXPT [0-9]*$/#define FA_SM90_EXPT $e/" "$d/src/cuda/fwd_sm90.cuh"
    (cd "$d" && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_WITH_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" -DFLASHATTN_BUILD_TESTS=OFF >"$d/build.log" 2>&1 &&
       cmake --build build -j "$jobs_each" >>"$d/build.log" 2>&1) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  for e in $EXPTS; do
    [ "$e" = 0 ] || [ -x "$(tool "$e")" ] ||
      { echo "experiment $e: build failed"; tail -n 30 "$(expt_dir "$e")/build.log"; exit 1; }
  done
fi

if [[ " $STAGES_E " == *" bench "* ]]; then
  for r in $(seq 1 "${ROUNDS:-1}"); do
    for e in $EXPTS; do
      echo "=== FA_SM90_EXPT=$e round $r" | tee -a "$OUT/expt.txt"
      # the SM clock and board power while it runs: a part left out may run faster only
      # because the rest then draws less power and the clock stays up
      nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 >/tmp/clk.csv &
      smi=$!
      # shellcheck disable=SC2086
      timeout 300 "$(tool "$e")" bench --backend cuda --sweep --op fwd ${SWEEP_ARGS:-} 2>&1 |
        awk '/^fwd/ {print $5, $7, $8, $15, $17}' | tee -a "$OUT/expt.txt"
      [ "${PIPESTATUS[0]}" = 124 ] && echo "experiment $e: the bench timed out" | tee -a "$OUT/expt.txt"
      kill $smi
      python3 - /tmp/clk.csv <<'PY' | tee -a "$OUT/expt.txt"
import statistics, sys
rows = [tuple(float(x) for x in l.split(",")) for l in open(sys.argv[1]) if l.count(",") == 1]
busy = [r for r in rows if r[1] > 300]  # samples under load
if busy:
    print("under load (>300 W, %d samples): SM clock median %.0f MHz, power median %.0f W"
          % (len(busy), statistics.median(r[0] for r in busy), statistics.median(r[1] for r in busy)))
PY
    done
  done
fi
