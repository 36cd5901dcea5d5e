"""FP8 inputs of the forward (float8_e4m3fn / float8_e5m2 with FlashAttention-3's q/k/v_descale)
and quantize_fp8, through the package (docs/fp8.md).

The reference is the float64 attention of the dequantised inputs (x8 as float64 times its
descale), so the correctness rule applies as for any dtype: the library's error against it at
most 2x that of a plain implementation in the output's precision (bf16 by default), plus the
slack. Descales are drawn from values with few significant bits (not 1), so that the
dequantised inputs are exact in float64 and in the baseline's arithmetic. Outputs given with
out= are poisoned (NaN) first: every element must be written.
"""

import numpy as np
import pytest

import flashattn
import reference as R
from flashattn import _native
from harness import BF16, cu

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

FP8 = {"e4m3": (torch.float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn), 448.0),
       "e5m2": (torch.float8_e5m2, np.dtype(ml_dtypes.float8_e5m2), 57344.0)}
DESCALES = np.array([0.25, 0.375, 0.5, 0.75, 1.5, 2.0, 3.0], np.float32)
needs_ext = pytest.mark.skipif(_native.ext is None, reason="the C extension is not built")


def fp8_numpy(rng, shape, fmt, mag=1.0):
    """N(0, mag^2) values rounded to the FP8 format (numpy, ml_dtypes)."""
    return (rng.standard_normal(shape) * mag).astype(np.float32).astype(FP8[fmt][1])


def descales(rng, batch, hk):
    return rng.choice(DESCALES, (batch, hk)).astype(np.float32)


def dequant(x8, d, batch_of_row=None):
    """x8 as float64 times its descale: d[b, h // g] for BSHD x8 (g = x8 heads / d's columns);
    varlen (THD) x8 with batch_of_row giving each row's sequence."""
    x = np.asarray(x8).astype(np.float64)
    if d is None:
        return x
    g = x.shape[-2] // d.shape[1]
    per_head = np.repeat(d.astype(np.float64), g, axis=1)   # (batch, heads of x)
    if batch_of_row is None:
        return x * per_head[:, None, :, None]
    return x * per_head[batch_of_row][:, :, None]


def to_torch(*xs):
    return [None if x is None else torch.from_numpy(np.asarray(x).view(np.uint8)).view(
        FP8["e4m3"][0] if x.dtype == FP8["e4m3"][1] else FP8["e5m2"][0])
            if x.dtype in (FP8["e4m3"][1], FP8["e5m2"][1]) else torch.from_numpy(x)
            for x in xs]


def check(name, got, ref_kw, deq, prec, seed):
    """The rule on an output (out and, when given, lse) against the dequantised inputs."""
    ref = R.attention(*deq, **ref_kw)
    base = R.attention(*deq, prec=prec, **ref_kw)
    out, lse = got
    out = np.asarray(out.float() if hasattr(out, "float") else out, dtype=np.float64)
    R.check_rule(f"out [{name}]", out, base["out"], ref["out"], prec, seed=seed)
    if lse is not None:
        lse = np.asarray(lse)
        assert lse.dtype == np.float32
        R.check_rule(f"lse [{name}]", lse, base["lse"], ref["lse"], prec, seed=seed)
    return ref


# (batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim, causal)
CASES = [(1, 1, 1, 2, 2, 16, False), (2, 37, 37, 4, 2, 64, True), (1, 37, 113, 3, 1, 32, False),
         (2, 17, 5, 2, 2, 128, True), (1, 5, 77, 2, 1, 256, True), (3, 1, 37, 4, 4, 40, False)]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}sq{}sk{}h{}/{}d{}{}".format(
    *c[:6], "c" if c[6] else ""))
