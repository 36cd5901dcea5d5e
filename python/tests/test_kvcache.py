"""flash_attn_with_kvcache and merge_attn on numpy arrays (and torch CPU tensors where torch is
installed), against a float64 reference written here: gather each sequence's cache rows
(through the block table when paged), append the new keys, attend with the mask aligned
bottom-right against the total length. The append itself is checked bit for bit on the whole
cache, whose unused rows hold NaN so that reading one shows."""

import dataclasses

import numpy as np
import pytest

import flashattn
import reference as R
from flashattn import FlashAttnError
from harness import BF16, DTYPES, F16, F32, f32


@dataclasses.dataclass
class KV:
    lens: tuple = (5, 17)        # tokens already in each sequence's cache
    sq: int = 1                  # query tokens per sequence
    new: int = 1                 # appended tokens per sequence (0: no k/v)
    hq: int = 4
    hk: int = 2
    d: int = 32
    page: int = None             # page size; None: contiguous cache
    spare: int = 7               # capacity beyond the longest sequence
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = None            # None, "head" or "batch"
    scale: float = None
    dtype: np.dtype = F32

    @property
    def batch(self):
        return len(self.lens)

    def __str__(self):
        s = (f"lens{list(self.lens)} sq{self.sq} new{self.new} h{self.hq}/{self.hk} d{self.d} "
             f"{'page' + str(self.page) if self.page else 'contiguous'}")
        for flag, text in ((self.causal, "causal"), (self.window != (-1, -1), f"w{self.window}"),
                           (self.softcap, f"cap{self.softcap}"),
                           (self.alibi, f"alibi-{self.alibi}"),
                           (self.scale is not None, f"scale{self.scale}")):
            if flag:
                s += " " + text
        return s


