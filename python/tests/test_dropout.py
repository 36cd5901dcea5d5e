"""Dropout through the package: forward and backward against a float64 torch reference
that applies the mask the call returns (return_attn_probs), seeds drawn from torch's and
numpy's generators, varlen, numpy, and the refusals; on CUDA tensors (skipped without a GPU)
the same against the reference under the 2x rule, the CUDA generator's seed and offset, and
the record. Run once per binding:
FLASHATTN_BINDING=ctypes selects the other one."""

import math

import numpy as np
import pytest

import flashattn

torch = pytest.importorskip("torch")


def _probs(q, k, causal):
    """softmax(scale q k^T + causal mask) in q's dtype, BSHD, GQA by repetition, (b, h, sq, sk);
    a row that sees no key (causal with sq > sk) is 0, as the library defines it."""
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, -math.inf)
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def reference(q, k, v, keep, p, causal):
    """float64 attention with dropout: softmax(scale q k^T + causal) * keep / (1 - p) @ v,
    BSHD, GQA by repetition; keep (batch, heads, sq, sk)."""
    q, k, v = (t.double() for t in (q, k, v))
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    pr = _probs(q, k, causal) * keep.double() / (1 - p)
    return torch.einsum("bhij,bjhd->bihd", pr, v)


def inputs(rng, b, sq, sk, hq, hkv, d):
    mk = lambda *s: torch.tensor(rng.standard_normal(s), dtype=torch.float32, requires_grad=True)
    return mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("causal", [False, True])
def test_against_reference(rng, p, causal):
    q, k, v = inputs(rng, 2, 37, 53, 4, 2, 32)
    out, lse, keep = flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                               return_attn_probs=True)
    assert "_dropout" in flashattn.last_selection().kernel
    assert keep.shape == (2, 4, 37, 53) and keep.dtype == torch.uint8
    dout = torch.tensor(rng.standard_normal(out.shape), dtype=torch.float32)
    out.backward(dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, keep, p, causal)
    ref.backward(dout.double())
    scale = 1 / (1 - p)
    torch.testing.assert_close(out.double(), ref, atol=2e-5 * scale, rtol=1e-4)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, atol=5e-5 * scale, rtol=1e-4)
    assert 0 < keep.float().mean().item() < 1
    # a mask that is not the call's (another seed) does not reproduce its output
    other = torch.from_numpy(flashattn.dropout_mask(1, 2, p, 2, 4, 37, 53))
    assert not torch.allclose(out.double(), reference(q64, k64, v64, other, p, causal),
                              atol=1e-3)


def test_torch_seed_repeatable(rng):
    q, k, v = inputs(rng, 1, 20, 24, 2, 2, 16)
    torch.manual_seed(5)
    a = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    b = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    c = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)  # the generator moved on
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(flashattn.flash_attn_func(q, k, v, dropout_p=0.5, generator=g1),
                       flashattn.flash_attn_func(q, k, v, dropout_p=0.5, generator=g2))


def test_int_seed_is_the_mask_seed(rng):
    q, k, v = inputs(rng, 2, 9, 30, 2, 1, 8)
    out, _, keep = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, generator=1234,
                                             return_attn_probs=True)
    want = flashattn.dropout_mask(1234, 0, 0.3, 2, 2, 9, 30)
    np.testing.assert_array_equal(keep.numpy(), want)
    # numpy inputs through attention_forward with the same triple: the same output
    o2, _ = flashattn.attention_forward(q.detach().numpy(), k.detach().numpy(),
                                        v.detach().numpy(), dropout=(0.3, 1234, 0))
    np.testing.assert_array_equal(out.detach().numpy(), o2)


