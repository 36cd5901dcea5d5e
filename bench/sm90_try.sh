#!/usr/bin/env bash
# bench/sm90_try.sh — one device call that tries the Hopper forward's consumer schedules
# against each other (issue 7): build (gpu.sh's build stage), then for each schedule in
# SCHEDULES the forward test sweep on the GPU with the sm90 kernel enabled (verbose, so the log
# names the kernel of every case) and the forward bench sweep; the peers (SDPA cuDNN and
# flash) once; one table per schedule against the same peer rows.
#
#   run(command="COMMIT=<sha> bash bench/sm90_try.sh", carry=[".deps"], timeout_s=600)
#
# Environment: SCHEDULES (default "plain overlap pingpong"), SWEEP_ARGS (both sides, default
# the whole forward sweep), TEST=0 skips the tests, PEERS=0 the peers. Files back (at most 8):
# summary.txt tests.log bench.log peers.json ours.json table_<schedule>.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-gpu}
SCHEDULES=${SCHEDULES:-plain overlap pingpong}
SWEEP_ARGS=${SWEEP_ARGS:-}
COMMIT=${COMMIT:-unknown}
mkdir -p "$OUT"
S=$OUT/summary.txt
export PYTHONUNBUFFERED=1

STAGES=build COMMIT=$COMMIT OUT=/tmp/fa-build bash bench/gpu.sh >/tmp/fa-build.log 2>&1 ||
  { tail -n 60 /tmp/fa-build.log; cp /tmp/fa-build.log "$OUT/bench.log"; exit 1; }
# gpu.sh unpacked cmocka/cJSON under /tmp/deps; the test binaries need them at run time
LIBDIR=$(dirname "$(find /tmp/deps -name 'libcmocka.so*' | head -n 1)")
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
grep -E "^(date|nvcc|commit)|NVIDIA" /tmp/fa-build.log | head -n 5 | tee "$S"

export FLASHATTN_CUDA_SM90=1
for s in $SCHEDULES; do
  if [ "${TEST:-1}" = 1 ]; then
    echo "=== test_fwd cuda, schedule $s" >>"$OUT/tests.log"
    FLASHATTN_SM90_SCHEDULE=$s FLASHATTN_TEST_VERBOSE=1 timeout -k 5 150 \
      "$BUILD/tests/test_fwd" cuda >/tmp/t.log 2>&1
    rc=$?
    cat /tmp/t.log >>"$OUT/tests.log"
    echo "test_fwd $s: exit $rc; $(grep -c 'PASSED\|  OK ' /tmp/t.log) ok lines," \
      "$(grep -c 'sm90_fwd' /tmp/t.log) lines name sm90_fwd, $(grep -c 'FAILED' /tmp/t.log) FAILED lines" | tee -a "$S"
  fi
  echo "=== bench $s" >>"$OUT/bench.log"
  # shellcheck disable=SC2086
  FLASHATTN_SM90_SCHEDULE=$s timeout -k 5 200 "$BUILD/tools/flashattn" bench --backend cuda --sweep \
    --op fwd $SWEEP_ARGS --json "/tmp/ours_$s.json" >>"$OUT/bench.log" 2>&1
  echo "bench $s: exit $?" | tee -a "$S"
done
unset FLASHATTN_CUDA_SM90
if [ "${PEERS:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout -k 5 200 python3 bench/peers.py --op fwd $SWEEP_ARGS --json "$OUT/peers.json" >>"$OUT/bench.log" 2>&1
  echo "peers: exit $?" | tee -a "$S"
fi
python3 - "$OUT/ours.json" /tmp/ours_*.json <<'PY'
import json, os, sys
doc = {}
for p in sys.argv[2:]:
    try:
        doc[os.path.basename(p)[5:-5]] = json.load(open(p))
    except (OSError, ValueError) as e:
        print("ours.json: %s left out: %s" % (p, e))
json.dump(doc, open(sys.argv[1], "w"))
PY
for s in $SCHEDULES; do
  [ -f "/tmp/ours_$s.json" ] && [ -f "$OUT/peers.json" ] || continue
  python3 bench/table.py "/tmp/ours_$s.json" "$OUT/peers.json" --commit "$COMMIT" \
    --command "FLASHATTN_CUDA_SM90=1 FLASHATTN_SM90_SCHEDULE=$s flashattn bench --backend cuda --sweep --op fwd $SWEEP_ARGS" \
    --command "python3 bench/peers.py --op fwd $SWEEP_ARGS" --out "$OUT/table_$s.md" >/dev/null 2>>"$OUT/bench.log"
  echo; echo "### schedule $s"; cat "$OUT/table_$s.md"
done
