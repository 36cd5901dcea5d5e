#!/usr/bin/env bash
# bench/clock_pair.sh — the SM clock and board power that ours and cuDNN's forward sustain on the
# same row (issue 7): the H100 runs these kernels at its 700 W limit, where the clock follows the
# energy a call spends, so a row can be lost to power as well as to cycles. Per shape, each side
# runs its 1000 timed calls (both tools' most) alone while nvidia-smi samples clock and power
# every 20 ms; the medians of the samples under load (> 300 W) are printed beside each side's
# TFLOP/s.
#
#   run(command="SHAPES='128:512:0 256:512:0' bash bench/clock_pair.sh", carry=[".deps"])
#
# SHAPES: D:N:CAUSAL as bench/ncu_peers.sh (bf16, 16k tokens, model dim 2048). Needs build-gpu
# (bench/device_build.sh builds it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. bench/device_build.sh
sample() {  # sample CMD...: runs CMD while sampling; prints "clock MHz, power W" medians
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 20 >/tmp/clk.csv &
  local smi=$!
  "$@" >/tmp/side.log 2>&1
  kill $smi
  python3 - /tmp/clk.csv <<'PY'
import statistics, sys
rows = [tuple(float(x) for x in l.split(",")) for l in open(sys.argv[1]) if l.count(",") == 1]
busy = [r for r in rows if r[1] > 300]
print("clock %4.0f MHz, power %3.0f W (%d samples)" % (
    statistics.median(r[0] for r in busy) if busy else 0,
    statistics.median(r[1] for r in busy) if busy else 0, len(busy)), end="")
PY
}
for shape in ${SHAPES:-128:512:0 256:512:0 128:2048:0}; do
  IFS=: read -r d n c <<<"$shape"
  mask=none
  [ "$c" = 1 ] && mask=causal
  echo -n "d $d seqlen $n $mask  ours:  "
  sample build-gpu/tools/flashattn bench --backend cuda --sweep --head-dim "$d" --seqlens "$n" \
    --masks "$mask" --op fwd --reps 1000 --max-time 0
  echo "  $(awk '/^fwd/ {print $15, "TFLOP/s"}' /tmp/side.log)"
  echo -n "d $d seqlen $n $mask  cudnn: "
  sample python3 bench/peers.py --impls cudnn --ops fwd --head-dims "$d" --seqlens "$n" \
    --masks "$mask" --reps 1000 --max-time 0
  echo "  $(awk '$1 == "cudnn" {print $13, "TFLOP/s"}' /tmp/side.log)"
done