class Cache:
    """A cache holding random keys/values for the first lens[b] tokens of each sequence and
    NaN everywhere else; paged: pool pages handed out in a shuffled order, with spare pages."""

    def __init__(self, case, rng):
        self.case = case
        b, hk, d, dt = case.batch, case.hk, case.d, case.dtype
        cap = max(case.lens) + case.new + case.spare
        if case.page:
            self.max_pages = -(-cap // case.page)
            num_pages = b * self.max_pages + 3
            order = rng.permutation(num_pages)
            self.table = order[:b * self.max_pages].reshape(b, self.max_pages).astype(np.int32)
            shape = (num_pages, case.page, hk, d)
        else:
            self.table = None
            shape = (b, cap, hk, d)
        self.k = np.full(shape, np.nan, dtype=dt)
        self.v = np.full(shape, np.nan, dtype=dt)
        for i, n in enumerate(case.lens):
            for t in range(n):
                self.k[self.where(i, t)] = rng.standard_normal((hk, d)).astype(dt)
                self.v[self.where(i, t)] = rng.standard_normal((hk, d)).astype(dt)

    def where(self, b, t):
        """Index of token t of sequence b in the cache arrays."""
        if self.table is None:
            return (b, t)
        return (self.table[b, t // self.case.page], t % self.case.page)

    def rows(self, arr, b, n):
        return np.stack([arr[self.where(b, t)] for t in range(n)]) if n else \
            np.zeros((0,) + arr.shape[2:], arr.dtype)

    def appended(self, k_new, v_new):
        """The cache arrays as they must be after appending k_new/v_new."""
        k, v = self.k.copy(), self.v.copy()
        for b, n in enumerate(self.case.lens):
            for t in range(k_new.shape[1] if k_new is not None else 0):
                k[self.where(b, n + t)] = k_new[b, t]
                v[self.where(b, n + t)] = v_new[b, t]
        return k, v


def kv_reference(cache, q, k_new, v_new, slopes, prec=None, scale=None):
    """dict(out (b, sq, hq, d), lse (b, hq, sq)) of the gathered problem, through the varlen
    path of reference.attention (sequence b: the cache's rows, then the new ones)."""
    case = cache.case
    b, sq = case.batch, q.shape[1]
    keys, vals = [], []
    for i, n in enumerate(case.lens):
        ks, vs = [cache.rows(cache.k, i, n)], [cache.rows(cache.v, i, n)]
        if k_new is not None:
            ks.append(k_new[i])
            vs.append(v_new[i])
        keys.append(np.concatenate(ks))
        vals.append(np.concatenate(vs))
    lens_k = [len(x) for x in keys]
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    cu_q = np.arange(b + 1) * sq
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    res = R.attention(f64(q.reshape(b * sq, case.hq, case.d)), f64(np.concatenate(keys)),
                      f64(np.concatenate(vals)), scale=scale, causal=case.causal,
                      window=case.window, softcap=f32(case.softcap), alibi=slopes, cu_q=cu_q,
                      cu_k=cu_k, prec=prec)
    return {"out": res["out"].reshape(q.shape),
            "lse": res["lse"].reshape(case.hq, b, sq).transpose(1, 0, 2)}


def inputs(case, rng):
    cache = Cache(case, rng)
    b, dt = case.batch, case.dtype
    q = rng.standard_normal((b, case.sq, case.hq, case.d)).astype(dt)
    k_new = v_new = None
    if case.new:
        k_new = rng.standard_normal((b, case.new, case.hk, case.d)).astype(dt)
        v_new = rng.standard_normal((b, case.new, case.hk, case.d)).astype(dt)
    slopes = None
    if case.alibi == "head":
        slopes = rng.uniform(0.05, 1.0, case.hq).astype(np.float32)
    elif case.alibi == "batch":
        slopes = rng.uniform(0.05, 1.0, (b, case.hq)).astype(np.float32)
    return cache, q, k_new, v_new, slopes


def run(case, cache, q, k_new, v_new, slopes, **kw):
    args = dict(k=k_new, v=v_new, cache_seqlens=np.array(case.lens, np.int32),
                block_table=cache.table, softmax_scale=case.scale, causal=case.causal,
                window_size=case.window, softcap=case.softcap, alibi_slopes=slopes,
                return_softmax_lse=True)
    args.update(kw)
    return flashattn.flash_attn_with_kvcache(q, cache.k, cache.v, **args)


def bits(x):
    return np.ascontiguousarray(x).view(np.uint8)


def check(case, seed, cache, q, k_new, v_new, slopes, out, lse, expect_cache=None):
    """The rule on out and lse, exact zeros / -inf for rows that see no key, and the cache
    bit for bit (expect_cache: the arrays from Cache.appended taken before the call)."""
    scale = f32(case.scale) if case.scale is not None else f32(1.0 / np.sqrt(case.d))
    ref = kv_reference(cache, q, k_new, v_new, slopes, scale=scale)
    base = kv_reference(cache, q, k_new, v_new, slopes, prec=case.dtype, scale=scale)
    tag = f"{case} {np.dtype(case.dtype).name} seed {seed}"
    assert out.shape == q.shape and out.dtype == case.dtype, (out.shape, out.dtype)
    assert lse.shape == (case.batch, case.hq, case.sq) and lse.dtype == np.float32
    R.check_rule(f"out [{tag}]", np.asarray(out, np.float64), base["out"], ref["out"],
                 case.dtype, seed=seed)
    R.check_rule(f"lse [{tag}]", lse, base["lse"], ref["lse"], case.dtype, seed=seed)
    empty = np.isneginf(ref["lse"])  # (b, hq, sq)
    assert np.all(np.asarray(out, np.float64).transpose(0, 2, 1, 3)[empty] == 0), tag
    if expect_cache is not None:
        assert np.array_equal(bits(cache.k), bits(expect_cache[0])), f"k cache [{tag}]"
        assert np.array_equal(bits(cache.v), bits(expect_cache[1])), f"v cache [{tag}]"


CASES = [
    KV(),                                                               # contiguous decode
    KV(lens=(15, 30, 0), sq=3, new=3, hq=4, hk=1, d=16, page=16, causal=True),  # crossings, MQA
    KV(lens=(63, 1), sq=2, new=2, hq=2, hk=2, d=64, page=64),           # crosses 64
    KV(lens=(0, 1), sq=1, new=0, hq=8, hk=2, page=16),                  # empty cache, no append
    KV(lens=(0, 1, 16), sq=2, new=0, hq=4, hk=2, causal=True),          # 0 and 1, causal sq>1
    KV(lens=(40, 70), sq=4, new=4, hq=8, hk=2, page=16, causal=True, window=(8, 0)),
    KV(lens=(20, 33), sq=3, new=0, window=(5, 3)),                      # right window past c(i)
    KV(lens=(20, 33), sq=2, new=1, d=48, softcap=2.0, alibi="head", page=16),
    KV(lens=(9, 50, 3), sq=3, new=1, hq=6, hk=3, alibi="batch", page=64, causal=True, scale=0.3),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_kvcache_against_reference(case, dtype, rng, seed):
    case = dataclasses.replace(case, dtype=dtype)
    cache, q, k_new, v_new, slopes = inputs(case, rng)
    expect = cache.appended(k_new, v_new)
    out, lse = run(case, cache, q, k_new, v_new, slopes)
    check(case, seed, cache, q, k_new, v_new, slopes, out, lse, expect)
    sel = flashattn.last_selection()
    assert (sel.backend, sel.op) == ("cpu", "fwd") and "kvcache" in sel.kernel, sel


@pytest.mark.parametrize("page", [None, 16])
def test_num_splits_agree(page, rng, seed):
    case = KV(lens=(300, 517), sq=2, new=1, hq=4, hk=2, d=32, page=page, causal=True)
    cache, q, k_new, v_new, slopes = inputs(case, rng)
    results = {}
    for splits in (1, 3, 0):
        if splits == 1:
            out, lse = run(case, cache, q, k_new, v_new, slopes, num_splits=1)
            check(case, seed, cache, q, k_new, v_new, slopes, out, lse,
                  cache.appended(k_new, v_new))
        else:  # the cache holds the new tokens now: attend without appending them again
            lens2 = tuple(n + case.new for n in case.lens)
            c2 = dataclasses.replace(case, lens=lens2, new=0)
            cache.case = c2
            out, lse = run(c2, cache, q, None, None, slopes, num_splits=splits)
            check(c2, seed, cache, q, None, None, slopes, out, lse)
        sel = flashattn.last_selection()
        if splits:
            assert sel.num_splits == splits, sel
        results[splits] = out, lse
    # the split runs computed the same attention as the unsplit run
    np.testing.assert_allclose(results[3][0], results[1][0], rtol=0, atol=2e-6)
    np.testing.assert_allclose(results[3][1], results[1][1], rtol=0, atol=2e-6)


def test_return_values_and_defaults(rng, seed):
    case = KV(lens=(3, 8), sq=2, new=0, hq=2, hk=1, d=16)
    cache, q, _, _, _ = inputs(case, rng)
    out = flashattn.flash_attn_with_kvcache(q, cache.k, cache.v,
                                            cache_seqlens=np.array(case.lens, np.int32))
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    out2, lse = flashattn.flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=case.lens,
                                                  return_softmax_lse=True)
    np.testing.assert_array_equal(out, out2)
    check(case, seed, cache, q, None, None, None, out2, lse)


def test_cache_seqlens_forms(rng, seed):
    case = KV(lens=(6, 6), sq=1, new=0, hq=2, hk=2, d=16, spare=0)   # cache exactly full
    cache, q, _, _, _ = inputs(case, rng)
    f = lambda s: flashattn.flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=s)  # noqa
    ref = f(np.array([6, 6], np.int32))
    for form in (6, np.int64(6), np.array(6), [6, 6], (6, 6), np.array([6, 6], np.int64), None):
        np.testing.assert_array_equal(f(form), ref, err_msg=repr(form))
    # cache_seqlens=None reads the whole capacity of a paged cache too
    pc = Cache(dataclasses.replace(case, page=4), rng)  # 6 tokens: 2 pages of 4, last half full
    full = dataclasses.replace(case, lens=(8, 8), page=4)
    pc.case = full
    for b in range(2):
        for t in range(6, 8):
            pc.k[pc.where(b, t)] = rng.standard_normal((2, 16)).astype(np.float32)
            pc.v[pc.where(b, t)] = rng.standard_normal((2, 16)).astype(np.float32)
    out, lse = flashattn.flash_attn_with_kvcache(q, pc.k, pc.v, block_table=pc.table,
                                                 return_softmax_lse=True)
    check(full, seed, pc, q, None, None, None, out, lse)


def test_cache_batch_idx_and_larger_cache(rng, seed):
    """cache_batch_idx picks the cache row of each sequence (rows appended in place); without
    it a cache with more rows than q's batch serves sequence b from row b."""
    case = KV(lens=(4, 9, 2, 7), sq=1, new=2, hq=4, hk=2, d=16)
    cache, q4, kn4, vn4, _ = inputs(case, rng)
    idx = np.array([3, 1], np.int32)
    q, kn, vn = q4[:2], kn4[:2], vn4[:2]
    lens = np.array([case.lens[3], case.lens[1]], np.int32)
    k_before, v_before = cache.k.copy(), cache.v.copy()
    out, lse = flashattn.flash_attn_with_kvcache(q, cache.k, cache.v, kn, vn, cache_seqlens=lens,
                                                 cache_batch_idx=idx, return_softmax_lse=True)
    # the same problem on a cache of the two selected rows
    sub = Cache.__new__(Cache)
    sub.case, sub.table = dataclasses.replace(case, lens=tuple(lens)), None
    sub.k, sub.v = k_before[idx], v_before[idx]
    expect = sub.appended(kn, vn)
    check(sub.case, seed, sub, q, kn, vn, None, out, lse)
    k_after, v_after = k_before.copy(), v_before.copy()
    k_after[idx], v_after[idx] = expect
    assert np.array_equal(bits(cache.k), bits(k_after))
    assert np.array_equal(bits(cache.v), bits(v_after))
    # a cache of 4 rows for a batch of 2: rows 0 and 1 serve it, rows 2 and 3 stay as they are
    k_before = cache.k.copy()
    out = flashattn.flash_attn_with_kvcache(q, cache.k, cache.v, kn, vn,
                                            cache_seqlens=[int(x) + 2 for x in lens])
    assert np.array_equal(bits(cache.k[2:]), bits(k_before[2:]))
    assert np.array_equal(bits(cache.k[0, lens[0] + 2:lens[0] + 4]), bits(kn[0]))


def test_strided_cache_and_inputs(rng, seed):
    """A cache that is a strided view (heads outermost in memory) is written through its
    strides; strided q / k / v pass as they are."""
    case = KV(lens=(5, 11), sq=2, new=2, hq=4, hk=2, d=16, causal=True)
    cache, q, kn, vn, _ = inputs(case, rng)
    for name in ("k", "v"):
        arr = getattr(cache, name)
        hm = np.ascontiguousarray(arr.transpose(2, 0, 1, 3)).transpose(1, 2, 0, 3)
        setattr(cache, name, hm)
    assert not cache.k.flags.c_contiguous
    expect = cache.appended(kn, vn)
    qs = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    out, lse = run(case, cache, qs, kn, vn, None)
    check(case, seed, cache, q, kn, vn, None, out, lse, expect)


# ---- merge_attn ----

def _shards(rng, thd):
    """q, k, v and key shards [0, a), [a, b), [b, sk) of a non-causal problem."""
    b, sq, sk, hq, hk, d = 2, 5, 29, 4, 2, 16
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, hk, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, hk, d)).astype(np.float32)
    return q, k, v, [slice(0, 7), slice(7, 20), slice(20, sk)]


