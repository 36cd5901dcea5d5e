#!/usr/bin/env bash
# bench/ncu_bwd.sh — the backward's kernels one by one, ours beside FlashAttention-2's (issue 3):
# builds (gpu.sh's build stage), then for each shape profiles one backward call of ours
# (pre, main, post kernels) and one of PyTorch SDPA's flash backend (dot(dO, O), main, dQ
# convert) with Nsight Compute and prints each kernel's name and duration.
#
#   run(command="COMMIT=<sha> bash bench/ncu_bwd.sh", carry=[".deps"], timeout_s=600)
#
# Environment: SHAPES, space-separated BATCH:SEQLEN:CAUSAL(0|1) (default "32:512:0 1:16384:0
# 8:2048:1"), d 128, 16 heads, bf16.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-32:512:0 1:16384:0 8:2048:1}
mkdir -p "$OUT"
. bench/device_build.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
durations() { # report -> "name duration" lines
  "$NCU" --import "$1" --page details --csv 2>/dev/null | python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 5]
ix = {h: i for i, h in enumerate(rows[0])}
for r in rows[1:]:
    if r[ix["Metric Name"]] == "Duration":
        print("  %-70s %10s %s" % (r[ix["Kernel Name"]][:70], r[ix["Metric Value"]], r[ix["Metric Unit"]]))'
}
for sh in $SHAPES; do
  IFS=: read -r B N CZ <<<"$sh"
  mask=none; [ "$CZ" = 1 ] && mask=causal
  echo "=== d 128, batch $B, seqlen $N, $mask" | tee -a "$OUT/ncu_bwd.txt"
  timeout -k 5 120 "$NCU" --clock-control none --section SpeedOfLight -k regex:bwd \
    --launch-skip 3 --launch-count 3 -f -o /tmp/ours "$BUILD/tools/flashattn" bench \
    --backend cuda --batch "$B" --heads 16 --head-dim 128 --seqlens "$N" --masks "$mask" \
    --dtype bf16 --op bwd --warmup 1 --reps 3 --max-time 0 --no-peak >/tmp/ncu_ours.log 2>&1
  echo " ours (exit $?):" | tee -a "$OUT/ncu_bwd.txt"
  durations /tmp/ours.ncu-rep | tee -a "$OUT/ncu_bwd.txt"
  timeout -k 5 120 "$NCU" --clock-control none --section SpeedOfLight -k regex:flash_bwd \
    --launch-skip 3 --launch-count 3 -f -o /tmp/fa2 python3 - "$B" "$N" "$CZ" >/tmp/ncu_fa2.log 2>&1 <<'PY'
import sys, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
B, N, cz = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
q, k, v = (torch.randn(B, 16, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(B, 16, N, 128, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cz)
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
PY
  echo " FA2 (exit $?):" | tee -a "$OUT/ncu_bwd.txt"
  durations /tmp/fa2.ncu-rep | tee -a "$OUT/ncu_bwd.txt"
done
