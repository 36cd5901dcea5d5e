#!/usr/bin/env bash
# bench/sm90_expt.sh — one device call that times the Hopper forward with parts of its key
# loop taken out (FA_SM90_EXPT in fwd_sm90.cuh: 1 V not loaded, 2 neither K nor V, 3 no
# softmax, 4 no S = Q K^T, 5 no O += P V: wrong results, the times say what each part costs;
# 6, 7 variants with right results), sampling the SM clock and the power meanwhile. Builds once
# (gpu.sh's build stage), then per experiment recompiles fwd_sm90.cu alone with the macro's
# value and times the forward bench on the same shapes.
#
#   run(command="EXPTS='0 3 4 5' SWEEP_ARGS='--head-dim 128 --seqlens 2048,8192 --masks none' \
#                bash bench/sm90_expt.sh", carry=[".deps"])
#
# Files back: expt.txt (per experiment the bench's rows: d, seqlen, mask, TFLOP/s, kernel).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
# a build folder of its own: its last object is an experiment's, and a later call's build of
# build-gpu must not mistake it for current (the copied tree keeps the header's old mtime)
export BUILD=${BUILD:-build-expt}
mkdir -p "$OUT"
. bench/device_build.sh
# the experiment is the default of FA_SM90_EXPT in the header (this copy's; put back at the
# end), so that the build recompiles fwd_sm90.cu alone
trap 'sed -i "s/^#define FA_SM90_EXPT [0-9]*$/#define FA_SM90_EXPT 0/" src/cuda/fwd_sm90.cuh' EXIT
for e in ${EXPTS:-0 3 4 5}; do
  sed -i "s/^#define FA_SM90_EXPT [0-9]*$/#define FA_SM90_EXPT $e/" src/cuda/fwd_sm90.cuh
  cmake --build "$BUILD" -j "$(nproc)" >/tmp/expt_build.log 2>&1 ||
    { tail -n 30 /tmp/expt_build.log; exit 1; }
  echo "=== FA_SM90_EXPT=$e" | tee -a "$OUT/expt.txt"
  # the SM clock and board power while it runs: a part left out may run faster only because
  # the rest then draws less power and the clock stays up
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 >/tmp/clk.csv &
  smi=$!
  # shellcheck disable=SC2086
  "$BUILD/tools/flashattn" bench --backend cuda --sweep --op fwd ${SWEEP_ARGS:-} 2>&1 |
    awk '/^fwd/ {print $5, $7, $8, $15, $17}' | tee -a "$OUT/expt.txt"
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
