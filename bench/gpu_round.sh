#!/usr/bin/env bash
# bench/gpu_round.sh — one lent-GPU call that checks a merge round: bench/gpu.sh's build, the
# fuzzer on the idle CPU cores meanwhile (bench/fuzz_bg.sh), the GPU and Python test entries,
# the host CPU's AMX/AVX-512 levels, optional extra commands, bench/gpu.sh's decode stage, and
# the fuzzer's count. Results under $OUT (gpu.sh's files, round.txt with the key lines).
#   run(command="COMMIT=<sha> bash bench/gpu_round.sh", carry=[".deps", "build-fuzzcarry"], timeout_s=600)
# (the lent image has no clang: without the carried fuzzer, made by `bench/fuzz_bg.sh carry`, the
# fuzzer stage reports "build failed" and nothing runs)
# Environment: COMMIT; CTEST_ARGS (default "-L gpu|python"); CPU_TESTS (a ctest -R regex for
# the host CPU's levels, default the _amx and _avx512 entries); EXTRA (a command run after the
# tests, e.g. a benchmark writing into $OUT; its limit is what is left less EXTRA_RESERVE_S,
# default 100, kept for the stages after it); FUZZ_WORKERS (default 8, 0: none); STAGES_AFTER
# (default "decode"); BUDGET_S (default 560: the call's limit less the machine's start).
# Time (H200, 2026-11-29): build 136 s, `-L gpu` about 190 s and the Python suite about 210 s
# beside the fuzzer: the three do not fit one call; run `ctest -L python` in a second call on the
# still-warm machine (build-gpu is kept there).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# NCCL for test_cp / bench_cp: no NVLink SHARP (the device rules), torch's library unless given
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${FLASHATTN_NCCL_LIBRARY:-}" ]; then
  nccl=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 2>/dev/null | head -1)
  [ -n "$nccl" ] && export FLASHATTN_NCCL_LIBRARY=$nccl
fi
export OUT=${OUT:-/tmp/fa-round-out}
mkdir -p "$OUT"
R=$OUT/round.txt
: >"$R"
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
say() { echo "$*" | tee -a "$R"; }
say "round: commit ${COMMIT:-?}, $(date -u +%H:%M:%SZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

OUT=$OUT/build STAGES=build BUDGET_S=300 bash bench/gpu.sh >/dev/null 2>&1 ||
  { say "build FAILED"; tail -30 "$OUT/build/build.log"; exit 1; }
say "build ok at $(( $(date +%s) - T0 ))s"
workers=${FUZZ_WORKERS:-8}
fuzz_s=$(( $(left) - 60 ))
[ "$workers" -gt 0 ] && bench/fuzz_bg.sh start "$workers" "$fuzz_s" 2>&1 | tee -a "$R"

OUT=$OUT/test STAGES=test CTEST_ARGS="${CTEST_ARGS:--L gpu|python}" TEST_TIMEOUT=$(( $(left) - 200 )) \
  BUDGET_S=$(( $(left) - 150 )) bash bench/gpu.sh >"$OUT/test-stdout.txt" 2>&1
say "tests: $(grep -E "passed, [0-9]+ failed" "$OUT/test-stdout.txt" | tail -1)"
grep -E "\*\*\*Failed|Timeout|FAILED" "$OUT/test/test.log" 2>/dev/null | head -20 | tee -a "$R"
ctest --test-dir build-gpu -R "${CPU_TESTS:-_amx\$|_avx512\$}" --timeout 120 >"$OUT/cpu-levels.txt" 2>&1
say "host CPU levels: $(grep -E "tests passed|tests failed" "$OUT/cpu-levels.txt")"
grep -E "\*\*\*Failed|Not Run|Skipped" "$OUT/cpu-levels.txt" | head -10 | tee -a "$R"
extra_s=$(( $(left) - ${EXTRA_RESERVE_S:-100} ))
if [ -n "${EXTRA:-}" ] && [ "$extra_s" -le 10 ]; then
  say "extra: not run (${extra_s}s left for it)"
elif [ -n "${EXTRA:-}" ]; then
  timeout "$extra_s" bash -c "$EXTRA" >"$OUT/extra.txt" 2>&1
  say "extra: rc $?"; tail -25 "$OUT/extra.txt" | tee -a "$R"
fi
if [ -n "${STAGES_AFTER-decode}" ] && [ "$(left)" -gt 150 ]; then
  OUT=$OUT/after STAGES="${STAGES_AFTER-decode}" BUDGET_S=$(( $(left) - 40 )) bash bench/gpu.sh \
    >"$OUT/after-stdout.txt" 2>&1
  say "after (${STAGES_AFTER-decode}): rc $?"
  tail -30 "$OUT/after-stdout.txt" | tee -a "$R"
fi
[ "$workers" -gt 0 ] && bench/fuzz_bg.sh report 2>&1 | tee -a "$R"
for a in build-fuzz*/artifacts; do cp -r "$a" "$OUT/fuzz-artifacts" 2>/dev/null; done
# each finding also as base64 in round.txt: files past the call's count limit do not come back
for f in build-fuzz*/artifacts/crash-* build-fuzz*/artifacts/timeout-*; do
  [ -f "$f" ] && say "finding $(basename "$f") base64 $(base64 -w0 "$f")"
done
say "total $(( $(date +%s) - T0 ))s"