def test_flash_attn_func_torch(fmt, case, rng, seed):
    b, sq, sk, hq, hk, d, causal = case
    q, k, v = (fp8_numpy(rng, s, fmt) for s in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)))
    qd, kd, vd = (descales(rng, b, hk) for _ in range(3))
    tq, tk, tv, tqd, tkd, tvd = to_torch(q, k, v, qd, kd, vd)
    out, lse, _ = flashattn.flash_attn_func(tq, tk, tv, causal=causal, return_attn_probs=True,
                                            q_descale=tqd, k_descale=tkd, v_descale=tvd)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (b, sq, hq, d)
    sel = flashattn.last_selection()
    assert sel is not None and f"f8{fmt}" in sel.kernel, sel
    deq = (dequant(q, qd), dequant(k, kd), dequant(v, vd))
    check(f"{fmt} {case}", (out, lse.numpy()), dict(causal=causal), deq, BF16, seed)
    # the fast path (no descales: 1) and the same call through attention_forward agree
    o1 = flashattn.flash_attn_func(tq, tk, tv, causal=causal)
    check(f"{fmt} {case} no descales", (o1, None), dict(causal=causal),
          (dequant(q, None), dequant(k, None), dequant(v, None)), BF16, seed)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float16, "bf16"])
def test_attention_forward_numpy_out_poisoned(fmt, out_dtype, rng, seed):
    """numpy (ml_dtypes) FP8 arrays; out= of each dtype the library writes, poisoned first."""
    out_dtype = BF16 if out_dtype == "bf16" else np.dtype(out_dtype)
    b, sq, sk, hq, hk, d = 2, 19, 23, 6, 2, 48
    q, k, v = (fp8_numpy(rng, s, fmt) for s in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)))
    qd, kd, vd = (descales(rng, b, hk) for _ in range(3))
    out = np.full((b, sq, hq, d), np.nan, dtype=out_dtype)
    lse = np.full((b, hq, sq), np.nan, dtype=np.float32)
    o, l = flashattn.attention_forward(q, k, v, causal=True, window_size=(7, -1), out=out,
                                       softmax_lse=lse, q_descale=qd, k_descale=kd,
                                       v_descale=vd)
    assert o is out and l is lse
    assert np.isfinite(np.asarray(out, np.float64)).all() and np.isfinite(lse).all()
    deq = (dequant(q, qd), dequant(k, kd), dequant(v, vd))
    check(f"{fmt} out {out_dtype}", (out, lse), dict(causal=True, window=(7, -1)), deq,
          out_dtype, seed)
    # without out: bfloat16, the package's choice (FlashAttention-3's)
    o2, _ = flashattn.attention_forward(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    assert o2.dtype == BF16


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_varlen(fmt, rng, seed):
    lens_q, lens_k = (3, 0, 37, 1), (5, 4, 37, 0)
    hq, hk, d = 4, 2, 64
    cq, ck = cu(lens_q), cu(lens_k)
    q = fp8_numpy(rng, (cq[-1], hq, d), fmt)
    k, v = (fp8_numpy(rng, (ck[-1], hk, d), fmt) for _ in range(2))
    qd, kd, vd = (descales(rng, len(lens_q), hk) for _ in range(3))
    tq, tk, tv, tqd, tkd, tvd, tcq, tck = to_torch(q, k, v, qd, kd, vd, cq, ck)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        tq, tk, tv, tcq, tck, max(lens_q), max(lens_k), causal=True, return_attn_probs=True,
        q_descale=tqd, k_descale=tkd, v_descale=tvd)
    assert out.dtype == torch.bfloat16
    bq = np.repeat(np.arange(len(lens_q)), lens_q)
    bk = np.repeat(np.arange(len(lens_k)), lens_k)
    deq = (dequant(q, qd, bq), dequant(k, kd, bk), dequant(v, vd, bk))
    ref = check(f"varlen {fmt}", (out, lse.numpy()), dict(causal=True, cu_q=cq, cu_k=ck), deq,
                BF16, seed)
    empty = ~np.isfinite(ref["lse"])
    assert np.isneginf(lse.numpy()[empty]).all()
    assert (out.float().numpy()[~np.isfinite(ref["lse"]).T] == 0).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("paged", [False, True])