def _to_thd(out, lse):
    b, s, h, d = out.shape
    return out.reshape(b * s, h, d), np.ascontiguousarray(lse.transpose(1, 0, 2)).reshape(h, b * s)


@pytest.mark.parametrize("layout", ["bshd-list", "bshd-stacked", "thd"])
def test_merge_attn_matches_direct(layout, rng, seed):
    q, k, v, shards = _shards(rng, layout == "thd")
    outs, lses = [], []
    for s in shards:
        o, l, _ = flashattn.flash_attn_func(q, k[:, s], v[:, s], return_attn_probs=True)
        outs.append(o)
        lses.append(l)
    # a part that saw no key: lse -inf, out never read (NaN)
    outs.append(np.full_like(outs[0], np.nan))
    lses.append(np.full_like(lses[0], -np.inf))
    if layout == "thd":
        pairs = [_to_thd(o, l) for o, l in zip(outs, lses)]
        outs, lses = [p[0] for p in pairs], [p[1] for p in pairs]
    if layout == "bshd-stacked":
        outs, lses = np.stack(outs), np.stack(lses)
    out, lse = flashattn.merge_attn(outs, lses)
    sel = flashattn.last_selection()
    assert (sel.op, sel.backend) == ("merge", "cpu"), sel
    f64 = [np.asarray(x, np.float64) for x in (q, k, v)]
    ref = R.attention(*f64, scale=f32(1 / 4.0))
    base = R.attention(*f64, scale=f32(1 / 4.0), prec=F32)
    ref_out, ref_lse, base_out, base_lse = ref["out"], ref["lse"], base["out"], base["lse"]
    if layout == "thd":
        ref_out, ref_lse = _to_thd(ref_out, ref_lse)
        base_out, base_lse = _to_thd(base_out, base_lse)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    R.check_rule(f"merged out [{layout}]", out, base_out, ref_out, F32, seed=seed)
    R.check_rule(f"merged lse [{layout}]", lse, base_lse, ref_lse, F32, seed=seed)


