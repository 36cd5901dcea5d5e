#!/bin/sh
# Runs the Python tests against the flashattn package installed in the virtual environment $1
# (`make venv` installs it there, with the library of the build it just made). pytest runs from
# tests/, so the source tree's python/flashattn is not on sys.path; conftest.py reports the
# copy that was imported, and with FLASHATTN_TEST_INSTALLED=1 fails if it is the source's.
# Exits 77 (CTest's "skipped") when there is no such environment, or no package in it.
# FLASHATTN_LIBRARY, when set, still overrides the library the package bundles.
venv=${1:?usage: run.sh VENV_DIR}
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "no virtual environment at $venv (make venv creates it): Python tests skipped"
  exit 77
fi
py="$(cd "$venv" && pwd)/bin/python" # absolute: the next line leaves the caller's directory
cd "$(dirname "$0")" || exit 1
if ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("flashattn") is None)'; then
  echo "flashattn is not installed in $venv (make venv installs it): Python tests skipped"
  exit 77
fi
FLASHATTN_TEST_INSTALLED=1 exec "$py" -m pytest -p no:cacheprovider .
