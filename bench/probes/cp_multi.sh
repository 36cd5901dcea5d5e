#!/usr/bin/env bash
# bench/probes/cp_multi.sh — issue 40's checks and figures on a machine of 2 or more GPUs, run as
# bench/gpu_round.sh's EXTRA (after its build and package install), most important first, each
# step bounded so that a hang costs its own limit only:
#   1. test_cp over every GPU (worlds 1 and N) under its watchdog (CP_WORLD=2 too: CP_W2=1);
#   2. bench_cp at 128k tokens (32/8 heads, d 128, bf16, causal, zigzag) on every GPU;
#   3. bench_cp at 512k tokens on every GPU (no one-GPU baseline), and at 128k on 2 GPUs;
#   4. bench/cp_bench.py under torchrun on every GPU (our Python ring and PyTorch's
#      context_parallel, 128k; CP_PY_ARGS adds options);
#   5. the Python suite's NCCL cases (test_distributed.py -k nccl).
# Logs under $OUT; CP_S is this script's budget in seconds (default 400).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
left() { echo $(( ${CP_S:-400} - ($(date +%s) - T0) )); }
B=${BUILD:-build-gpu}
N=$(nvidia-smi -L | wc -l)
echo "== $N GPUs; NCCL ${FLASHATTN_NCCL_LIBRARY:-libnccl.so.2}"
W=$N; [ "${CP_W2:-0}" = 1 ] && W="2 $N"
for w in $W; do
  echo "== test_cp, world $w"
  CP_WORLD=$w CP_TIMEOUT=40 timeout 150 "$B/tests/test_cp" >"$OUT/cp_w$w.txt" 2>&1
  echo "rc $?"; grep -E "FAIL|test_cp" "$OUT/cp_w$w.txt" | tail -8
done
bcp() { # name, timeout, arguments...
  local name=$1 t=$2; shift 2
  [ "$(left)" -lt $((t + 20)) ] && { echo "== $name: no time left"; return; }
  echo "== bench_cp $name"
  timeout "$t" "$B/tools/bench/bench_cp" "$@" >"$OUT/bench_cp_$name.txt" 2>&1
  echo "rc $?"; grep "^|" "$OUT/bench_cp_$name.txt" | tail -4
}
bcp "128k_w$N" 80 --world "$N" --reps 5 --warmup 2
bcp "512k_w$N" 90 --world "$N" --tokens 524288 --no-baseline --reps 3 --warmup 1
[ "$N" -gt 2 ] && bcp 128k_w2 80 --world 2 --reps 5 --warmup 2
if [ "$(left)" -gt 130 ]; then
  echo "== cp_bench.py 128k, world $N ${CP_PY_ARGS:-}"
  timeout $(( $(left) - 40 < 150 ? $(left) - 40 : 150 )) python3 -m torch.distributed.run \
    --nproc-per-node "$N" bench/cp_bench.py --reps 5 --warmup 2 --json "$OUT/cp_bench_w$N.json" \
    --md "$OUT/cp_bench_w$N.md" ${CP_PY_ARGS:-} >"$OUT/cp_bench_w$N.log" 2>&1
  echo "rc $?"; grep -E "^\| flashattn|^\| torch|^- fwd|^- one" "$OUT/cp_bench_w$N.md" 2>/dev/null | tail -12
fi
if [ "$(left)" -gt 60 ]; then
  echo "== pytest test_distributed.py -k nccl"
  (cd python/tests && timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -rf \
    test_distributed.py -k nccl >"$OUT/pytest_dist.log" 2>&1)
  echo "rc $?"; grep -E "^FAILED|passed|failed" "$OUT/pytest_dist.log" | tail -8
fi
echo "cp_multi: $(( $(date +%s) - T0 ))s"