def test_merge_attn_empty_rows_dtype_and_buffers(rng, seed):
    b, s, h, d = 1, 3, 2, 8
    o1 = rng.standard_normal((b, s, h, d)).astype(np.float32)
    o2 = rng.standard_normal((b, s, h, d)).astype(np.float32)
    l1 = rng.standard_normal((b, h, s)).astype(np.float32)
    l2 = rng.standard_normal((b, h, s)).astype(np.float32)
    l1[0, 0, 0] = l2[0, 0, 0] = -np.inf          # a row neither part saw
    l2[0, 1, 2] = -np.inf                        # a row only part 1 saw
    o2[0, 2, 1] = np.nan                         # ...whose other out is not read
    lse_ref = np.logaddexp(l1.astype(np.float64), l2.astype(np.float64))
    w1 = np.exp(np.where(np.isneginf(l1), -np.inf, l1 - np.where(np.isneginf(lse_ref), 0, lse_ref)))
    w2 = np.exp(np.where(np.isneginf(l2), -np.inf, l2 - np.where(np.isneginf(lse_ref), 0, lse_ref)))
    o2z = np.nan_to_num(o2.astype(np.float64))
    ref = (w1.transpose(0, 2, 1)[..., None] * o1 + w2.transpose(0, 2, 1)[..., None] * o2z)
    out_buf = np.full((b, s, h, d), np.nan, np.float32)
    lse_buf = np.full((b, h, s), np.nan, np.float32)
    out, lse = flashattn.merge_attn([o1, o2], [l1, l2], out=out_buf, softmax_lse=lse_buf)
    assert out is out_buf and lse is lse_buf
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6 * max(1, np.abs(ref).max()))
    lse_max = np.abs(lse_ref[np.isfinite(lse_ref)]).max()
    np.testing.assert_allclose(lse, lse_ref, rtol=0, atol=1e-6 * max(1, lse_max))
    assert np.all(out[0, 0, 0] == 0) and np.isneginf(lse[0, 0, 0])
    # fp32 parts into a bfloat16 / float16 out: the merged value rounded once
    for dt in [F16] + ([BF16] if BF16 is not None else []):
        o, _ = flashattn.merge_attn([o1, o2], [l1, l2], out_dtype=dt)
        u = R.UNIT_ROUNDOFF[np.dtype(dt)]
        assert o.dtype == dt
        err = np.abs(o.astype(np.float64) - ref)
        assert np.all(err <= u * np.abs(ref) + 1e-6), (dt, err.max())


# ---- errors ----

Q = np.zeros((2, 1, 4, 16), np.float32)
KC = np.zeros((2, 8, 2, 16), np.float32)
KN = np.ones((2, 1, 2, 16), np.float32)


def lib_error(status_name, fragment, fn, *args, **kw):
    with pytest.raises(FlashAttnError) as e:
        fn(*args, **kw)
    assert e.value.status_name == status_name, str(e.value)
    assert fragment in e.value.message, str(e.value)
    assert flashattn.last_selection() is None
    return e.value



