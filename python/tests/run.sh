#!/bin/sh
# Runs the Python tests with the interpreter of the virtual environment given as $1;
# exits 77 (CTest's "skipped") when there is none. FLASHATTN_LIBRARY names the library.
venv=${1:?usage: run.sh VENV_DIR}
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "no virtual environment at $venv (make venv creates it): Python tests skipped"
  exit 77
fi
cd "$(dirname "$0")/.." || exit 1
exec "$py" -m pytest -q -p no:cacheprovider tests