def test_with_kvcache_append(fmt, paged, rng, seed):
    b, sq, hq, hk, d, cap, new = 3, 2, 4, 2, 32, 48, 2
    seqlens = np.array([0, 13, 45], np.int32)
    q = fp8_numpy(rng, (b, sq, hq, d), fmt)
    kn, vn = (fp8_numpy(rng, (b, new, hk, d), fmt) for _ in range(2))
    kc, vc = (fp8_numpy(rng, (b, cap, hk, d), fmt) for _ in range(2))
    qd, kd, vd = (descales(rng, b, hk) for _ in range(3))
    tq, tkn, tvn, tkc, tvc, tqd, tkd, tvd, tsl = to_torch(q, kn, vn, kc.copy(), vc.copy(), qd,
                                                          kd, vd, seqlens)
    kw = {}
    if paged:  # pages of 16 rows in a shuffled pool
        page, pages = 16, cap // 16
        perm = rng.permutation(b * pages)
        pool_k = torch.empty((b * pages, page, hk, d), dtype=tkc.dtype)
        pool_v = torch.empty_like(pool_k)
        table = perm.reshape(b, pages).astype(np.int32)
        for bb in range(b):
            for p in range(pages):
                pool_k[table[bb, p]] = tkc[bb, p * page:(p + 1) * page]
                pool_v[table[bb, p]] = tvc[bb, p * page:(p + 1) * page]
        tkc, tvc, kw = pool_k, pool_v, dict(block_table=torch.from_numpy(table))
    out, lse = flashattn.flash_attn_with_kvcache(tq, tkc, tvc, tkn, tvn, cache_seqlens=tsl,
                                                 causal=True, return_softmax_lse=True,
                                                 q_descale=tqd, k_descale=tkd, v_descale=tvd,
                                                 **kw)
    assert out.dtype == torch.bfloat16
    for bb in range(b):
        n = seqlens[bb] + new
        kf = np.concatenate([kc[bb, :seqlens[bb]], kn[bb]])[None]
        vf = np.concatenate([vc[bb, :seqlens[bb]], vn[bb]])[None]
        deq = (dequant(q[bb:bb + 1], qd[bb:bb + 1]), dequant(kf, kd[bb:bb + 1]),
               dequant(vf, vd[bb:bb + 1]))
        assert kf.shape[1] == n
        check(f"kvcache {fmt} paged={paged} b{bb}", (out[bb:bb + 1], lse[bb:bb + 1].numpy()),
              dict(causal=True), deq, BF16, seed)


@needs_ext
def test_extension_and_ctypes_agree(rng, monkeypatch):
    """The C extension's path and the ctypes path give the same bits for FP8."""
    q, k, v = (fp8_numpy(rng, (2, 21, 2, 32), "e4m3") for _ in range(3))
    qd, kd, vd = (descales(rng, 2, 2) for _ in range(3))
    kw = dict(causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    a = flashattn.attention_forward(q, k, v, **kw)
    sel = flashattn.last_selection()
    monkeypatch.setattr(_native, "ext", None)
    c = flashattn.attention_forward(q, k, v, **kw)
    assert flashattn.last_selection() == sel
    for x, y in zip(a, c):
        np.testing.assert_array_equal(np.asarray(x, np.float64), np.asarray(y, np.float64))


# ---- bad arguments ----

def _qkv(fmt="e4m3", b=2, hq=4, hk=2):
    rng = np.random.default_rng(1)
    return to_torch(*(fp8_numpy(rng, s, fmt) for s in ((b, 9, hq, 16), (b, 9, hk, 16),
                                                      (b, 9, hk, 16))))


def test_mixed_dtypes_raise_type_error():
    q, k, v = _qkv()
    k5 = k.float().to(torch.float8_e5m2)
    with pytest.raises(TypeError, match="k is float8_e5m2"):
        flashattn.flash_attn_func(q, k5, v)
    with pytest.raises(TypeError, match="v is bfloat16"):
        flashattn.flash_attn_func(q, k, v.to(torch.bfloat16))
    with pytest.raises(TypeError, match="q is bfloat16"):
        flashattn.flash_attn_func(q.to(torch.bfloat16), k, v)
    kc = k.clone()
    with pytest.raises(TypeError, match="k_cache is float8_e5m2"):
        flashattn.flash_attn_with_kvcache(q, kc.float().to(torch.float8_e5m2), kc)


@pytest.mark.parametrize("bad,err,match", [
    (lambda: torch.ones(2, 4), ValueError, r"k_descale has shape \(2, 4\): expected \(batch, "
                                           r"num_heads_k\) = \(2, 2\)"),
    (lambda: torch.ones(2), ValueError, r"k_descale has shape \(2,\)"),
    (lambda: torch.ones(2, 2, dtype=torch.float64), TypeError, "k_descale has dtype"),
    (lambda: np.ones((2, 2), np.float32), TypeError, "k_descale must be a torch tensor"),
])
def test_bad_descale(bad, err, match):
    q, k, v = _qkv()
    with pytest.raises(err, match=match):
        flashattn.flash_attn_func(q, k, v, k_descale=bad())


def test_descale_on_other_device_raises():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: no second device to put a descale on")
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="v_descale is on cuda"):
        flashattn.flash_attn_func(q, k, v, v_descale=torch.ones(2, 2, device="cuda"))


