#!/usr/bin/env bash
# bench/probes/round_fp8.sh — the FP8 Hopper forward's checks before it merges, run as
# bench/gpu_round.sh's EXTRA (after its build, package install and ctest stage), each step
# bounded, most important first:
#   1. test_fp8.py's sm90 e4m3 rows over several seeds (the d128 failure was ~1 in 5 draws);
#   2. compute-sanitizer memcheck of test_fp8_cuda;
#   3. bench/fp8_vs_bf16.py (FP8 forward against bf16, d 128).
# Logs under $OUT; FP8_S is this script's budget in seconds (default 240).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
left() { echo $(( ${FP8_S:-240} - ($(date +%s) - T0) )); }
B=${BUILD:-build-gpu}
echo "== test_fp8.py -k e4m3_sm90 over seeds"
fails=0
for s in 1 2 3 4 5 6; do
  [ "$(left)" -lt 150 ] && break
  (cd python/tests && FLASHATTN_TEST_SEED=$s timeout 60 python3 -m pytest -q -p no:cacheprovider \
    -rf test_fp8.py -k e4m3_sm90 >>"$OUT/fp8_seeds.txt" 2>&1) || { fails=$((fails + 1)); echo "seed $s FAILED"; }
done
echo "seed runs failed: $fails"; grep -E "passed|failed" "$OUT/fp8_seeds.txt" | tail -6
cs=compute-sanitizer
command -v $cs >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
echo "== memcheck test_fp8_cuda"
timeout $(( $(left) - 70 < 120 ? $(left) - 70 : 120 )) $cs --tool memcheck --error-exitcode 99 \
  "$B/tests/test_fp8_cuda" cuda >"$OUT/fp8_memcheck.txt" 2>&1
echo "rc $? (124: incomplete)"; grep -E "ERROR SUMMARY|cases|FAIL" "$OUT/fp8_memcheck.txt" | tail -5
if [ "$(left)" -gt 40 ]; then
  echo "== fp8_vs_bf16.py"
  timeout $(( $(left) - 10 )) python3 bench/fp8_vs_bf16.py >"$OUT/fp8_vs_bf16.txt" 2>&1
  echo "rc $?"; tail -12 "$OUT/fp8_vs_bf16.txt"
fi
echo "round_fp8: $(( $(date +%s) - T0 ))s"
