"""Builds attention cases, runs them through flashattn, the float64 reference and the plain
baseline, and applies the correctness rule."""

import dataclasses

import numpy as np

import reference as R

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
BF16 = R.BF16
DTYPES = [F32, F16] + ([BF16] if BF16 is not None else [])


@dataclasses.dataclass
class Case:
    b: int = 1
    sq: int = 8
    sk: int = 8
    hq: int = 2
    hkv: int = 2
    d: int = 16
    dtype: np.dtype = F32
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = None            # None, "head" or "batch"
    scale: float = None
    lens_q: tuple = None         # varlen when set
    lens_k: tuple = None
    strided: bool = False

    @property
    def varlen(self):
        return self.lens_q is not None

    @property
    def batch(self):
        return len(self.lens_q) if self.varlen else self.b

    def __str__(self):
        parts = [f"varlen q{list(self.lens_q)} k{list(self.lens_k)}" if self.varlen
                 else f"b{self.b} sq{self.sq} sk{self.sk}",
                 f"h{self.hq}/{self.hkv} d{self.d} {np.dtype(self.dtype).name}"]
        if self.causal:
            parts.append("causal")
        if self.window != (-1, -1):
            parts.append(f"window{self.window}")
        if self.softcap:
            parts.append(f"softcap{self.softcap}")
        if self.alibi:
            parts.append(f"alibi-{self.alibi}")
        if self.scale is not None:
            parts.append(f"scale{self.scale}")
        if self.strided:
            parts.append("strided")
        return " ".join(parts)


def randn(rng, shape, dtype, strided=False):
    """N(0, 1) values rounded to dtype; strided: a non-contiguous view (outer dimensions
    permuted, with gaps), whose last dimension stays contiguous."""
    x = rng.standard_normal(shape).astype(dtype)
    if not strided:
        return x
    n = len(shape)
    perm = list(rng.permutation(n - 1)) + [n - 1]
    big_shape = [shape[p] + (1 if i < n - 1 else 3) for i, p in enumerate(perm)]
    big = np.full(big_shape, np.nan, dtype=dtype)
    inner = big[tuple(slice(0, shape[p]) for p in perm)]
    inv = np.argsort(perm)
    view = inner.transpose(inv)
    view[...] = x
    assert not view.flags.c_contiguous and view.strides[-1] == view.itemsize
    return view


def cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def inputs(case, rng):
    """q, k, v (library dtype, maybe strided), slopes, cu_q, cu_k."""
    if case.varlen:
        qs = (sum(case.lens_q), case.hq, case.d)
        ks = (sum(case.lens_k), case.hkv, case.d)
        cu_q, cu_k = cu(case.lens_q), cu(case.lens_k)
    else:
        qs = (case.b, case.sq, case.hq, case.d)
        ks = (case.b, case.sk, case.hkv, case.d)
        cu_q = cu_k = None
    q = randn(rng, qs, case.dtype, case.strided)
    k = randn(rng, ks, case.dtype, case.strided)
    v = randn(rng, ks, case.dtype, case.strided)
    slopes = None
    if case.alibi == "head":
        slopes = rng.uniform(0.05, 1.0, case.hq).astype(np.float32)
    elif case.alibi == "batch":
        slopes = rng.uniform(0.05, 1.0, (case.batch, case.hq)).astype(np.float32)
    return q, k, v, slopes, cu_q, cu_k


def f32(x):
    """A scalar as the library sees it (fa_params holds floats)."""
    return None if x is None else float(np.float32(x))


def resolved_scale(case):
    return f32(case.scale) if case.scale is not None else f32(1.0 / np.sqrt(case.d))


def ref_kwargs(case, slopes, cu_q, cu_k):
    return dict(scale=resolved_scale(case), causal=case.causal, window=case.window,
                softcap=f32(case.softcap), alibi=slopes, cu_q=cu_q, cu_k=cu_k)


def lib_kwargs(case, slopes):
    return dict(softmax_scale=case.scale, causal=case.causal, window_size=case.window,
                softcap=case.softcap, alibi_slopes=slopes)


def check_forward(case, seed, q, k, v, slopes, cu_q, cu_k, out, lse):
    """Rule on out and lse; returns the reference dict for further checks."""
    kw = ref_kwargs(case, slopes, cu_q, cu_k)
    f64 = [np.asarray(x, dtype=np.float64) for x in (q, k, v)]
    ref = R.attention(*f64, **kw)
    base = R.attention(*f64, prec=case.dtype, **kw)
    tag = f"{case} seed {seed}"
    assert out.shape == ref["out"].shape and out.dtype == case.dtype, (out.shape, out.dtype)
    R.check_rule(f"out [{tag}]", np.asarray(out, dtype=np.float64), base["out"], ref["out"],
                 case.dtype, seed=seed)
    if lse is not None:
        assert lse.dtype == np.float32 and lse.shape == ref["lse"].shape, (lse.dtype, lse.shape)
        R.check_rule(f"lse [{tag}]", lse, base["lse"], ref["lse"], case.dtype, seed=seed)
    # rows that see no key: exactly 0 output, -inf lse
    empty = ~np.isfinite(ref["lse"])
    if lse is not None:
        assert np.all(np.isneginf(np.asarray(lse)[empty])), tag
    return ref


def check_backward(case, seed, q, k, v, dout, slopes, cu_q, cu_k, dq, dk, dv):
    kw = ref_kwargs(case, slopes, cu_q, cu_k)
    f64 = [np.asarray(x, dtype=np.float64) for x in (q, k, v, dout)]
    ref = R.attention(*f64, **kw)
    base = R.attention(*f64, prec=case.dtype, **kw)
    ref["dout"] = f64[3]
    n_rows = (max(case.lens_q) if case.varlen else case.sq) * (case.hq // case.hkv)
    ex_dq, ex_dk = R.grad_extra(ref, f64[0], f64[1], resolved_scale(case), n_rows)
    tag = f"{case} seed {seed}"
    for name, got, extra in (("dq", dq, ex_dq), ("dk", dk, ex_dk), ("dv", dv, 0.0)):
        got = np.asarray(got)
        assert got.shape == ref[name].shape and got.dtype == case.dtype, (name, got.shape)
        R.check_rule(f"{name} [{tag}]", got.astype(np.float64), base[name], ref[name],
                     case.dtype, extra=extra, seed=seed)