def test_descale_with_non_fp8_inputs_raises():
    """Decided: a descale means nothing for bf16 inputs; it is an error, not ignored."""
    q, k, v = (x.to(torch.bfloat16) for x in _qkv())
    with pytest.raises(ValueError, match="q_descale given but q is bfloat16"):
        flashattn.flash_attn_func(q, k, v, q_descale=torch.ones(2, 2))
    with pytest.raises(ValueError, match="descales apply to FP8"):
        flashattn.attention_forward(q.float().numpy(), k.float().numpy(), v.float().numpy(),
                                    v_descale=np.ones((2, 2), np.float32))


def test_requires_grad_raises():
    q, k, v = _qkv()
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward only"):
        flashattn.flash_attn_func(q, k, v)
    with pytest.raises(RuntimeError, match="forward only"):
        flashattn.flash_attn_varlen_func(q.view(-1, 4, 16), k.view(-1, 2, 16),
                                         v.view(-1, 2, 16), torch.tensor([0, 9, 18]).int(),
                                         torch.tensor([0, 9, 18]).int(), 9, 9)
    with torch.no_grad():  # nothing to record: an inference call
        out = flashattn.flash_attn_func(q, k, v)
    assert out.dtype == torch.bfloat16 and not out.requires_grad


def test_fp8_out_and_descale_values_refused_by_library():
    q, k, v = _qkv()
    with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_DTYPE"):
        flashattn.attention_forward(q, k, v, out=torch.empty(q.shape, dtype=q.dtype))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        d = torch.ones(2, 2)
        d[1, 0] = bad
        with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_INVALID_ARGUMENT"):
            flashattn.flash_attn_func(q, k, v, k_descale=d)


# ---- quantize_fp8 ----

