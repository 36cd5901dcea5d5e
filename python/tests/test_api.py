"""Library lookup, the selection record, settings, per-thread contexts, strides and zero-size
inputs (the README examples: test_readme.py)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import flashattn
from flashattn import _tensors
from harness import F16, F32, Case, check_forward, inputs, randn

PKG = pathlib.Path(flashattn.__file__).resolve().parent


def test_library_info():
    assert re.fullmatch(r"\d+\.\d+\.\d+", flashattn.library_version())
    if os.environ.get("FLASHATTN_LIBRARY"):
        assert flashattn.library_path() == os.environ["FLASHATTN_LIBRARY"]
    names = flashattn.kernel_names()
    assert "cpu_fwd_scalar_f32_64x64" in names and "cpu_bwd_scalar_bf16_64x64" in names
    assert isinstance(flashattn.cpu_features(), str)
    assert flashattn.has_cuda() in (True, False)


def _python(code, env, cwd):
    """A fresh interpreter run in cwd (which `python -c` puts first on sys.path)."""
    full = {k: v for k, v in os.environ.items() if k != "FLASHATTN_LIBRARY"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_lookup_order(tmp_path):
    """The ctypes binding: FLASHATTN_LIBRARY first and final; then a copy next to the
    package."""
    lib = flashattn.library_path()
    pkg = tmp_path / "flashattn"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__", "libflashattn*"))
    shutil.copy(lib, pkg / "libflashattn.so")
    code = "import flashattn; print(flashattn.library_path()); print(flashattn.library_version())"
    r = _python(code, {"FLASHATTN_BINDING": "ctypes"}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(pkg / "libflashattn.so")
    # a named library that cannot be loaded is an error, not a fall-through to the copy
    code = ("import flashattn\n"
            "try:\n    flashattn.library_version()\n"
            "except flashattn.LibraryNotFound as e:\n    print('LibraryNotFound', e)\n")
    r = _python(code, {"FLASHATTN_LIBRARY": "/nonexistent/lib.so", "FLASHATTN_BINDING": "ctypes"},
                tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("LibraryNotFound"), r.stdout + r.stderr
    assert "/nonexistent/lib.so" in r.stdout and "FLASHATTN_LIBRARY" in r.stdout


def test_selection_record(rng):
    q, k, v, *_ = inputs(Case(sq=9, sk=12, dtype=F16), rng)
    flashattn.flash_attn_func(q, k, v)
    s = flashattn.last_selection()
    assert (s.backend, s.op) == ("cpu", "fwd")
    assert re.fullmatch(r"cpu_fwd_(scalar|avx2|avx512)_f16_\d+x\d+", s.kernel)
    assert s.tile_q > 0 and s.tile_k > 0 and s.threads >= 1 and s.num_splits >= 1
    assert s.reason == ""


def test_set_options_threads_and_strict(rng):
    q, k, v, *_ = inputs(Case(b=2, sq=33, sk=40, hq=4, hkv=2, d=32), rng)
    ref = flashattn.flash_attn_func(q, k, v)
    old = flashattn.set_options(threads=1, strict=True)
    try:
        opts = flashattn.get_options()
        assert set(opts) == {"threads", "strict", "algo", "device_checks"}
        assert (opts["threads"], opts["strict"], opts["algo"]) == (1, True, "auto")
        out = flashattn.flash_attn_func(q, k, v)
        assert flashattn.last_selection().threads == 1
    finally:
        flashattn.set_options(**old)
    np.testing.assert_array_equal(out, ref)  # the CPU kernels do not depend on thread count
    with pytest.raises(ValueError):
        flashattn.set_options(algo="fast")
    with pytest.raises(ValueError):
        flashattn.set_options(threads=-1)


def test_threads_have_their_own_contexts(rng):
    cases = [inputs(Case(b=2, sq=20 + i, sk=30, hq=4, hkv=2, d=32), rng)[:3] for i in range(4)]
    expected = [flashattn.flash_attn_func(*c, causal=True) for c in cases]
    results, errors = {}, []

    def work(i):
        try:
            for _ in range(20):
                out = flashattn.flash_attn_func(*cases[i], causal=True)
                np.testing.assert_array_equal(out, expected[i])
                assert flashattn.last_selection().op == "fwd"
            results[i] = True
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4


def test_numpy_layouts_pass_through_or_copy(rng, seed):
    case = Case(b=2, sq=11, sk=14, hq=4, hkv=2, d=16)
    q, k, v, *_ = inputs(case, rng)
    ref = flashattn.flash_attn_func(q, k, v)
    # permuted outer strides: passed through
    qp = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert _tensors.NumpyOps.prepare(qp) is qp
    np.testing.assert_array_equal(flashattn.flash_attn_func(qp, k, v), ref)
    # copies: negative strides, non-native byte order, misaligned data, broadcast (0 stride)
    qr = np.ascontiguousarray(q[:, ::-1])[:, ::-1]  # same values, negative stride
    qb = q.astype(q.dtype.newbyteorder(">"))
    raw = np.zeros(q.nbytes + 1, np.uint8)
    qm = raw[1:].view(np.float32).reshape(q.shape)
    qm[...] = q
    for x in (qr, qb, qm):
        assert _tensors.NumpyOps.prepare(x) is not x
        np.testing.assert_array_equal(flashattn.flash_attn_func(x, k, v), ref)
    kb = np.broadcast_to(k[:, :1], k.shape)
    vb = np.broadcast_to(v[:, :1], v.shape)
    out = flashattn.flash_attn_func(q, kb, vb)
    np.testing.assert_allclose(out, np.broadcast_to(v[:, :1].repeat(2, axis=2), q.shape),
                               rtol=1e-6, atol=1e-6)


def test_strided_outputs(rng, seed):
    case = Case(b=2, sq=11, sk=14, hq=4, hkv=2, d=16, causal=True)
    q, k, v, *_ = inputs(case, rng)
    out = randn(rng, q.shape, F32, strided=True)
    out[...] = np.nan  # poisoned: every element must be written
    lse = np.full((3, 2, 11, 4), np.nan, np.float32)[1].transpose(0, 2, 1)  # (b, h, s) view
    res = flashattn.attention_forward(q, k, v, causal=True, out=out, softmax_lse=lse)
    assert res[0] is out and res[1] is lse
    check_forward(case, seed, q, k, v, None, None, None, out, lse)


def test_return_lse_false(rng):
    q, k, v, *_ = inputs(Case(), rng)
    out, lse = flashattn.attention_forward(q, k, v, return_lse=False)
    assert lse is None and out.shape == q.shape


def test_zero_size_inputs():
    q = np.zeros((0, 5, 2, 8), np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, q, q, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (0, 2, 5)
    assert flashattn.last_selection() is None  # no kernel ran
    q = np.ones((1, 3, 2, 8), np.float32)
    k = np.ones((1, 0, 2, 8), np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert (out == 0).all() and np.isneginf(lse).all()
    dq, dk, dv = flashattn.attention_backward(out, q, k, k, out, lse)
    assert (dq == 0).all() and dk.shape == k.shape
    qv = np.ones((4, 2, 8), np.float32)
    kv = np.zeros((0, 2, 8), np.float32)
    out, lse, _ = flashattn.flash_attn_varlen_func(qv, kv, kv, [0, 4], [0, 0], 4, 0,
                                                   return_attn_probs=True)
    assert (out == 0).all() and lse.shape == (2, 4) and np.isneginf(lse).all()
