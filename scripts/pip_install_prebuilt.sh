#!/usr/bin/env bash
# Installs the Python package (as `pip install ./python` does: a copy, not the source tree) into
# the environment of $PYTHON (default python3), with the library of a build directory already
# built: pip's prebuilt mode bundles BUILD_DIR/python/flashattn/libflashattn.so and compiles only
# the extension flashattn._ext (seconds). Offline: --no-build-isolation (scikit-build-core 0.10+
# and cmake 3.21+ must be installed there); --no-deps (numpy must be too).
# Usage: scripts/pip_install_prebuilt.sh BUILD_DIR    (`make venv` runs it with .venv's python)
set -euo pipefail
build=${1:?usage: scripts/pip_install_prebuilt.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
lib=$(cd "$build" && pwd)/python/flashattn/libflashattn.so
if [ ! -f "$lib" ]; then
  echo "pip_install_prebuilt: no $lib: build first (make build, or cmake --build $build)" >&2
  exit 1
fi
FLASHATTN_PREBUILT_LIBRARY=$lib exec "${PYTHON:-python3}" -m pip install -q --no-build-isolation \
  --no-deps "$root/python"
