"""The yardsticks of the Python tests, in numpy.

attention() computes softmax attention exactly as the library documents it (bottom-right
aligned masks, windows, softcap, ALiBi, GQA, varlen, LSE, empty rows -> O = 0, LSE = -inf),
and its gradients, in one of two precisions:
  prec=None   float64 throughout: the reference ("truth");
  prec=P      a plain implementation in P (float32, float16 or bfloat16): every matmul in
              fp32 with its result rounded to P, softmax and elementwise steps in fp32. Its
              error against the reference is the yardstick of the correctness rule.
check_rule() applies the correctness rule (docs/architecture.md): the library's max and mean
error against the reference may be at most 2x the plain implementation's, plus a slack of a few
roundings of P.
"""

import numpy as np

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11,
                 np.dtype(np.float64): 2.0**-53}
if BF16 is not None:
    UNIT_ROUNDOFF[BF16] = 2.0**-8


def visible_mask(sq, sk, causal, window):
    """(sq, sk) bool: key j visible to query i (bottom-right aligned)."""
    wl, wr = window
    if causal:
        wr = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    c = i + sk - sq
    m = np.ones((sq, sk), dtype=bool)
    if wl >= 0:
        m &= j >= c - wl
    if wr >= 0:
        m &= j <= c + wr
    return m


class _Arith:
    """The arithmetic of one precision. Arrays stay float64; the plain mode rounds them where
    a plain implementation stores a value (the same points as the library's FA_ALGO_PLAIN,
    src/cpu/ref_naive.c, so that this yardstick is the one the C tests use):
      f32()  an elementwise fp32 step (scaling, softcap, exp, softmax sums);
      rnd()  a finished matmul result stored in P;
      mm()   a matmul whose sum runs in fp32, term by term (fused multiply-add), rounded to P.
    A BLAS-style blocked/pairwise fp32 sum is several times more accurate than the term-by-term
    one at head_dim 256; the rule is defined against the latter."""

    def __init__(self, prec):
        self.plain = prec is not None
        self.prec = None if prec is None else np.dtype(prec)

    def f32(self, x):
        return np.asarray(x).astype(np.float32).astype(np.float64) if self.plain else x

    def rnd(self, x):
        if not self.plain:
            return x
        return np.asarray(x).astype(np.float32).astype(self.prec).astype(np.float64)

    def acc(self, spec, a, b):
        """einsum with one contracted index; plain: summed in fp32 in index order, unrounded."""
        if not self.plain:
            return np.einsum(spec, a, b, optimize=True)
        ins, out = spec.split("->")
        sa, sb = ins.split(",")
        c = next(ch for ch in sa if ch in sb and ch not in out)
        ia, ib = sa.index(c), sb.index(c)
        term = f"{sa.replace(c, '')},{sb.replace(c, '')}->{out}"
        total = 0.0
        for t in range(a.shape[ia]):  # products of two fp32 values are exact in float64
            total = self.f32(total + np.einsum(term, np.take(a, t, ia), np.take(b, t, ib)))
        return np.asarray(total, dtype=np.float64)

    def mm(self, spec, a, b):
        return self.rnd(self.acc(spec, a, b))

    def rowsum(self, x):
        """Sum over the last axis, fp32 and in order when plain."""
        if not self.plain or x.shape[-1] == 0:
            return x.sum(-1)
        return np.cumsum(x.astype(np.float32), axis=-1, dtype=np.float32)[..., -1].astype(
            np.float64)


def _sequences(q, k, cu_q, cu_k):
    """(q slice, k slice, batch index) per sequence; BSHD is a batch of equal lengths."""
    if cu_q is None:
        for b in range(q.shape[0]):
            yield (b, slice(None)), (b, slice(None)), b
    else:
        for b in range(len(cu_q) - 1):
            yield slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1]), b


def _group_major(x, hk, g):
    """(i, h, ...) with h = kv * g + r  ->  (r * i, kv, ...): the rows that feed one kv head,
    in the order the plain implementation sums them (query head of the group, then row)."""
    i = x.shape[0]
    y = x.reshape(i, hk, g, *x.shape[2:])
    y = np.moveaxis(y, 2, 0)
    return y.reshape(g * i, hk, *x.shape[2:])


