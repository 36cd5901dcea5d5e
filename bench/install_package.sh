# bench/install_package.sh — sourced by bench/gpu.sh and bench/cp_gpu.sh (from the repository
# root): defines install_package, which installs our Python package against the library already
# built in $BUILD. scripts/pip_install_prebuilt.sh pip-installs ./python offline
# (--no-build-isolation) into $PYTHON (default python3) where that script exists; otherwise, or
# if it fails, the package runs from the source tree on the ctypes path (FLASHATTN_LIBRARY +
# PYTHONPATH, exported: call it in the script's own shell, not in a subshell). It reports
# through the caller's note() (one line for the summary).
install_package() {
  if [ -f scripts/pip_install_prebuilt.sh ]; then
    if bash scripts/pip_install_prebuilt.sh "$BUILD"; then
      note "install_package: scripts/pip_install_prebuilt.sh $BUILD ok"
      return 0
    fi
    note "install_package: scripts/pip_install_prebuilt.sh failed; FLASHATTN_LIBRARY + PYTHONPATH instead"
  else
    note "install_package: no scripts/pip_install_prebuilt.sh; FLASHATTN_LIBRARY + PYTHONPATH"
  fi
  export FLASHATTN_LIBRARY=$PWD/$BUILD/libflashattn.so PYTHONPATH=$PWD/python
}
