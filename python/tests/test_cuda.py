"""torch CUDA tensors on a GPU (runs on the device; skips elsewhere): forward and backward
through autograd under the correctness rule (docs/architecture.md), with torch's
scaled_dot_product_attention in float64 as the reference and a plain implementation in the
tensors' precision as the baseline.
Also: the current stream is honoured, and a library without the CUDA backend says so."""

import numpy as np
import pytest

import flashattn
import reference as R

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
F = torch.nn.functional
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def need_backend():
    if not flashattn.has_cuda():
        pytest.skip("libflashattn was built without the CUDA backend")


def attention(q, k, v, causal, window, dtype):
    """BSHD attention, bottom-right aligned mask. float64: torch's SDPA (the reference).
    float16/bfloat16: a plain implementation (matmuls in dtype, softmax in fp32), the
    yardstick of the rule, as flash-attention's own tests use."""
    sq, sk, g = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    mask = torch.from_numpy(R.visible_mask(sq, sk, causal, window)).to(q.device)
    qt, kt, vt = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(g, dim=1), vt.repeat_interleave(g, dim=1)
    if dtype == torch.float64:
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    else:
        s = (qt @ kt.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        o = p.to(dtype) @ vt
    return o.transpose(1, 2)


def rule(name, got, base, ref, dtype, extra=0.0):
    got, base, ref = (x.detach().double() for x in (got, base, ref))
    k_err, b_err = (got - ref).abs(), (base - ref).abs()
    slack = 4 * UNIT[dtype] * max(1.0, ref.abs().max().item()) + extra
    ok_max = k_err.max().item() <= 2 * b_err.max().item() + slack
    ok_mean = k_err.mean().item() <= 2 * b_err.mean().item() + slack
    assert torch.isfinite(got).all() and ok_max and ok_mean, (
        f"{name}: flashattn max {k_err.max().item():.3g} mean {k_err.mean().item():.3g}, "
        f"plain max {b_err.max().item():.3g} mean {b_err.mean().item():.3g}, slack {slack:.3g}")


CASES = [  # b, sq, sk, hq, hkv, d, causal, window
    (2, 128, 128, 8, 8, 64, False, (-1, -1)),
    (2, 113, 257, 8, 2, 128, True, (-1, -1)),
    (1, 256, 256, 4, 1, 96, True, (32, -1)),
    (1, 64, 300, 4, 4, 256, False, (16, 16)),
    (3, 17, 17, 6, 2, 32, True, (-1, -1)),
    (1, 1, 513, 8, 2, 192, True, (-1, -1)),
    # head dims that are not multiples of 8: the backend copies the operands into zero-padded
    # buffers (src/cuda/pad.h) and runs the kernel of the next compiled size
    (2, 113, 130, 4, 2, 59, True, (-1, -1)),
    (1, 70, 200, 4, 1, 111, False, (32, 8)),
    (2, 40, 65, 2, 2, 217, True, (-1, -1)),
]


def padded_record(d):
    """The selection record of a padded call names the padding (kernel suffix and reason)."""
    sel = flashattn.last_selection()
    assert sel.backend == "cuda"
    if d % 8:
        assert sel.kernel.endswith(f"_pad{d}") and "zero-padded" in sel.reason, sel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_fwd_bwd_against_sdpa(case, dtype, seed):
    need_backend()
    b, sq, sk, hq, hkv, d, causal, window = case
    gen = torch.Generator(device="cuda").manual_seed(hash(seed) & 0xFFFFFFFF)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    q, k, v = rnd(b, sq, hq, d), rnd(b, sk, hkv, d), rnd(b, sk, hkv, d)
    dout = rnd(b, sq, hq, d)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse, _ = flashattn.flash_attn_func(*leaves, causal=causal, window_size=window,
                                            return_attn_probs=True)
    padded_record(d)
    out.backward(dout)
    padded_record(d)
    grads = [x.grad for x in leaves]

    results = {}
    for prec in (torch.float64, dtype):
        xs = [x.detach().to(prec).requires_grad_() for x in (q, k, v)]
        o = attention(*xs, causal, window, prec)
        o.backward(dout.to(prec))
        results[prec] = (o, *[x.grad for x in xs])
    ref, base = results[torch.float64], results[dtype]
    rule("out", out, base[0], ref[0], dtype)
    for name, got, bs, rf in zip(("dq", "dk", "dv"), grads, base[1:], ref[1:]):
        rule(name, got, bs, rf, dtype)

    # LSE against the float64 log-sum-exp of the masked scores
    qd, kd = q.double(), k.double().repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qd, kd) / d**0.5
    mask = torch.from_numpy(R.visible_mask(sq, sk, causal, window)).to("cuda")
    lse_ref = torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)
    fin = torch.isfinite(lse_ref)
    assert torch.equal(torch.isneginf(lse), ~fin)
    assert (lse[fin].double() - lse_ref[fin]).abs().max().item() < 1e-3