# (mantissa bits, smallest subnormal exponent) of each format: rounding to nearest errs by at
# most half a unit of the last place, 2^-(m+1) relative for normal values, and half the
# subnormal spacing absolutely below them
_FMT = {"e4m3": (3, -9), "e5m2": (2, -16)}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("block_rows", [0, 1, 16, 50])
@pytest.mark.parametrize("kind", ["numpy-f32", "torch-bf16", "torch-f16"])
def test_quantize_round_trip(fmt, block_rows, kind, rng, seed):
    b, s, h, d = 2, 37, 3, 24
    x = rng.standard_normal((b, s, h, d)) * rng.choice([1e-3, 1.0, 30.0], (b, 1, h, 1))
    x[0, 0, 0, :3] = [12.0, -40.0, 0.0]  # an outlier in the first block
    x[1, :, 2, :] = 0.0                  # an all-zero head: scale 1
    if kind == "numpy-f32":
        xin = x.astype(np.float32)
        xf = xin.astype(np.float64)
    else:
        xin = torch.from_numpy(x).to(torch.bfloat16 if kind == "torch-bf16" else torch.float16)
        xf = xin.double().numpy()
    x8, scales = flashattn.quantize_fp8(xin, dtype=fmt, block_rows=block_rows)
    nb = 1 if block_rows == 0 else -(-s // block_rows)
    assert tuple(scales.shape) == (b, h, nb)
    scales = np.asarray(scales)
    assert scales.dtype == np.float32
    if kind == "numpy-f32":
        assert x8.dtype == FP8[fmt][1]
    else:
        assert x8.dtype == FP8[fmt][0]
        x8 = x8.view(torch.uint8).numpy().view(FP8[fmt][1])
    rows = np.arange(s) // (block_rows or s)
    sc = scales.astype(np.float64)[:, :, rows].transpose(0, 2, 1)[..., None]  # (b, s, h, 1)
    back = x8.astype(np.float64) * sc
    m, sub = _FMT[fmt]
    bound = np.abs(xf) * 2.0**-(m + 1) + sc * 2.0**(sub - 1)
    err = np.abs(back - xf)
    assert (err <= bound * (1 + 1e-6)).all(), (
        f"seed {seed}: worst error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}")
    # each block's largest magnitude maps to the format's max; an all-zero block has scale 1
    fmax = FP8[fmt][2]
    for bb in range(b):
        for hh in range(h):
            for blk in range(nb):
                sel = rows == blk
                amax = np.abs(xf[bb, sel, hh]).max()
                want = np.float32(amax / fmax) if amax > 0 else 1.0
                np.testing.assert_allclose(scales[bb, hh, blk], want, rtol=2**-23)


def test_quantize_hadamard_keeps_scores(rng, seed):
    """q and k rotated alike: the dequantised pair's scores are q k^T up to the FP8 rounding
    (bounded through the norms, which the orthogonal rotation keeps), the rotation changes the
    stored values, and the attention of the rotated pair obeys the rule against its
    dequantised inputs."""
    b, s, h, d = 1, 40, 2, 64
    q = rng.standard_normal((b, s, h, d)).astype(np.float32)
    k = rng.standard_normal((b, s, h, d)).astype(np.float32)
    q8, qs = flashattn.quantize_fp8(q, hadamard=True, sign_seed=7)
    k8, ks = flashattn.quantize_fp8(k, hadamard=True, sign_seed=7)
    qr = q8.astype(np.float64) * qs[:, None, :, :]
    kr = k8.astype(np.float64) * ks[:, None, :, :]
    got = np.einsum("bihd,bjhd->bhij", qr, kr)
    want = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k.astype(np.float64))
    # |error of a rotated row| <= 2^-4 |row| + scale 2^-10 sqrt(d) (e4m3: half an ulp, half
    # the subnormal spacing); the score's error is |eq||k| + |q||ek| + |eq||ek|
    nq, nk = np.linalg.norm(q, axis=-1), np.linalg.norm(k, axis=-1)       # (b, s, h)
    eq = 2.0**-4 * nq + qs[:, None, :, 0] * 2.0**-10 * np.sqrt(d)
    ek = 2.0**-4 * nk + ks[:, None, :, 0] * 2.0**-10 * np.sqrt(d)
    t = lambda x: np.moveaxis(x, 2, 1)  # (b, h, s)
    bound = (t(eq)[..., :, None] * t(nk)[..., None, :] + t(nq)[..., :, None] * t(ek)[..., None, :]
             + t(eq)[..., :, None] * t(ek)[..., None, :])
    assert (np.abs(got - want) <= bound * (1 + 1e-6)).all(), f"seed {seed}"
    plain8, _ = flashattn.quantize_fp8(q)
    assert not np.array_equal(plain8.view(np.uint8), q8.view(np.uint8))
    v = rng.standard_normal((b, s, h, d)).astype(np.float32)
    v8, vs = flashattn.quantize_fp8(v)
    out = np.full(q.shape, np.nan, np.float32)
    flashattn.attention_forward(q8, k8, v8, q_descale=qs[..., 0], k_descale=ks[..., 0],
                                v_descale=vs[..., 0], out=out)
    deq = (qr, kr, v8.astype(np.float64) * vs[:, None, :, :])
    check("hadamard", (out, None), {}, deq, np.float32, seed)


