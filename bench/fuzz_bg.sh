#!/usr/bin/env bash
# bench/fuzz_bg.sh — the libFuzzer target on a lent machine's idle CPU cores while a GPU call
# runs (issue 42 counts executions toward 10 million):
#   (start them after the GPU build: beside it, 10 workers pushed the build past 220 s)
#   bench/fuzz_bg.sh start WORKERS SECONDS   builds build-fuzz (scripts/fuzz.sh, clang; or runs
#                                            the carried $FUZZ_BIN, default
#                                            build-fuzzcarry/fuzz_api, where there is no clang) and
#                                            starts WORKERS independent fuzzing processes in
#                                            the background for SECONDS, logs in $FUZZ_LOGS
#   bench/fuzz_bg.sh carry                   builds the target here and copies it with its OpenMP
#                                            runtime and corpus into build-fuzzcarry, for
#                                            run(carry=["build-fuzzcarry", ...])
#   bench/fuzz_bg.sh report                  waits for them, then prints the executions summed
#                                            over the workers and any crash file
# Findings land in $FUZZ_BUILD/artifacts/ (default build-fuzz) (copy them out with the call's $OUT).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs=${FUZZ_LOGS:-/tmp/fuzz-logs}
carried=${FUZZ_BIN:-build-fuzzcarry/fuzz_api}
if ! command -v "${FUZZ_CC:-clang}" >/dev/null && [ -x "$carried" ]; then
  export FUZZ_BIN=$carried FUZZ_BUILD=$(dirname "$carried") # no clang here: the carried build
fi
case "${1:-}" in
start)
  workers=${2:?workers} seconds=${3:?seconds}
  mkdir -p "$logs"
  # build only (a zero-second run), then the workers; -jobs=-workers: one process each
  CC=${FUZZ_CC:-clang} FUZZ_SECONDS=1 JOBS=$(nproc) scripts/fuzz.sh -runs=0 >"$logs/build.log" 2>&1 ||
    { echo "fuzz_bg: build failed (tail of $logs/build.log):"; tail -5 "$logs/build.log"; exit 1; }
  rm -f fuzz-*.log # libFuzzer writes fuzz-<job>.log into the repository root (fuzz.sh's cwd)
  (CC=${FUZZ_CC:-clang} FUZZ_SECONDS=$seconds JOBS=$(nproc) nohup scripts/fuzz.sh -jobs="$workers" \
    -workers="$workers" >"$logs/main.log" 2>&1 &)
  echo "fuzz_bg: $workers workers for ${seconds}s, logs in $logs"
  ;;
carry)
  FUZZ_BIN= FUZZ_BUILD=build-fuzz FUZZ_SECONDS=1 scripts/fuzz.sh -runs=0 >/dev/null 2>&1 ||
    { echo "fuzz_bg: build failed (run scripts/fuzz.sh -runs=0 to see why)"; exit 1; }
  mkdir -p build-fuzzcarry
  cp build-fuzz/fuzz/fuzz_api build-fuzzcarry/
  omp=$(ldd build-fuzz/fuzz/fuzz_api | awk '/libomp/ {print $3}')
  [ -n "$omp" ] && cp -L "$omp" build-fuzzcarry/
  # the corpus this machine grew, if any (an empty one keeps the carried corpus.tgz)
  [ -n "$(ls -A build-fuzz/corpus 2>/dev/null)" ] &&
    tar -czf build-fuzzcarry/corpus.tgz -C build-fuzz/corpus .
  echo "fuzz_bg: build-fuzzcarry holds $(git rev-parse --short HEAD)'s target ($(du -sh build-fuzzcarry | cut -f1))"
  ;;
report)
  # by process name (-x): -f also matched a caller whose command line named fuzz_api, and
  # waited for itself until the call's limit
  while pgrep -x fuzz_api >/dev/null; do sleep 2; done
  mv fuzz-*.log "$logs"/ 2>/dev/null
  execs=$(cat "$logs"/fuzz-*.log 2>/dev/null | grep -o "stat::number_of_executed_units: *[0-9]*" |
    awk '{s += $2} END {print s + 0}')
  echo "fuzz_bg: $execs executions over $(ls "$logs"/fuzz-*.log 2>/dev/null | wc -l) workers"
  ls "${FUZZ_BUILD:-build-fuzz}"/artifacts/ 2>/dev/null | sed 's/^/fuzz_bg: finding /'
  grep -h "ERROR\|SUMMARY" "$logs"/fuzz-*.log 2>/dev/null | sort | uniq -c | head -5
  ;;
*) echo "usage: bench/fuzz_bg.sh start WORKERS SECONDS | carry | report" >&2; exit 2 ;;
esac