def test_current_stream_is_used(seed):
    need_backend()
    q = torch.randn(2, 200, 4, 64, device="cuda", dtype=torch.float16)
    ref = flashattn.flash_attn_func(q, q, q, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flashattn.flash_attn_func(q, q, q, causal=True)
    side.synchronize()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # queued behind a sleep on the side stream: not run while only the default stream is done
    out = torch.full_like(q, float("nan"))
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock cycles
        flashattn.attention_forward(q, q, q, causal=True, out=out, return_lse=False)
    torch.cuda.current_stream().synchronize()
    if not side.query():  # the sleep still runs: our kernel must still wait behind it
        assert torch.isnan(out).all()
    side.synchronize()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    if flashattn.binding() == "ctypes":  # its contexts are per stream
        from flashattn import _context
        keys = list(_context._tls.contexts)
        assert any(key[2] == side.cuda_stream for key in keys), keys


def test_varlen_against_per_sequence_sdpa():
    need_backend()
    lens_q, lens_k = [37, 0, 128], [64, 5, 128]
    hq, hkv, d, dt = 8, 2, 128, torch.bfloat16
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, device="cuda", dtype=dt)
    k = torch.randn(sum(lens_k), hkv, d, device="cuda", dtype=dt)
    v = torch.randn(sum(lens_k), hkv, d, device="cuda", dtype=dt)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                           causal=True)
    for bi in range(3):
        qs, ks = slice(cu_q[bi], cu_q[bi + 1]), slice(cu_k[bi], cu_k[bi + 1])
        if lens_q[bi] == 0:
            continue
        ref = attention(q[None, qs], k[None, ks], v[None, ks], True, (-1, -1), torch.float64)[0]
        base = attention(q[None, qs], k[None, ks], v[None, ks], True, (-1, -1), dt)[0]
        rule(f"out seq {bi}", out[qs], base, ref, dt)


@pytest.mark.parametrize("d", [1, 59, 217])
def test_odd_head_dim_packed_and_kvcache(d, seed):
    """Packed qkv of an odd head dim has rows that are not 16-byte aligned: the padded path
    reads them as they are, so the forward equals the one of contiguous copies bit for bit and
    the packed gradient matches theirs under the rule; the KV-cache path runs such a head dim
    on zero-padded copies too (src/cuda/pad_kv.h): the append lands bit for bit in the
    caller's cache (nothing else of it changes) and out passes the rule."""
    need_backend()
    dt = torch.float16
    gen = torch.Generator(device="cuda").manual_seed(hash(seed) & 0xFFFFFFFF)
    qkv = torch.randn(2, 77, 3, 4, d, device="cuda", generator=gen).to(dt)
    packed = qkv.clone().requires_grad_()
    out = flashattn.flash_attn_qkvpacked_func(packed, causal=True)
    padded_record(d)
    q, k, v = (qkv[:, :, i].contiguous() for i in range(3))
    assert torch.equal(out, flashattn.flash_attn_func(q, k, v, causal=True))
    dout = torch.randn(out.shape, device="cuda", generator=gen).to(dt)
    out.backward(dout)
    padded_record(d)
    xs = [x.double().requires_grad_() for x in (q, k, v)]
    attention(*xs, True, (-1, -1), torch.float64).backward(dout.double())
    ys = [x.clone().requires_grad_() for x in (q, k, v)]
    attention(*ys, True, (-1, -1), dt).backward(dout)
    for i, name in enumerate(("dq", "dk", "dv")):
        rule(name, packed.grad[:, :, i], ys[i].grad, xs[i].grad, dt)
    ck, cv = (torch.randn(2, 64, 4, d, device="cuda", generator=gen).to(dt) for _ in range(2))
    kn, vn = (torch.randn(2, 3, 4, d, device="cuda", generator=gen).to(dt) for _ in range(2))
    kc, vc = ck.clone(), cv.clone()
    out = flashattn.flash_attn_with_kvcache(q[:, :3], kc, vc, kn, vn, cache_seqlens=10,
                                            causal=True)
    padded_record(d)
    ck[:, 10:13], cv[:, 10:13] = kn, vn
    assert torch.equal(bits16(kc), bits16(ck)) and torch.equal(bits16(vc), bits16(cv))
    keys = [x[:, :13] for x in (ck, cv)]
    ref = attention(q[:, :3].double(), *(x.double() for x in keys), True, (-1, -1),
                    torch.float64)
    rule("kvcache out", out, attention(q[:, :3], *keys, True, (-1, -1), dt), ref, dt)


