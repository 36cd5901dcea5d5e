#!/usr/bin/env bash
# bench/sm90_try.sh — one device call that tries variants of a Hopper kernel against each other
# (OP=fwd, the default: the forward, issue 7; OP=bwd: the backward): build (gpu.sh's build
# stage); for each variant the op's test sweep on the GPU (the forward's once with the default
# grid and once with a persistent grid of 3 blocks, so that every block loops over tiles),
# verbose so that the log names the kernel of every case; then the op's bench sweep of each
# variant; the peers (SDPA cuDNN and flash) once; one table of all variants beside the peers
# (bench/variants.py). It builds a bring-up build (-DFLASHATTN_BRINGUP=ON, folder build-bringup),
# the only kind that reads the FLASHATTN_SM90_* switches (src/cuda/fwd_sm90_bringup.cuh).
#
#   run(command="COMMIT=<sha> bash bench/sm90_try.sh", carry=[".deps"], timeout_s=600)
#
# Environment: OP (fwd or bwd), VARIANTS, space-separated NAME=VAR=VALUE[,VAR=VALUE...] (the
# bring-up switches of fwd_sm90_bringup.cuh, FLASHATTN_CUDA_SM90_BWD=0 for the sm80 backward; default
# "default=FLASHATTN_SM90_SCHEDULE=overlap"), SWEEP_ARGS (both
# sides, default the whole forward sweep), ROUNDS (default 1: rounds of the variants' benches,
# in turn, so that the clock's drift falls on all alike; round r > 1 of NAME is column NAME.r),
# TEST=0 skips the tests, PEERS=0 the peers, EXTRA (a command run last, output in extra.log).
# Files back: summary.txt variants.md tests.log bench.log peers.json ours.json extra.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-bringup}
export BUILD CMAKE_ARGS="-DFLASHATTN_BRINGUP=ON ${CMAKE_ARGS:-}"
VARIANTS=${VARIANTS:-default=FLASHATTN_SM90_SCHEDULE=overlap}
SWEEP_ARGS=${SWEEP_ARGS:-}
COMMIT=${COMMIT:-unknown}
OP=${OP:-fwd}
GRIDS="persistent 3"
[ "$OP" = fwd ] || GRIDS=persistent
mkdir -p "$OUT"
S=$OUT/summary.txt
export PYTHONUNBUFFERED=1

. bench/device_build.sh
grep -E "^(date|nvcc|commit)|NVIDIA H" /tmp/fa-build.log | head -n 5 | tee "$S"

# run_variant SPEC CMD...: CMD with the variant's variables set
run_variant() {
  local spec=$1
  shift
  local envs
  IFS=, read -r -a envs <<<"${spec#*=}"
  env "${envs[@]}" "$@"
}
if [ "${TEST:-1}" = 1 ]; then
  for v in $VARIANTS; do
    for g in $GRIDS; do
      echo "=== test_$OP cuda, variant $v, grid $g" >>"$OUT/tests.log"
      FLASHATTN_SM90_GRID=$g FLASHATTN_TEST_VERBOSE=1 run_variant "$v" \
        timeout -k 5 150 "$BUILD/tests/test_$OP" cuda >/tmp/t.log 2>&1
      rc=$?
      cat /tmp/t.log >>"$OUT/tests.log"
      echo "test_$OP ${v%%=*} grid $g: exit $rc; $(grep -c '^\[       OK' /tmp/t.log) OK," \
        "$(grep -c '^\[  FAILED' /tmp/t.log) FAILED; cases on sm90: $(grep -c "$OP sm90_$OP" /tmp/t.log)" | tee -a "$S"
    done
  done
fi
variants=()
for r in $(seq 1 "${ROUNDS:-1}"); do
  for v in $VARIANTS; do
    n=${v%%=*}
    [ "$r" -gt 1 ] && n="$n.$r"
    echo "=== bench $v (round $r)" >>"$OUT/bench.log"
    # shellcheck disable=SC2086
    run_variant "$v" timeout -k 5 200 "$BUILD/tools/flashattn" bench --backend cuda --sweep --op "$OP" \
      $SWEEP_ARGS --json "/tmp/ours_$n.json" >>"$OUT/bench.log" 2>&1
    echo "bench $n: exit $?" | tee -a "$S"
    variants+=("$n=/tmp/ours_$n.json")
  done
done
if [ "${PEERS:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout -k 5 200 python3 bench/peers.py --op "$OP" $SWEEP_ARGS --json "$OUT/peers.json" >>"$OUT/bench.log" 2>&1
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
if [ -f "$OUT/peers.json" ]; then
  python3 bench/variants.py "$OUT/peers.json" "${variants[@]}" >"$OUT/variants.md" 2>>"$OUT/bench.log"
  cat "$OUT/variants.md"
fi
[ -n "${EXTRA:-}" ] && { bash -c "$EXTRA" >"$OUT/extra.log" 2>&1; echo "extra: exit $?" | tee -a "$S"; }
cat "$S"
