"""Error paths: what the library rejects surfaces as FlashAttnError with its status and
message; what the Python layer rejects is a ValueError / TypeError / NotImplementedError."""

import numpy as np
import pytest

import flashattn
from flashattn import FlashAttnArgumentError, FlashAttnError


def arr(*shape, dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


Q, K = arr(2, 8, 4, 16), arr(2, 10, 2, 16)


def lib_error(status_name, fragment, fn, *args, **kw):
    with pytest.raises(FlashAttnError) as e:
        fn(*args, **kw)
    assert e.value.status_name == status_name, str(e.value)
    assert fragment in e.value.message, str(e.value)
    assert str(e.value).startswith(status_name)
    assert flashattn.last_selection() is None  # a failed call leaves no record
    return e.value


@pytest.mark.parametrize("fn,args", [
    (flashattn.flash_attn_func, (Q, K, K)),
    (flashattn.flash_attn_qkvpacked_func, (arr(1, 4, 3, 2, 8),)),
    (flashattn.flash_attn_kvpacked_func, (Q, arr(2, 10, 2, 2, 16))),
    (flashattn.flash_attn_varlen_func, (Q[0], K[0], K[0], [0, 8], [0, 10], 8, 10)),
    (flashattn.flash_attn_varlen_qkvpacked_func, (arr(4, 3, 2, 8), [0, 4], 4)),
    (flashattn.flash_attn_varlen_kvpacked_func, (Q[0], arr(10, 2, 2, 16), [0, 8], [0, 10], 8, 10)),
])
def test_dropout_runs_and_is_checked(fn, args):
    off = fn(*args, dropout_p=0.0)
    on = fn(*args, dropout_p=0.5, generator=7)  # the CPU backend drops (test_dropout.py)
    assert on.shape == off.shape and not np.array_equal(on, off)
    np.testing.assert_array_equal(on, fn(*args, dropout_p=0.5, generator=7))
    with pytest.raises(ValueError, match="dropout_p"):
        fn(*args, dropout_p=1.0)


def test_library_without_kvcache_entry_points(monkeypatch):
    """The ctypes binding: a libflashattn built before the KV-cache API loads; only the calls
    needing it fail."""
    from flashattn import _lib, _native
    monkeypatch.setattr(_native, "ext", None)
    monkeypatch.setattr(_lib, "has_symbol", lambda name: name not in _lib._OPTIONAL)
    kc = np.zeros((2, 10, 2, 16), np.float32)
    with pytest.raises(NotImplementedError, match="needs fa_fwd_kvcache, which .* lacks.*rebuild"):
        flashattn.flash_attn_with_kvcache(Q, kc, kc, cache_seqlens=np.array([4, 4], np.int32))
    with pytest.raises(NotImplementedError, match="needs fa_merge_attn"):
        flashattn.merge_attn([Q], [np.zeros((2, 4, 8), np.float32)])
    with pytest.raises(NotImplementedError, match="needs fa_context_set_device_checks"):
        flashattn.set_options(device_checks=False)
    flashattn.flash_attn_func(Q, K, K)  # the rest works


def test_status_exceptions_are_value_and_runtime_errors():
    e = lib_error("FA_ERR_DTYPE", "k is f16 but q is f32", flashattn.flash_attn_func,
                  Q, K.astype(np.float16), K)
    assert isinstance(e, FlashAttnArgumentError) and isinstance(e, ValueError)
    assert isinstance(e, RuntimeError) and e.status == 4


def test_shapes():
    lib_error("FA_ERR_SHAPE", "v->shape[1]", flashattn.flash_attn_func, Q, K, arr(2, 9, 2, 16))
    lib_error("FA_ERR_SHAPE", "head_dim of q (16) and k (8)", flashattn.flash_attn_func,
              Q, arr(2, 10, 2, 8), arr(2, 10, 2, 8))
    lib_error("FA_ERR_SHAPE", "batch of q (2) and k (3)", flashattn.flash_attn_func,
              Q, arr(3, 10, 2, 16), arr(3, 10, 2, 16))
    lib_error("FA_ERR_GQA", "heads_q = 4 is not a multiple of heads_kv = 3",
              flashattn.flash_attn_func, Q, arr(2, 10, 3, 16), arr(2, 10, 3, 16))
    lib_error("FA_ERR_HEAD_DIM", "head_dim = 300", flashattn.flash_attn_func,
              arr(1, 2, 1, 300), arr(1, 2, 1, 300), arr(1, 2, 1, 300))
    lib_error("FA_ERR_SHAPE", "shape[3] = 0", flashattn.flash_attn_func,
              arr(1, 2, 1, 0), arr(1, 2, 1, 0), arr(1, 2, 1, 0))
    with pytest.raises(ValueError, match="expected 4 dimensions"):
        flashattn.flash_attn_func(Q[0], K, K)
    with pytest.raises(ValueError, match="packed qkv"):
        flashattn.flash_attn_qkvpacked_func(arr(1, 4, 2, 2, 8))
    with pytest.raises(ValueError, match="packed kv"):
        flashattn.flash_attn_kvpacked_func(Q, arr(2, 10, 2, 16))


def test_dtypes():
    with pytest.raises(TypeError, match="unsupported numpy dtype int32"):
        flashattn.flash_attn_func(Q.astype(np.int32), K, K)
    with pytest.raises(TypeError, match="numpy arrays or torch tensors"):
        flashattn.flash_attn_func(Q.tolist(), K, K)
    lib_error("FA_ERR_DTYPE", "FA_ALGO_NAIVE", flashattn.flash_attn_func,
              Q.astype(np.float64), K.astype(np.float64), K.astype(np.float64))


def test_options():
    with pytest.raises(ValueError, match="softmax_scale = 0"):
        flashattn.flash_attn_func(Q, K, K, softmax_scale=0.0)
    lib_error("FA_ERR_INVALID_ARGUMENT", "softmax_scale", flashattn.flash_attn_func, Q, K, K,
              softmax_scale=-1.0)
    lib_error("FA_ERR_INVALID_ARGUMENT", "softcap", flashattn.flash_attn_func, Q, K, K,
              softcap=-1.0)
    lib_error("FA_ERR_INVALID_ARGUMENT", "window (-2, 0)", flashattn.flash_attn_func, Q, K, K,
              window_size=(-2, 0))
    with pytest.raises(ValueError, match="window_size"):
        flashattn.flash_attn_func(Q, K, K, window_size=3)
    with pytest.raises(ValueError, match=r"alibi_slopes has shape \(3,\)"):
        flashattn.flash_attn_func(Q, K, K, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"expected \(4,\) or \(2, 4\)"):
        flashattn.flash_attn_func(Q, K, K, alibi_slopes=np.ones((3, 4), np.float32))


def test_varlen():
    q, k = Q[0], K[0]  # 8 and 10 tokens
    f = flashattn.flash_attn_varlen_func
    lib_error("FA_ERR_VARLEN", "cu_seqlens_q[batch=2] = 7 but the tensors hold 8 tokens",
              f, q, k, k, [0, 3, 7], [0, 5, 10], 4, 5)
    lib_error("FA_ERR_VARLEN", "cu_seqlens_k decreases", f, q, k, k, [0, 3, 8], [0, 6, 5], 5, 6)
    lib_error("FA_ERR_VARLEN", "cu_seqlens_q[0] = 1", f, q, k, k, [1, 3, 8], [0, 5, 10], 5, 5)
    lib_error("FA_ERR_VARLEN", "max_seqlen_q/k = 2/5", f, q, k, k, [0, 3, 8], [0, 5, 10], 2, 5)
    with pytest.raises(ValueError, match="both hold batch"):
        f(q, k, k, [0, 3, 8], [0, 10], 5, 10)
    with pytest.raises(ValueError, match="batch >= 1"):
        f(q, k, k, [0], [0], 5, 10)
    with pytest.raises(TypeError, match="integers"):
        f(q, k, k, np.array([0.0, 8.0]), [0, 10], 8, 10)
    with pytest.raises(ValueError, match="both cu_seqlens_q and cu_seqlens_k"):
        flashattn.attention_forward(q, k, k, cu_seqlens_q=[0, 8])
    with pytest.raises(ValueError, match="expected 3 dimensions"):
        f(Q, K, K, [0, 8], [0, 10], 8, 10)


def test_backward_arguments():
    out, lse = flashattn.attention_forward(Q, K, K)
    lib_error("FA_ERR_DTYPE", "lse is f64, must be f32", flashattn.attention_backward,
              out, Q, K, K, out, lse.astype(np.float64))
    lib_error("FA_ERR_SHAPE", "lse must be [batch, heads_q, seqlen_q]",
              flashattn.attention_backward, out, Q, K, K, out, lse[:, :, :4])
    lib_error("FA_ERR_SHAPE", "dout->shape[1]", flashattn.attention_backward,
              out[:, :4], Q, K, K, out, lse)


def test_output_overlapping_input():
    q = Q.copy()
    lib_error("FA_ERR_INVALID_ARGUMENT", "output out overlaps input q",
              flashattn.attention_forward, q, K, K, out=q)


def test_output_with_unsupported_layout():
    out = np.empty((2, 8, 4, 32), np.float32)[..., ::2]  # last dim strided: cannot be copied
    lib_error("FA_ERR_STRIDE", "out->stride[3] = 2", flashattn.attention_forward, Q, K, K,
              out=out)
