"""torch tensors on the CPU: forward, autograd through fa_bwd against the reference gradients,
packed functions, strides, and gradcheck through the library's float64 reference."""

import numpy as np
import pytest

import flashattn
from flashattn import _tensors
from harness import DTYPES, F32, Case, check_backward, check_forward, inputs, lib_kwargs, randn

torch = pytest.importorskip("torch")

TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}
if len(DTYPES) > 2:
    TORCH[DTYPES[2]] = torch.bfloat16


def to_torch(x, requires_grad=False):
    """A torch tensor with the values and the strides of x (gaps included)."""
    x = np.asarray(x)
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(TORCH[x.dtype])
    if not x.flags.c_contiguous:
        strides = [s // x.itemsize for s in x.strides]
        span = 1 + sum((n - 1) * s for n, s in zip(x.shape, strides))
        base = torch.full((span,), float("nan"), dtype=t.dtype)
        view = torch.as_strided(base, x.shape, strides)
        view.copy_(t)
        t = view
    return t.requires_grad_(requires_grad)


def to_np(t, dtype):
    return t.detach().float().numpy().astype(dtype)


CASES = [
    Case(b=2, sq=17, sk=23, hq=4, hkv=2, d=32),
    Case(sq=33, sk=17, hq=6, hkv=2, d=40, causal=True),
    Case(sq=19, sk=40, hq=2, hkv=1, window=(4, 2), softcap=2.0, alibi="head"),
    Case(b=2, sq=11, sk=11, d=64, causal=True, alibi="batch", scale=0.3),
    Case(b=2, sq=13, sk=21, hq=4, hkv=2, d=24, strided=True, causal=True),
    Case(lens_q=(5, 0, 12), lens_k=(9, 3, 12), hq=4, hkv=2, d=16, causal=True, alibi="head"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_autograd(case, dtype, rng, seed):
    case = Case(**{**case.__dict__, "dtype": dtype})
    q, k, v, slopes, cu_q, cu_k = inputs(case, rng)
    dout = randn(rng, q.shape, dtype)
    tq, tk, tv = (to_torch(x, True) for x in (q, k, v))
    if case.strided:  # the library reads the strided views as they are
        assert _tensors.TorchOps.prepare(tq) is tq and not tq.is_contiguous()
    ts = None if slopes is None else torch.from_numpy(slopes)
    kw = lib_kwargs(case, ts)
    if case.varlen:
        out, lse, probs = flashattn.flash_attn_varlen_func(
            tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k), max(case.lens_q),
            max(case.lens_k), return_attn_probs=True, **kw)
    else:
        out, lse, probs = flashattn.flash_attn_func(tq, tk, tv, return_attn_probs=True, **kw)
    assert probs is None and out.dtype == TORCH[np.dtype(dtype)] and lse.dtype == torch.float32
    assert out.requires_grad and not lse.requires_grad
    check_forward(case, seed, q, k, v, slopes, cu_q, cu_k, to_np(out, dtype), lse.numpy())
    (out * torch.from_numpy(dout.astype(np.float32)).to(out.dtype)).sum().backward()
    assert flashattn.last_selection().op == "bwd"
    check_backward(case, seed, q, k, v, dout, slopes, cu_q, cu_k,
                   *(to_np(t.grad, dtype) for t in (tq, tk, tv)))


def test_torch_matches_numpy_path(rng):
    case = Case(b=2, sq=9, sk=12, hq=4, hkv=1, d=16, causal=True)
    q, k, v, *_ = inputs(case, rng)
    a = flashattn.flash_attn_func(q, k, v, causal=True)
    b = flashattn.flash_attn_func(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    np.testing.assert_array_equal(a, b.numpy())


def _grads(fn, *tensors):
    for t in tensors:
        t.grad = None
    out = fn(*tensors)
    out.sum().backward()  # the upstream gradient is an expanded tensor with zero strides
    return out.detach(), [t.grad.clone() for t in tensors]


def test_qkvpacked_grads_are_packed_and_equal_unpacked(rng):
    qkv = torch.from_numpy(randn(rng, (2, 14, 3, 2, 16), F32)).requires_grad_()
    out_p, (g,) = _grads(lambda x: flashattn.flash_attn_qkvpacked_func(x, causal=True), qkv)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    out_u, gs = _grads(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=True), q, k, v)
    torch.testing.assert_close(out_p, out_u, rtol=0, atol=0)
    torch.testing.assert_close(g, torch.stack(gs, dim=2), rtol=0, atol=0)


def test_kvpacked_and_varlen_packed(rng):
    q = torch.from_numpy(randn(rng, (2, 5, 4, 8), F32)).requires_grad_()
    kv = torch.from_numpy(randn(rng, (2, 9, 2, 2, 8), F32)).requires_grad_()
    out, (gq, gkv) = _grads(lambda a, b: flashattn.flash_attn_kvpacked_func(a, b), q, kv)
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    q2 = q.detach().clone().requires_grad_()
    out2, (gq2, gk, gv) = _grads(lambda a, b, c: flashattn.flash_attn_func(a, b, c), q2, k, v)
    torch.testing.assert_close(out, out2, rtol=0, atol=0)
    torch.testing.assert_close(gkv, torch.stack([gk, gv], dim=2), rtol=0, atol=0)

    cu = torch.tensor([0, 6, 6, 15], dtype=torch.int32)
    qkv = torch.from_numpy(randn(rng, (15, 3, 2, 8), F32)).requires_grad_()
    out, (g,) = _grads(lambda x: flashattn.flash_attn_varlen_qkvpacked_func(x, cu, 9, causal=True),
                       qkv)
    parts = [qkv.detach()[:, i].clone().requires_grad_() for i in range(3)]
    out2, gs = _grads(lambda a, b, c: flashattn.flash_attn_varlen_func(a, b, c, cu, cu, 9, 9,
                                                                       causal=True), *parts)
    torch.testing.assert_close(out, out2, rtol=0, atol=0)
    torch.testing.assert_close(g, torch.stack(gs, dim=1), rtol=0, atol=0)

    qv = torch.from_numpy(randn(rng, (15, 2, 8), F32)).requires_grad_()
    kvv = torch.from_numpy(randn(rng, (10, 2, 1, 8), F32)).requires_grad_()
    cuk = torch.tensor([0, 4, 4, 10], dtype=torch.int32)
    out, (gq, gkv) = _grads(lambda a, b: flashattn.flash_attn_varlen_kvpacked_func(
        a, b, cu, cuk, 9, 6), qv, kvv)
    assert gq.shape == qv.shape and gkv.shape == kvv.shape and torch.isfinite(gkv).all()


def test_strides_pass_through_and_last_dim_copy(rng):
    x = torch.from_numpy(randn(rng, (2, 4, 10, 16), F32))   # (b, h, s, d)
    q = x.transpose(1, 2)                                    # (b, s, h, d), permuted strides
    assert _tensors.TorchOps.prepare(q) is q
    k = torch.from_numpy(randn(rng, (2, 16, 10, 4), F32)).permute(0, 2, 3, 1)  # last dim strided
    assert k.stride(-1) != 1 and _tensors.TorchOps.prepare(k) is not k
    v = torch.from_numpy(randn(rng, (2, 10, 4, 16), F32))
    out = flashattn.flash_attn_func(q, k, v)
    ref = flashattn.flash_attn_func(q.contiguous(), k.contiguous(), v)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # gradients flow back through the copy to the strided leaf
    k.requires_grad_()
    flashattn.flash_attn_func(q, k, v).sum().backward()
    assert k.grad.shape == k.shape and torch.isfinite(k.grad).all()


def test_output_strided_like_q(rng):
    """out is empty_like(q), as flash_attn allocates it: a permuted q gives a permuted out; a q
    whose last dimension is strided gives a contiguous one; values as from contiguous inputs."""
    x = torch.from_numpy(randn(rng, (2, 4, 10, 16), F32))
    q = x.transpose(1, 2)                                    # (b, s, h, d) over (b, h, s, d)
    k, v = (torch.from_numpy(randn(rng, (2, 10, 4, 16), F32)) for _ in range(2))
    with torch.no_grad():
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        ref = flashattn.flash_attn_func(q.contiguous(), k, v, causal=True)
        assert out.stride() == q.stride() and ref.is_contiguous()
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        q2 = torch.from_numpy(randn(rng, (2, 16, 4, 10), F32)).permute(0, 3, 2, 1)
        assert q2.stride(-1) != 1
        out2 = flashattn.flash_attn_func(q2, k, v)
        assert out2.is_contiguous()
        torch.testing.assert_close(out2, flashattn.flash_attn_func(q2.contiguous(), k, v),
                                   rtol=0, atol=0)


def test_no_grad_and_inference_mode(rng):
    q, k, v = (torch.from_numpy(randn(rng, (1, 6, 2, 8), F32)).requires_grad_() for _ in range(3))
    with torch.no_grad():
        out = flashattn.flash_attn_func(q, k, v)
    assert not out.requires_grad
    with torch.inference_mode():
        out2 = flashattn.flash_attn_func(q.detach(), k.detach(), v.detach())
    torch.testing.assert_close(out, out2, rtol=0, atol=0)


def test_gradcheck_float64_through_naive(rng):
    """Finite differences against fa_bwd, in float64 through the library's naive reference."""
    shape_q, shape_k = (1, 4, 2, 6), (1, 5, 1, 6)
    q = torch.from_numpy(rng.standard_normal(shape_q)).requires_grad_()
    k = torch.from_numpy(rng.standard_normal(shape_k)).requires_grad_()
    v = torch.from_numpy(rng.standard_normal(shape_k)).requires_grad_()
    slopes = torch.tensor([0.3, 0.7], dtype=torch.float32)
    old = flashattn.set_options(algo="naive")
    try:
        assert torch.autograd.gradcheck(
            lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=True, softcap=1.5,
                                                      alibi_slopes=slopes, window_size=(2, -1)),
            (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)
    finally:
        flashattn.set_options(**old)


def test_empty_inputs(rng):
    q = torch.zeros(0, 5, 2, 8, requires_grad=True)
    k = torch.zeros(0, 7, 2, 8, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert out.shape == (0, 5, 2, 8) and lse.shape == (0, 2, 5)
    out.sum().backward()
    assert q.grad.shape == q.shape
    q = torch.ones(1, 3, 2, 8, requires_grad=True)
    k = torch.ones(1, 0, 2, 8)
    out, lse, _ = flashattn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    out.sum().backward()
    assert (q.grad == 0).all()


def test_cuda_tensor_without_cuda_backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if flashattn.has_cuda():
        pytest.skip("library has the CUDA backend (see test_cuda.py)")
    q = torch.randn(1, 4, 2, 8, device="cuda")
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, q, q)
    assert e.value.status_name == "FA_ERR_NO_BACKEND"


def test_torch_errors():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(TypeError, match="mixed numpy arrays and torch tensors"):
        flashattn.flash_attn_func(q, q.numpy(), q)
    with pytest.raises(flashattn.FlashAttnArgumentError) as e:
        flashattn.flash_attn_func(q, q.half(), q.half())
    assert e.value.status_name == "FA_ERR_DTYPE"
    with pytest.raises(TypeError, match="unsupported torch dtype"):
        flashattn.flash_attn_func(q.int(), q, q)
    with pytest.raises(ValueError, match="flashattn takes CPU and CUDA tensors"):
        m = q.to("meta")
        flashattn.flash_attn_func(m, m, m)
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(q, q, q, dropout_p=1.5)
