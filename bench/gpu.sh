#!/usr/bin/env bash
# bench/gpu.sh — everything the lent GPU machine is for, in one call: build with the CUDA
# backend, run the whole test suite, optionally compute-sanitizer, then time our kernels and
# PyTorch's (FlashAttention-2, cuDNN) on the same sweep and print the joined table last; the
# decode stage does the same for inference decoding (fa_fwd_kvcache against PyTorch SDPA); the
# door stage times what a PyTorch user pays per call through our Python package against SDPA.
#
# The machine is bare and cannot install packages: cmocka and cJSON come as .deb files that
# bench/fetch_deps.sh downloaded into .deps/ on the development machine (ignored by git, so
# the call must carry it). Run from the repository root, e.g. with the device tool:
#   run(command="COMMIT=<sha> bash bench/gpu.sh", carry=[".deps"], timeout_s=600)
#
# Environment:
#   STAGES      stages to run; they always run in this order (default "build test bench"):
#                 build     configure (-DFLASHATTN_WITH_CUDA=ON, CUDA_ARCHS) and compile
#                 test      scripts/run_tests.sh build-gpu (every ctest entry, GPU ones too)
#                 sanitize  compute-sanitizer memcheck, then racecheck, on test_fwd/test_bwd/
#                           test_kvcache cuda
#                 bench     flashattn bench --backend cuda --sweep, bench/peers.py, bench/table.py
#                 decode    flashattn bench --decode, bench/peers_decode.py,
#                           bench/table_decode.py (not in the default: STAGES="build decode")
#                 door      bench/torch_door.py against our Python package (installed after
#                           the build for the test and door stages: install_package): host,
#                           loop, CUDA-graph and kernel µs per call of flash_attn_func /
#                           flash_attn_with_kvcache against SDPA cuDNN and flash (door.md,
#                           door.json; about 90 s; not in the default: STAGES="build door")
#   CTEST_ARGS  extra ctest options for the test stage (e.g. "-L gpu|python": the GPU entries
#               and the Python tests only, when the CPU levels ran elsewhere)
#   TEST_TIMEOUT  the test stage's limit in seconds (default 300)
#   SANITIZE_TESTS  the tests the sanitize stage runs (default "test_fwd test_bwd test_kvcache")
#   SANITIZE=1  adds "sanitize" to the default stages (it is slow, and squeezed by the time kept
#               for the bench: for a full sanitizer pass use STAGES="build sanitize")
#   COMMIT      the commit measured, for the table header (default: git describe if .git exists)
#   BUDGET_S    seconds the whole script may take (default 540, under the 600 s call limit);
#               every stage runs under a timeout that leaves time for the bench
#   CUDA_ARCHS  CMAKE_CUDA_ARCHITECTURES (default 90a: the H100)
#   CMAKE_ARGS  extra configure options (e.g. -DFLASHATTN_WITH_CUDA=OFF to try this script
#               on a machine without a GPU); BUILD the build directory (default build-gpu)
#   ROUNDS      rounds of (our sweep, the peers' sweep) in the bench stage (default 2); the
#               table keeps each implementation's best round per row
#   SWEEP_ARGS  options for both `flashattn bench --sweep` and bench/peers.py, which share
#               their names (e.g. "--head-dim 128 --seqlens 2048,8192 --masks none"; the
#               GQA sweep of issue 37: "--heads 32 --heads-kv 8 --head-dim 128"; its packed
#               batch: "--head-dim 128 --masks causal --varlen $(python3 bench/varlen_lengths.py)")
#   BENCH_ARGS  extra options for `flashattn bench` only (after --sweep, so they override it)
#   PEERS_ARGS  extra options for bench/peers.py only (e.g. "--impls cudnn")
#   PAUSE       seconds the GPU idles before each row, on both sides (default 0.25): our
#               sweep ran its rows back to back while peers.py fills new inputs between
#               rows, so their rows started from a less throttled clock (per-row minimum
#               12% above the median for cuDNN, 4% for ours; docs/perf/fwd_sm90.md, 2026-11-27)
#   DECODE_ROUNDS      rounds of (our decode sweep, the peers') (default 2), best round kept
#   DECODE_ARGS        options for both `flashattn bench --decode` and bench/peers_decode.py,
#                      which share their names (e.g. "--batches 1 --cache-lens 8192,32768")
#   DECODE_BENCH_ARGS  for `flashattn bench --decode` only (e.g. "--paged --checks off")
#   DECODE_PEERS_ARGS  for bench/peers_decode.py only (e.g. "--impls cudnn")
#   DOOR_ARGS   extra options for bench/torch_door.py (e.g. "--binding ctypes", "--rows small")
#   OUT         where results go (set by the device tool; default /tmp/fa-out); at most 8
#               files come back, chosen in this order among those that exist: summary.txt
#               table.md decode.md door.md ours.json peers.json decode.json door.json
#               sanitize.log test.log bench.log build.log (the decode and door stages log into
#               bench.log; decode.json holds both sides). STAGES="build test bench decode" or
#               more make more than 8: the last of that list stay behind, and summary.txt
#               names them. table.md, decode.md, door.md and sanitize.log become the current
#               tables of this card under bench/results/ through bench/record.py (bench/README.md,
#               "Results"): summary.txt ends with the record.py line for each.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
OUT=${OUT:-/tmp/fa-out}
BUDGET_S=${BUDGET_S:-540}
CUDA_ARCHS=${CUDA_ARCHS:-90a}
PAUSE=${PAUSE:-0.25}
BUILD=${BUILD:-build-gpu}
WORK=/tmp/fa-gpu
DEPS=/tmp/deps
if [ -z "${STAGES:-}" ]; then
  STAGES="build test bench"
  [ "${SANITIZE:-0}" = 1 ] && STAGES="build test sanitize bench"
