"""Forward of every flash_attn function on numpy arrays, against the float64 reference under
the correctness rule, sweeping dtypes, masks, windows, softcap, ALiBi, GQA, odd sizes, varlen
(with empty sequences) and strided inputs."""

import numpy as np
import pytest

import flashattn
from harness import BF16, DTYPES, F16, F32, Case, check_forward, inputs, randn

CASES = [
    Case(),
    Case(b=2, sq=17, sk=33, hq=4, hkv=4, d=32),
    Case(sq=1, sk=1, d=8),
    Case(sq=1, sk=113, hq=4, hkv=1, d=64, causal=True),              # decode-like, MQA
    Case(b=2, sq=33, sk=17, hq=6, hkv=2, d=40, causal=True),          # sq > sk: empty rows
    Case(sq=40, sk=40, hq=2, hkv=1, d=24, causal=True),
    Case(sq=30, sk=50, window=(5, 3)),
    Case(sq=50, sk=30, hq=4, hkv=2, window=(0, 0)),                   # diagonal only, empty rows
    Case(sq=31, sk=31, window=(7, -1)),
    Case(sq=31, sk=45, window=(-1, 2)),
    Case(sq=20, sk=64, causal=True, window=(8, -1)),
    Case(sq=20, sk=30, d=48, softcap=2.0),
    Case(sq=20, sk=30, d=48, softcap=1.5, causal=True, alibi="head"),
    Case(b=3, sq=9, sk=21, hq=4, hkv=2, alibi="batch"),
    Case(sq=12, sk=19, scale=0.5),
    Case(sq=7, sk=13, d=256),
    Case(sq=5, sk=9, d=1),
    Case(b=2, sq=19, sk=23, hq=4, hkv=2, d=32, strided=True, causal=True),
]


def _ids(cases):
    return [str(c) for c in cases]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_flash_attn_func(case, dtype, rng, seed):
    case = Case(**{**case.__dict__, "dtype": dtype})
    q, k, v, slopes, _, _ = inputs(case, rng)
    out, lse, probs = flashattn.flash_attn_func(
        q, k, v, softmax_scale=case.scale, causal=case.causal, window_size=case.window,
        softcap=case.softcap, alibi_slopes=slopes, return_attn_probs=True)
    assert probs is None
    check_forward(case, seed, q, k, v, slopes, None, None, out, lse)


def test_plain_return_is_out_only(rng):
    case = Case(sq=5, sk=6)
    q, k, v, *_ = inputs(case, rng)
    out = flashattn.flash_attn_func(q, k, v)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    out2, lse, probs = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
    np.testing.assert_array_equal(out, out2)


def test_default_scale_is_inverse_sqrt_d(rng):
    case = Case(sq=9, sk=11, d=20)
    q, k, v, *_ = inputs(case, rng)
    a = flashattn.flash_attn_func(q, k, v)
    b = flashattn.flash_attn_func(q, k, v, softmax_scale=1 / np.sqrt(20))
    np.testing.assert_array_equal(a, b)
    c = flashattn.flash_attn_func(q, k, v, softmax_scale=0.9)
    assert not np.array_equal(a, c)


def test_causal_overrides_window_right(rng):
    """flash_attn semantics: causal=True with window_size=(w, w) means window (w, 0)."""
    case = Case(sq=20, sk=24, causal=True, window=(4, 0))
    q, k, v, *_ = inputs(case, rng)
    a = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(4, 4))
    b = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(4, 0))
    np.testing.assert_array_equal(a, b)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(4, 9),
                                            return_attn_probs=True)
    check_forward(case, None, q, k, v, None, None, None, out, lse)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
def test_qkvpacked(dtype, rng, seed):
    case = Case(b=2, sq=21, sk=21, hq=3, hkv=3, d=32, dtype=dtype, causal=True, softcap=3.0,
                alibi="head")
    qkv = randn(rng, (2, 21, 3, 3, 32), dtype)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    slopes = rng.uniform(0.1, 0.5, 3).astype(np.float32)
    out, lse, _ = flashattn.flash_attn_qkvpacked_func(
        qkv, causal=True, softcap=3.0, alibi_slopes=slopes, return_attn_probs=True)
    check_forward(case, seed, q, k, v, slopes, None, None, out, lse)


@pytest.mark.parametrize("dtype", [F32, BF16] if BF16 is not None else [F32],
                         ids=lambda d: np.dtype(d).name)
