"""CUDA graphs and the in-kernel index checks, on a GPU (skips elsewhere).

A call captured in a torch.cuda.CUDAGraph (global capture mode, which forbids host
synchronisation and allocations outside torch's pool) replays to the same results as the eager
call on the same inputs: forward, forward + backward, and KV-cache decoding (contiguous and
paged, with k/v appended). A bad cache_seqlens or block_table element is clamped by the kernels
and reported, without a synchronisation, by flashattn.check() or the next call."""

import pytest

import flashattn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def cuda_build():
    if not flashattn.has_cuda():
        pytest.skip("libflashattn was built without the CUDA backend")
    flashattn.check()  # no error left over from an earlier test


@pytest.fixture
def gen(seed):
    return torch.Generator(device="cuda").manual_seed(hash(seed) & 0xFFFFFFFF)


def randn(shape, gen, dtype=BF16):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def capture(fn):
    """fn() captured after a warm-up on a side stream, as torch.cuda.graphs asks."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = fn()
    return g, res


def test_forward_graph(gen):
    q, k, v = randn((2, 200, 8, 128), gen), randn((2, 333, 2, 128), gen), \
        randn((2, 333, 2, 128), gen)
    g, out = capture(lambda: flashattn.flash_attn_func(q, k, v, causal=True))
    for _ in range(2):  # new inputs in the captured buffers
        for x in (q, k, v):
            x.copy_(randn(x.shape, gen))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = flashattn.flash_attn_func(q, k, v, causal=True)
        assert torch.equal(out, ref)


def test_forward_backward_graph(gen):
    q = randn((1, 256, 4, 64), gen).requires_grad_()
    k = randn((1, 256, 4, 64), gen).requires_grad_()
    v = randn((1, 256, 4, 64), gen).requires_grad_()
    dout = randn((1, 256, 4, 64), gen)

    def step():
        for x in (q, k, v):
            x.grad = None
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        out.backward(dout)
        return out, q.grad, k.grad, v.grad

    g, (out, dq, dk, dv) = capture(step)
    with torch.no_grad():
        for x in (q, k, v, dout):
            x.copy_(randn(x.shape, gen))
    g.replay()
    torch.cuda.synchronize()
    got = [t.clone() for t in (out, dq, dk, dv)]
    qe, ke, ve = (x.detach().clone().requires_grad_() for x in (q, k, v))
    oe = flashattn.flash_attn_func(qe, ke, ve, causal=True, deterministic=False)
    oe.backward(dout)
    assert torch.equal(got[0], oe)
    # dq accumulates with atomics: the same values up to the order of the additions
    for a, b in zip(got[1:], (qe.grad, ke.grad, ve.grad)):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_graph_with_append(paged, gen):
    b, hq, hk, d, page = 3, 16, 4, 128, 64
    lens = torch.tensor([700, 0, 1500], dtype=torch.int32, device="cuda")
    q, kn, vn = randn((b, 1, hq, d), gen), randn((b, 1, hk, d), gen), randn((b, 1, hk, d), gen)
    if paged:
        npages, maxp = 96, 32
        kc, vc = randn((npages, page, hk, d), gen), randn((npages, page, hk, d), gen)
        table = torch.randperm(npages, device="cuda")[:b * maxp].view(b, maxp).int()
    else:
        kc, vc = randn((b, 2048, hk, d), gen), randn((b, 2048, hk, d), gen)
        table = None
    k0, v0 = kc.clone(), vc.clone()

    def call(kc, vc):
        return flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                                 block_table=table, causal=True)

    g, out = capture(lambda: call(kc, vc))
    q.copy_(randn(q.shape, gen))
    kn.copy_(randn(kn.shape, gen))
    out.fill_(float("nan"))
    kc.copy_(k0), vc.copy_(v0)
    g.replay()
    torch.cuda.synchronize()
    ke, ve = k0.clone(), v0.clone()
    ref = call(ke, ve)
    assert torch.equal(out, ref)
    assert torch.equal(kc, ke) and torch.equal(vc, ve)  # the same rows appended


def test_bad_cache_index_is_reported_without_sync(gen):
    b, hq, hk, d = 2, 8, 2, 64
    q = randn((b, 1, hq, d), gen)
    kc, vc = randn((b, 256, hk, d), gen), randn((b, 256, hk, d), gen)
    bad = torch.tensor([10, 300], dtype=torch.int32, device="cuda")  # 300 > the 256 rows
    flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=bad)  # no error yet: no sync
    torch.cuda.synchronize()
    with pytest.raises(flashattn.FlashAttnArgumentError, match=r"seqlens\[1\]") as e:
        flashattn.check()
    assert e.value.status_name == "FA_ERR_VARLEN"
    flashattn.check()  # cleared
    good = torch.tensor([10, 200], dtype=torch.int32, device="cuda")
    flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=bad)
    torch.cuda.synchronize()
    out = torch.full_like(q, float("nan"))
    # the next call raises the recorded error and writes nothing
    with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_VARLEN"):
        flashattn.attention_forward(q, kc, vc, out=out)
    assert torch.isnan(out).all()
    flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=good)
    torch.cuda.synchronize()
    flashattn.check()


def test_bad_block_table_entry_is_reported(gen):
    b, hq, hk, d, page = 2, 8, 2, 64, 16
    q = randn((b, 1, hq, d), gen)
    kc, vc = randn((20, page, hk, d), gen), randn((20, page, hk, d), gen)
    table = torch.arange(8, device="cuda", dtype=torch.int32).view(b, 4)
    table[1, 2] = 9999
    lens = torch.tensor([60, 60], dtype=torch.int32, device="cuda")
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    with pytest.raises(flashattn.FlashAttnArgumentError, match="block_table"):
        flashattn.check()


def test_sync_checks_fail_before_writing(gen):
    q = randn((2, 1, 8, 64), gen)
    kc, vc = randn((2, 256, 2, 64), gen), randn((2, 256, 2, 64), gen)
    bad = torch.tensor([-1, 5], dtype=torch.int32, device="cuda")
    old = flashattn.set_options(device_checks=True)
    try:
        with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_VARLEN"):
            flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=bad)
    finally:
        flashattn.set_options(device_checks="default" if old["device_checks"] is None
                              else old["device_checks"])
    flashattn.check()
