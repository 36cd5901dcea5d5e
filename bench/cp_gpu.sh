#!/usr/bin/env bash
# bench/cp_gpu.sh — issue 40's evidence from one call on a machine with 2 (or more) GPUs:
# builds our library with the CUDA backend (bench/gpu.sh's build stage: .deps carried, cmocka
# and cJSON unpacked from their .deb files), installs the Python package into $PYTHON
# (bench/install_package.sh), then runs python/tests/test_distributed.py (gloo on the CPU and
# NCCL with one GPU per rank) and bench/cp_bench.py under torchrun on NPROC GPUs (our ring,
# PyTorch's context_parallel, and the 1-GPU time of the whole sequence), 128k tokens by default.
# Run from the repository root, e.g. with the device tool on nvidia-h200-x2:
#   run(command="bash bench/cp_gpu.sh", carry=[".deps"], kind="nvidia-h200-x2", timeout_s=600)
#
# NVLink SHARP / multicast stays off (the device rules): NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 are exported here for every
# child, and set again by the test workers and cp_bench.py.
#
# Environment:
#   STAGES      default "build install test bench", run in that order
#   BUDGET_S    seconds the whole script may take (default 560, under the 600 s call limit);
#               each stage runs under a timeout that keeps time for the later ones
#   NPROC       ranks of the ring, one GPU each (default 2)
#   CP_ARGS     extra options for bench/cp_bench.py (e.g. "--reps 5", or on a machine without
#               GPUs "--device cpu --tokens 512 --heads 4 --heads-k 2 --head-dim 32")
#   TEST_ARGS   extra pytest options for test_distributed.py (e.g. "-k nccl")
#   PYTHON      the interpreter that holds torch (default python3)
#   BUILD, CUDA_ARCHS (default 90a), CMAKE_ARGS, COMMIT: as in bench/gpu.sh (the C tests are
#               not built: -DFLASHATTN_BUILD_TESTS=OFF comes before CMAKE_ARGS)
#   OUT         where results go (set by the device tool; default /tmp/fa-cp-out):
#               summary.txt (machine, topology, stage times, test counts, the table),
#               cp.md and cp.json (cp_bench.py's table and rows), test.log, bench.log,
#               build.log
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT=${OUT:-/tmp/fa-cp-out}
BUDGET_S=${BUDGET_S:-560}
BUILD=${BUILD:-build-gpu}
CUDA_ARCHS=${CUDA_ARCHS:-90a}
NPROC=${NPROC:-2}
PYTHON=${PYTHON:-python3}
export PYTHON
STAGES=${STAGES:-build install test bench}
WORK=/tmp/fa-cp
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILED=0

has_stage() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET_S - $(elapsed))); }
note() { echo "$*" | tee -a "$SUMMARY"; }

# run_stage NAME CAP RESERVE MIN LOG CMD...: CMD with its output appended to LOG, under a
# timeout of CAP seconds, less if the budget minus RESERVE (kept for the later stages) is
# smaller; skipped when that leaves fewer than MIN seconds. (bench/gpu.sh's rule.)
run_stage() {
  local name=$1 cap=$2 reserve=$3 min=$4 log=$5
  shift 5
  local limit=$(($(left) - reserve))
  [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt "$min" ]; then
    note "$(printf '%-8s SKIPPED: %ss left of the %ss budget' "$name" "$(left)" "$BUDGET_S")"
    FAILED=1
    return 1
  fi
  echo "=== $name (timeout ${limit}s, $(elapsed)s elapsed) ==="
  local t rc what=ok
  t=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && what="TIMEOUT after ${limit}s"
  [ $rc -ne 0 ] && [ "$what" = ok ] && what="FAILED (exit $rc)"
  note "$(printf '%-8s %-24s %4ss' "$name" "$what" "$(($(date +%s) - t))")"
  if [ $rc -ne 0 ]; then
    FAILED=1
    echo "--- last lines of $log ---"
    tail -n 30 "$log"
  fi
  return $rc
}