def test_python_argument_errors():
    f = flashattn.flash_attn_with_kvcache
    kc, vc = KC.copy(), KC.copy()
    with pytest.raises(ValueError, match="k is given but v is not"):
        f(Q, kc, vc, k=KN, cache_seqlens=1)
    with pytest.raises(ValueError, match="pass cache_seqlens"):
        f(Q, kc, vc, KN, KN)
    with pytest.raises(ValueError, match=r"cache_seqlens has shape \(3,\)"):
        f(Q, kc, vc, cache_seqlens=[1, 2, 3])
    with pytest.raises(TypeError, match="integers"):
        f(Q, kc, vc, cache_seqlens=np.array([1.0, 2.0]))
    pool = np.zeros((6, 4, 2, 16), np.float32)
    for bt in (np.zeros(2, np.int32), np.zeros((3, 2), np.int32), np.zeros((2, 0), np.int32)):
        with pytest.raises(ValueError, match="block_table has shape"):
            f(Q, pool, pool, cache_seqlens=1, block_table=bt)
    with pytest.raises(TypeError, match="integers"):
        f(Q, pool, pool, cache_seqlens=1, block_table=np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="cache_batch_idx selects rows"):
        f(Q, pool, pool, cache_seqlens=1, block_table=np.zeros((2, 1), np.int32),
          cache_batch_idx=[0, 1])
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\] = 2 is outside"):
        f(Q, kc, vc, cache_seqlens=1, cache_batch_idx=[0, 2])
    with pytest.raises(ValueError, match="expected 4 dimensions"):
        f(Q[0], kc, vc, cache_seqlens=1)
    with pytest.raises(ValueError, match="softmax_scale = 0"):
        f(Q, kc, vc, cache_seqlens=1, softmax_scale=0.0)
    # the cache is written in place: a layout that would need a copy, or a read-only array
    strided = np.zeros((2, 8, 2, 32), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="cannot be written in place"):
        f(Q, strided, vc, KN, KN, cache_seqlens=1)
    ro = KC.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        f(Q, ro, vc, KN, KN, cache_seqlens=1)
    assert not kc.any() and not vc.any()
    # reading (no append) from such caches is fine: they are copied
    f(Q, strided, ro, cache_seqlens=1)


def test_library_errors_leave_the_cache_alone():
    f = flashattn.flash_attn_with_kvcache
    pool = np.zeros((6, 4, 2, 16), np.float32)
    bt = np.array([[0, 1], [2, 6]], np.int32)          # page 6 is outside the pool of 6
    lib_error("FA_ERR_INVALID_ARGUMENT", "block_table[1][1] = 6, outside the pool of 6 pages",
              f, Q, pool, pool.copy(), KN, KN, cache_seqlens=[3, 4], block_table=bt)
    lib_error("FA_ERR_SHAPE", "the cache has room for 8", f, Q, KC.copy(), KC.copy(), KN, KN,
              cache_seqlens=[3, 8])
    # paged: the room is a block_table row's pages (2 of 4 tokens), and the message says so
    lib_error("FA_ERR_SHAPE", "more than the 8 that a row of block_table maps", f, Q, pool,
              pool.copy(), KN, KN, cache_seqlens=[3, 8],
              block_table=np.array([[0, 1], [2, 3]], np.int32))
    lib_error("FA_ERR_SHAPE", "seqlens[0] = -1", f, Q, KC.copy(), KC.copy(),
              cache_seqlens=[-1, 2])
    bt = np.array([[0, 1], [1, 2]], np.int32)          # both append to row 1 of page 1
    lib_error("FA_ERR_INVALID_ARGUMENT", "both append to row 1 of pool page 1", f, Q, pool,
              pool.copy(), KN, KN, cache_seqlens=[5, 1], block_table=bt)
    lib_error("FA_ERR_INVALID_ARGUMENT", "num_splits = -1", f, Q, KC.copy(), KC.copy(),
              cache_seqlens=1, num_splits=-1)
    lib_error("FA_ERR_GQA", "heads_q = 4 is not a multiple of heads_kv = 3", f, Q,
              np.zeros((2, 8, 3, 16), np.float32), np.zeros((2, 8, 3, 16), np.float32),
              cache_seqlens=1)
    lib_error("FA_ERR_DTYPE", "f16", f, Q, KC.astype(np.float16), KC.astype(np.float16),
              cache_seqlens=1)
    assert not pool.any()


def test_merge_errors():
    o = np.zeros((1, 2, 2, 8), np.float32)
    lse = np.zeros((1, 2, 2), np.float32)
    with pytest.raises(ValueError, match="at least one part"):
        flashattn.merge_attn([], [])
    with pytest.raises(ValueError, match="one LSE per part"):
        flashattn.merge_attn([o, o], [lse])
    lib_error("FA_ERR_DTYPE", "lse_parts[1] is f64", flashattn.merge_attn, [o, o],
              [lse, lse.astype(np.float64)])
    lib_error("FA_ERR_SHAPE", "lse_parts[0] must be [batch, heads, seqlen]", flashattn.merge_attn,
              [o], [lse[:, :, :1]])
    lib_error("FA_ERR_SHAPE", "out_parts[1]", flashattn.merge_attn, [o, o[:, :1]], [lse, lse])


def test_zero_batch_and_device_checks_option():
    out, lse = flashattn.flash_attn_with_kvcache(Q[:0], KC[:0], KC[:0], cache_seqlens=[],
                                                 return_softmax_lse=True)
    assert out.shape == (0, 1, 4, 16) and lse.shape == (0, 4, 1)
    old = flashattn.set_options(device_checks=False)
    try:
        assert flashattn.get_options()["device_checks"] is False
        out = flashattn.flash_attn_with_kvcache(Q, KC, KC, cache_seqlens=2)  # CPU: no effect
        assert out.shape == Q.shape
    finally:
        flashattn.set_options(device_checks=True if old["device_checks"] is None
                              else old["device_checks"])


