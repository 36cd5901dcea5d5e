#!/usr/bin/env bash
# bench/ab_builds.sh — one device call: this tree's kernels against another commit's, on the
# same card, with the peers in the same call: gpu.sh's build of this tree, the base tree built
# the same way from a tarball (the device's copy of the tree has no .git), then ROUNDS rounds of
# `flashattn bench --sweep` of each build in turn (so that the clock's drift falls on both),
# the peers once (bench/peers.py), and one table of both beside the peers (bench/variants.py).
# For changes meant to leave the kernels' speed alone (a clean-up whose SASS changed).
#
#   git archive -o ab-base.tar <base>     # on the development machine; untracked, so it
#                                         # travels with the tree (delete it afterwards, and
#                                         # keep it out of commits: `git add -A` takes it)
#   run(command="AB_BASE_TAR=ab-base.tar BASE=<base> COMMIT=<sha> bash bench/ab_builds.sh",
#       carry=[".deps"], timeout_s=600)
#
# Environment: AB_BASE_TAR (required), BASE and COMMIT (names for the table), SWEEP_ARGS (both
# sides' sweep options, default "--head-dim 64,128,256 --seqlens 512,2048,8192"), ROUNDS
# (default 2; a round starts only before LIMIT_S, default 430 s), PAUSE (seconds idle before
# each row, default 0.25). Files back: ab.md (the
# table), summary.txt, base.json, new.json, peers.json, ab.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-gpu}
: "${AB_BASE_TAR:?AB_BASE_TAR: a git archive of the base commit}"
BASE=${BASE:-base}
COMMIT=${COMMIT:-new}
SWEEP_ARGS=${SWEEP_ARGS:---head-dim 64,128,256 --seqlens 512,2048,8192}
ROUNDS=${ROUNDS:-2}
PAUSE=${PAUSE:-0.25}
mkdir -p "$OUT"
S=$OUT/summary.txt
LOG=$OUT/ab.log
export PYTHONUNBUFFERED=1
START=$(date +%s)
LIMIT_S=${LIMIT_S:-430} # no sweep starts after this many seconds (the call's limit is 600)
late() { [ $(($(date +%s) - START)) -gt "$LIMIT_S" ] && echo "skipped: $1 (${LIMIT_S}s passed)" | tee -a "$S"; }

. bench/device_build.sh
grep -E "^(date|nvcc|commit)|NVIDIA H" /tmp/fa-build.log | head -n 5 | tee "$S"
base_dir=/tmp/ab-base
rm -rf "$base_dir" && mkdir -p "$base_dir" && tar -xf "$AB_BASE_TAR" -C "$base_dir" &&
  cp -r .deps "$base_dir/" || { echo "ab: cannot unpack $AB_BASE_TAR" | tee -a "$S"; exit 1; }
t0=$(date +%s)
(cd "$base_dir" && STAGES=build OUT=/tmp/ab-base-out COMMIT=$BASE bash bench/gpu.sh) \
  >"$OUT/base-build.log" 2>&1 || { tail -n 30 "$OUT/base-build.log"; exit 1; }
echo "base $BASE built in $(($(date +%s) - t0)) s" | tee -a "$S"

# shellcheck disable=SC2086
sweep() { "$1" bench --backend cuda --sweep --pause "$PAUSE" $SWEEP_ARGS --json "$2" >>"$LOG" 2>&1; }
for r in $(seq 1 "$ROUNDS"); do
  [ "$r" -gt 1 ] && late "round $r" && break
  sweep "$base_dir/$BUILD/tools/flashattn" "$OUT/base_$r.json" || echo "base round $r failed" | tee -a "$S"
  sweep "$BUILD/tools/flashattn" "$OUT/new_$r.json" || echo "new round $r failed" | tee -a "$S"
  echo "round $r done at $(($(date +%s) - START)) s" | tee -a "$S"
done
# shellcheck disable=SC2086
python3 bench/peers.py --pause "$PAUSE" $SWEEP_ARGS --json "$OUT/peers.json" >>"$LOG" 2>&1 ||
  echo "peers failed" | tee -a "$S"
cols=()
for r in $(seq 1 "$ROUNDS"); do
  [ -f "$OUT/base_$r.json" ] || continue
  cols+=("$BASE.$r=$OUT/base_$r.json" "$COMMIT.$r=$OUT/new_$r.json")
done
{
  echo "# $COMMIT against $BASE, one call: $(grep -m1 'NVIDIA H' /tmp/fa-build.log)"
  echo
  echo "command: \`AB_BASE_TAR=... BASE=$BASE COMMIT=$COMMIT ROUNDS=$ROUNDS SWEEP_ARGS='$SWEEP_ARGS' bash bench/ab_builds.sh\`; rounds alternate base/new; TFLOP/s"
  echo
  python3 bench/variants.py "$OUT/peers.json" "${cols[@]}"
} >"$OUT/ab.md" 2>>"$LOG"
# one file per side (the device returns few files): a JSON list of its rounds
for side in base new; do
  python3 -c 'import json, sys; json.dump([json.load(open(f)) for f in sys.argv[2:]], open(sys.argv[1], "w"))' \
    "$OUT/$side.json" "$OUT/${side}"_[0-9]*.json 2>>"$LOG" && rm -f "$OUT/${side}"_[0-9]*.json
done
tail -n 30 "$OUT/ab.md"
