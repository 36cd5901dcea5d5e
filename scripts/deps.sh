#!/usr/bin/env bash
# Installs the Debian packages the build needs when they are missing: the C test framework
# (cmocka), the JSON writer of the `flashattn` tool (cJSON), OpenBLAS (the matrix products of
# `flashattn demo`'s naive side; without it the demo falls back to C loops), pkg-config, cmake,
# python3-venv, and python3-dev (Python.h, for the package's extension).
set -euo pipefail
need=()
pkg-config --version >/dev/null 2>&1 || need+=(pkg-config)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if command -v pkg-config >/dev/null 2>&1; then
  pkg-config --exists cmocka || need+=(libcmocka-dev)
  pkg-config --exists libcjson || need+=(libcjson-dev)
  pkg-config --exists openblas || need+=(libopenblas-dev)
else
  need+=(libcmocka-dev libcjson-dev libopenblas-dev)
fi
# python3 -m venv (for the Python package's tests) needs ensurepip, a separate Debian package
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# the package's extension (make venv builds it) compiles against Python.h
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  >/dev/null 2>&1 || need+=(python3-dev)
[ ${#need[@]} -eq 0 ] && exit 0
echo "deps: installing ${need[*]}"
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo -n"; else
  echo "deps: need root (or sudo) to install: ${need[*]}" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${need[@]}" >/dev/null
