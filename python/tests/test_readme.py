"""Every Python block of README.md and python/README.md runs as written, on the CPU.

A block runs in a fresh interpreter (from an empty directory, so that the installed package is
the one imported). The line right before its fence may say what it needs:

    <!-- test: needs torch -->                 runs where torch imports, else skipped
    <!-- test: needs torch, transformers -->   every module named must import
    <!-- test: needs cuda -->                  runs where torch sees a CUDA device

A block without such a line must run with numpy alone: torch is made unimportable for it, so
that a snippet promising the numpy path cannot lean on torch unnoticed. An unknown word in a
marker fails, so that a typo does not skip a block silently.
"""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
READMES = (ROOT / "README.md", ROOT / "python" / "README.md")
BLOCK = re.compile(r"(?:<!-- test: ([^>]*?) -->\n)?```python\n(.*?)```", re.S)
NO_TORCH = "import sys\nsys.modules['torch'] = None  # the numpy path must not need torch\n"


def _blocks():
    found = []
    for path in READMES:
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start(2)) + 1
            name = f"{path.relative_to(ROOT)}:{line}"
            found.append(pytest.param(m.group(1), m.group(2), name, id=name))
    return found


def _needs(marker):
    """The modules a marker names, and whether it asks for a CUDA device."""
    words = [w.strip() for w in re.sub(r"^needs\s+", "", marker or "").split(",") if w.strip()]
    if marker and not marker.startswith("needs "):
        pytest.fail(f"unknown README test marker {marker!r}: expected 'needs <module>, ...'")
    cuda = "cuda" in words
    mods = [w for w in words if w != "cuda"] + (["torch"] if cuda else [])
    for m in mods:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", m):
            pytest.fail(f"README test marker {marker!r}: {m!r} is not a module name")
    return mods, cuda


def test_readmes_have_python_blocks():
    """The extraction below finds the blocks at all (a changed fence would skip them all)."""
    present = [p for p in READMES if p.exists()]
    if not present:
        pytest.skip("the READMEs are not beside the tests")
    assert len(_blocks()) >= 4, "README.md and python/README.md hold at least 4 Python blocks"


@pytest.mark.parametrize("marker,code,where", _blocks())
def test_readme_block(marker, code, where, tmp_path):
    mods, cuda = _needs(marker)
    for m in dict.fromkeys(mods):
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{where} needs {m}, which is not installed")
    if cuda:
        import torch
        if not torch.cuda.is_available():
            pytest.skip(f"{where} needs a CUDA device")
    source = code if mods else NO_TORCH + code
    run = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, (f"{where} failed as written:\n{code}\n--- stdout\n{run.stdout}"
                                 f"\n--- stderr\n{run.stderr}")