def test_kvpacked(dtype, rng, seed):
    case = Case(b=2, sq=9, sk=26, hq=4, hkv=2, d=16, dtype=dtype, window=(6, 1))
    q = randn(rng, (2, 9, 4, 16), dtype)
    kv = randn(rng, (2, 26, 2, 2, 16), dtype)
    out, lse, _ = flashattn.flash_attn_kvpacked_func(q, kv, window_size=(6, 1),
                                                     return_attn_probs=True)
    check_forward(case, seed, q, kv[:, :, 0], kv[:, :, 1], None, None, None, out, lse)


VARLEN = [
    Case(lens_q=(5, 0, 17), lens_k=(9, 4, 17), hq=4, hkv=2, d=32),     # empty query sequence
    Case(lens_q=(3, 7, 1), lens_k=(0, 12, 30), causal=True),           # empty key sequence
    Case(lens_q=(16, 9), lens_k=(8, 20), hq=2, hkv=1, causal=True, window=(3, -1),
         softcap=2.0, alibi="batch"),
    Case(lens_q=(1, 13, 6, 8), lens_k=(1, 13, 6, 8), window=(2, 2), alibi="head", strided=True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", VARLEN, ids=_ids(VARLEN))
def test_varlen(case, dtype, rng, seed):
    case = Case(**{**case.__dict__, "dtype": dtype})
    q, k, v, slopes, cu_q, cu_k = inputs(case, rng)
    out, lse, probs = flashattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(case.lens_q), max(case.lens_k), causal=case.causal,
        window_size=case.window, softcap=case.softcap, alibi_slopes=slopes,
        return_attn_probs=True)
    assert probs is None and lse.shape == (case.hq, sum(case.lens_q))
    check_forward(case, seed, q, k, v, slopes, cu_q, cu_k, out, lse)


def test_varlen_max_seqlen_may_be_loose_or_zero(rng):
    case = Case(lens_q=(4, 6), lens_k=(5, 3))
    q, k, v, _, cu_q, cu_k = inputs(case, rng)
    a = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 5)
    b = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 100)
    c = flashattn.flash_attn_varlen_func(q, k, v, cu_q.astype(np.int64), list(cu_k), None, 0)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_varlen_qkvpacked(rng, seed):
    lens = (7, 0, 12)
    case = Case(lens_q=lens, lens_k=lens, hq=2, hkv=2, d=16, causal=True)
    qkv = randn(rng, (sum(lens), 3, 2, 16), F32)
    cu = np.array([0, 7, 7, 19], dtype=np.int32)
    out, lse, _ = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 12, causal=True,
                                                             return_attn_probs=True)
    check_forward(case, seed, qkv[:, 0], qkv[:, 1], qkv[:, 2], None, cu, cu, out, lse)


def test_varlen_kvpacked(rng, seed):
    case = Case(lens_q=(3, 8), lens_k=(10, 2), hq=4, hkv=1, d=8, window=(1, 1))
    q = randn(rng, (11, 4, 8), F32)
    kv = randn(rng, (12, 2, 1, 8), F32)
    cu_q, cu_k = np.array([0, 3, 11], np.int32), np.array([0, 10, 12], np.int32)
    out, lse, _ = flashattn.flash_attn_varlen_kvpacked_func(
        q, kv, cu_q, cu_k, 8, 10, window_size=(1, 1), return_attn_probs=True)
    check_forward(case, seed, q, kv[:, 0], kv[:, 1], None, cu_q, cu_k, out, lse)


def test_float64_through_naive_reference(rng):
    """algo='naive' runs the library's float64 reference: it must agree with this test's
    float64 reference to ~1e-12 (a cross-check of both, and of the f64 path)."""
    import reference as R
    case = Case(b=2, sq=13, sk=17, hq=4, hkv=2, d=24, causal=True, softcap=2.0, alibi="head",
                window=(6, -1))
    q, k, v, slopes, _, _ = inputs(Case(**{**case.__dict__, "dtype": np.float64}), rng)
    old = flashattn.set_options(algo="naive")
    try:
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(6, -1),
                                                softcap=2.0, alibi_slopes=slopes,
                                                return_attn_probs=True)
        assert flashattn.last_selection().kernel == "cpu_fwd_naive_f64"
    finally:
        flashattn.set_options(**old)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    ref = R.attention(q, k, v, scale=float(np.float32(1 / np.sqrt(24))), causal=True,
                      window=(6, -1), softcap=2.0, alibi=slopes)
    np.testing.assert_allclose(out, ref["out"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref["lse"], rtol=0, atol=1e-12)
