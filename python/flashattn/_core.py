"""Forward and backward on numpy arrays or torch tensors (no autograd here).

These are the public low-level entry points `flashattn.attention_forward` and
`flashattn.attention_backward`; the flash_attn-compatible functions and the torch autograd
Function are built on them.
"""

import ctypes
import math

from . import _context, _fp8, _lib, _native
from ._tensors import ops_for

_OPTION_DOC = """
    softmax_scale  multiplier of q.k; None: 1/sqrt(head_dim) (0 is rejected: the library reads
                   0 as "default")
    causal         bottom-right aligned causal mask (query i sees keys j <= i + sk - sq);
                   as in flash_attn, it overrides window_size[1] (the right side becomes 0)
    window_size    (left, right) around the diagonal, -1 for unbounded on that side
    softcap        > 0: scores become softcap * tanh(score / softcap); 0: off
    alibi_slopes   fp32 (nheads,) or (batch, nheads): adds -slope * |i + sk - sq - j|
    cu_seqlens_q/k int32 (batch + 1,) prefix sums: varlen mode, tensors are (total, heads, d)
    max_seqlen_q/k bounds on the lengths (None or 0: computed by the library on the CPU)
    dropout        None, or (dropout_p, seed, offset): each probability kept with probability
                   1 - dropout_p and scaled by 1 / (1 - dropout_p), the mask a function of seed,
                   offset and the element (dropout_mask returns it); pass the forward's triple
                   to the backward. The CPU backend only (CUDA: FlashAttnError, not built yet)
    q_descale, k_descale, v_descale
                   FP8 inputs only (forward): None (1), or fp32 (batch, num_heads_k) on q's
                   device, FlashAttention-3's shape; the real value of a stored element is
                   its descale (per batch entry and kv head, q's too) times it
"""


class Options:
    """Resolved options of one attention call, shared by its forward and backward."""

    __slots__ = ("softmax_scale", "causal", "window", "softcap", "alibi_slopes", "cu_seqlens_q",
                 "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "deterministic", "dropout",
                 "descales")

    def __init__(self, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                 max_seqlen_k=None, deterministic=False, dropout=None, descales=None):
        if softmax_scale is not None:
            softmax_scale = float(softmax_scale)
            if softmax_scale == 0.0:
                raise ValueError("softmax_scale = 0 is not supported (the library reads 0 as "
                                 "'use the default 1/sqrt(head_dim)'); pass None for the default")
            softmax_scale = _lib.c_float(softmax_scale, "softmax_scale")
        try:
            left, right = (int(w) for w in window_size)
        except (TypeError, ValueError):
            raise ValueError(f"window_size = {window_size!r}, expected (left, right) integers, "
                             f"-1 for unbounded") from None
        left = _lib.c_int(left, "window_size[0]")
        right = _lib.c_int(right, "window_size[1]")
        if causal and right > 0:
            right = 0  # flash_attn: causal wins over the window's right side
        if (cu_seqlens_q is None) != (cu_seqlens_k is None):
            raise ValueError("varlen needs both cu_seqlens_q and cu_seqlens_k")
        self.softmax_scale = softmax_scale
        self.causal = bool(causal)
        self.window = (left, right)
        self.softcap = _lib.c_float(softcap, "softcap")
        self.alibi_slopes = alibi_slopes
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_k = cu_seqlens_k
        self.max_seqlen_q = 0 if max_seqlen_q is None else _lib.c_int(max_seqlen_q, "max_seqlen_q")
        self.max_seqlen_k = 0 if max_seqlen_k is None else _lib.c_int(max_seqlen_k, "max_seqlen_k")
        self.deterministic = bool(deterministic)
        # None, or (p, seed, offset) resolved once: the backward reuses them (same mask)
        self.dropout = _dropout_triple(dropout)
        # None, or (q_descale, k_descale, v_descale) as given (FP8 inputs; _fp8 checks them)
        self.descales = (None if descales is None or all(d is None for d in descales)
                         else tuple(descales))

    def ext_scalars(self):
        """softmax_scale, causal, window_size, softcap: the extension's scalar arguments."""
        return self.softmax_scale, self.causal, self.window, self.softcap

    @property
    def varlen(self):
        return self.cu_seqlens_q is not None

    def scale_for(self, head_dim):
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(head_dim)