# ---- torch CPU tensors ----

def test_torch_paged_kvcache_matches_numpy(rng, seed):
    torch = pytest.importorskip("torch")
    case = KV(lens=(15, 30, 1), sq=2, new=3, hq=4, hk=2, d=16, page=16, causal=True)
    cache, q, kn, vn, _ = inputs(case, rng)
    tk, tv = torch.from_numpy(cache.k.copy()), torch.from_numpy(cache.v.copy())
    tq = torch.from_numpy(q).requires_grad_()
    expect = cache.appended(kn, vn)
    out, lse = run(case, cache, q, kn, vn, None)                     # numpy, appends
    tout, tlse = flashattn.flash_attn_with_kvcache(
        tq, tk, tv, torch.from_numpy(kn), torch.from_numpy(vn),
        cache_seqlens=torch.tensor(case.lens, dtype=torch.int32),
        block_table=torch.from_numpy(cache.table), causal=True, return_softmax_lse=True)
    assert isinstance(tout, torch.Tensor) and tout.grad_fn is None
    np.testing.assert_array_equal(tout.numpy(), out)                 # one kernel, one result
    np.testing.assert_array_equal(tlse.numpy(), lse)
    assert np.array_equal(bits(tk.numpy()), bits(expect[0]))
    assert np.array_equal(bits(tv.numpy()), bits(expect[1]))
    # merge_attn on torch tensors
    mo, ml = flashattn.merge_attn([tout.detach(), tout.detach()], [tlse, tlse])
    np.testing.assert_allclose(mo.numpy(), out, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ml.numpy(), lse + np.log(2), rtol=0, atol=1e-5)


# ---- fused rotary embedding and left-padded caches (flash_attn's semantics) ----

def rotate(x, cos, sin, pos, interleaved):
    """x (..., d) float64 with its first rotary_dim columns rotated at positions pos (an array
    broadcasting against x's leading dimensions), written out here in numpy: pairs (2c, 2c+1)
    interleaved (GPT-J), else (c, c + rotary_dim / 2) (GPT-NeoX)."""
    x = np.array(x, dtype=np.float64)
    half = cos.shape[1]
    c = np.asarray(cos, np.float64)[pos][..., None, :]  # (..., 1 head, half)
    s_ = np.asarray(sin, np.float64)[pos][..., None, :]
    i1 = np.arange(half) * 2 if interleaved else np.arange(half)
    i2 = i1 + 1 if interleaved else i1 + half
    x1, x2 = x[..., i1].copy(), x[..., i2].copy()
    x[..., i1] = x1 * c - x2 * s_
    x[..., i2] = x1 * s_ + x2 * c
    return x


@dataclasses.dataclass
class Rot:
    case: KV
    rot_dim: int = 32
    interleaved: bool = True
    tables_f32: bool = False
    lpad: tuple = None           # cache_leftpad (contiguous caches only)

    def __str__(self):
        return (f"{self.case} rot{self.rot_dim}{'-pairs' if self.interleaved else '-halves'}"
                f"{'-f32tables' if self.tables_f32 else ''}"
                + (f" leftpad{list(self.lpad)}" if self.lpad else ""))


ROT_CASES = [
    Rot(KV(lens=(37, 0, 100), sq=1, new=1, hq=4, hk=2, d=72), 32, False),
    Rot(KV(lens=(20, 3, 64), sq=5, new=5, hq=6, hk=3, d=72, causal=True), 32, True),
    Rot(KV(lens=(10, 50, 7), sq=5, new=5, hq=4, hk=4, d=72, page=16), 32, True, True),
    Rot(KV(lens=(30, 9, 12), sq=5, new=5, hq=4, hk=2, d=72, page=16, causal=True), 72, False),
    Rot(KV(lens=(44, 5, 17), sq=3, new=3, hq=4, hk=2, d=64, window=(8, -1)), 16, False),
    Rot(KV(lens=(30, 8, 70), sq=5, new=5, hq=4, hk=2, d=72, causal=True), 32, False,
        lpad=(7, 0, 69)),
    Rot(KV(lens=(40, 10, 100), sq=1, new=1, hq=4, hk=2, d=72), 32, True, lpad=(5, 10, 37)),
    Rot(KV(lens=(50, 20, 6), sq=2, new=0, hq=4, hk=2, d=40, window=(8, -1)), 0,
        lpad=(12, 20, 0)),
]


