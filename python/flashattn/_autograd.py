"""The torch.autograd.Function behind the flash_attn-compatible functions.

Forward saves q, k, v (as given: packed tensors stay packed), out and the LSE; backward calls
fa_bwd with the same options. Packed inputs get packed gradients written in place through
views (dq, dk, dv of one dqkv buffer), so autograd never concatenates them.
"""

from . import _core, _tensors

_function = None


def unpack(layout, tensors):
    """q, k, v as views of the call's tensors. layout: 'q,k,v', 'q,kv' or 'qkv'."""
    if layout == "qkv":
        (qkv,) = tensors
        return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
    if layout == "q,kv":
        q, kv = tensors
        return q, kv[..., 0, :, :], kv[..., 1, :, :]
    return tensors


def _grad_buffers(layout, tensors, torch):
    """Gradient tensors to return to autograd, and the dq, dk, dv views fa_bwd writes."""
    grads = [torch.empty(tuple(t.shape), dtype=t.dtype, device=t.device) for t in tensors]
    return grads, unpack(layout, grads)


def function():
    """FlashAttnFunction, defined on first use so that importing flashattn never imports torch."""
    global _function
    if _function is not None:
        return _function
    torch = _tensors._import_torch()

    class FlashAttnFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, layout, opts, return_lse, *tensors):
            q, k, v = unpack(layout, tensors)
            out, lse = _core.attention_forward(q, k, v, _opts=opts)
            ctx.save_for_backward(*tensors, out, lse)
            ctx.layout = layout
            ctx.opts = opts
            if return_lse:
                ctx.mark_non_differentiable(lse)
                return out, lse
            return out

        @staticmethod
        def backward(ctx, dout, *unused):
            *tensors, out, lse = ctx.saved_tensors
            q, k, v = unpack(ctx.layout, tensors)
            grads, (dq, dk, dv) = _grad_buffers(ctx.layout, tensors, torch)
            _core.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv,
                                     _opts=ctx.opts)
            return (None, None, None, *grads)

    _function = FlashAttnFunction
    return _function
