#!/usr/bin/env bash
# bench/ncu_peers.sh — how the peers' forward kernels are launched beside ours (issue 7): for
# each shape, one Nsight Compute pass over cuDNN's SDPA forward (through bench/peers.py), one
# over FlashAttention-2's and one over ours, with the launch statistics and speed of light of
# every attention kernel: name, grid, block, registers, shared memory, duration, SM clock.
# A single launch each (no sustained clock), so it tells shapes and tilings, not the table.
#
#   run(command="COMMIT=<sha> bash bench/ncu_peers.sh", carry=[".deps"], timeout_s=600)
#
# Environment: SHAPES, space-separated D:N:CAUSAL (default "128:512:0 128:512:1 64:512:1
# 128:16384:0"), at 16384 tokens and model dim 2048 as the sweep; IMPLS (default "cudnn flash
# ours"); ENVS (variables for our side, e.g. FLASHATTN_CUDA_SM90=0); SASS=1 adds the
# per-instruction counters and writes each run's SASS with them (sass_*.csv: the peers' kernels'
# instruction shapes and order, e.g. their wgmma widths). Without "ours" nothing is built.
# Files back: launches.md (one row per kernel launch profiled), ncu_*.csv, sass_*.csv.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-128:512:0 128:512:1 64:512:1 128:16384:0}
IMPLS=${IMPLS:-cudnn flash ours}
mkdir -p "$OUT"
case " $IMPLS " in *" ours "*) . bench/device_build.sh ;; esac
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECTIONS="--section LaunchStats --section SpeedOfLight --section Occupancy"
[ "${SASS:-0}" = 1 ] && SECTIONS="$SECTIONS --section SourceCounters"
for shape in $SHAPES; do
  IFS=: read -r d n c <<<"$shape"
  b=$((16384 / n)) h=$((2048 / d))
  mask=none
  [ "$c" = 1 ] && mask=causal
  for impl in $IMPLS; do
    tag="d${d}_n${n}_${mask}_$impl"
    if [ "$impl" = ours ]; then
      # shellcheck disable=SC2086
      env ${ENVS:-} timeout -k 5 150 "$NCU" --clock-control none -k regex:fwd_sm90 --launch-skip 2 \
        --launch-count 1 $SECTIONS -f -o "/tmp/p_$tag" "$BUILD/tools/flashattn" bench --backend cuda \
        --batch "$b" --heads "$h" --head-dim "$d" --seqlens "$n" --masks "$mask" --dtype bf16 \
        --op fwd --warmup 2 --reps 3 --max-time 0 --no-peak >"/tmp/ncu_$tag.log" 2>&1
    else
      # every kernel of the last timed calls: the attention kernel is picked out by name below
      # (SASS=1: the attention kernel's third launch alone)
      sel="--launch-skip 0 --launch-count 16"
      [ "${SASS:-0}" = 1 ] && sel="-k regex:fprop|flash_fwd --launch-skip 2 --launch-count 1"
      # shellcheck disable=SC2086
      timeout -k 5 150 "$NCU" --clock-control none \
        $sel $SECTIONS -f -o "/tmp/p_$tag" python3 bench/peers.py \
        --impls "$impl" --ops fwd --head-dim "$d" --seqlens "$n" --masks "$mask" --warmup 3 \
        --reps 3 --max-time 0 --min-time 0 --rotate 0 >"/tmp/ncu_$tag.log" 2>&1
    fi
    echo "ncu $tag: exit $?"
    "$NCU" --import "/tmp/p_$tag.ncu-rep" --page details --csv >"$OUT/ncu_$tag.csv" 2>&1
    [ "${SASS:-0}" = 1 ] && "$NCU" --import "/tmp/p_$tag.ncu-rep" --page source --csv \
      --print-source sass >"$OUT/sass_$tag.csv" 2>&1
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/launches.md"
import csv, glob, os, sys
want = ["Grid Size", "Block Size", "Registers Per Thread", "Dynamic Shared Memory Per Block",
        "Duration", "SM Frequency", "Compute (SM) Throughput", "DRAM Throughput", "Achieved Occupancy"]
print("| run | kernel | " + " | ".join(want) + " |")
print("|---|---|" + "---|" * len(want))
for path in sorted(glob.glob(os.path.join(sys.argv[1], "ncu_*.csv"))):
    tag = os.path.basename(path)[4:-4]
    rows = {}
    try:
        for r in csv.DictReader(open(path)):
            key = (r.get("ID"), r.get("Kernel Name", "")[:90])
            rows.setdefault(key, {})[r.get("Metric Name")] = "%s %s" % (r.get("Metric Value"), r.get("Metric Unit", ""))
    except (OSError, csv.Error) as e:
        print("| %s | unreadable: %s |" % (tag, e))
        continue
    for (i, name), m in rows.items():
        print("| %s | %s | " % (tag, name) + " | ".join(m.get(w, "").strip() for w in want) + " |")
PY
