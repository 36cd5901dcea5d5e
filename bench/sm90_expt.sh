#!/usr/bin/env bash
# bench/sm90_expt.sh — times the Hopper forward built with FA_SM90_EXPT values (fwd_sm90.cuh:
# 1 V not loaded, 2 neither K nor V, 3 no softmax, 4 no S = Q K^T, 5 no O += P V: wrong
# results, the times say what each part costs; 6, 8, 9 switched variants with right results),
# sampling the SM clock and the power meanwhile.
#
# Experiment 0 is gpu.sh's build ($BUILD, build-gpu: the sources as they are). Every other
# value gets a fresh copy of the tree in /tmp/expt-<n> with the macro's default changed, all
# built at once (the library and the command only). Then ROUNDS rounds each time every
# experiment in the order given, so that the clock's drift falls on all of them alike.
#
#   run(command="EXPTS='0 9' ROUNDS=2 SWEEP_ARGS='--head-dim 64 --seqlens 512,2048 \
#                --masks causal' bash bench/sm90_expt.sh", carry=[".deps"])
#
# EXPT_STAGES (default "build bench"): "build" alone starts nothing else, so the copies can
# compile in the background while the same call runs the tests on build-gpu, e.g.
#   STAGES=build bash bench/gpu.sh      # also unpacks the deps the copies' builds need
#   EXPTS=9 EXPT_STAGES=build bash bench/sm90_expt.sh & STAGES=test bash bench/gpu.sh; wait
#   EXPTS='0 9' EXPT_STAGES=bench bash bench/sm90_expt.sh
# Without 0 among EXPTS the bench stage builds nothing (an unused number, e.g. 62, is then the
# copy of the sources as they are). PEERS (e.g. "cudnn") adds a bench/peers.py run of those
# implementations to every round, after the experiments, on the same SWEEP_ARGS.
# Files back: expt.txt (per experiment and round the bench's rows: d, seqlen, mask, TFLOP/s,
# kernel; then the clock and power under load).
#
# Two more stages look inside the builds (where a variant's time goes, not how long it takes):
#   trace  each experiment (0 included) built once more with its timeline (-DFA_SM90_TRACE, in
#          /tmp/expt-<n>-trace; the build stage makes these copies when "trace" is among the
#          stages) and run on SHAPES as bench/trace_sm90.sh does: trace.txt
#   sass   the SASS of the kernels whose names match SASS_KERNEL (grep -E on the mangled name,
#          default the d 128 short bf16 one): per experiment the opcode counts (sass.txt) and
#          the whole listing (sass-<n>.txt.gz)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
EXPTS=${EXPTS:-0 3 4 5}
STAGES_E=${EXPT_STAGES:-build bench}
mkdir -p "$OUT"
ROOT=$PWD
# build-gpu as it is and the deps on the paths (gpu.sh's work folder is its: not while
# another gpu.sh runs, hence not in the build stage, which needs only the unpacked deps)
if [[ " $STAGES_E " == *" bench "* && " $EXPTS " == *" 0 "* ]]; then
  . bench/device_build.sh
else
  LIBDIR=$(dirname "$(find /tmp/deps -name 'libcmocka.so*' | head -n 1)")
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
expt_dir() { echo "/tmp/expt-$1"; }
tool() { if [ "$1" = 0 ]; then echo "$ROOT/${BUILD:-build-gpu}/tools/flashattn"; else echo "$(expt_dir "$1")/build/tools/flashattn"; fi; }

if [[ " $STAGES_E " == *" build "* ]]; then
  export CMAKE_PREFIX_PATH="/tmp/deps/usr" CMAKE_LIBRARY_PATH="$LIBDIR" CMAKE_INCLUDE_PATH="/tmp/deps/usr/include"
  n=0
  for e in $EXPTS; do [ "$e" = 0 ] || n=$((n + 1)); done
  traced=""
  [[ " $STAGES_E " == *" trace "* ]] && traced="$EXPTS"
  for e in $traced; do n=$((n + 1)); done
  jobs_each=$(($(nproc) / (n > 0 ? n : 1)))
  [ "$jobs_each" -lt 1 ] && jobs_each=1
  pids=()
  # copy E DIR [CUDA flags]: the tree with FA_SM90_EXPT E, built in DIR
  copy() {
    local e=$1 d=$2 flags=${3:-}
    rm -rf "$d" && mkdir -p "$d"
    # a plain copy: new mtimes, so nothing of an earlier call's build is taken for current
    tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$d"
    sed -i "s/^#define FA_SM90_EXPT [0-9]*$/#define FA_SM90_EXPT $e/" "$d/src/cuda/fwd_sm90.cuh"
    (cd "$d" && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_WITH_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" -DFLASHATTN_BUILD_TESTS=OFF \
       ${flags:+"-DCMAKE_CUDA_FLAGS=$flags"} >"$d/build.log" 2>&1 &&
       cmake --build build -j "$jobs_each" >>"$d/build.log" 2>&1) &
    pids+=($!)
  }
  for e in $EXPTS; do [ "$e" = 0 ] || copy "$e" "$(expt_dir "$e")"; done
  for e in $traced; do copy "$e" "$(expt_dir "$e")-trace" -DFA_SM90_TRACE; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  for e in $EXPTS; do
    [ "$e" = 0 ] || [ -x "$(tool "$e")" ] ||
      { echo "experiment $e: build failed"; tail -n 30 "$(expt_dir "$e")/build.log"; exit 1; }
  done
  for e in $traced; do
    [ -x "$(expt_dir "$e")-trace/build/tools/flashattn" ] ||
      { echo "experiment $e, traced: build failed"; tail -n 30 "$(expt_dir "$e")-trace/build.log"; exit 1; }
  done
