#!/usr/bin/env bash
# bench/probes/cp_multi.sh — issue 40's checks and figures on a machine of 2 or more GPUs, run as
# bench/gpu_round.sh's EXTRA (after its build and package install), most important first, each
# step bounded so that a hang costs its own limit only:
#   1. test_cp over 2 GPUs (CP_WORLD=2) and over every GPU, under its watchdog;
#   2. bench_cp at 128k tokens (32/8 heads, d 128, bf16, causal, zigzag) on 2 and on every GPU;
#   3. the Python suite's NCCL cases (test_distributed.py, worlds 2 and 4);
#   4. bench/cp_bench.py under torchrun: our Python ring and PyTorch's context_parallel, 128k,
#      on every GPU, then on 2;
#   5. bench_cp at 512k tokens on every GPU (no one-GPU baseline).
# Logs under $OUT; CP_S is this script's budget in seconds (default 400).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
left() { echo $(( ${CP_S:-400} - ($(date +%s) - T0) )); }
B=${BUILD:-build-gpu}
N=$(nvidia-smi -L | wc -l)
echo "== $N GPUs; NCCL ${FLASHATTN_NCCL_LIBRARY:-libnccl.so.2}"
for w in 2 "$N"; do
  echo "== test_cp, world $w"
  CP_WORLD=$w CP_TIMEOUT=40 timeout 150 "$B/tests/test_cp" >"$OUT/cp_w$w.txt" 2>&1
  echo "rc $?"; grep -E "^world|FAIL|test_cp" "$OUT/cp_w$w.txt" | tail -16
  [ "$w" = "$N" ] && break
done
for w in 2 "$N"; do
  [ "$(left)" -lt 120 ] && break
  echo "== bench_cp 128k, world $w"
  timeout 90 "$B/tools/bench/bench_cp" --world "$w" --reps 5 --warmup 2 >"$OUT/bench_cp_w$w.txt" 2>&1
  echo "rc $?"; tail -7 "$OUT/bench_cp_w$w.txt"
  [ "$w" = "$N" ] && break
done
if [ "$(left)" -gt 150 ]; then
  echo "== pytest test_distributed.py (NCCL worlds)"
  (cd python/tests && timeout 120 python3 -m pytest -q -p no:cacheprovider -rf test_distributed.py \
    >"$OUT/pytest_dist.txt" 2>&1)
  echo "rc $?"; grep -E "^FAILED|passed|failed" "$OUT/pytest_dist.txt" | tail -8
fi
for w in "$N" 2; do
  [ "$(left)" -lt 110 ] && break
  echo "== cp_bench.py 128k, world $w"
  timeout $(( $(left) - 60 < 150 ? $(left) - 60 : 150 )) python3 -m torch.distributed.run \
    --nproc-per-node "$w" bench/cp_bench.py --reps 5 --warmup 2 --json "$OUT/cp_bench_w$w.json" \
    --md "$OUT/cp_bench_w$w.md" >"$OUT/cp_bench_w$w.txt" 2>&1
  echo "rc $?"; cat "$OUT/cp_bench_w$w.md" 2>/dev/null | tail -12
  [ "$w" = 2 ] && break
done
if [ "$(left)" -gt 60 ]; then
  echo "== bench_cp 512k, world $N"
  timeout $(( $(left) - 10 )) "$B/tools/bench/bench_cp" --tokens 524288 --no-baseline --reps 3 \
    --warmup 1 >"$OUT/bench_cp_512k.txt" 2>&1
  echo "rc $?"; tail -5 "$OUT/bench_cp_512k.txt"
fi
echo "cp_multi: $(( $(date +%s) - T0 ))s"