# ---- the machine ----
note "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); stages: $STAGES; budget ${BUDGET_S}s; $NPROC ranks"
note "commit: ${COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}"
note "env: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee -a "$SUMMARY"
echo "--- nvidia-smi topo -m" >>"$SUMMARY"
nvidia-smi topo -m 2>&1 | tee -a "$SUMMARY"
note "python: $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count(), "NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1 | tail -n 1)"

# ---- stages; seconds kept for the later ones ----
bench_reserve=0
has_stage bench && bench_reserve=150
test_reserve=$bench_reserve
has_stage test && test_reserve=$((bench_reserve + 60))
install_reserve=$test_reserve
has_stage install && install_reserve=$((test_reserve + 20))

if has_stage build; then
  # bench/gpu.sh's build stage (deps from .deps, configure, compile, `flashattn info`) under
  # the time this stage may take; its own log and summary are copied into build.log
  limit=$(($(left) - install_reserve))
  [ "$limit" -gt 400 ] && limit=400
  run_stage build 400 "$install_reserve" 60 "$WORK/build-stage.log" \
    env STAGES=build OUT="$WORK/gpu-sh" BUDGET_S=$((limit - 10)) BUILD="$BUILD" \
    CUDA_ARCHS="$CUDA_ARCHS" CMAKE_ARGS="-DFLASHATTN_BUILD_TESTS=OFF ${CMAKE_ARGS:-}" \
    bash bench/gpu.sh
  cat "$WORK/build-stage.log" "$WORK/gpu-sh/build.log" >"$OUT/build.log" 2>/dev/null
  grep -E "^deps:|^build " "$WORK/gpu-sh/summary.txt" 2>/dev/null | sed 's/^/  gpu.sh: /' | tee -a "$SUMMARY"
fi

if has_stage install; then
  # in this shell: the fallback exports FLASHATTN_LIBRARY and PYTHONPATH for what follows
  # shellcheck source=bench/install_package.sh
  . bench/install_package.sh
  echo "=== install ($(elapsed)s elapsed) ==="
  install_package >>"$OUT/build.log" 2>&1
  "$PYTHON" -c 'import flashattn; print("flashattn", flashattn.__file__, "library", flashattn.library_path(), "cuda", flashattn.has_cuda())' 2>&1 | tail -n 1 | tee -a "$SUMMARY"
fi

if has_stage test; then
  run_stage test 150 "$bench_reserve" 30 "$OUT/test.log" \
    bash -c "cd python/tests && exec \"\$PYTHON\" -m pytest -p no:cacheprovider -v -rs test_distributed.py ${TEST_ARGS:-}"
  # the counts, and every skip reason once (an NCCL run that skipped is missing evidence);
  # -v: a run cut off by its timeout still shows which tests passed (the NCCL runs come first)
  grep -E "passed|failed|error" "$OUT/test.log" | tail -n 1 | sed 's/^/  test: /' | tee -a "$SUMMARY"
  grep -E "^SKIPPED" "$OUT/test.log" | sed -E 's/^SKIPPED \[[0-9]+\] [^:]+:[0-9]+: //' | sort | uniq -c |
    sed 's/^/  skipped: /' | tee -a "$SUMMARY"
fi

if has_stage bench; then
  # shellcheck disable=SC2086
  run_stage bench 600 5 40 "$OUT/bench.log" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" bench/cp_bench.py \
    --json "$OUT/cp.json" --md "$OUT/cp.md" ${CP_ARGS:-}
  # the failures cp_bench.py reported (the table repeats them as "- error:" lines)
  grep -E "Error" "$OUT/bench.log" | grep -v "^- error" | head -n 8 | sed 's/^/  bench: /' |
    tee -a "$SUMMARY"
fi

note "total $(elapsed)s"
rm -f "$OUT"/*.tmp
if [ -f "$OUT/cp.md" ]; then
  echo >>"$SUMMARY"
  cat "$OUT/cp.md" >>"$SUMMARY"
fi
echo
echo "=== summary ==="
cat "$SUMMARY"
exit $FAILED
