#!/usr/bin/env bash
# Runs every test of a build tree through CTest and ends with one line
# "N passed, N failed, N skipped" counted from CTest's JUnit report.
# Usage: scripts/run_tests.sh BUILD_DIR [label-for-the-summary]
# CTEST_ARGS (environment): extra ctest options, e.g. "-L gpu|python" for a subset.
set -uo pipefail
build=${1:?build dir}
label=${2:+$2: }
junit="$build/ctest-junit.xml"
rm -f "$junit"
# shellcheck disable=SC2086 # CTEST_ARGS is a list of options
ctest --test-dir "$build" --output-on-failure --output-junit "$(realpath -m "$junit")" -j "$(nproc 2>/dev/null || echo 2)" ${CTEST_ARGS:-}
rc=$?
if [ ! -f "$junit" ]; then
  echo "${label}0 passed, 1 failed (ctest produced no report)"
  exit 1
fi
# CTest writes the <testsuite> attributes one per line: flatten before matching.
attr() { tr '\n\t' '  ' <"$junit" | grep -o "<testsuite [^>]*" | grep -o " $1=\"[0-9]*\"" | head -1 | grep -o '[0-9]*'; }
total=$(attr tests); failed=$(attr failures); skipped=$(attr skipped); disabled=$(attr disabled)
skipped=$(( ${skipped:-0} + ${disabled:-0} ))
passed=$(( total - failed - skipped ))
echo "${label}${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
