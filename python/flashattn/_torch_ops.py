"""The calls as torch.library custom ops, for torch.compile and torch.export.

Namespace flashattn_c (flash_attn registers `flash_attn`, and `flashattn` is this package's
name): fwd, bwd and fwd_kvcache, each with a fake implementation (shapes only) and, for fwd,
registered autograd through bwd. Eager calls do not come here (the functions call the library
directly, which costs less host time); the functions of flash_attn_interface switch to these
ops while torch.compile or torch.export traces them, so a compiled model has no graph break.
Imported when torch is first seen (flashattn._tensors._import_torch).
"""

import math
from typing import Optional

import torch
from torch import Tensor

from . import _core, _kvcache

_NS = "flashattn_c"


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _opts(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
          cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
          deterministic=False, descales=None):
    return _core.Options(softmax_scale, causal, (window_left, window_right), softcap,
                         alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         deterministic, descales=descales)


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def _out_like(q):
    """The output of a call on q: like q, or bf16 for FP8 q (the library's FP8 output as the
    package allocates it, see _fp8)."""
    return q.new_empty(q.shape, dtype=torch.bfloat16 if q.dtype in _FP8 else q.dtype)


@torch.library.custom_op(f"{_NS}::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
        max_seqlen_k: int, deterministic: bool, q_descale: Optional[Tensor] = None,
        k_descale: Optional[Tensor] = None,
        v_descale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Attention forward: (out, softmax_lse). deterministic is the backward's. FP8 q, k, v
    (with their descales) give a bf16 out."""
    opts = _opts(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                 cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic,
                 (q_descale, k_descale, v_descale))
    return _core.attention_forward(q, k, v, _opts=opts)


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
              cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic,
              q_descale=None, k_descale=None, v_descale=None):
    varlen = cu_seqlens_q is not None
    return (_out_like(q),
            q.new_empty(_lse_shape(q, varlen), dtype=torch.float32))


@torch.library.custom_op(f"{_NS}::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
        deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Attention backward: (dq, dk, dv)."""
    opts = _opts(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                 cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic)
    return _core.attention_backward(dout, q, k, v, out, softmax_lse, _opts=opts)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, softmax_lse, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup(ctx, inputs, output):
    q, k, v = inputs[:3]
    ctx.scalars = inputs[3:8]          # softmax_scale, causal, window_left/right, softcap
    alibi, cu_q, cu_k = inputs[8:11]
    ctx.tail = inputs[11:14]           # max_seqlen_q/k, deterministic
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi, cu_q, cu_k)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, *ctx.scalars, alibi, cu_q, cu_k, *ctx.tail)
    return (dq, dk, dv) + (None,) * 14  # the 14 options and descales have no gradient


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


@torch.library.custom_op(f"{_NS}::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], cache_seqlens: Optional[Tensor], cache_seqlens_int: int,
                cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor],
                softmax_scale: float, causal: bool, window_left: int, window_right: int,
                softcap: float, alibi_slopes: Optional[Tensor], num_splits: int,
                q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                v_descale: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                rotary_sin: Optional[Tensor] = None, rotary_interleaved: bool = True,
                cache_leftpad: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """KV-cache attention with an in-place append: (out, softmax_lse). cache_seqlens_int is
    used when cache_seqlens is None and it is >= 0 (one length for every sequence). The fused
    rotary tables and cache_leftpad are op arguments (appended last, defaults as eager) so a
    traced call keeps them instead of breaking the graph."""
    seqlens = cache_seqlens if cache_seqlens is not None else (
        cache_seqlens_int if cache_seqlens_int >= 0 else None)
    opts = _opts(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                 descales=(q_descale, k_descale, v_descale))
    out, lse = _kvcache.kvcache_forward(q, k_cache, v_cache, k, v, seqlens, cache_batch_idx,
                                        block_table, num_splits, True, _opts=opts,
                                        rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                        rotary_interleaved=rotary_interleaved,
                                        cache_leftpad=cache_leftpad)
    return out, lse


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, *rest):
    return (_out_like(q),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


# ---- what the flash_attn functions call while torch.compile / torch.export trace them ----

def scale_of(softmax_scale, q):
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _descales(opts):
    return opts.descales if opts.descales is not None else (None, None, None)


def attention(q, k, v, opts, return_lse):
    """flash_attn_func and the varlen functions under tracing: out, or (out, lse)."""
    out, lse = fwd(q, k, v, scale_of(opts.softmax_scale, q), opts.causal, opts.window[0],
                   opts.window[1], opts.softcap, opts.alibi_slopes, opts.cu_seqlens_q,
                   opts.cu_seqlens_k, opts.max_seqlen_q, opts.max_seqlen_k, opts.deterministic,
                   *_descales(opts))
    return (out, lse) if return_lse else out


def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, opts,
            num_splits, return_lse, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
            cache_leftpad=None):
    """flash_attn_with_kvcache under tracing."""
    seqlens_int = -1
    if isinstance(cache_seqlens, int):
        seqlens_int, cache_seqlens = cache_seqlens, None
    scale = scale_of(opts.softmax_scale, q)
    out, lse = fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, seqlens_int,
                           cache_batch_idx, block_table, scale, opts.causal, opts.window[0],
                           opts.window[1], opts.softcap, opts.alibi_slopes, int(num_splits),
                           *_descales(opts), rotary_cos, rotary_sin, bool(rotary_interleaved),
                           cache_leftpad)
    return (out, lse) if return_lse else out


# flash_attn_varlen_func's seqused_q / seqused_k / block_table ops, registered with these
from . import _torch_fa3_ops  # noqa: E402,F401