def _dropout_triple(dropout):
    """None, or (dropout_p, seed, offset) with p a float32 in (0, 1) and uint64 seed and offset;
    p = 0 is None (off)."""
    if dropout is None:
        return None
    p, seed, offset = dropout
    p = _lib.c_float(p, "dropout_p")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p = {p}, must be in [0, 1)")
    if p == 0.0:
        return None
    seed, offset = int(seed), int(offset)
    for name, x in (("dropout seed", seed), ("dropout offset", offset)):
        if not 0 <= x < 1 << 64:
            raise ValueError(f"{name} = {x}, must be in [0, 2^64)")
    return (p, seed, offset)


def _require(fn, **arrays):
    """A clear error for a required array passed as None (not an AttributeError further on)."""
    for name, x in arrays.items():
        if x is None:
            hint = (" (the forward's log-sum-exp: attention_forward returns it with "
                    "return_lse=True)" if name == "softmax_lse" else "")
            raise ValueError(f"{fn}: {name} is None; it is required{hint}")


def _check_ndim(opts, **tensors):
    nd = 3 if opts.varlen else 4
    layout = "(total, heads, head_dim)" if opts.varlen else "(batch, seqlen, heads, head_dim)"
    for name, t in tensors.items():
        if t.ndim != nd:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected {nd} dimensions "
                             f"{layout}{' (varlen)' if opts.varlen else ''}")


def aux_arrays(ops, opts, q):
    """The call's small arrays in the form the library reads (contiguous, int32 prefix sums and
    fp32 slopes, on q's device), with their shapes checked: (alibi, cu_q, cu_k, batch, alibi
    batch stride)."""
    heads_q = q.shape[-2]
    batch = q.shape[0]
    cq = ck = alibi = None
    alibi_stride = 0
    if opts.varlen:
        cq = ops.small(opts.cu_seqlens_q, "int32", q, "cu_seqlens_q")
        ck = ops.small(opts.cu_seqlens_k, "int32", q, "cu_seqlens_k")
        if cq.ndim != 1 or cq.shape[0] < 2:
            raise ValueError(f"cu_seqlens_q has shape {tuple(cq.shape)}: expected "
                             f"(batch + 1,) with batch >= 1")
        if tuple(ck.shape) != tuple(cq.shape):
            raise ValueError(f"cu_seqlens_k has shape {tuple(ck.shape)} but cu_seqlens_q has "
                             f"{tuple(cq.shape)}: both hold batch + 1 values")
        batch = cq.shape[0] - 1
    if opts.alibi_slopes is not None:
        alibi = ops.small(opts.alibi_slopes, "float32", q, "alibi_slopes")
        if alibi.ndim == 1 and alibi.shape[0] == heads_q:
            alibi_stride = 0
        elif alibi.ndim == 2 and tuple(alibi.shape) == (batch, heads_q):
            alibi_stride = heads_q
        else:
            raise ValueError(f"alibi_slopes has shape {tuple(alibi.shape)}: expected "
                             f"({heads_q},) or ({batch}, {heads_q}) (nheads or "
                             f"batch x nheads, fp32)")
    return alibi, cq, ck, batch, alibi_stride


class _Bound:
    """An Options bound to the tensors of one call for the ctypes binding: fa_params plus the
    arrays it points into (kept alive here for the duration of the call)."""

    def __init__(self, ops, opts, q, backward, heads_k=0):
        self.params = _lib.Params.default()
        p = self.params
        p.softmax_scale = opts.softmax_scale or 0.0
        p.causal = int(opts.causal)
        p.window_left, p.window_right = opts.window
        p.softcap = opts.softcap
        p.deterministic = int(opts.deterministic and backward)
        if opts.dropout is not None:
            p.dropout_p, p.dropout_seed, p.dropout_offset = opts.dropout
        alibi, cq, ck, self.batch, alibi_stride = aux_arrays(ops, opts, q)
        self.keep = [x for x in (alibi, cq, ck) if x is not None]
        if not backward:
            desc = _fp8.descale_arrays(ops, opts.descales, q, heads_k, self.batch)
            _fp8.set_params(ops, p, desc)
            self.keep.append(desc)
        if opts.varlen:
            p.cu_seqlens_q = ops.ptr(cq)
            p.cu_seqlens_k = ops.ptr(ck)
            p.batch = self.batch
            p.max_seqlen_q = opts.max_seqlen_q
            p.max_seqlen_k = opts.max_seqlen_k
        if alibi is not None:
            p.alibi_batch_stride = alibi_stride
            p.alibi_slopes = ops.ptr(alibi)


