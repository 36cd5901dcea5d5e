"""Issue 42's argument findings, through both bindings (the extension where it is built, and
ctypes with the extension hidden): integers that do not fit the C argument are refused, never
wrapped; the library's new rules (softmax_scale bound, ALiBi slopes, merge part LSEs, outputs
that alias, FA_ERR_BUSY) surface with their status; a missing softmax_lse is a clear error."""

import numpy as np
import pytest

import flashattn
from flashattn import FlashAttnArgumentError, FlashAttnError, _lib, _native

BINDINGS = ["extension", "ctypes"]


@pytest.fixture(params=BINDINGS)
def binding(request, monkeypatch):
    if request.param == "extension":
        if _native.ext is None:
            pytest.skip("flashattn._ext is not built")
    else:
        monkeypatch.setattr(_native, "ext", None)
    return request.param


def arr(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("window", [(2**70, 0), (2**64 - 1, -1), (0, 2**63), (-2**63 - 1, 0)])
def test_window_out_of_int64_is_refused(binding, rng, window):
    q = arr(rng, 1, 6, 2, 8)
    side = r"window_size\[0\]" if abs(window[0]) >= 2**63 - 1 else r"window_size\[1\]"
    with pytest.raises(OverflowError, match=rf"{side} = .* outside the 64-bit"):
        flashattn.flash_attn_func(q, q, q, window_size=window)
    with pytest.raises(OverflowError, match="64-bit"):
        flashattn.attention_backward(q, q, q, q, q, np.zeros((1, 2, 6), np.float32),
                                     window_size=window)


def test_window_at_int64_max_is_taken(binding, rng):
    q = arr(rng, 1, 6, 2, 8)
    a = flashattn.flash_attn_func(q, q, q, window_size=(2**63 - 1, 2**63 - 1))
    np.testing.assert_array_equal(a, flashattn.flash_attn_func(q, q, q))


@pytest.mark.parametrize("splits", [2**31, -2**31 - 1, 2**64])
def test_num_splits_out_of_int_is_refused(binding, rng, splits):
    q = arr(rng, 1, 1, 2, 8)
    kc = arr(rng, 1, 16, 2, 8)
    with pytest.raises(OverflowError, match="num_splits = .* 32-bit"):
        flashattn.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=9, num_splits=splits)


def test_kvcache_integers_out_of_int32_are_refused(binding, rng):
    q = arr(rng, 1, 1, 2, 8)
    kc = arr(rng, 1, 16, 2, 8)
    with pytest.raises(OverflowError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=2**32 + 5)


def test_max_seqlen_out_of_int64_is_refused(binding, rng):
    q = arr(rng, 8, 2, 8)
    with pytest.raises(OverflowError, match="max_seqlen_k"):
        flashattn.flash_attn_varlen_func(q, q, q, [0, 8], [0, 8], 8, 2**64 + 8)


def test_threads_out_of_int_is_refused():
    with pytest.raises(OverflowError, match="threads"):
        flashattn.set_options(threads=2**32)
    assert flashattn.get_options()["threads"] >= 0


def test_tiny_scale_and_softcap_do_not_become_the_default(binding, rng):
    q = arr(rng, 1, 4, 2, 8)
    with pytest.raises(ValueError, match="softmax_scale = .* rounds to 0"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=1e-50)
    with pytest.raises(ValueError, match="softcap = .* rounds to 0"):
        flashattn.flash_attn_func(q, q, q, softcap=1e-60)


def test_huge_scale_is_refused(binding, rng):
    """3e38 once gave NaN everywhere (scale * log2(e) overflowed fp32)."""
    q = arr(rng, 1, 4, 2, 8)
    with pytest.raises(FlashAttnArgumentError, match="FA_MAX_SOFTMAX_SCALE"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=3e38)
    z = np.zeros_like(q)
    out = flashattn.flash_attn_func(z, q, q, softmax_scale=2.0**126)  # the bound: finite
    np.testing.assert_allclose(out, np.broadcast_to(q.mean(1, keepdims=True), q.shape),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e20])
def test_bad_alibi_slope_is_refused(binding, rng, bad):
    q = arr(rng, 1, 4, 2, 8)
    slopes = np.array([0.5, bad], np.float32)
    with pytest.raises(FlashAttnArgumentError, match=r"alibi_slopes\[1\]"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=slopes)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_merge_part_lse_nan_or_inf_is_refused(binding, rng, bad):
    o = [arr(rng, 1, 3, 2, 8) for _ in range(2)]
    lse = [arr(rng, 1, 2, 3) for _ in range(2)]
    lse[1][0, 1, 2] = bad
    with pytest.raises(FlashAttnArgumentError, match=r"lse_parts\[1\]"):
        flashattn.merge_attn(o, lse)
    lse[1][0, 1, 2] = -np.inf  # an empty part: fine
    out, l = flashattn.merge_attn(o, lse)
    assert np.isfinite(out).all() and np.isfinite(l).all()


def test_output_that_aliases_itself_is_refused(binding, rng):
    q = arr(rng, 1, 4, 2, 8)
    buf = np.empty(64, np.float32)
    # heads 7 elements apart with 8 values each: element 7 of head 0 is element 0 of head 1
    out = np.lib.stride_tricks.as_strided(buf, (1, 4, 2, 8), (4 * 64, 4 * 14, 4 * 7, 4))
    with pytest.raises(FlashAttnArgumentError, match="share an address"):
        flashattn.attention_forward(q, q, q, out=out)


def test_lse_overlapping_out_is_refused(binding, rng):
    q = arr(rng, 1, 4, 2, 8)
    out = np.empty((1, 4, 2, 8), np.float32)
    lse = out.reshape(-1)[:8].reshape(1, 2, 4)
    with pytest.raises(FlashAttnArgumentError, match="overlaps output"):
        flashattn.attention_forward(q, q, q, out=out, softmax_lse=lse)


def test_packed_gradients_still_pass(binding, rng):
    q = arr(rng, 1, 5, 2, 8)
    out, lse = flashattn.attention_forward(q, q, q)
    packed = np.empty((1, 5, 3, 2, 8), np.float32)
    dq, dk, dv = flashattn.attention_backward(out, q, q, q, out, lse, dq=packed[:, :, 0],
                                              dk=packed[:, :, 1], dv=packed[:, :, 2])
    ref = flashattn.attention_backward(out, q, q, q, out, lse)
    for a, b in zip((dq, dk, dv), ref):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(FlashAttnArgumentError, match="share elements"):
        flashattn.attention_backward(out, q, q, q, out, lse, dq=packed[:, :, 0],
                                     dk=packed[:, :, 1], dv=packed[:, :, 1])


def test_backward_without_lse_is_a_clear_error(binding, rng):
    q = arr(rng, 1, 4, 2, 8)
    out, _ = flashattn.attention_forward(q, q, q)
    with pytest.raises(ValueError, match="softmax_lse is None"):
        flashattn.attention_backward(out, q, q, q, out, None)


def test_busy_status_is_known():
    assert _lib.STATUS_NAMES[17] == "FA_ERR_BUSY"
    assert 17 not in _lib.ARGUMENT_STATUSES  # a usage error of the machine, not an argument
    e = FlashAttnError(17, "in use")
    assert e.status_name == "FA_ERR_BUSY" and not isinstance(e, ValueError)