def test_without_cuda_backend_the_error_says_so():
    if flashattn.has_cuda():
        pytest.skip("library has the CUDA backend")
    q = torch.randn(1, 4, 2, 8, device="cuda")
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, q, q)
    assert e.value.status_name == "FA_ERR_NO_BACKEND"


# ---- KV cache (paged, torch CUDA tensors) ----

def paged_cache(gen, dtype, lens, new, hk, d, page):
    """A shuffled page pool: random rows for the first lens[b] tokens of each sequence, NaN in
    every other row (reading one would show). Returns pool_k, pool_v, block_table (CUDA int32)."""
    b = len(lens)
    max_pages = -(-(max(lens) + new + 5) // page)
    num_pages = b * max_pages + 3
    order = torch.randperm(num_pages, generator=gen, device="cuda")
    table = order[:b * max_pages].view(b, max_pages).to(torch.int32)
    pools = []
    for _ in range(2):
        pool = torch.full((num_pages, page, hk, d), float("nan"), device="cuda", dtype=dtype)
        for i, n in enumerate(lens):
            t = torch.arange(n, device="cuda")
            pool[table[i, t // page].long(), t % page] = torch.randn(
                n, hk, d, device="cuda", generator=gen).to(dtype)
        pools.append(pool)
    return pools[0], pools[1], table


def gather(pool, table, n, b, page):
    t = torch.arange(n, device="cuda")
    return pool[table[b, t // page].long(), t % page]


def bits16(x):
    return x.contiguous().view(torch.int16)


KV_CASES = [  # lens, sq, new, hq, hk, d, page, causal, window
    ([0, 1, 63, 300], 1, 1, 8, 2, 128, 16, False, (-1, -1)),
    ([15, 64, 129, 1000], 4, 4, 8, 1, 64, 64, True, (-1, -1)),
    ([0, 5, 129, 700], 2, 0, 4, 4, 256, 16, True, (100, 0)),
    # head dims that are not multiples of 8: the pages gathered into zero-padded copies and
    # the appended rows copied back through block_table (src/cuda/pad_kv.h)
    ([3, 60, 200], 2, 2, 6, 2, 59, 16, True, (-1, -1)),
    ([0, 17, 300, 33], 1, 1, 8, 1, 217, 64, False, (-1, -1)),
    ([1, 90], 3, 3, 4, 4, 111, 16, True, (32, 0)),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", KV_CASES, ids=[str(c[:3] + c[6:7]) for c in KV_CASES])
def test_kvcache_paged(case, dtype, seed):
    """flash_attn_with_kvcache on a paged cache with device seqlens/block_table: the append
    (bit for bit, pages crossed, on a side stream) and the attention under the rule against
    float64 SDPA of the gathered sequence, for num_splits 0, 1 and 3 and with device checks
    off; every variant agrees with the others."""
    need_backend()
    lens, sq, new, hq, hk, d, page, causal, window = case
    gen = torch.Generator(device="cuda").manual_seed(hash(seed) & 0xFFFFFFFF)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    b = len(lens)
    pool_k, pool_v, table = paged_cache(gen, dtype, lens, new, hk, d, page)
    q = rnd(b, sq, hq, d)
    kn, vn = (rnd(b, new, hk, d), rnd(b, new, hk, d)) if new else (None, None)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")

    # expected cache, and the reference per sequence
    exp_k, exp_v = pool_k.clone(), pool_v.clone()
    for i, n in enumerate(lens):
        t = torch.arange(n, n + new, device="cuda")
        if new:
            exp_k[table[i, t // page].long(), t % page] = kn[i]
            exp_v[table[i, t // page].long(), t % page] = vn[i]
    ref_out, base_out, ref_lse = [], [], []
    for i, n in enumerate(lens):
        K, V = gather(exp_k, table, n + new, i, page), gather(exp_v, table, n + new, i, page)
        if n + new == 0:  # no key: out 0, lse -inf
            ref_out.append(torch.zeros(1, sq, hq, d, device="cuda", dtype=torch.float64))
            base_out.append(ref_out[-1])
            ref_lse.append(torch.full((hq, sq), float("-inf"), device="cuda",
                                      dtype=torch.float64))
            continue
        ref_out.append(attention(q[i:i + 1], K[None], V[None], causal, window, torch.float64))
        base_out.append(attention(q[i:i + 1], K[None], V[None], causal, window, dtype))
        s = torch.einsum("ihd,jhd->hij", q[i].double(),
                         K.double().repeat_interleave(hq // hk, dim=1)) / d**0.5
        mask = torch.from_numpy(R.visible_mask(sq, n + new, causal, window)).to("cuda")
        ref_lse.append(torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1))
    ref_out, base_out, ref_lse = torch.cat(ref_out), torch.cat(base_out), torch.stack(ref_lse)

    side = torch.cuda.Stream()
    results = []
    for splits, checks in ((0, True), (1, True), (3, True), (0, False), (3, False)):
        pk, pv = pool_k.clone(), pool_v.clone()
        flashattn.set_options(device_checks=checks)
        try:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out, lse = flashattn.flash_attn_with_kvcache(
                    q, pk, pv, kn, vn, cache_seqlens=seqlens, block_table=table, causal=causal,
                    window_size=window, num_splits=splits, return_softmax_lse=True)
            sel = flashattn.last_selection()
            side.synchronize()
        finally:
            flashattn.set_options(device_checks="default")
        tag = f"{case} splits {splits} checks {checks}"
        assert sel.backend == "cuda", sel
        if splits:
            assert sel.num_splits == splits, (tag, sel)
        if d % 8:  # the padded copies, named in the record
            assert sel.kernel.endswith(f"_paged_pad{d}") and "zero-padded" in sel.reason, sel
        else:
            assert sel.reason == "", (tag, sel)  # both check modes run the preferred kernel
        assert torch.equal(bits16(pk), bits16(exp_k)), tag
        assert torch.equal(bits16(pv), bits16(exp_v)), tag
        rule(f"out [{tag}]", torch.nan_to_num(out.float(), nan=1e9), base_out, ref_out, dtype)
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(lse), ~fin), tag
        assert (lse[fin].double() - ref_lse[fin]).abs().max().item() < 1e-3, tag
        results.append(out)
    for out in results[1:]:
        rule("splits agree", out, results[0], ref_out, dtype)
    if flashattn.binding() == "ctypes":  # its contexts are per stream
        from flashattn import _context
        assert any(key[2] == side.cuda_stream for key in _context._tls.contexts)


def test_kvcache_device_check_errors_and_merge():
    """A bad block_table or seqlens on the device is FA_ERR_VARLEN with nothing written (device
    checks on); merge_attn on CUDA tensors recombines two halves of the cache."""
    need_backend()
    flashattn.set_options(device_checks=True)  # whatever FLASHATTN_DEVICE_CHECKS says
    try:
        _kvcache_errors_and_merge()
    finally:
        flashattn.set_options(device_checks="default")


def _kvcache_errors_and_merge():
    gen = torch.Generator(device="cuda").manual_seed(7)
    dt, hq, hk, d, page = torch.bfloat16, 4, 2, 64, 16
    pool_k, pool_v, table = paged_cache(gen, dt, [40, 20], 2, hk, d, page)
    q = torch.randn(2, 1, hq, d, device="cuda", generator=gen).to(dt)
    kn = torch.randn(2, 2, hk, d, device="cuda", generator=gen).to(dt)
    seqlens = torch.tensor([40, 20], dtype=torch.int32, device="cuda")
    bad = table.clone()
    bad[1, 1] = pool_k.shape[0]
    before = bits16(pool_k).clone()
    for kw, frag in ((dict(cache_seqlens=seqlens, block_table=bad), "outside the pool"),
                     (dict(cache_seqlens=seqlens + 1000, block_table=table),
                      "row of cache->block_table maps")):
        with pytest.raises(flashattn.FlashAttnError) as e:
            flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, kn, kn, **kw)
        assert e.value.status_name == "FA_ERR_VARLEN" and frag in e.value.message, str(e.value)
    assert torch.equal(bits16(pool_k), before)

    # keys [0, 16) and [16, 40) of sequence 0 / [0, 16) and [16, 20) of sequence 1 as two
    # calls (the second through a table shifted by one page), merged
    one = torch.ones(2, dtype=torch.int32, device="cuda")
    full, full_lse = flashattn.flash_attn_with_kvcache(
        q, pool_k, pool_v, cache_seqlens=seqlens, block_table=table, return_softmax_lse=True)
    o1, l1 = flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=16 * one,
                                               block_table=table, return_softmax_lse=True)
    o2, l2 = flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=seqlens - 16,
                                               block_table=table[:, 1:].contiguous(),
                                               return_softmax_lse=True)
    out, lse = flashattn.merge_attn([o1, o2], [l1, l2])
    assert flashattn.last_selection().op == "merge"
    assert (lse - full_lse).abs().max().item() < 1e-4
    # each of out, o1, o2 and full is rounded to bf16 once
    bound = 4 * 2.0**-8 * max(1.0, full.float().abs().max().item())
    assert (out.float() - full.float()).abs().max().item() <= bound


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("i", range(8), ids=lambda i: f"rot-case{i}")
def test_kvcache_rotary_and_leftpad(i, dtype, seed):
    """test_kvcache.py's rotary / left-padding cases on the GPU: q rotated into the workspace,
    k rotated as it is appended, keys from the pad on; against the same float64 reference."""
    need_backend()
    import test_kvcache as T
    np_dt = np.dtype(np.float16) if dtype == "float16" else R.BF16
    if np_dt is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    tdt = getattr(torch, dtype)

    def to(x):
        x = np.ascontiguousarray(x)
        if x.dtype == R.BF16:
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(x).cuda()

    def back(x):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(R.BF16)
        return x.numpy()

    assert tdt in (torch.float16, torch.bfloat16)
    T.rot_check(T.ROT_CASES[i], np_dt, np.random.default_rng(seed), seed, dev=(to, back))
    torch.cuda.synchronize()
    flashattn.check()


def test_kvcache_leftpad_device_checks():
    """A cache_leftpad past its sequence's length on the device: FA_ERR_VARLEN naming
    cache_leftpad with nothing written (device checks on); without them the call runs with the
    pad clamped and the next check() reports it."""
    need_backend()
    gen = torch.Generator(device="cuda").manual_seed(11)
    dt, hq, hk, d = torch.float16, 4, 2, 64
    kc = torch.randn(2, 32, hk, d, device="cuda", generator=gen).to(dt)
    vc = torch.randn(2, 32, hk, d, device="cuda", generator=gen).to(dt)
    q = torch.randn(2, 1, hq, d, device="cuda", generator=gen).to(dt)
    kn = torch.randn(2, 1, hk, d, device="cuda", generator=gen).to(dt)
    seqlens = torch.tensor([10, 5], dtype=torch.int32, device="cuda")
    pad = torch.tensor([3, 6], dtype=torch.int32, device="cuda")  # 6 > 5
    before = bits16(kc).clone()
    flashattn.set_options(device_checks=True)
    try:
        with pytest.raises(flashattn.FlashAttnError) as e:
            flashattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens,
                                              cache_leftpad=pad)
        assert e.value.status_name == "FA_ERR_VARLEN", str(e.value)
        assert "cache_leftpad[1] = 6" in e.value.message, str(e.value)
        assert torch.equal(bits16(kc), before)
    finally:
        flashattn.set_options(device_checks="default")
    flashattn.set_options(device_checks=False)
    try:
        flashattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens,
                                          cache_leftpad=pad)
        torch.cuda.synchronize()
        with pytest.raises(flashattn.FlashAttnError, match=r"cache_leftpad\[1\] = 6"):
            flashattn.check()
    finally:
        flashattn.set_options(device_checks="default")


# A thread's contexts outlive it: a Python thread that called us exits mid-program, torch's
# autograd thread (which ran the backward) at process exit. Neither may crash the process
# (before the extension deferred their destruction to a live thread, both did: the CUDA
# runtime's per-thread state is gone when a thread-exit destructor runs; docs/perf/python_door.md P5).
_THREAD_EXIT = r"""
import sys, threading, torch, flashattn
def call():
    q = torch.randn(1, 80, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    o = flashattn.flash_attn_func(q, q, q, causal=True)
    o.sum().backward()
    torch.cuda.synchronize()
    return float(q.grad.abs().sum())
for _ in range(int(sys.argv[1])):
    t = threading.Thread(target=call)
    t.start()
    t.join()
print("main", call())  # the main thread's first call destroys the exited threads' contexts
"""


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_exited_threads_and_process_exit_do_not_crash(threads):
    need_backend()
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _THREAD_EXIT, str(threads)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"exit code {r.returncode}\n{r.stderr[-3000:]}"
    assert r.stdout.startswith("main "), r.stdout