fi
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/*
export PYTHONUNBUFFERED=1
SUMMARY=$WORK/summary.txt
FAILED=0

has_stage() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET_S - $(elapsed))); }
# Results are copied out after every stage, so a call cut off at its limit still returns
# what was done; .tmp files of an interrupted JSON write stay behind. The device returns at
# most 8 files: the first 8 of this list that exist.
RESULT_FILES="summary.txt table.md decode.md door.md ours.json peers.json decode.json door.json sanitize.log test.log bench.log build.log"
HELD_BACK=""
publish() {
  local n=0 f
  HELD_BACK=""
  for f in $RESULT_FILES; do
    [ -f "$WORK/$f" ] || continue
    if [ $n -lt 8 ]; then
      cp "$WORK/$f" "$OUT/$f"
      n=$((n + 1))
    else
      rm -f "$OUT/$f"
      HELD_BACK="$HELD_BACK $f"
    fi
  done
  return 0
}
note() { echo "$*" | tee -a "$SUMMARY"; }

# install_package: our Python package against the library built in $BUILD (for the test and
# door stages); bench/install_package.sh says how. It reports through note().
# shellcheck source=bench/install_package.sh
. bench/install_package.sh

# run_stage NAME CAP RESERVE MIN CMD...: runs CMD with its output in $WORK/NAME.log (or
# $STAGE_LOG) under a timeout of CAP seconds, less if the budget minus RESERVE (kept for later
# stages) is smaller; skipped when fewer than MIN seconds would be left.
run_stage() {
  local name=$1 cap=$2 reserve=$3 min=$4 log=${STAGE_LOG:-$WORK/$1.log}
  shift 4
  local limit=$(($(left) - reserve))
  [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt "$min" ]; then
    note "$(printf '%-9s SKIPPED: %ss left of the %ss budget' "$name" "$(left)" "$BUDGET_S")"
    FAILED=1
    return 1
  fi
  echo "=== $name (timeout ${limit}s, $(elapsed)s elapsed) ==="
  local t rc
  t=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t)) what=ok
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && what="TIMEOUT after ${limit}s"
  [ $rc -ne 0 ] && [ "$what" = ok ] && what="FAILED (exit $rc)"
  note "$(printf '%-9s %-24s %4ss' "$name" "$what" "$dt")"
  if [ $rc -ne 0 ]; then
    FAILED=1
    echo "--- last lines of $log ---"
    tail -n 40 "$log"
  fi
  publish
  return $rc
}

# ---- the machine ----
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "stages: $STAGES; budget ${BUDGET_S}s; CUDA archs $CUDA_ARCHS"
} | tee "$SUMMARY"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
nvidia-smi 2>&1 | head -n 20
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee -a "$SUMMARY"
{
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1); cc: $(cc --version 2>/dev/null | head -n 1)"
  echo "python: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())' 2>&1 | tail -n 1)"
  echo "cpus: $(nproc)"
} | tee -a "$SUMMARY"

# ---- cmocka and cJSON, unpacked outside / ----
mkdir -p "$DEPS"
ndeb=0
for f in .deps/*.deb; do
  [ -f "$f" ] || continue
  ndeb=$((ndeb + 1))
  if command -v dpkg >/dev/null; then
    dpkg -x "$f" "$DEPS"
  else # no dpkg: a .deb is an ar archive holding data.tar.*
    (d=$(mktemp -d) && cd "$d" && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$DEPS" && rm -rf "$d")
  fi
done
LIBDIR=$(dirname "$(find "$DEPS" -name 'libcmocka.so*' 2>/dev/null | head -n 1)" 2>/dev/null)
if [ "$ndeb" -gt 0 ] && [ -n "$LIBDIR" ]; then
  export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  # find_library looks under lib/<multiarch> only where the compiler reports one: name the
  # directories too, in case this machine's distribution is not Debian-like.
  export CMAKE_LIBRARY_PATH="$LIBDIR${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}"
  export CMAKE_INCLUDE_PATH="$DEPS/usr/include${CMAKE_INCLUDE_PATH:+:$CMAKE_INCLUDE_PATH}"
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "deps: $ndeb packages unpacked into $DEPS (libraries in $LIBDIR)"
else
  note "deps: no .deps/*.deb (run bench/fetch_deps.sh here and carry .deps); relying on the system"
fi

COMMIT=${COMMIT:-$(git describe --always --dirty 2>/dev/null || echo "unknown (pass COMMIT=<sha>)")}
note "commit: $COMMIT"

# ---- stages ----
# seconds kept for the stages after the current one
DECODE_ROUNDS=${DECODE_ROUNDS:-2}
door_reserve=0
has_stage door && door_reserve=150
decode_reserve=$door_reserve
has_stage decode && decode_reserve=$((20 + DECODE_ROUNDS * 120 + door_reserve))
bench_reserve=$decode_reserve
has_stage bench && bench_reserve=$((240 + decode_reserve))

if has_stage build; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # An existing build dir made with another generator cannot be reused.
  if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD"
  fi
  # FLASHATTN_VENV: the python3 environment (torch's) for CTest's python entry
  pyenv=$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null)
  run_stage build 360 0 60 bash -c "
    set -e
    cmake -S . -B $BUILD ${gen[*]} -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES='$CUDA_ARCHS' ${pyenv:+-DFLASHATTN_VENV=$pyenv} ${CMAKE_ARGS:-}
    cmake --build $BUILD -j $(nproc)
    $BUILD/tools/flashattn info"
  grep -E "warning|error" "$WORK/build.log" | grep -v "^--" | head -n 20
fi

# the package, installed once against this build, for the python tests and the door stage
if has_stage test || has_stage door; then
  echo "=== install_package ($(elapsed)s elapsed) ==="
  install_package >>"$WORK/build.log" 2>&1 # in this shell: the fallback exports its variables
  tail -n 1 "$SUMMARY"
fi

if has_stage test; then
  run_stage test "${TEST_TIMEOUT:-300}" "$bench_reserve" 30 scripts/run_tests.sh "$BUILD" gpu
  grep -E "passed, .* failed|Failed|\*\*\*" "$WORK/test.log" | tail -n 15
fi

if has_stage sanitize; then
  cs=compute-sanitizer
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    command -v compute-sanitizer >/dev/null || [ ! -x "$c" ] || cs=$c
  done
  # Each tool/test pair gets a sixth of the stage; a timeout there means "incomplete".
  share=$(( ($(left) - bench_reserve) / 6 ))
  [ "$share" -gt 150 ] && share=150
  run_stage sanitize $((6 * share + 20)) "$bench_reserve" 60 bash -c "
    rc=0
    for tool in memcheck racecheck; do
      for t in ${SANITIZE_TESTS:-test_fwd test_bwd test_kvcache}; do
        echo \"--- compute-sanitizer --tool \$tool $BUILD/tests/\$t cuda (timeout ${share}s)\"
        timeout -k 5 $share '$cs' --tool \$tool --error-exitcode 99 $BUILD/tests/\$t cuda
        r=\$?
        echo \"--- \$tool \$t: exit \$r\$([ \$r = 124 ] && echo ' (timeout: incomplete)')\"
        [ \$r = 0 ] || rc=1
      done
    done
    exit \$rc"
  grep -E "^--- .*exit|ERROR SUMMARY|RACECHECK SUMMARY" "$WORK/sanitize.log"
fi

if has_stage bench; then
  TOOL_CMD="$BUILD/tools/flashattn bench --backend cuda --sweep --pause $PAUSE ${SWEEP_ARGS:-} ${BENCH_ARGS:-}"
  PEERS_CMD="python3 bench/peers.py --pause $PAUSE ${SWEEP_ARGS:-} ${PEERS_ARGS:-}"
  # Rounds of our sweep then the peers' (ROUNDS, default 2): this GPU's speed drifts over a
  # call (clocks, neighbours), so the table takes each implementation's best round per row,
  # the same rule for all three. The commands are split into words on purpose (BENCH_ARGS /
  # PEERS_ARGS hold several options).
  ROUNDS=${ROUNDS:-2}
  for r in $(seq 1 "$ROUNDS"); do
    rest=$((ROUNDS - r))
    # shellcheck disable=SC2086
    STAGE_LOG=$WORK/bench.log run_stage "bench$r" 150 $((15 + rest * 150 + decode_reserve)) 40 $TOOL_CMD --json "$WORK/ours_$r.json"
    # shellcheck disable=SC2086
    STAGE_LOG=$WORK/bench.log run_stage "peers$r" 150 $((15 + rest * 150 + decode_reserve)) 40 $PEERS_CMD --json "$WORK/peers_$r.json"
  done
  # one file per side (the device returns at most 8 files): a JSON list of the rounds
  for side in ours peers; do
    python3 -c 'import json, sys; json.dump([json.load(open(f)) for f in sys.argv[2:]], open(sys.argv[1], "w"))' \
      "$WORK/$side.json" "$WORK/${side}"_[0-9]*.json 2>>"$WORK/bench.log"
  done
  python3 bench/table.py "$WORK/ours.json" "$WORK/peers.json" --commit "$COMMIT" \
    --command "STAGES='$STAGES' CUDA_ARCHS=$CUDA_ARCHS bash bench/gpu.sh" \
    --command "$TOOL_CMD --json ours.json" --command "$PEERS_CMD --json peers.json" \
    --out "$WORK/table.md" >/dev/null 2>>"$WORK/bench.log" || FAILED=1
fi

if has_stage decode; then
  DEC_TOOL_CMD="$BUILD/tools/flashattn bench --backend cuda --decode ${DECODE_ARGS:-} ${DECODE_BENCH_ARGS:-}"
  DEC_PEERS_CMD="python3 bench/peers_decode.py ${DECODE_ARGS:-} ${DECODE_PEERS_ARGS:-}"
  # Alternating rounds, each side's fastest round per row kept (as in the bench stage).
  for r in $(seq 1 "$DECODE_ROUNDS"); do
    rest=$((DECODE_ROUNDS - r))
    # shellcheck disable=SC2086
    STAGE_LOG=$WORK/bench.log run_stage "decode$r" 120 $((10 + rest * 120 + door_reserve)) 30 $DEC_TOOL_CMD --json "$WORK/decode_ours_$r.json"
    # shellcheck disable=SC2086
    STAGE_LOG=$WORK/bench.log run_stage "dpeers$r" 120 $((10 + rest * 120 + door_reserve)) 30 $DEC_PEERS_CMD --json "$WORK/decode_peers_$r.json"
  done
  # both sides in one file: {"ours": [rounds], "peers": [rounds]}
  python3 - "$WORK" "$DECODE_ROUNDS" >>"$WORK/bench.log" 2>&1 <<'PY'
import json, os, sys
work, rounds = sys.argv[1], int(sys.argv[2])
doc = {}
for side in ("ours", "peers"):
    doc[side] = []
    for r in range(1, rounds + 1):
        path = os.path.join(work, "decode_%s_%d.json" % (side, r))
        try:
            with open(path) as f:
                doc[side].append(json.load(f))
        except (OSError, ValueError) as e:
            print("decode.json: %s left out: %s" % (path, e))
with open(os.path.join(work, "decode.json"), "w") as f:
    json.dump(doc, f)
PY
  gpu_cmd="STAGES='$STAGES' CUDA_ARCHS=$CUDA_ARCHS DECODE_ROUNDS=$DECODE_ROUNDS"
  for v in DECODE_ARGS DECODE_BENCH_ARGS DECODE_PEERS_ARGS; do
    [ -n "${!v:-}" ] && gpu_cmd="$gpu_cmd $v='${!v}'"
  done
  python3 bench/table_decode.py "$WORK/decode.json" --commit "$COMMIT" \
    --command "$gpu_cmd bash bench/gpu.sh" \
    --command "$DEC_TOOL_CMD --json decode_ours_<round>.json" \
    --command "$DEC_PEERS_CMD --json decode_peers_<round>.json" \
    --out "$WORK/decode.md" >/dev/null 2>>"$WORK/bench.log" || FAILED=1
  publish
fi

if has_stage door; then
  # shellcheck disable=SC2086
  STAGE_LOG=$WORK/bench.log run_stage door 150 0 40 python3 bench/torch_door.py \
    --tool "$BUILD/tools/flashattn" --commit "$COMMIT" --out "$WORK" ${DOOR_ARGS:-}
  publish
fi

# The record.py line that files each table as the current one of this card and workload
# (bench/README.md, "Results"), so that the names under bench/results/ are not retyped by hand.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -o -m 1 'H[0-9]00' | tr H h)
sweep=fwd-bwd
case " ${SWEEP_ARGS:-} ${BENCH_ARGS:-} " in *" --op fwd "*) sweep=fwd ;; esac
for pair in "table.md $sweep" "decode.md decode" "door.md door" "sanitize.log sanitize"; do
  read -r file workload <<<"$pair"
  [ -f "$WORK/$file" ] && note "to file: python3 bench/record.py ${card:-<card>} $workload $file --commit $COMMIT"
done
note "total $(elapsed)s"
publish
[ -n "$HELD_BACK" ] && note "held back by the 8-file limit:$HELD_BACK" && publish
echo
echo "=== summary ==="
cat "$SUMMARY"
for t in table.md decode.md door.md; do
  if [ -f "$WORK/$t" ]; then
    echo
    cat "$WORK/$t"
  fi
done
exit $FAILED