fi

if [[ " $STAGES_E " == *" trace "* ]]; then
  for e in $EXPTS; do
    for s in ${SHAPES:-128:2048:none}; do
      IFS=: read -r d n mask <<<"$s"
      echo "=== FA_SM90_EXPT=$e d $d seqlen $n mask $mask" >>"$OUT/trace.txt"
      # a timeout: a variant that hangs ends here and still leaves the later stages their time
      FLASHATTN_SM90_TRACE_FILE=/tmp/trace.bin timeout 60 "$(expt_dir "$e")-trace/build/tools/flashattn" bench \
        --backend cuda --sweep --head-dim "$d" --seqlens "$n" --masks "$mask" --op fwd \
        --reps 5 --max-time 1 2>&1 | tail -n 1 >>"$OUT/trace.txt"
      python3 bench/trace_sm90.py /tmp/trace.bin >>"$OUT/trace.txt" 2>&1
      rm -f /tmp/trace.bin
    done
  done
fi

if [[ " $STAGES_E " == *" sass "* ]]; then
  pat=${SASS_KERNEL:-bfloat16NS0_3CfgILi128ELi128ELi2ELi3ELi2ELi40EEELi0E}
  for e in $EXPTS; do
    b=$(dirname "$(dirname "$(tool "$e")")")
    obj=$(find "$b" -name 'fwd_sm90.cu.o' | head -n 1)
    for k in $(cuobjdump -elf "$obj" 2>/dev/null | grep -oE '_ZN2fa4sm9015fwd_sm90_kernel[A-Za-z0-9_]+ArgsE\b' | sort -u | grep -E "$pat"); do
      cuobjdump -sass -fun "$k" "$obj" >"/tmp/sass-$e.txt" 2>&1
      echo "=== FA_SM90_EXPT=$e $k" >>"$OUT/sass.txt"
      grep -oE '^ +/\*[0-9a-f]{4,}\*/ +(@!?U?P[0-9T] +)?[A-Z0-9_.]+' "/tmp/sass-$e.txt" |
        awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -n 40 >>"$OUT/sass.txt"
      gzip -c "/tmp/sass-$e.txt" >"$OUT/sass-$e.txt.gz"
    done
  done
fi

if [[ " $STAGES_E " == *" bench "* ]]; then
  for r in $(seq 1 "${ROUNDS:-1}"); do
    for e in $EXPTS; do
      echo "=== FA_SM90_EXPT=$e round $r" | tee -a "$OUT/expt.txt"
      # the SM clock and board power while it runs: a part left out may run faster only
      # because the rest then draws less power and the clock stays up
      nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 >/tmp/clk.csv &
      smi=$!
      # shellcheck disable=SC2086
      timeout 300 "$(tool "$e")" bench --backend cuda --sweep --op fwd ${SWEEP_ARGS:-} 2>&1 |
        awk '/^fwd/ {print $5, $7, $8, $15, $17}' | tee -a "$OUT/expt.txt"
      [ "${PIPESTATUS[0]}" = 124 ] && echo "experiment $e: the bench timed out" | tee -a "$OUT/expt.txt"
      kill $smi
      python3 - /tmp/clk.csv <<'PY' | tee -a "$OUT/expt.txt"
import statistics, sys
rows = [tuple(float(x) for x in l.split(",")) for l in open(sys.argv[1]) if l.count(",") == 1]
busy = [r for r in rows if r[1] > 300]  # samples under load
if busy:
    print("under load (>300 W, %d samples): SM clock median %.0f MHz, power median %.0f W"
          % (len(busy), statistics.median(r[0] for r in busy), statistics.median(r[1] for r in busy)))
PY
    done
    if [ -n "${PEERS:-}" ]; then
      echo "=== peers $PEERS round $r" | tee -a "$OUT/expt.txt"
      # shellcheck disable=SC2086
      timeout 300 python3 bench/peers.py --ops fwd --impls "$PEERS" ${SWEEP_ARGS:-} 2>&1 | tee -a "$OUT/expt.txt"
    fi
  done
fi
