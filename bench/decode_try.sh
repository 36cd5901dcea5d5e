#!/usr/bin/env bash
# bench/decode_try.sh — a quick look at the decode kernel on the device (issue 4): build
# (gpu.sh's build stage), test_kvcache on the GPU, our decode rows at the library's splits
# and at forced ones, the peers on the same rows, and optionally one ncu profile.
#
#   run(command="COMMIT=<sha> bash bench/decode_try.sh", carry=[".deps"], timeout_s=600)
#
# Environment: ARGS (rows; default batch 1, caches 8k/32k/128k, both layouts, checks off),
# SPLITS (forced num_splits to try, e.g. "16 48 64", at SPLIT_BATCHES x SPLIT_LENS, default
# 1 x 8192), PEERS=0 (skip the peers),
# NCU=1 (ncu at batch 1 x NCU_LEN, default 8192: details and per-instruction SASS, summarised by sass_stalls.py),
# NSYS=1 (nsys at batch 1 x 8k: the last GPU operations of the trace, kernels and memsets).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-gpu}
ARGS=${ARGS:---batches 1 --cache-lens 8192,32768,131072 --checks off}
mkdir -p "$OUT"
S=$OUT/summary.txt
: >"$S"
. bench/device_build.sh
TOOL="$BUILD/tools/flashattn"
(cd "$BUILD" && timeout -k 5 120 ctest -R kvcache --output-on-failure) >"$OUT/test.log" 2>&1
echo "test_kvcache: exit $? ($(grep -E 'tests passed|tests failed' "$OUT/test.log"))" | tee -a "$S"
# shellcheck disable=SC2086
timeout -k 5 120 "$TOOL" bench --backend cuda --decode $ARGS --json "$OUT/decode_ours.json" \
  >"$OUT/bench.log" 2>&1
echo "ours: exit $?" | tee -a "$S"
for s in ${SPLITS:-}; do
  timeout -k 5 60 "$TOOL" bench --backend cuda --decode --batches "${SPLIT_BATCHES:-1}" \
    --cache-lens "${SPLIT_LENS:-8192}" \
    --contiguous --checks off --splits "$s" >>"$OUT/bench.log" 2>&1
  echo "splits $s: exit $?" | tee -a "$S"
done
if [ "${PEERS:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout -k 5 150 python3 bench/peers_decode.py $ARGS --json "$OUT/decode_peers.json" \
    >>"$OUT/bench.log" 2>&1
  echo "peers: exit $?" | tee -a "$S"
fi
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout -k 5 200 "$NCU_BIN" --clock-control none -k regex:decode --launch-skip 5 --cache-control none \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    --section Occupancy --section SourceCounters --section MemoryWorkloadAnalysis -f -o /tmp/p_dec \
    "$TOOL" bench --backend cuda --decode --batches 1 --cache-lens "${NCU_LEN:-8192}" \
    --contiguous --checks off --warmup 2 --reps 3 --max-time 0 >/tmp/ncu_dec.log 2>&1
  echo "ncu: exit $?" | tee -a "$S"
  "$NCU_BIN" --import /tmp/p_dec.ncu-rep --page details --csv >"$OUT/ncu_dec.csv" 2>&1
  "$NCU_BIN" --import /tmp/p_dec.ncu-rep --page source --csv --print-source sass >/tmp/sass_dec.csv 2>&1
  python3 bench/sass_stalls.py /tmp/sass_dec.csv --lines 40 >"$OUT/stalls.txt" 2>&1
fi
if [ "${NSYS:-0}" = 1 ]; then
  NSYS_BIN=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1)
  # shellcheck disable=SC2086
  timeout -k 5 120 "$NSYS_BIN" profile -o /tmp/dec_nsys -f true --stats=false \
    "$TOOL" bench --backend cuda --decode --batches 1 --cache-lens 8192 --contiguous \
    --checks off >/tmp/nsys.log 2>&1
  echo "nsys: exit $?" | tee -a "$S"
  "$NSYS_BIN" stats -r cuda_gpu_trace -f csv /tmp/dec_nsys.nsys-rep 2>/dev/null |
    tail -n 40 >"$OUT/nsys_trace.csv"
fi
grep -E '^ *[0-9]' "$OUT/bench.log" | head -n 60
cat "$S"
