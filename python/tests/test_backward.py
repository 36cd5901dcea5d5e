"""attention_backward (fa_bwd) on numpy arrays against the reference gradients, and the
harness's plain baseline against the library's own FA_ALGO_PLAIN (the same yardstick)."""

import numpy as np
import pytest

import flashattn
import reference as R
from harness import (BF16, DTYPES, F16, F32, Case, check_backward, inputs, lib_kwargs, randn,
                     ref_kwargs)

CASES = [
    Case(b=2, sq=17, sk=23, hq=4, hkv=2, d=32),
    Case(sq=1, sk=1, d=8),
    Case(sq=33, sk=17, hq=6, hkv=2, d=40, causal=True),               # empty rows
    Case(sq=19, sk=40, hq=2, hkv=1, window=(4, 2), softcap=2.0),
    Case(b=2, sq=11, sk=11, hq=4, hkv=4, d=64, causal=True, alibi="batch", scale=0.3),
    Case(sq=9, sk=14, d=256, window=(-1, 0)),
    Case(b=2, sq=13, sk=21, hq=4, hkv=2, d=24, strided=True, causal=True, softcap=1.0),
    Case(lens_q=(5, 0, 12), lens_k=(9, 3, 12), hq=4, hkv=2, d=16, causal=True, alibi="head"),
    Case(lens_q=(4, 6), lens_k=(0, 6), window=(1, 1), strided=True),
]


def _backward(case, rng, deterministic=False):
    q, k, v, slopes, cu_q, cu_k = inputs(case, rng)
    dout = randn(rng, q.shape, case.dtype, case.strided)
    kw = lib_kwargs(case, slopes)
    if case.varlen:
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(case.lens_q),
                  max_seqlen_k=max(case.lens_k))
    out, lse = flashattn.attention_forward(q, k, v, **kw)
    grads = flashattn.attention_backward(dout, q, k, v, out, lse, deterministic=deterministic,
                                         **kw)
    return (q, k, v, dout, slopes, cu_q, cu_k), grads


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_backward(case, dtype, rng, seed):
    case = Case(**{**case.__dict__, "dtype": dtype})
    (q, k, v, dout, slopes, cu_q, cu_k), (dq, dk, dv) = _backward(case, rng)
    assert flashattn.last_selection().op == "bwd"
    check_backward(case, seed, q, k, v, dout, slopes, cu_q, cu_k, dq, dk, dv)


def test_deterministic_is_accepted_and_repeatable(rng):
    case = Case(b=2, sq=21, sk=30, hq=4, hkv=2, d=32, causal=True)
    state = rng.bit_generator.state
    _, g1 = _backward(case, rng, deterministic=True)
    rng.bit_generator.state = state
    _, g2 = _backward(case, rng, deterministic=True)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)


def test_into_given_buffers_and_packed_grads(rng):
    """dq/dk/dv may be views of one packed dqkv (they share memory, as flash_attn's packed
    backward does); the library writes through their strides."""
    qkv = randn(rng, (2, 10, 3, 2, 16), F32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    dout = randn(rng, q.shape, F32)
    out, lse = flashattn.attention_forward(q, k, v, causal=True)
    dqkv = np.full(qkv.shape, np.nan, dtype=np.float32)
    res = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True,
                                       dq=dqkv[:, :, 0], dk=dqkv[:, :, 1], dv=dqkv[:, :, 2])
    assert all(np.shares_memory(r, dqkv) for r in res)
    assert np.isfinite(dqkv).all()
    fresh = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    for i in range(3):
        np.testing.assert_array_equal(dqkv[:, :, i], fresh[i])


PLAIN_CASES = [
    Case(sq=7, sk=13, d=256),
    Case(b=2, sq=33, sk=17, hq=6, hkv=2, d=40, causal=True, softcap=2.0, alibi="head", dtype=F16),
    Case(sq=20, sk=30, hq=4, hkv=2, window=(3, 2), dtype=BF16 if BF16 is not None else F16),
    Case(lens_q=(5, 0, 9), lens_k=(6, 2, 9), hq=2, hkv=1, causal=True, dtype=F16),
]


@pytest.mark.parametrize("case", PLAIN_CASES, ids=[str(c) for c in PLAIN_CASES])
def test_numpy_plain_is_the_library_plain(case, rng):
    """The yardstick of these tests is the one the C tests use: the harness's plain
    implementation agrees with FA_ALGO_PLAIN to within rounding of libm differences."""
    q, k, v, slopes, cu_q, cu_k = inputs(case, rng)
    dout = randn(rng, q.shape, case.dtype)
    f64 = [x.astype(np.float64) for x in (q, k, v, dout)]
    base = R.attention(*f64, prec=case.dtype, **ref_kwargs(case, slopes, cu_q, cu_k))
    kw = lib_kwargs(case, slopes)
    if case.varlen:
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    old = flashattn.set_options(algo="plain")
    try:
        out, lse = flashattn.attention_forward(q, k, v, **kw)
        assert flashattn.last_selection().kernel.startswith("cpu_fwd_plain")
        grads = flashattn.attention_backward(dout, q, k, v, out, lse, **kw)
    finally:
        flashattn.set_options(**old)
    u = R.UNIT_ROUNDOFF[np.dtype(case.dtype)]
    for name, got in zip(("out", "lse", "dq", "dk", "dv"), (out, lse) + grads):
        exp = base[name]
        tol = 2 * u * np.maximum(1.0, np.abs(np.where(np.isfinite(exp), exp, 0)))
        got = np.asarray(got, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            same = (got == exp) | (np.abs(got - exp) <= tol)
        assert same.all(), f"{name}: {np.count_nonzero(~same)} elements differ"