def test_numpy_backward_takes_the_triple(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((1, 12, 2, 8), (1, 15, 2, 8), (1, 15, 2, 8)))
    dout = rng.standard_normal((1, 12, 2, 8)).astype(np.float32)
    drop = (0.4, 77, 3)
    out, lse = flashattn.attention_forward(q, k, v, causal=True, dropout=drop)
    dq, dk, dv = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True, dropout=drop)
    keep = torch.from_numpy(flashattn.dropout_mask(77, 3, 0.4, 1, 2, 12, 15))
    qt, kt, vt = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    ref = reference(qt, kt, vt, keep, 0.4, True)
    ref.backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(out, ref.detach().numpy(), atol=5e-5, rtol=1e-4)
    for got, want in ((dq, qt.grad), (dk, kt.grad), (dv, vt.grad)):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4)
    # without the triple the backward is another function: the gradient differs
    dq0, _, _ = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert not np.allclose(dq0, dq, atol=1e-3)


def test_varlen(rng):
    lens_q, lens_k = [5, 0, 11], [7, 3, 11]
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    q = torch.tensor(rng.standard_normal((sum(lens_q), 2, 16)), dtype=torch.float32)
    k = torch.tensor(rng.standard_normal((sum(lens_k), 2, 16)), dtype=torch.float32)
    v = torch.tensor(rng.standard_normal((sum(lens_k), 2, 16)), dtype=torch.float32)
    out, _, keep = flashattn.flash_attn_varlen_func(q, k, v, cq, ck, 11, 11, dropout_p=0.5,
                                                    causal=True, return_attn_probs=True)
    assert keep.shape == (3, 2, 11, 11)
    for b in range(3):
        if lens_q[b] == 0:
            continue
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ref = reference(q[None, qs], k[None, ks], v[None, ks],
                        keep[b:b + 1, :, :lens_q[b], :lens_k[b]], 0.5, True)
        torch.testing.assert_close(out[qs].double(), ref[0], atol=5e-5, rtol=1e-4)


def test_refusals(rng):
    q, k, v = inputs(rng, 1, 4, 4, 1, 1, 8)
    with pytest.raises(ValueError):
        flashattn.flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(TypeError):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.5, generator="seed")


# ---- CUDA ----

needs_gpu = pytest.mark.skipif(not (flashattn.has_cuda() and torch.cuda.is_available()),
                               reason="no CUDA backend or GPU")


def reference_low(q, k, v, keep, p, causal, dt=None):
    """reference() on the GPU; dt: the baseline, the same math with the probabilities rounded
    to the kernel's dtype before P V and fp32 elsewhere (the 2x rule's comparison point)."""
    if dt is None:
        return reference(q, k, v, keep, p, causal)
    qf, kf, vf = (t.float() for t in (q, k, v))
    vf = vf.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    pr = (_probs(qf, kf, causal) * keep.float() / (1 - p)).to(dt).float()
    return torch.einsum("bhij,bjhd->bihd", pr, vf).to(dt)


def within_2x(name, got, ref, base, slack):
    """|got - ref| <= 2 |base - ref| + slack, in max norm (the design's rule)."""
    e, b = (got.double() - ref).abs().max().item(), (base.double() - ref).abs().max().item()
    assert e <= 2 * b + slack, f"{name}: error {e:.3g}, baseline {b:.3g}, slack {slack:.3g}"


