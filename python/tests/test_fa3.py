"""FlashAttention-3's interface arguments (flash_attn_interface): seqused_q / seqused_k,
flash_attn_varlen_func(block_table=...) on a paged KV cache, flash_attn_combine, and the
hints (num_splits, pack_gqa, sm_margin) against the float64 reference with the 2x rule.
Unused rows and pages hold NaN (poison): a call that read them would fail. numpy on the CPU
always; torch on CUDA when present (test_*_torch)."""

import numpy as np
import pytest

import flashattn
from flashattn import flash_attn_combine, flash_attn_func, flash_attn_varlen_func
from reference import attention, check_rule
from harness import cu

H, HK, D = 4, 2, 24


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _check(name, out, lse, q, k, v, cq, ck, seed, **kw):
    ref = attention(q, k, v, cu_q=cq, cu_k=ck, **kw)
    base = attention(q, k, v, cu_q=cq, cu_k=ck, prec=np.float32, **kw)
    check_rule(name + " out", out, base["out"], ref["out"], np.float32, seed=seed)
    check_rule(name + " lse", lse, base["lse"], ref["lse"], np.float32, seed=seed)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 2))])
def test_seqused_against_reference(causal, window, rng, seed):
    span_q, span_k = [7, 0, 13, 5], [9, 4, 17, 1]
    used_q, used_k = [5, 0, 13, 2], [9, 3, 11, 0]
    cq, ck = cu(span_q), cu(span_k)
    q, k, v = _rand(rng, (cq[-1], H, D)), _rand(rng, (ck[-1], HK, D)), _rand(rng, (ck[-1], HK, D))
    rows_q = [cq[b] + j for b in range(4) for j in range(used_q[b])]
    rows_k = [ck[b] + j for b in range(4) for j in range(used_k[b])]
    unused_q = sorted(set(range(cq[-1])) - set(rows_q))
    unused_k = sorted(set(range(ck[-1])) - set(rows_k))
    q[unused_q], k[unused_k], v[unused_k] = np.nan, np.nan, np.nan  # never to be read
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cq, ck, 17, 17, causal=causal, window_size=window, return_attn_probs=True,
        seqused_q=np.array(used_q, np.int32), seqused_k=np.array(used_k, np.int32),
        num_splits=0, pack_gqa=True)
    assert np.all(out[unused_q] == 0) and np.all(lse[:, unused_q] == -np.inf)
    _check("seqused", out[rows_q], lse[:, rows_q], q[rows_q], k[rows_k], v[rows_k],
           cu(used_q), cu(used_k), seed, causal=causal, window=window)


def _paged(rng, lens, page, extra_pages=3):
    """A pool with the sequences' keys in shuffled pages, NaN in every row no sequence owns."""
    need = [-(-n // page) for n in lens]
    max_pages = max(need) + 1
    n_pages = sum(need) + extra_pages
    order = rng.permutation(n_pages)
    pool_k = np.full((n_pages, page, HK, D), np.nan, np.float32)
    pool_v = pool_k.copy()
    table = np.full((len(lens), max_pages), n_pages + 7, np.int32)  # unused entries: bad pages
    ks, vs, used = [], [], 0
    for b, n in enumerate(lens):
        kb, vb = _rand(rng, (n, HK, D)), _rand(rng, (n, HK, D))
        ks.append(kb)
        vs.append(vb)
        for p in range(need[b]):
            table[b, p] = order[used]
            rows = slice(p * page, min(n, (p + 1) * page))
            pool_k[order[used], :rows.stop - rows.start] = kb[rows]
            pool_v[order[used], :rows.stop - rows.start] = vb[rows]
            used += 1
    return pool_k, pool_v, table, np.concatenate(ks), np.concatenate(vs)


@pytest.mark.parametrize("page", [1, 3, 16])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (4, 0))])
def test_paged_varlen_against_reference(page, causal, window, rng, seed):
    lens_q, lens_k = [3, 0, 11, 1], [10, 5, 23, 1]
    pool_k, pool_v, table, k, v = _paged(rng, lens_k, page)
    cq, ck = cu(lens_q), cu(lens_k)
    q = _rand(rng, (cq[-1], H, D))
    slopes = rng.uniform(0.1, 0.9, H).astype(np.float32)
    for how in ("seqused_k", "cu_seqlens_k"):
        extra = ({"seqused_k": np.array(lens_k, np.int32)} if how == "seqused_k"
                 else {"cu_seqlens_k": ck})
        out, lse, _ = flash_attn_varlen_func(
            q, pool_k, pool_v, cq, max_seqlen_q=11, causal=causal, window_size=window,
            alibi_slopes=slopes, return_attn_probs=True, block_table=table, **extra)
        _check(f"paged varlen ({how})", out, lse, q, k, v, cq, ck, seed, causal=causal,
               window=window, alibi=slopes)


