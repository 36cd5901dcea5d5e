#!/usr/bin/env bash
# bench/probes/round_x2.sh — the extra checks of a merge round on 2 GPUs, run as
# bench/gpu_round.sh's EXTRA after its build and ctest stage, most important first, each
# bounded so that a hang costs its own limit only:
#   1. the Python tests of the KV-cache, compile, FA3 and FP8 paths on CUDA;
#   2. test_fp8_cuda (the Hopper FP8 forward);
#   3. test_cp on both GPUs under its watchdog (CP_TIMEOUT), again on non-blocking streams if
#      the first run fails;
#   4. bench_cp when the ring passed and time is left.
# Logs under $OUT; ROUND_S is this script's budget in seconds (default 300).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
left() { echo $(( ${ROUND_S:-300} - ($(date +%s) - T0) )); }
B=${BUILD:-build-gpu}
echo "== pytest (kvcache, compile, fa3, fp8, cuda)"
(cd python/tests && timeout 150 python3 -m pytest -q -p no:cacheprovider -rf \
  test_kvcache.py test_compile.py test_fa3.py test_fp8.py test_cuda.py >"$OUT/pytest.txt" 2>&1)
echo "rc $?"; grep -E "^FAILED|passed|failed" "$OUT/pytest.txt" | tail -12
echo "== test_fp8_cuda"
timeout 60 "$B/tests/test_fp8_cuda" cuda >"$OUT/fp8.txt" 2>&1
echo "rc $?"; grep -iE "fail|pass|error|refus" "$OUT/fp8.txt" | tail -14
[ "$(left)" -lt 50 ] && exit 0
echo "== test_cp (the context's default stream)"
CP_TIMEOUT=30 timeout 100 "$B/tests/test_cp" >"$OUT/cp.txt" 2>&1
rc=$?; echo "rc $rc"; grep -E "^world|FAIL|test_cp" "$OUT/cp.txt" | tail -10
if [ $rc -ne 0 ] && [ "$(left)" -gt 50 ]; then
  echo "== test_cp (non-blocking streams)"
  CP_STREAM=nonblocking CP_TIMEOUT=30 timeout 100 "$B/tests/test_cp" >"$OUT/cp_nb.txt" 2>&1
  echo "rc $?"; grep -E "^world|FAIL|test_cp" "$OUT/cp_nb.txt" | tail -10
fi
if grep -q "all passed" "$OUT/cp.txt" "$OUT/cp_nb.txt" 2>/dev/null && [ "$(left)" -gt 60 ]; then
  echo "== bench_cp"
  timeout $(( $(left) - 10 )) "$B/tools/bench/bench_cp" --reps 5 --warmup 2 2>&1 | tee "$OUT/bench_cp.txt" | tail -7
fi