def _declined(what):
    return RuntimeError(f"flashattn._ext declined {what} after the arguments were normalised: "
                        f"a bug in flashattn, please report it")


def _lse_shape(opts, q):
    if opts.varlen:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


def _lse_dtype(ops, q):
    return "float64" if ops.fa_dtype(q) == _lib.DTYPE_F64 else "float32"


def _rows_empty(opts, t):
    """No token rows at all (batch, seqlen or total is 0)."""
    dims = t.shape[:1] if opts.varlen else t.shape[:2]
    return any(n == 0 for n in dims) and t.shape[-1] > 0 and t.shape[-2] > 0


def _ctx_for(ops, q):
    device, index, stream = ops.place(q)
    backend = _lib.BACKEND_CUDA if device == _lib.DEVICE_CUDA else _lib.BACKEND_CPU
    return _context.context(backend, index, stream)


def attention_forward(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                      softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=None, max_seqlen_k=None, out=None, softmax_lse=None,
                      return_lse=True, dropout=None, q_descale=None, k_descale=None,
                      v_descale=None, _opts=None):
    """Attention forward through fa_fwd, on numpy arrays or torch tensors (no autograd).

    q (batch, seqlen_q, nheads, d), k/v (batch, seqlen_k, nheads_k, d); varlen: (total, heads, d).
    Returns (out, softmax_lse): out like q (contiguous, or the `out` given), softmax_lse fp32
    (batch, nheads, seqlen_q) or, varlen, (nheads, total_q) (None when return_lse is False).
    Rows that see no key get out = 0 and lse = -inf.
    FP8 q, k, v (float8_e4m3fn / float8_e5m2, one dtype; the CPU backend, and on CUDA e4m3 at
    head dims 128/256 on sm_90, else FlashAttnArgumentError FA_ERR_DTYPE): the library writes out in the dtype
    of the `out` given (f32, f16 or bf16); without one, out is bfloat16.
    """
    _require("attention_forward", q=q, k=k, v=v)
    opts = _opts or Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            dropout=dropout, descales=(q_descale, k_descale, v_descale))
    ext = _native.ext
    if ext is not None and opts.descales is None:
        r = ext.fwd(q, k, v, out, softmax_lse, return_lse, *opts.ext_scalars(), opts.alibi_slopes,
                    opts.cu_seqlens_q, opts.cu_seqlens_k, opts.max_seqlen_q, opts.max_seqlen_k,
                    False, opts.dropout, None)
        if r is not NotImplemented:
            return r
    ops = ops_for(q, k, v, out, softmax_lse)
    _check_ndim(opts, q=q, k=k, v=v)
    fp8 = _fp8.check_inputs(ops, {"q": q, "k": k, "v": v}, opts.descales)
    q, k, v = ops.prepare(q), ops.prepare(k), ops.prepare(v)
    if out is None and fp8:
        out = ops.empty(tuple(q.shape), q, _fp8.OUT_DTYPE)
    if ext is not None:
        for x in (out, softmax_lse):
            if x is not None:
                ops.view(x)  # raises for outputs the library cannot write
        alibi, cq, ck, batch, _ = aux_arrays(ops, opts, q)
        desc = _fp8.descale_arrays(ops, opts.descales, q, k.shape[-2], batch)
        r = ext.fwd(q, k, v, out, softmax_lse, return_lse, *opts.ext_scalars(), alibi, cq, ck,
                    opts.max_seqlen_q, opts.max_seqlen_k, False, opts.dropout, desc)
        if r is NotImplemented:
            raise _declined("fwd")
        return r
    want_lse = return_lse or softmax_lse is not None
    if out is None:
        out = ops.empty(tuple(q.shape), q)
    if want_lse and softmax_lse is None:
        softmax_lse = ops.empty(_lse_shape(opts, q), q, _lse_dtype(ops, q))
    if _rows_empty(opts, q) or _rows_empty(opts, k):
        # Nothing to compute: every query row (if any) sees no key.
        _context.clear_selection()
        out[...] = 0
        if want_lse:
            softmax_lse[...] = -math.inf
        return out, softmax_lse if want_lse else None
    with ops.guard(q):
        bound = _Bound(ops, opts, q, backward=False, heads_k=k.shape[-2])
        ctx = _ctx_for(ops, q)
        views = [ops.view(t) for t in (q, k, v, out)]
        lse_view = ctypes.byref(ops.view(softmax_lse)) if want_lse else None
        L = ctx._lib
        _context.call(ctx, L.fa_fwd, ctypes.byref(views[0]), ctypes.byref(views[1]),
                      ctypes.byref(views[2]), ctypes.byref(bound.params), ctypes.byref(views[3]),
                      lse_view)
    return out, softmax_lse if want_lse else None


