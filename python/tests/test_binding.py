"""The two bindings: the C extension flashattn._ext (the default where it was built) and the
ctypes fallback compute the same function; the extension's fast path and the Python layer's
general path (which normalises what the fast path declines) agree bit for bit. The ctypes
path is run in-process by hiding the extension (flashattn._native.ext = None)."""

import numpy as np
import pytest

import flashattn
from flashattn import _native
from harness import F32, Case, inputs

needs_ext = pytest.mark.skipif(_native.ext is None, reason="flashattn._ext is not built")


def test_binding_is_reported():
    assert flashattn.binding() in ("extension", "ctypes")
    assert (flashattn.binding() == "ctypes") == bool(flashattn.binding_reason())


def _calls(q, k, v, kc, vc, kn, vn, seqlens, table):
    out = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(9, -1), softcap=3.0)
    o2, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
    dq, dk, dv = flashattn.attention_backward(o2, q, k, v, o2, lse)
    dec = flashattn.flash_attn_with_kvcache(q[:, :2], kc, vc, kn, vn, cache_seqlens=seqlens,
                                            block_table=table, causal=True)
    return [out, o2, lse, dq, dk, dv, dec, kc]


@needs_ext
def test_extension_and_ctypes_agree(rng, monkeypatch):
    case = Case(b=2, sq=21, sk=37, hq=4, hkv=2, d=32)
    q, k, v, *_ = inputs(case, rng)
    pool = rng.standard_normal((12, 16, 2, 32)).astype(np.float32)
    table = rng.permutation(12)[:8].reshape(2, 4).astype(np.int32)
    kn = rng.standard_normal((2, 2, 2, 32)).astype(np.float32)
    seqlens = np.array([5, 40], np.int32)
    ext = _calls(q, k, v, pool.copy(), pool.copy(), kn, kn, seqlens, table)
    sel = flashattn.last_selection()
    monkeypatch.setattr(_native, "ext", None)
    ct = _calls(q, k, v, pool.copy(), pool.copy(), kn, kn, seqlens, table)
    assert flashattn.last_selection() == sel
    for i, (a, b) in enumerate(zip(ext, ct)):
        np.testing.assert_array_equal(a, b, err_msg=f"result {i}")


@needs_ext
def test_fast_path_declines_to_the_general_path(rng):
    """What the fast path does not take (Python lists, int64 index arrays, host slopes,
    non-native byte order) goes through the general path and gives the same bits."""
    case = Case(b=1, sq=9, sk=14, hq=4, hkv=2, d=16)
    q, k, v, *_ = inputs(case, rng)
    slopes = np.linspace(0.1, 0.8, 4).astype(np.float32)
    ref = flashattn.flash_attn_func(q, k, v, alibi_slopes=slopes)
    assert _native.ext.fwd(q, k, v, None, None, False, None, False, (-1, -1), 0.0,
                           slopes.tolist(), None, None, None, None, True, None) is NotImplemented
    np.testing.assert_array_equal(flashattn.flash_attn_func(q, k, v, alibi_slopes=slopes.tolist()),
                                  ref)
    qb = q.astype(q.dtype.newbyteorder(">"))
    np.testing.assert_array_equal(flashattn.flash_attn_func(qb, k, v, alibi_slopes=slopes), ref)
    kc = rng.standard_normal((1, 20, 2, 16)).astype(np.float32)
    a = flashattn.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=np.array([13], np.int64))
    b = flashattn.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=13)
    np.testing.assert_array_equal(a, b)


def test_empty_and_errors_through_either_binding(rng, monkeypatch):
    for hide in (False, True):
        if hide:
            monkeypatch.setattr(_native, "ext", None)
        q = np.zeros((0, 5, 2, 8), F32)
        out, lse, _ = flashattn.flash_attn_func(q, q, q, return_attn_probs=True)
        assert out.shape == q.shape and lse.shape == (0, 2, 5)
        assert flashattn.last_selection() is None
        good = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
        with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_GQA"):
            kv = good[:, :, :1].repeat(3, 2)  # 3 kv heads for 2 query heads
            flashattn.flash_attn_func(good, kv, kv)