def rot_inputs(rc, rng, poison=(np.nan, np.nan)):
    case = rc.case
    cache, q, k_new, v_new, _ = inputs(case, rng)
    # rows before the left padding hold NaN: the CPU must neither attend to nor read them
    # (the GPU gets loud finite values: a masked key sharing a tile with visible ones may
    # carry NaN into a row there, fa_fwd's note on issue 42)
    for b, lp in enumerate(rc.lpad or ()):
        for t in range(lp):
            cache.k[cache.where(b, t)] = poison[0]
            cache.v[cache.where(b, t)] = poison[1]
    cos = sin = None
    if rc.rot_dim:
        cap = cache.k.shape[1] * (cache.max_pages if case.page else 1)
        tdt = np.float32 if rc.tables_f32 else case.dtype
        ang = rng.uniform(0, 2 * np.pi, (cap + case.sq, rc.rot_dim // 2))
        cos, sin = np.cos(ang).astype(tdt), np.sin(ang).astype(tdt)
    return cache, q, k_new, v_new, cos, sin


def rot_reference(rc, cache, q, k_new, v_new, cos, sin, prec):
    """kv_reference on the rotated q and new keys (rounded to prec for the baseline), keys
    from each sequence's left padding on."""
    case = rc.case
    lens = np.array(case.lens)
    qr, kr = np.asarray(q, np.float64), None if k_new is None else np.asarray(k_new, np.float64)
    if rc.rot_dim:
        per_token = case.causal or case.window != (-1, -1)
        qpos = lens[:, None] + (np.arange(case.sq)[None, :] if per_token else 0)
        qr = rotate(q, cos, sin, np.broadcast_to(qpos, (case.batch, case.sq)), rc.interleaved)
        kr = rotate(k_new, cos, sin, lens[:, None] + np.arange(case.new)[None, :],
                    rc.interleaved)
    if prec is not None:
        qr = qr.astype(prec)
        kr = None if kr is None else kr.astype(prec)
    b, sq = case.batch, case.sq
    keys, vals = [], []
    for i, n in enumerate(case.lens):
        lp = rc.lpad[i] if rc.lpad else 0
        ks = [np.asarray(cache.rows(cache.k, i, n), np.float64)[lp:]]
        vs = [np.asarray(cache.rows(cache.v, i, n), np.float64)[lp:]]
        if kr is not None:
            ks.append(np.asarray(kr[i], np.float64))
            vs.append(np.asarray(v_new[i], np.float64))
        keys.append(np.concatenate(ks))
        vals.append(np.concatenate(vs))
    cu_k = np.concatenate([[0], np.cumsum([len(x) for x in keys])]).astype(np.int64)
    res = R.attention(np.asarray(qr, np.float64).reshape(b * sq, case.hq, case.d),
                      np.concatenate(keys), np.concatenate(vals),
                      scale=f32(1.0 / np.sqrt(case.d)), causal=case.causal, window=case.window,
                      cu_q=np.arange(b + 1) * sq, cu_k=cu_k, prec=prec)
    return {"out": res["out"].reshape(q.shape),
            "lse": res["lse"].reshape(case.hq, b, sq).transpose(1, 0, 2)}, kr


def rot_check(rc, dtype, rng, seed, dev=None):
    """One ROT_CASES case against the float64 reference. dev: None runs on numpy arrays; else
    (to, back) converting numpy arrays to device tensors and back (test_cuda.py)."""
    rc = dataclasses.replace(rc, case=dataclasses.replace(rc.case, dtype=dtype))
    case = rc.case
    cache, q, k_new, v_new, cos, sin = rot_inputs(rc, rng, (4.0, 100.0) if dev else
                                                  (np.nan, np.nan))
    q_before, kn_before = q.copy(), None if k_new is None else k_new.copy()
    ref, k_rot = rot_reference(rc, cache, q, k_new, v_new, cos, sin, None)
    base, _ = rot_reference(rc, cache, q, k_new, v_new, cos, sin, case.dtype)
    expect_k, expect_v = cache.appended(k_new, v_new)
    to, back = dev if dev else ((lambda x: x), (lambda x: x))
    opt = lambda x: None if x is None else to(x)  # noqa: E731
    kc, vc = to(cache.k), to(cache.v)
    out, lse = flashattn.flash_attn_with_kvcache(
        to(q), kc, vc, opt(k_new), opt(v_new), rotary_cos=opt(cos), rotary_sin=opt(sin),
        cache_seqlens=to(np.array(case.lens, np.int32)), block_table=opt(cache.table),
        cache_leftpad=None if rc.lpad is None else to(np.array(rc.lpad, np.int32)),
        causal=case.causal, window_size=case.window, rotary_interleaved=rc.interleaved,
        return_softmax_lse=True)
    out, lse, cache.k, cache.v = back(out), back(lse), back(kc), back(vc)
    tag = f"{rc} {np.dtype(dtype).name} seed {seed}"
    R.check_rule(f"out [{tag}]", np.asarray(out, np.float64), base["out"], ref["out"], dtype,
                 seed=seed)
    R.check_rule(f"lse [{tag}]", lse, base["lse"], ref["lse"], dtype, seed=seed)
    empty = np.isneginf(ref["lse"])
    assert np.all(np.asarray(out, np.float64).transpose(0, 2, 1, 3)[empty] == 0), tag
    assert np.all(np.isfinite(np.asarray(out, np.float64))), tag
    # q and k are inputs: not written
    assert np.array_equal(bits(q), bits(q_before)), tag
    if k_new is not None:
        assert np.array_equal(bits(k_new), bits(kn_before)), tag
    # the cache: v appended as is, k rotated (one rounding to the dtype, fp32 arithmetic),
    # nothing else touched
    assert np.array_equal(bits(cache.v), bits(expect_v)), f"v cache [{tag}]"
    if k_new is not None:
        u = {F32: 2.0**-24, F16: 2.0**-11}.get(np.dtype(dtype), 2.0**-8) + 2.0**-22
        for b, n in enumerate(case.lens):
            for t in range(case.new):
                got = np.asarray(cache.k[cache.where(b, n + t)], np.float64)
                mag = np.abs(np.asarray(k_new[b, t], np.float64)).max(axis=-1, keepdims=True)
                assert np.all(np.abs(got - k_rot[b, t]) <= u * (np.abs(k_rot[b, t]) + 4 * mag)), \
                    f"rotated key b{b} t{t} [{tag}]"
                expect_k[cache.where(b, n + t)] = cache.k[cache.where(b, n + t)]
    assert np.array_equal(bits(cache.k), bits(expect_k)), f"k cache [{tag}]"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rc", ROT_CASES, ids=[str(c) for c in ROT_CASES])
def test_rotary_and_leftpad_against_reference(rc, dtype, rng, seed):
    rot_check(rc, dtype, rng, seed)


def test_rotary_non_causal_uses_one_position():
    """flash_attn's rule: without causal or a window every query rotates at cache_seqlens; a
    query identical across tokens then gives identical rows (per-token positions would not)."""
    rng = np.random.default_rng(5)
    q = np.repeat(rng.standard_normal((1, 1, 2, 16)).astype(np.float32), 4, axis=1)
    kc = np.zeros((1, 16, 2, 16), np.float32)
    kc[:, :6] = rng.standard_normal((1, 6, 2, 16))
    kn = rng.standard_normal((1, 4, 2, 16)).astype(np.float32)
    ang = rng.uniform(0, 2 * np.pi, (16, 8))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    f = flashattn.flash_attn_with_kvcache
    out = f(q, kc.copy(), kc.copy(), kn, kn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=6)
    assert np.array_equal(out[0, 0], out[0, 3])
    out = f(q, kc.copy(), kc.copy(), kn, kn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=6,
            causal=True)
    assert not np.allclose(out[0, 2], out[0, 3])


def test_rotary_and_leftpad_errors():
    f = flashattn.flash_attn_with_kvcache
    cos = np.ones((8, 4), np.float32)
    kc, vc = KC.copy(), KC.copy()
    with pytest.raises(ValueError, match="rotary_cos is given but rotary_sin is not"):
        f(Q, kc, vc, KN, KN, cache_seqlens=1, rotary_cos=cos)
    with pytest.raises(ValueError, match=r"rotary_sin has shape \(8,\)"):
        f(Q, kc, vc, KN, KN, cache_seqlens=1, rotary_cos=cos, rotary_sin=np.ones(8, np.float32))
    with pytest.raises(ValueError, match=r"cache_leftpad has shape \(3,\)"):
        f(Q, kc, vc, KN, KN, cache_seqlens=1, cache_leftpad=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="cache_batch_idx with cache_leftpad"):
        f(Q, kc, vc, cache_seqlens=1, cache_batch_idx=[0, 1], cache_leftpad=[0, 0])
    lib_error("FA_ERR_NULL_POINTER", "k_new/v_new are NULL", f, Q, kc, vc, cache_seqlens=1,
              rotary_cos=cos, rotary_sin=cos)
    lib_error("FA_ERR_SHAPE", "rotary_dim = 18, more than head_dim = 16", f, Q, kc, vc, KN, KN,
              cache_seqlens=1, rotary_cos=np.ones((8, 9), np.float32),
              rotary_sin=np.ones((8, 9), np.float32))
    lib_error("FA_ERR_SHAPE", "rotary_cos has 7 rows", f, Q, kc, vc, KN, KN, cache_seqlens=1,
              rotary_cos=cos[:7], rotary_sin=cos[:7])
    lib_error("FA_ERR_DTYPE", "rotary_cos is f16", f, Q, kc, vc, KN, KN, cache_seqlens=1,
              rotary_cos=cos.astype(np.float16), rotary_sin=cos.astype(np.float16))
    lib_error("FA_ERR_INVALID_ARGUMENT", "cache_leftpad[1] = 3, must be in [0, cache->seqlens[1]",
              f, Q, kc, vc, KN, KN, cache_seqlens=[2, 2], cache_leftpad=[0, 3])
    pool = np.zeros((6, 4, 2, 16), np.float32)
    lib_error("FA_ERR_UNSUPPORTED", "cache_leftpad with a paged cache", f, Q, pool, pool.copy(),
              KN, KN, cache_seqlens=1, block_table=np.array([[0, 1], [2, 3]], np.int32),
              cache_leftpad=[0, 0])
    assert not kc.any() and not vc.any() and not pool.any()


def test_rotary_torch_cpu_matches_numpy(rng, seed):
    torch = pytest.importorskip("torch")
    rc = ROT_CASES[1]
    case = rc.case
    cache, q, k_new, v_new, cos, sin = rot_inputs(rc, rng)
    kc_np, vc_np = cache.k.copy(), cache.v.copy()
    kw = dict(cache_seqlens=np.array(case.lens, np.int32), causal=True, rotary_interleaved=True)
    out_np = flashattn.flash_attn_with_kvcache(q, kc_np, vc_np, k_new, v_new, rotary_cos=cos,
                                               rotary_sin=sin, **kw)
    t = torch.from_numpy
    kc_t, vc_t = t(cache.k.copy()), t(cache.v.copy())
    kw["cache_seqlens"] = t(kw["cache_seqlens"])
    out_t = flashattn.flash_attn_with_kvcache(t(q), kc_t, vc_t, t(k_new), t(v_new),
                                              rotary_cos=t(cos), rotary_sin=t(sin), **kw)
    assert np.array_equal(bits(out_t.numpy()), bits(out_np))
    assert np.array_equal(bits(kc_t.numpy()), bits(kc_np))