def attention_backward(dout, q, k, v, out, softmax_lse, softmax_scale=None, causal=False,
                       window_size=(-1, -1), softcap=0.0, alibi_slopes=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                       deterministic=False, dq=None, dk=None, dv=None, dropout=None,
                       _opts=None):
    """Attention backward through fa_bwd: the gradients of out with respect to q, k, v.

    Takes the forward's q, k, v, its out and softmax_lse, the upstream gradient dout (like out),
    and the forward's options. Returns (dq, dk, dv), like q, k, v (or the arrays given, which
    may share memory with each other, as views of one packed dqkv do).
    deterministic  asks for run-to-run identical gradients (the CPU backend always is).
    """
    _require("attention_backward", dout=dout, q=q, k=k, v=v, out=out, softmax_lse=softmax_lse)
    opts = _opts or Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic,
                            dropout)
    ext = _native.ext
    if ext is not None:
        r = ext.bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, *opts.ext_scalars(),
                    opts.alibi_slopes, opts.cu_seqlens_q, opts.cu_seqlens_k, opts.max_seqlen_q,
                    opts.max_seqlen_k, opts.deterministic, opts.dropout)
        if r is not NotImplemented:
            return r
    ops = ops_for(dout, q, k, v, out, softmax_lse, dq, dk, dv)
    _check_ndim(opts, dout=dout, q=q, k=k, v=v, out=out)
    dout, q, k, v, out = (ops.prepare(t) for t in (dout, q, k, v, out))
    softmax_lse = ops.prepare(softmax_lse, last_unit=False)
    if ext is not None:
        for x in (dq, dk, dv):
            if x is not None:
                ops.view(x)
        alibi, cq, ck, _, _ = aux_arrays(ops, opts, q)
        r = ext.bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, *opts.ext_scalars(), alibi, cq,
                    ck, opts.max_seqlen_q, opts.max_seqlen_k, opts.deterministic, opts.dropout)
        if r is NotImplemented:
            raise _declined("bwd")
        return r
    grads = [g if g is not None else ops.empty(tuple(t.shape), t)
             for g, t in ((dq, q), (dk, k), (dv, v))]
    if _rows_empty(opts, q) or _rows_empty(opts, k):
        _context.clear_selection()
        for g in grads:
            g[...] = 0
        return tuple(grads)
    with ops.guard(q):
        bound = _Bound(ops, opts, q, backward=True)
        ctx = _ctx_for(ops, q)
        views = [ops.view(t) for t in (q, k, v, out, dout, softmax_lse)]
        gviews = [ops.view(g) for g in grads]
        r = ctypes.byref
        _context.call(ctx, ctx._lib.fa_bwd, *(r(x) for x in views), r(bound.params),
                      *(r(g) for g in gviews))
    return tuple(grads)


attention_forward.__doc__ += _OPTION_DOC
attention_backward.__doc__ += _OPTION_DOC