def attention(q, k, v, dout=None, scale=None, causal=False, window=(-1, -1), softcap=0.0,
              alibi=None, cu_q=None, cu_k=None, prec=None):
    """Returns dict(out, lse[, dq, dk, dv]) as float64 arrays in the library's layouts.

    q, k, v, dout: arrays holding values exactly representable in prec (any float dtype).
    alibi: None, (hq,) or (batch, hq) slopes. cu_q/cu_k: varlen prefix sums (THD tensors).
    """
    A = _Arith(prec)
    hq, hk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    g = hq // hk
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.zeros(q.shape, dtype=np.float64)
    varlen = cu_q is not None
    lse = np.zeros((hq, q.shape[0]) if varlen else (q.shape[0], hq, q.shape[1]))
    grads = dout is not None
    if grads:
        dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for qs, ks, b in _sequences(q, k, cu_q, cu_k):
        Q, K, V = (np.asarray(x, dtype=np.float64) for x in (q[qs], k[ks], v[ks]))
        sq, sk = Q.shape[0], K.shape[0]
        Kx, Vx = np.repeat(K, g, axis=1), np.repeat(V, g, axis=1)  # head h reads kv h // g
        s = A.f32(A.mm("ihd,jhd->hij", Q, Kx) * scale)
        if softcap > 0:
            t = np.tanh(s / softcap)
            s = A.f32(softcap * t)
        if alibi is not None:
            slopes = np.asarray(alibi, dtype=np.float64)
            slopes = slopes[b] if slopes.ndim == 2 else slopes
            dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :])
            s = A.f32(s - slopes[:, None, None] * dist)
        vis = np.broadcast_to(visible_mask(sq, sk, causal, window)[None], s.shape)
        empty = ~vis.any(-1)
        mx = np.where(empty, 0.0, np.max(np.where(vis, s, -np.inf), axis=-1, initial=-np.inf))
        e = A.f32(np.where(vis, np.exp(np.where(vis, s, 0.0) - mx[..., None]), 0.0))
        tot = np.where(empty, 1.0, A.rowsum(e))
        p = A.f32(e / tot[..., None])
        row_lse = np.where(empty, -np.inf, A.f32(mx + np.log(tot)))
        out[qs] = A.mm("hij,jhd->ihd", A.rnd(p), Vx)
        if varlen:
            lse[:, qs] = row_lse
        else:
            lse[b] = row_lse
        if not grads:
            continue
        dO = np.asarray(dout[qs], dtype=np.float64)
        dP = A.mm("ihd,jhd->hij", dO, Vx)
        D = A.rowsum(p * dP) if not A.plain else _fma_rowsum(A, p, dP)
        dS = A.f32(p * (dP - D[..., None]))
        ddot = scale if softcap <= 0 else scale * (1 - t * t)
        dS = A.rnd(A.f32(dS * ddot))
        dq[qs] = A.mm("hij,jhd->ihd", dS, Kx)
        dS_n = _group_major(np.moveaxis(dS, 0, 1), hk, g)      # (g*sq, hk, sk)
        P_n = _group_major(np.moveaxis(A.rnd(p), 0, 1), hk, g)
        dk[ks] = A.mm("nkj,nkd->jkd", dS_n, _group_major(Q, hk, g))
        dv[ks] = A.mm("nkj,nkd->jkd", P_n, _group_major(dO, hk, g))
    res = {"out": out, "lse": lse}
    if grads:
        res.update(dq=dq, dk=dk, dv=dv)
    return res


def _fma_rowsum(A, p, dp):
    """D_i = sum_j P_ij dP_ij, fused multiply-adds in fp32, in order."""
    total = np.zeros(p.shape[:-1])
    for j in range(p.shape[-1]):
        total = A.f32(total + p[..., j] * dp[..., j])
    return total


# ---- the correctness rule ----

def errors(x, ref):
    """(max_abs, mean_abs, nonfinite) of x against ref. Where ref is -inf (an empty row's LSE)
    x must be exactly -inf; any other non-finite value of x counts as nonfinite."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    fin = np.isfinite(ref)
    bad = int(np.count_nonzero(~np.isfinite(x[fin])))
    bad += int(np.count_nonzero(x[~fin] != ref[~fin]))
    if not fin.any():
        return 0.0, 0.0, bad
    diff = np.abs(x[fin] - ref[fin])
    diff = np.where(np.isfinite(diff), diff, np.inf)
    return float(diff.max()), float(diff.mean()), bad


def check_rule(name, got, base, ref, prec, extra=0.0, seed=None):
    """Asserts the correctness rule (docs/architecture.md) for one output; returns the margin
    (error / allowed)."""
    k_max, k_mean, k_bad = errors(got, ref)
    b_max, b_mean, b_bad = errors(base, ref)
    ref_max = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0))
    slack = 4.0 * UNIT_ROUNDOFF[np.dtype(prec)] * max(1.0, ref_max) + extra
    lim_max, lim_mean = 2 * b_max + slack, 2 * b_mean + slack
    msg = (f"{name} ({np.dtype(prec).name}, seed {seed}): library max {k_max:.3g} mean "
           f"{k_mean:.3g}, plain max {b_max:.3g} mean {b_mean:.3g}, allowed max {lim_max:.3g} "
           f"mean {lim_mean:.3g}, nonfinite {k_bad}")
    assert k_bad == 0 and b_bad == 0, msg
    assert k_max <= lim_max and k_mean <= lim_mean, msg
    return max(k_max / lim_max, k_mean / lim_mean)


def grad_extra(ref, q, k, scale, n_rows):
    """The fp32 noise of D_i = rowsum(dO * O) in dQ and dK (see testkit/tk_case.c)."""
    dmag = float(np.max(np.abs(ref["dout"] * ref["out"]).sum(-1), initial=0.0))
    base = 8.0 * 2.0**-24 * dmag * scale
    return (base * float(np.max(np.abs(k))),
            base * float(np.max(np.abs(q))) * np.sqrt(n_rows))