@needs_gpu
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 113, 157, 4, 2, 64), (1, 257, 131, 2, 1, 128)])
def test_cuda_against_reference(rng, dt, causal, shape):
    dt = getattr(torch, dt)
    b, sq, sk, hq, hkv, d = shape
    p = 0.17
    mk = lambda *s: torch.tensor(rng.standard_normal(s), dtype=dt, device="cuda",
                                 requires_grad=True)
    q, k, v = mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d)
    out, lse, keep = flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                               return_attn_probs=True)
    sel = flashattn.last_selection()
    assert sel.kernel.startswith("sm80_fwd") and "_dropout" in sel.kernel, sel.kernel
    assert keep.device == q.device and keep.shape == (b, hq, sq, sk)
    dout = torch.tensor(rng.standard_normal(out.shape), dtype=dt, device="cuda")
    out.backward(dout)
    assert "_dropout" in flashattn.last_selection().kernel
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, keep, p, causal)
    ref.backward(dout.double())
    qb, kb, vb = (t.detach().clone().requires_grad_() for t in (q, k, v))
    base = reference_low(qb, kb, vb, keep, p, causal, dt)
    base.backward(dout)
    within_2x("out", out, ref, base, 1e-3)
    for name, got, want, bg in (("dq", q.grad, q64.grad, qb.grad), ("dk", k.grad, k64.grad, kb.grad),
                                ("dv", v.grad, v64.grad, vb.grad)):
        within_2x(name, got, want, bg, 1e-3 * want.abs().max().item() + 1e-3)
    # a wrong mask must not pass: another seed's mask against the call's output
    other = torch.from_numpy(flashattn.dropout_mask(1, 2, p, b, hq, sq, sk)).cuda()
    wrong = reference(q64.detach(), k64.detach(), v64.detach(), other, p, causal)
    e_wrong = (out.double() - wrong).abs().max().item()
    e_base = (base.double() - ref).abs().max().item()
    assert e_wrong > 2 * e_base + 1e-3


@needs_gpu
def test_cuda_generator_seed_and_offset(rng):
    q, k, v = (torch.tensor(rng.standard_normal((1, 40, 2, 64)), dtype=torch.float16,
                            device="cuda") for _ in range(3))
    torch.cuda.manual_seed(5)
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    off0 = gen.get_offset()
    a = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    assert gen.get_offset() > off0  # the call took its slot of the CUDA generator
    torch.cuda.manual_seed(5)
    b = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    c = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)  # the offset moved on
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # the mask returned is the one of the CUDA generator's (seed, offset) at the call
    torch.cuda.manual_seed(6)
    seed, off = gen.initial_seed(), gen.get_offset()
    _, _, keep = flashattn.flash_attn_func(q, k, v, dropout_p=0.5, return_attn_probs=True)
    want = flashattn.dropout_mask(seed, off, 0.5, 1, 2, 40, 40)
    np.testing.assert_array_equal(keep.cpu().numpy(), want)


@needs_gpu
def test_cuda_varlen(rng):
    lens_q, lens_k = [5, 0, 131], [7, 3, 140]
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32, device="cuda")
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32, device="cuda")
    mk = lambda n: torch.tensor(rng.standard_normal((n, 2, 64)), dtype=torch.float16,
                                device="cuda", requires_grad=True)
    q, k, v = mk(sum(lens_q)), mk(sum(lens_k)), mk(sum(lens_k))
    out, _, keep = flashattn.flash_attn_varlen_func(q, k, v, cq, ck, 131, 140, dropout_p=0.3,
                                                    causal=True, return_attn_probs=True)
    assert keep.shape == (3, 2, 131, 140)
    dout = torch.tensor(rng.standard_normal(out.shape), dtype=torch.float16, device="cuda")
    out.backward(dout)
    for b in range(3):
        if lens_q[b] == 0:
            continue
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        kb = keep[b:b + 1, :, :lens_q[b], :lens_k[b]]
        q64, k64, v64 = (t.detach()[None, sl].double().requires_grad_()
                         for t, sl in ((q, qs), (k, ks), (v, ks)))
        ref = reference(q64, k64, v64, kb, 0.3, True)
        ref.backward(dout[None, qs].double())
        qb, kb16, vb = (t.detach()[None, sl].clone().requires_grad_()
                        for t, sl in ((q, qs), (k, ks), (v, ks)))
        base = reference_low(qb, kb16, vb, kb, 0.3, True, torch.float16)
        base.backward(dout[None, qs])
        within_2x(f"out[{b}]", out[None, qs], ref, base, 1e-3)
        for name, got, want, bg in (("dq", q.grad[None, qs], q64.grad, qb.grad),
                                    ("dk", k.grad[None, ks], k64.grad, kb16.grad),
                                    ("dv", v.grad[None, ks], v64.grad, vb.grad)):
            within_2x(f"{name}[{b}]", got, want, bg, 1e-3 * want.abs().max().item() + 1e-3)
