#!/usr/bin/env bash
# Builds the libFuzzer target fuzz/fuzz_api (clang, ASan + UBSan, CPU only) in $FUZZ_BUILD and
# runs it for $FUZZ_SECONDS seconds (default 60) from the committed seeds (fuzz/corpus) plus
# what earlier runs of this build found. A finding stops the run with its input saved as
# $FUZZ_BUILD/artifacts/crash-*; replay it with `$FUZZ_BUILD/fuzz/fuzz_api FILE`.
# FUZZ_BIN names a fuzz_api built elsewhere (a machine without clang runs a carried one; its
# folder holds corpus/ or corpus.tgz, artifacts/ and any runtime library it needs).
# Usage: scripts/fuzz.sh [extra libFuzzer flags]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD:-build-fuzz}
bin=$build/fuzz/fuzz_api
if [ -n "${FUZZ_BIN:-}" ]; then
  bin=$FUZZ_BIN build=$(dirname "$FUZZ_BIN")
  mkdir -p "$build/corpus"
  [ -f "$build/corpus.tgz" ] && [ -z "$(ls -A "$build/corpus")" ] && tar -xzf "$build/corpus.tgz" -C "$build/corpus"
  export LD_LIBRARY_PATH=$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
seconds=${FUZZ_SECONDS:-60}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
cc=${CC:-clang}
if [ -z "${FUZZ_BIN:-}" ]; then
  case "$("$cc" --version 2>/dev/null | head -1)" in
    *clang*) ;;
    *) echo "fuzz: needs clang with libFuzzer (CC=$cc is not clang; or set FUZZ_BIN)" >&2; exit 1 ;;
  esac
  CC=$cc cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHATTN_WITH_CUDA=OFF \
    -DFLASHATTN_FUZZ=ON -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_TOOLS=OFF >/dev/null
  cmake --build "$build" -j "$jobs" --target fuzz_api
fi
mkdir -p "$build/corpus" "$build/artifacts"

exec "$bin" "$build/corpus" fuzz/corpus -max_total_time="$seconds" \
  -timeout=20 -rss_limit_mb=4096 -max_len=512 -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/" "$@"
