#!/usr/bin/env bash
# bench/probes/cp_exit.sh — one call on nvidia-h200-x2: where the NCCL ranks' SIGSEGV at exit
# comes from (issue 40). Builds and installs the package (bench/cp_gpu.sh's stages), compiles
# bench/probes/segv_trace.c, then runs bench/probes/cp_exit.py under torchrun in each mode, with
# the tracer preloaded and faulthandler on, and finally test_distributed.py's NCCL runs
# (TEST_ARGS, default "-k nccl") the same way. Each mode's log is $OUT/exit-<mode>.log; the
# summary keeps every mode's exit code, its last phase line and the tracer's frames.
#   run(command="COMMIT=<sha> bash bench/probes/cp_exit.sh", carry=[".deps"], kind="nvidia-h200-x2")
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/fa-cp-exit}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
S=$OUT/exit-summary.txt
: >"$S"
note() { echo "$*" | tee -a "$S"; }
T0=$(date +%s)

OUT=$OUT/cp STAGES="build" BUDGET_S=${BUILD_BUDGET_S:-330} BUILD=$BUILD bash bench/cp_gpu.sh \
  >"$OUT/build.txt" 2>&1
note "build: rc $? after $(($(date +%s) - T0))s"
# shellcheck source=bench/install_package.sh
. bench/install_package.sh
install_package >>"$OUT/build.txt" 2>&1
"$PYTHON" -c 'import flashattn, torch; print("flashattn", flashattn.__version__, flashattn.has_cuda(), "torch", torch.__version__, "NCCL", torch.cuda.nccl.version())' 2>&1 | tail -n 1 | tee -a "$S"
cc -shared -fPIC -O1 -g -o "$OUT/segv_trace.so" bench/probes/segv_trace.c || note "segv_trace: build failed"
trace=$OUT/segv_trace.so

# the part of a log worth reading: phase lines, the first Python fatal-error block, the frames
digest() {
  grep -E "^\[rank|Fatal Python|Segmentation|segv_trace|File \"|^/|^\S+\.so|Thread 0x|Current thread|exitcode|SIGSEGV|Signal" "$1" |
    grep -Ev "^\[rank.*\] (imported|all_reduce)" | awk '!seen[$0]++' | head -n "${2:-60}"
}

for m in nccl import fwd bwd ring "ring --no-destroy"; do
  log=$OUT/exit-${m// /}.log
  t=$(date +%s)
  # shellcheck disable=SC2086
  LD_PRELOAD=$trace timeout -k 5 90 "$PYTHON" -X faulthandler -m torch.distributed.run \
    --standalone --nproc-per-node 2 bench/probes/cp_exit.py --mode $m >"$log" 2>&1
  rc=$?
  note "=== mode $m: rc $rc in $(($(date +%s) - t))s"
  digest "$log" 40 | tee -a "$S"
done

t=$(date +%s)
(cd python/tests && LD_PRELOAD=$trace timeout -k 5 ${TEST_S:-150} "$PYTHON" -X faulthandler -m pytest \
  -p no:cacheprovider -q -s -x ${TEST_ARGS:--k nccl} test_distributed.py) >"$OUT/test.log" 2>&1
note "=== test_distributed ${TEST_ARGS:--k nccl}: rc $? in $(($(date +%s) - t))s"
grep -E "passed|failed|error" "$OUT/test.log" | tail -n 1 | tee -a "$S"
digest "$OUT/test.log" 60 | tee -a "$S"
note "total $(($(date +%s) - T0))s"