def test_quantize_bad_arguments():
    x = np.ones((1, 4, 1, 24), np.float32)
    with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_HEAD_DIM"):
        flashattn.quantize_fp8(x, hadamard=True)  # 24 is no power of two
    with pytest.raises(ValueError, match="block_rows"):
        flashattn.quantize_fp8(x, block_rows=-1)
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2"):
        flashattn.quantize_fp8(x, dtype=torch.float16)
    with pytest.raises(ValueError, match="4 dimensions"):
        flashattn.quantize_fp8(x[0])
    x[0, 1, 0, 3] = np.inf
    with pytest.raises(flashattn.FlashAttnArgumentError, match="FA_ERR_INVALID_ARGUMENT"):
        flashattn.quantize_fp8(x)


# ---- torch.compile ----

def test_compile_fp8(rng):
    q, k, v = (fp8_numpy(rng, s, "e4m3") for s in ((1, 17, 4, 32), (1, 17, 2, 32),
                                                   (1, 17, 2, 32)))
    kd = descales(rng, 1, 2)
    tq, tk, tv, tkd = to_torch(q, k, v, kd)

    def f(q, k, v, kd):
        return flashattn.flash_attn_func(q, k, v, causal=True, k_descale=kd)

    eager = f(tq, tk, tv, tkd)
    compiled = torch.compile(f, fullgraph=True, backend="eager")(tq, tk, tv, tkd)
    assert compiled.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)

    # the KV-cache op, appending FP8 tokens in place
    kc = to_torch(fp8_numpy(rng, (1, 24, 2, 32), "e4m3"))[0]
    kn = tk[:, :2]
    sl = torch.tensor([5], dtype=torch.int32)

    def g(q, kc, vc, kn, kd):
        return flashattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=sl,
                                                 causal=True, k_descale=kd)

    caches = [kc.clone() for _ in range(4)]
    eager = g(tq[:, :2], caches[0], caches[1], kn, tkd)
    compiled = torch.compile(g, fullgraph=True, backend="eager")(tq[:, :2], caches[2],
                                                                 caches[3], kn, tkd)
    assert compiled.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert torch.equal(caches[2].view(torch.uint8), caches[0].view(torch.uint8))


def test_opcheck_fp8(rng):
    q, k, v = to_torch(*(fp8_numpy(rng, s, "e5m2") for s in ((2, 12, 4, 16), (2, 15, 2, 16),
                                                             (2, 15, 2, 16))))
    qd, kd, vd = to_torch(*(descales(rng, 2, 2) for _ in range(3)))
    args = (q, k, v, 0.25, True, -1, 0, 0.0, None, None, None, 0, 0, False, qd, kd, vd)
    torch.library.opcheck(torch.ops.flashattn_c.fwd.default, args,
                          # test_schema multiplies FP8 tensors: torch has no such kernel
                          test_utils=("test_faketensor",))


# ---- CUDA ----

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cuda_works_or_refuses_clearly(fmt, rng, seed):
    """On CUDA tensors at head dim 64 (not built for FP8) the call either runs (checked by the
    rule) or raises the library's FA_ERR_DTYPE naming FP8; never a crash or a wrong answer."""
    if not flashattn.has_cuda():
        pytest.skip("libflashattn was built without the CUDA backend")
    q, k, v = (fp8_numpy(rng, s, fmt) for s in ((2, 33, 4, 64), (2, 40, 2, 64), (2, 40, 2, 64)))
    qd, kd, vd = (descales(rng, 2, 2) for _ in range(3))
    t = [x.cuda() for x in to_torch(q, k, v, qd, kd, vd)]
    try:
        out = flashattn.flash_attn_func(t[0], t[1], t[2], causal=True, q_descale=t[3],
                                        k_descale=t[4], v_descale=t[5])
    except flashattn.FlashAttnError as e:
        assert e.status_name == "FA_ERR_DTYPE" and "FP8" in e.message, e
    else:
        assert out.dtype == torch.bfloat16 and out.is_cuda
        deq = (dequant(q, qd), dequant(k, kd), dequant(v, vd))
        check(f"cuda {fmt}", (out.cpu(), None), dict(causal=True), deq, BF16, seed)
    x = torch.randn(1, 8, 2, 16, device="cuda")
    try:
        x8, s = flashattn.quantize_fp8(x)
    except flashattn.FlashAttnError as e:
        assert e.status_name == "FA_ERR_DEVICE", e
    else:
        assert x8.is_cuda and s.is_cuda