def test_paged_varlen_errors(rng):
    pool_k, pool_v, table, _, _ = _paged(rng, [4, 2], 2)
    q = _rand(rng, (3, H, D))
    with pytest.raises(ValueError, match="seqused_k .* or cu_seqlens_k"):
        flash_attn_varlen_func(q, pool_k, pool_v, cu([2, 1]), block_table=table)
    with pytest.raises(NotImplementedError, match="dropout_p > 0 with block_table"):
        flash_attn_varlen_func(q, pool_k, pool_v, cu([2, 1]), cu([4, 2]), 2, 4, 0.1,
                               block_table=table)
    with pytest.raises(ValueError, match=r"seqused_q\[1\] = 2 is outside 0..1"):
        flash_attn_varlen_func(q, pool_k, pool_v, cu([2, 1]), cu([4, 2]), 2, 4,
                               block_table=table, seqused_q=np.array([1, 2], np.int32))


@pytest.mark.parametrize("varlen", [False, True])
def test_combine_against_reference(varlen, rng, seed):
    b, sq, sk, splits = 2, 7, 29, 3
    q, k, v = _rand(rng, (b, sq, H, D)), _rand(rng, (b, sk, HK, D)), _rand(rng, (b, sk, HK, D))
    cuts = [0, 4, 4, sk]  # the second split is empty: lse -inf, no weight
    outs, lses = [], []
    for s in range(splits):
        lo, hi = cuts[s], cuts[s + 1]
        if hi > lo:
            o, l, _ = flash_attn_func(q, k[:, lo:hi], v[:, lo:hi], return_attn_probs=True)
        else:
            o, l = np.full(q.shape, np.nan, np.float32), np.full((b, H, sq), -np.inf, np.float32)
        outs.append(o.astype(np.float32))
        lses.append(l.transpose(0, 2, 1))  # FA3's (batch, seqlen, nheads)
    out_p, lse_p = np.stack(outs), np.ascontiguousarray(np.stack(lses))
    if varlen:
        out_p, lse_p = out_p.reshape(splits, b * sq, H, D), lse_p.reshape(splits, b * sq, H)
    buf = np.full(out_p.shape[1:], np.nan, np.float32)  # poisoned output buffer
    out, lse = flash_attn_combine(out_p, lse_p, out=buf)
    assert out is buf
    ref = attention(q, k, v)
    base = attention(q, k, v, prec=np.float32)
    got_lse = lse.reshape(b, sq, H).transpose(0, 2, 1) if varlen else lse.transpose(0, 2, 1)
    assert lse.shape == out_p.shape[1:-1]
    check_rule("combine out", out.reshape(b, sq, H, D), base["out"], ref["out"], np.float32,
               extra=1e-6, seed=seed)
    check_rule("combine lse", got_lse, base["lse"], ref["lse"], np.float32, extra=1e-6,
               seed=seed)
    out16, _ = flash_attn_combine(out_p, lse_p, out_dtype=np.float16)
    assert out16.dtype == np.float16


