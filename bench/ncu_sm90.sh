#!/usr/bin/env bash
# bench/ncu_sm90.sh — Nsight Compute on the Hopper forward, one launch per schedule (issue 7):
# builds (gpu.sh's build stage), then profiles the sm90 kernel under each of SCHEDULES at one
# shape and writes, per schedule, the details page (ncu_<s>.csv: speed of light, warp states,
# instruction mix) and the per-instruction SASS page (sass_<s>.csv: executed instructions and
# stall samples per line, summarised by bench/sass_stalls.py). A bring-up build
# (-DFLASHATTN_BRINGUP=ON, folder build-bringup), whose FLASHATTN_SM90_SCHEDULE picks the schedule.
#
#   run(command="COMMIT=<sha> bash bench/ncu_sm90.sh", carry=[".deps"], timeout_s=600)
#
# Environment: SCHEDULES (default "overlap pingpong"), SHAPE (the bench options of the profiled
# call; default bf16 d 128, batch 2, 16 heads, seqlen 8192, non-causal), PRE (a command run
# after the build, e.g. a test; its output goes to pre.log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/fa-out}
BUILD=${BUILD:-build-bringup}
export BUILD CMAKE_ARGS="-DFLASHATTN_BRINGUP=ON ${CMAKE_ARGS:-}"
SCHEDULES=${SCHEDULES:-overlap pingpong}
SHAPE=${SHAPE:---batch 2 --heads 16 --head-dim 128 --seqlens 8192 --dtype bf16}
mkdir -p "$OUT"
. bench/device_build.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -n "${PRE:-}" ] && { bash -c "$PRE" >"$OUT/pre.log" 2>&1; echo "pre: exit $?"; }
for s in $SCHEDULES; do
  # shellcheck disable=SC2086
  FLASHATTN_SM90_SCHEDULE=$s timeout -k 5 200 "$NCU" --clock-control none -k regex:fwd_sm90 \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters \
    --section MemoryWorkloadAnalysis -f -o "/tmp/p_$s" \
    "$BUILD/tools/flashattn" bench --backend cuda $SHAPE --op fwd --warmup 2 --reps 3 \
    --max-time 0 --no-peak >"/tmp/ncu_$s.log" 2>&1
  echo "ncu $s: exit $?"; tail -n 5 "/tmp/ncu_$s.log"
  "$NCU" --import "/tmp/p_$s.ncu-rep" --page details --csv >"$OUT/ncu_$s.csv" 2>&1
  "$NCU" --import "/tmp/p_$s.ncu-rep" --page source --csv --print-source sass >"$OUT/sass_$s.csv" 2>&1
  python3 bench/sass_stalls.py "$OUT/sass_$s.csv" --lines 30
  grep -E '"(Duration|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued Instruction|Executed Ipc Active|Registers Per Thread)"' \
    "$OUT/ncu_$s.csv" | cut -d, -f12- | head -n 12
done