def _e4m3_baseline(q, k, v, qd, kd, vd, causal, scale):
    """(float64 reference, baseline) of the sm90 FP8 kernel's computation, (b, s, h, d) numpy.
    The kernel rounds P to e4m3 for P V as FlashAttention-3 does, which dominates its error:
    the baseline does the same in fp32 (scores of the FP8 values, the descales in the scale,
    P against the row max rounded to e4m3, O = v_descale (P8 V8) / l) rounded to bf16."""
    q8, k8, v8 = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    b, sq, hq, d = q8.shape
    sk, hk = k8.shape[1], k8.shape[2]
    g = hq // hk
    ref = np.zeros(q8.shape)
    base = np.zeros(q8.shape)
    for bi in range(b):
        for h in range(hq):
            j = h // g
            s64 = q8[bi, :, h] @ k8[bi, :, j].T * (scale * float(qd[bi, j]) * float(kd[bi, j]))
            s32 = (q8[bi, :, h].astype(np.float32) @ k8[bi, :, j].T.astype(np.float32)) * \
                np.float32(scale * np.float32(qd[bi, j]) * np.float32(kd[bi, j]))
            if causal:
                mask = np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)
                s64[mask] = -np.inf
                s32[mask] = -np.inf
            p64 = np.exp(s64 - s64.max(1, keepdims=True))
            ref[bi, :, h] = (p64 @ v8[bi, :, j]) * float(vd[bi, j]) / p64.sum(1, keepdims=True)
            p32 = np.exp(s32 - s32.max(1, keepdims=True)).astype(np.float32)
            p8 = p32.astype(FP8["e4m3"][1]).astype(np.float32)
            o = (p8 @ v8[bi, :, j].astype(np.float32)) * (np.float32(vd[bi, j]) / p32.sum(1, keepdims=True))
            base[bi, :, h] = o.astype(ml_dtypes.bfloat16).astype(np.float64)
    return ref, base


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [128, 256])
def test_cuda_e4m3_sm90(causal, d, rng, seed):
    """e4m3 at the head dims the sm90 kernel is built for: on an sm_90 GPU it runs and meets the
    2x rule against a baseline that rounds P to e4m3 as the kernel does; elsewhere it is
    FA_ERR_DTYPE naming sm_90 (no fallback)."""
    if not flashattn.has_cuda():
        pytest.skip("libflashattn was built without the CUDA backend")
    q, k, v = (fp8_numpy(rng, s, "e4m3", 2.0 if i < 2 else 1.0)
               for i, s in enumerate(((2, 131, 4, d), (2, 200, 2, d), (2, 200, 2, d))))
    qd, kd, vd = (descales(rng, 2, 2) for _ in range(3))
    t = [x.cuda() for x in to_torch(q, k, v, qd, kd, vd)]
    scale = 1.0 / np.sqrt(d)
    try:
        out = flashattn.flash_attn_func(t[0], t[1], t[2], causal=causal, softmax_scale=scale,
                                        q_descale=t[3], k_descale=t[4], v_descale=t[5])
    except flashattn.FlashAttnError as e:
        assert torch.cuda.get_device_capability() != (9, 0), e
        assert e.status_name == "FA_ERR_DTYPE" and "sm_90" in e.message, e
        return
    assert out.dtype == torch.bfloat16 and out.is_cuda
    sel = flashattn.last_selection()
    assert sel is not None and sel.kernel.startswith("sm90_fwd_f8e4m3"), sel
    ref, base = _e4m3_baseline(q, k, v, qd, kd, vd, causal, scale)
    got = out.float().cpu().numpy().astype(np.float64)
    assert np.isfinite(got).all()
    ek, eb = np.abs(got - ref), np.abs(base - ref)
    slack = 4 * 2.0 ** -8 * max(1.0, np.abs(ref).max())
    assert ek.max() <= 2 * eb.max() + slack, (ek.max(), eb.max(), seed)
    assert ek.mean() <= 2 * eb.mean() + slack, (ek.mean(), eb.mean(), seed)