def test_hints_and_refusals(rng):
    q = _rand(rng, (1, 5, H, D))
    k = _rand(rng, (1, 6, HK, D))
    base = flash_attn_func(q, k, k)
    for kw in ({"num_splits": 0}, {"num_splits": 4}, {"pack_gqa": False}, {"sm_margin": 8}):
        np.testing.assert_array_equal(flash_attn_func(q, k, k, **kw), base)
    with pytest.raises(TypeError, match="pack_gqa"):
        flash_attn_func(q, k, k, pack_gqa="yes")
    with pytest.raises(NotImplementedError, match="qv="):
        flash_attn_func(q, k, k, qv=q)
    with pytest.raises(NotImplementedError, match="attention_chunk=8"):
        flash_attn_func(q, k, k, attention_chunk=8)
    with pytest.raises(NotImplementedError, match="scheduler_metadata"):
        flashattn.flash_attn_with_kvcache(q, k, k, scheduler_metadata=np.zeros(4, np.int32))


torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available() and flashattn.has_cuda()


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_fa3_paths_torch(device, rng, seed):
    """The paged varlen and seqused paths on torch tensors (CPU; CUDA when present) give the
    numpy results within the rounding of another kernel (fp32 on the CPU; on CUDA, which takes
    16-bit inputs, fp16 inputs, the numpy side computed from the same rounded values, and the
    output's fp16 rounding); seqused keeps autograd."""
    cuda = device == "cuda"
    dt = torch.float16 if cuda else torch.float32
    tol = dict(rtol=2e-3, atol=2e-3) if cuda else dict(rtol=1e-4, atol=1e-4)
    r16 = (lambda x: x.astype(np.float16).astype(np.float32)) if cuda else (lambda x: x)
    lens_q, lens_k = [3, 0, 11, 1], [10, 5, 23, 1]
    pool_k, pool_v, table, _, _ = _paged(rng, lens_k, 16)
    pool_k, pool_v = r16(pool_k), r16(pool_v)
    cq = cu(lens_q)
    q = r16(_rand(rng, (cq[-1], H, D)))
    ref = flash_attn_varlen_func(q, pool_k, pool_v, cq, causal=True, block_table=table,
                                 seqused_k=np.array(lens_k, np.int32))
    c = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(device)  # noqa: E731
    f = lambda x: c(x).to(dt)  # noqa: E731
    got = flash_attn_varlen_func(f(q), f(pool_k), f(pool_v), c(cq), causal=True,
                                 block_table=c(table), seqused_k=c(np.array(lens_k, np.int32)))
    np.testing.assert_allclose(got.float().cpu().numpy(), ref, **tol)
    k, v = r16(_rand(rng, (40, HK, D))), r16(_rand(rng, (40, HK, D)))
    ck, used = cu([10, 5, 23, 2]), np.array([7, 5, 0, 2], np.int32)
    ref = flash_attn_varlen_func(q, k, v, cq, ck, 11, 23, seqused_k=used)
    got = flash_attn_varlen_func(f(q), f(k), f(v), c(cq), c(ck), 11, 23, seqused_k=c(used))
    np.testing.assert_allclose(got.float().cpu().numpy(), ref, **tol)
    qt = f(q).requires_grad_(True)
    got = flash_attn_varlen_func(qt, f(k), f(v), c(cq), c(ck), 11, 23, seqused_k=c(used))
    got.sum().backward()
    assert qt.grad is not None and torch.isfinite(qt.grad).all()
    assert qt.grad[cq[2]:cq[3]].abs().sum() == 0  # sequence 2 uses no key
    assert qt.grad.abs().sum() > 0


def test_seqused_under_compile():
    """The seqused / paged paths size tensors from host reads: under tracing they run inside
    one op (flashattn_c::varlen_fa3; test_compile checks them further), equal to eager."""
    t = torch.randn((4, H, D))
    cq = torch.tensor([0, 4], dtype=torch.int32)
    torch._dynamo.reset()

    def call(q, cq):
        return flash_attn_varlen_func(q, q[:, :HK], q[:, :HK], cq, cq, 4, 4, seqused_k=cq[1:] - 1)

    got = torch.compile(call, fullgraph=True, backend="aot_eager")(t, cq)
    torch.testing.assert_close(got, call(t, cq), rtol=0, atol=0)
