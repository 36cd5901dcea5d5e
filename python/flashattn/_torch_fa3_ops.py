"""flash_attn_varlen_func's FlashAttention-3 arguments (seqused_q, seqused_k, block_table) as
torch.library ops, for torch.compile and torch.export.

Their eager paths (_fa3) read the index arrays on the host to size packed tensors, which a
traced graph cannot do; inside an op they run as they do eagerly, and the op's outputs have
shapes known from q alone: out like q, softmax_lse (nheads, total_q), rows that are not
computed 0 and -inf. The backward (seqused without block_table; a paged call has none, as
eagerly) is an op too: the used rows gathered, fa_bwd on them, the gradients scattered.
Imported by _torch_ops.
"""

from typing import Optional

import torch
from torch import Tensor

from . import _core, _fa3

_NS = "flashattn_c"


def _out_like(q):
    fp8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
    return q.new_empty(q.shape, dtype=torch.bfloat16 if q.dtype in fp8 else q.dtype)


def _full_rows(q, out, lse):
    """out and lse over every row of q: a paged call returns the rows cu_seqlens_q covers,
    which may be fewer (the rest: out 0, lse -inf, as for rows past seqused_q)."""
    n = q.shape[0]
    if out.shape[0] == n:
        return out.contiguous(), lse.contiguous()
    o = out.new_zeros((n,) + tuple(out.shape[1:]))
    o[:out.shape[0]] = out
    lf = lse.new_full((lse.shape[0], n), float("-inf"))
    lf[:, :lse.shape[1]] = lse
    return o, lf


@torch.library.custom_op(f"{_NS}::varlen_fa3", mutates_args=())
def varlen_fa3(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
               cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               seqused_q: Optional[Tensor], seqused_k: Optional[Tensor],
               block_table: Optional[Tensor], softmax_scale: float, causal: bool,
               window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], deterministic: bool,
               q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
               v_descale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """flash_attn_varlen_func with seqused_q / seqused_k / block_table: (out, softmax_lse).
    max_seqlen_q/k 0: not given."""
    from .flash_attn_interface import flash_attn_varlen_func
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q or None, max_seqlen_k or None, 0.0,
        softmax_scale, causal, (window_left, window_right), softcap, alibi_slopes,
        deterministic, True, block_table, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, seqused_q=seqused_q, seqused_k=seqused_k)
    return _full_rows(q, out, lse)


@varlen_fa3.register_fake
def _varlen_fa3_fake(q, k, v, *rest, **kw):
    return _out_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::varlen_fa3_bwd", mutates_args=())
def varlen_fa3_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_q: Optional[Tensor],
                   seqused_k: Optional[Tensor], softmax_scale: float, causal: bool,
                   window_left: int, window_right: int, softcap: float,
                   alibi_slopes: Optional[Tensor],
                   deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of varlen_fa3 without block_table: (dq, dk, dv), 0 in unused rows."""

    def bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k):
        return _core.attention_backward(
            dout, q, k, v, out, lse, softmax_scale, causal, (window_left, window_right),
            softcap, alibi_slopes, cu_q, cu_k, max_q, max_k, deterministic)

    return _fa3.seqused_backward(bwd, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                 seqused_q, seqused_k)


@varlen_fa3_bwd.register_fake
def _varlen_fa3_bwd_fake(dout, q, k, v, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    sq, sk, table = inputs[7:10]
    ctx.paged = table is not None
    ctx.scalars = inputs[10:15]  # softmax_scale, causal, window_left/right, softcap
    ctx.deterministic = inputs[16]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sq, sk, inputs[15])


def _backward(ctx, dout, dlse):
    if ctx.paged:
        raise RuntimeError("flash_attn_varlen_func(block_table=...) has no backward (an "
                           "inference call, as in flash_attn): run it under torch.no_grad() or "
                           "detach the inputs")
    q, k, v, out, lse, cu_q, cu_k, sq, sk, alibi = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = varlen_fa3_bwd(dout, q, k, v, out, lse, cu_q, cu_k, sq, sk, *ctx.scalars,
                                alibi, ctx.deterministic)
    return (dq, dk, dv) + (None,) * 17  # index arrays, options and descales: no gradient


varlen_fa3.register_autograd(_backward, setup_context=_setup)


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
           seqused_k, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
           deterministic, return_attn_probs, descales):
    """flash_attn_varlen_func(seqused_q= / seqused_k= / block_table=) under tracing."""
    if block_table is not None and torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v)):
        raise RuntimeError("flash_attn_varlen_func(block_table=...) has no backward (an "
                           "inference call, as in flash_attn): run it under torch.no_grad() or "
                           "detach the inputs")
    from ._torch_ops import scale_of
    out, lse = varlen_fa3(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q or 0),
                          int(max_seqlen_k or 0), seqused_q, seqused_k, block_table,
                          scale_of(softmax_scale, q), bool(causal), int(window_size[0]),
                          int(window_size[1]), float(softcap), alibi_slopes,
                          bool(deterministic), *descales)
    return (out, lse, None) if return_attn_probs else out
