# bench/sass_tools.sh — sourced by the SASS scripts: cuobjdump and nvdisasm, which this
# machine's CUDA install lacks, from NVIDIA's wheels (pip download, no install) into
# $SASS_TOOLS (default ~/.cache/flashattn-sass-tools; not under .deps, which travels to the
# device). Sets $cuobjdump and puts nvdisasm on PATH.
tools=${SASS_TOOLS:-$HOME/.cache/flashattn-sass-tools}
mkdir -p "$tools"
for pkg in nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; do
  bin=${pkg#nvidia-cuda-}
  if [ -z "$(find "$tools" -name "$bin" -type f 2>/dev/null | head -n 1)" ]; then
    pip download -q --no-deps "$pkg" -d "$tools/$pkg" >/dev/null
    python3 -m zipfile -e "$tools/$pkg"/*.whl "$tools/$pkg/x"
    chmod +x "$(find "$tools/$pkg/x" -name "$bin" -type f | head -n 1)"
  fi
done
cuobjdump=$(find "$tools" -name cuobjdump -type f | head -n 1)
chmod +x "$cuobjdump" "$(find "$tools" -name nvdisasm -type f | head -n 1)"
export PATH="$(dirname "$(find "$tools" -name nvdisasm -type f | head -n 1)"):$PATH"
