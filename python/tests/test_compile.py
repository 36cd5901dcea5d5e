"""torch.compile, torch.export and the torch.library ops (flashattn_c::fwd, ::bwd,
::fwd_kvcache) behind them: a compiled model that calls the flash_attn functions has no graph
break (fullgraph=True) and gives the eager results; the ops pass torch.library.opcheck (schema,
fake tensors, autograd registration). CPU always (fp32), CUDA when present (bf16)."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import (flash_attn_func, flash_attn_qkvpacked_func,  # noqa: E402
                       flash_attn_varlen_func, flash_attn_with_kvcache)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and flashattn.has_cuda() else [])


def _dtype(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def _randn(shape, device, gen, requires_grad=False):
    x = torch.randn(shape, generator=gen, dtype=torch.float32).to(device, _dtype(device))
    return x.requires_grad_(requires_grad)


@pytest.fixture
def gen(seed):
    return torch.Generator().manual_seed(hash(seed) & 0xFFFFFFFF)


class Block(torch.nn.Module):
    """Attention the way a model writes it: projections, flash_attn_func, an output layer."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.hd).unbind(2)
        y = flash_attn_func(q, k, v, causal=True, window_size=(24, 0), softcap=30.0)
        return self.o(y.reshape(b, s, -1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_block_matches_eager(device, backend, gen):
    if backend == "inductor" and device == "cpu" and not hasattr(torch, "compile"):
        pytest.skip("no torch.compile")
    torch._dynamo.reset()
    model = Block(64, 4, 2).to(device, _dtype(device))
    x = _randn((2, 40, 64), device, gen, requires_grad=True)
    ref = model(x)
    ref.square().sum().backward()
    gx, gw = x.grad.clone(), model.q.weight.grad.clone()
    x.grad = None
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    out = compiled(x)
    out.square().sum().backward()
    tol = 1e-5 if device == "cpu" else 2e-2
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(x.grad, gx, rtol=tol, atol=tol)
    torch.testing.assert_close(model.q.weight.grad, gw, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_varlen_packed_and_kvcache(device, gen):
    """The other entry points compile with no graph break and give the eager results; the
    compiled KV-cache call appends into the caches as the eager one does."""
    torch._dynamo.reset()
    h, d = 4, 16
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32, device=device)
    qv, kv, vv = (_randn((30, h, d), device, gen) for _ in range(3))

    def varlen(q, k, v, cu):
        return flash_attn_varlen_func(q, k, v, cu, cu, 21, 21, causal=True)

    torch.testing.assert_close(torch.compile(varlen, fullgraph=True, backend="aot_eager")(
        qv, kv, vv, cu), varlen(qv, kv, vv, cu), rtol=0, atol=0)

    qkv = _randn((2, 20, 3, h, d), device, gen, requires_grad=True)
    packed = torch.compile(lambda t: flash_attn_qkvpacked_func(t, causal=True), fullgraph=True,
                           backend="aot_eager")
    out = packed(qkv)
    out.sum().backward()
    g = qkv.grad.clone()
    qkv.grad = None
    ref = flash_attn_qkvpacked_func(qkv, causal=True)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(g, qkv.grad, rtol=0, atol=0)

    b = 2
    kc, vc = _randn((b, 48, 2, d), device, gen), _randn((b, 48, 2, d), device, gen)
    kc2, vc2 = kc.clone(), vc.clone()
    seqlens = torch.tensor([5, 31], dtype=torch.int32, device=device)
    q1, kn, vn = _randn((b, 2, h, d), device, gen), _randn((b, 2, 2, d), device, gen), \
        _randn((b, 2, 2, d), device, gen)

    def decode(q, kc, vc, kn, vn, seqlens):
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True,
                                       return_softmax_lse=True)

    out, lse = torch.compile(decode, fullgraph=True, backend="aot_eager")(q1, kc, vc, kn, vn,
                                                                           seqlens)
    ref, ref_lse = decode(q1, kc2, vc2, kn, vn, seqlens)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    torch.testing.assert_close(kc, kc2, rtol=0, atol=0)
    torch.testing.assert_close(kc[1, 31:33], kn[1], rtol=0, atol=0)  # appended in place


def test_export_forward(gen):
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return flash_attn_func(q, k, v, causal=True)

    q, k, v = (_randn((1, 17, 4, 32), "cpu", gen) for _ in range(3))
    ep = torch.export.export(M(), (q, k, v))
    assert "flashattn_c.fwd" in ep.graph_module.code
    torch.testing.assert_close(ep.module()(q, k, v), M()(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, gen):
    """torch.library.opcheck: schema, fake implementations, autograd registration."""
    ops = torch.ops.flashattn_c
    q = _randn((2, 12, 4, 16), device, gen, requires_grad=True)
    k = _randn((2, 15, 2, 16), device, gen, requires_grad=True)
    v = _randn((2, 15, 2, 16), device, gen, requires_grad=True)
    args = (q, k, v, 0.25, True, -1, 0, 0.0, None, None, None, 0, 0, False)
    torch.library.opcheck(ops.fwd.default, args)
    out, lse = ops.fwd(*args)
    dout = _randn(out.shape, device, gen)
    torch.library.opcheck(ops.bwd.default, (dout, q.detach(), k.detach(), v.detach(),
                                            out.detach(), lse.detach(), 0.25, True, -1, 0, 0.0,
                                            None, None, None, 0, 0, False))
    kc, vc = _randn((2, 32, 2, 16), device, gen), _randn((2, 32, 2, 16), device, gen)
    seqlens = torch.tensor([3, 20], dtype=torch.int32, device=device)
    kn, vn = _randn((2, 1, 2, 16), device, gen), _randn((2, 1, 2, 16), device, gen)
    torch.library.opcheck(ops.fwd_kvcache.default,
                          (q.detach()[:, :1], kc, vc, kn, vn, seqlens, -1, None, None, 0.25,
                           True, -1, 0, 0.0, None, 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_compiled_kvcache_rotary_and_leftpad(device, interleaved, gen):
    """rotary_cos / rotary_sin / rotary_interleaved / cache_leftpad trace into the op (no graph
    break) and give the eager results bit for bit, caches included; the eager call is checked
    against the float64 reference in test_kvcache. The rotation must matter (a call without
    it differs), so a traced op that dropped the tables would fail."""
    torch._dynamo.reset()
    b, h, hk, d, rd, cap = 3, 4, 2, 16, 10, 37
    kc, vc = _randn((b, cap, hk, d), device, gen), _randn((b, cap, hk, d), device, gen)
    q, kn, vn = (_randn((b, 3, n, d), device, gen) for n in (h, hk, hk))
    ang = torch.rand((cap, rd // 2), generator=gen, dtype=torch.float32) * 6.0
    cos, sin = ang.cos().to(device, _dtype(device)), ang.sin().to(device, _dtype(device))
    seqlens = torch.tensor([5, 30, 11], dtype=torch.int32, device=device)
    pad = torch.tensor([2, 0, 11], dtype=torch.int32, device=device)

    def call(q, kc, vc, kn, vn, seqlens, cos, sin, pad):
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=seqlens, cache_leftpad=pad, causal=True,
                                       rotary_interleaved=interleaved, return_softmax_lse=True)

    kc2, vc2, kc3, vc3 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    out, lse = torch.compile(call, fullgraph=True, backend="aot_eager")(
        q, kc, vc, kn, vn, seqlens, cos, sin, pad)
    ref, ref_lse = call(q, kc2, vc2, kn, vn, seqlens, cos, sin, pad)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    torch.testing.assert_close(kc, kc2, rtol=0, atol=0)
    plain = flash_attn_with_kvcache(q, kc3, vc3, kn, vn, cache_seqlens=seqlens,
                                    cache_leftpad=pad, causal=True)
    assert (plain - out).abs().max() > 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_varlen_seqused_and_paged(device, gen):
    """flash_attn_varlen_func(seqused_q=, seqused_k=) and (block_table=, seqused_k=) trace into
    one op each call (flashattn_c::varlen_fa3: no graph break) and give the eager results, the
    seqused gradients too (flashattn_c::varlen_fa3_bwd); the eager calls are checked against the
    float64 reference in test_fa3. The used counts must matter (rows past seqused_q are 0, and
    a call without seqused_k differs), so an op that dropped them would fail."""
    torch._dynamo.reset()
    h, hk, d = 4, 2, 16
    tol = 0 if device == "cpu" else 2e-2  # CUDA dq sums by atomics: not bitwise repeatable
    i32 = dict(dtype=torch.int32, device=device)
    cu_q, cu_k = torch.tensor([0, 9, 9, 30], **i32), torch.tensor([0, 12, 20, 45], **i32)
    used_q, used_k = torch.tensor([7, 0, 21], **i32), torch.tensor([12, 3, 10], **i32)
    leaves = [_randn((30, h, d), device, gen, True)] + [
        _randn((45, hk, d), device, gen, True) for _ in range(2)]

    def seqused(q, k, v, cu_q, cu_k, uq, uk):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 21, 25, causal=True, seqused_q=uq,
                                      seqused_k=uk, return_attn_probs=True)[:2]

    compiled = torch.compile(seqused, fullgraph=True, backend="aot_eager")
    out, lse = compiled(*leaves, cu_q, cu_k, used_q, used_k)
    dout = _randn(out.shape, device, gen)
    got = torch.autograd.grad(out, leaves, dout)
    ref, ref_lse = seqused(*leaves, cu_q, cu_k, used_q, used_k)
    want = torch.autograd.grad(ref, leaves, dout)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    assert (out[7:9] == 0).all() and torch.isneginf(lse[:, 7:9]).all()
    assert got[1][15:20].abs().max() == 0  # keys past seqused_k have no gradient
    full = flash_attn_varlen_func(*leaves, cu_q, cu_k, 21, 25, causal=True)
    assert (full[:7] - out[:7]).abs().max() > 1e-3

    page, b = 16, 3
    pool_k, pool_v = (_randn((8, page, hk, d), device, gen) for _ in range(2))
    table = torch.tensor([[5, 2], [0, 7], [3, 1]], **i32)
    lens_k = torch.tensor([20, 3, 32], **i32)

    def paged(q, kc, vc, cu_q, table, uk):
        return flash_attn_varlen_func(q, kc, vc, cu_q, None, 21, causal=True,
                                      block_table=table, seqused_k=uk, return_attn_probs=True)

    q = leaves[0].detach()
    with torch.no_grad():
        out, lse, _ = torch.compile(paged, fullgraph=True, backend="aot_eager")(
            q, pool_k, pool_v, cu_q, table, lens_k)
        ref, ref_lse, _ = paged(q, pool_k, pool_v, cu_q, table, lens_k)
        fewer, _, _ = paged(q, pool_k, pool_v, cu_q, table, lens_k - 2)
    assert b == table.shape[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    assert (fewer - out).abs().max() > 1e-3
    with pytest.raises(RuntimeError, match="no backward"):
        torch.compile(paged, fullgraph=True, backend="aot_eager")(
            leaves[0], pool_k, pool_v, cu_q, table, lens_k)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_varlen_fa3(device, gen):
    """torch.library.opcheck of the seqused op and its backward registration."""
    ops = torch.ops.flashattn_c
    i32 = dict(dtype=torch.int32, device=device)
    cu_q, cu_k = torch.tensor([0, 5, 12], **i32), torch.tensor([0, 8, 20], **i32)
    q = _randn((12, 4, 16), device, gen, True)
    k, v = (_randn((20, 2, 16), device, gen, True) for _ in range(2))
    args = (q, k, v, cu_q, cu_k, 0, 0, torch.tensor([4, 7], **i32), torch.tensor([8, 6], **i32),
            None, 0.25, True, -1, 0, 0.0, None, False)
    torch.library.opcheck(ops.varlen_fa3.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_kvcache_paged(device, gen):
    """flash_attn_with_kvcache(block_table=) traces into flashattn_c::fwd_kvcache (no graph
    break): out, lse and the pool after the append equal the eager call's bit for bit, and the
    append lands on the pages the table names."""
    torch._dynamo.reset()
    h, hk, d, page = 4, 2, 16, 16
    pool_k, pool_v = (_randn((6, page, hk, d), device, gen) for _ in range(2))
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=device)
    seqlens = torch.tensor([15, 20], dtype=torch.int32, device=device)
    q, kn, vn = _randn((2, 2, h, d), device, gen), _randn((2, 2, hk, d), device, gen), \
        _randn((2, 2, hk, d), device, gen)

    def call(q, kc, vc, kn, vn, seqlens, table):
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens,
                                       block_table=table, causal=True, return_softmax_lse=True)

    kc, vc, kc2, vc2 = pool_k.clone(), pool_v.clone(), pool_k.clone(), pool_v.clone()
    out, lse = torch.compile(call, fullgraph=True, backend="aot_eager")(q, kc, vc, kn, vn,
                                                                        seqlens, table)
    ref, ref_lse = call(q, kc2, vc2, kn, vn, seqlens, table)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    torch.testing.assert_close(kc, kc2, rtol=0, atol=0)
    torch.testing.assert_close(kc[4, 15], kn[0, 0], rtol=0, atol=0)  # token 15: page 4, row 15
    torch.testing.assert_close(kc[1, 0], kn[0, 1], rtol=0, atol=0)   # token 16: page 1, row 0
    torch.testing.assert_close(vc[5, 4:6], vn[1], rtol=0, atol=0)    # tokens 20, 21 of seq 1
