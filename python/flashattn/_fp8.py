"""FP8 inputs of the forward: the dtype rules and the descale arguments (docs/fp8.md).

q, k and v (and a KV cache and its appended k, v) share one FP8 dtype, float8_e4m3fn or
float8_e5m2 (torch's, or ml_dtypes' for numpy). The library writes the output in f32, f16 or
bf16, whichever dtype the `out` given has; without one the package allocates bf16, as
FlashAttention-3 does. The descales q_descale, k_descale, v_descale are fp32
(batch, num_heads_k) arrays on q's device, FlashAttention-3's shape: the real value of a stored
element of q for batch entry b and query head h is q_descale[b, h // (heads_q / heads_k)] times
it, likewise for k and v (fa_params: q_descale * k_descale multiplies the softmax scale,
v_descale the output). None is 1.
"""

from . import _lib
from ._tensors import is_torch

FP8_DTYPES = (_lib.DTYPE_F8_E4M3, _lib.DTYPE_F8_E5M2)
OUT_DTYPE = "bfloat16"  # the output's dtype when no out is given (FlashAttention-3's)


def is_fp8(ops, x):
    return x is not None and ops.fa_dtype(x) in FP8_DTYPES


def _dtype_name(x):
    return str(x.dtype).replace("torch.", "")


def check_inputs(ops, named, descales, grad_check=False):
    """The FP8 rules of one call over its inputs `named` {name: tensor or None}, q first:
    all FP8 of one dtype or none FP8 (TypeError naming the odd one), descales only with FP8
    inputs (ValueError), and with grad_check no torch tensor requiring grad while grad mode is
    on (there is no FP8 backward, as in FlashAttention-3). Returns whether the call is FP8."""
    items = [(n, x) for n, x in named.items() if x is not None]
    fp8 = [n for n, x in items if is_fp8(ops, x)]
    if fp8 and len(fp8) != len(items):
        odd = next(n for n, x in items if n not in fp8)
        raise TypeError(f"{fp8[0]} is {_dtype_name(named[fp8[0]])} but {odd} is "
                        f"{_dtype_name(named[odd])}: FP8 inputs must all share one FP8 dtype")
    if fp8:
        first = ops.fa_dtype(named[fp8[0]])
        for n in fp8:
            if ops.fa_dtype(named[n]) != first:
                raise TypeError(f"{fp8[0]} is {_dtype_name(named[fp8[0]])} but {n} is "
                                f"{_dtype_name(named[n])}: FP8 inputs must share one dtype "
                                f"(float8_e4m3fn or float8_e5m2)")
    if not fp8 and descales is not None:
        given = [n for n, d in zip(("q_descale", "k_descale", "v_descale"), descales)
                 if d is not None]
        raise ValueError(f"{', '.join(given)} given but q is {_dtype_name(items[0][1])}: "
                         f"descales apply to FP8 inputs (float8_e4m3fn / float8_e5m2) only")
    if fp8 and grad_check:
        refuse_grad(named)
    return bool(fp8)


def refuse_grad(named):
    """RuntimeError when autograd would record an FP8 call (grad mode on, an input requiring
    grad): the library has no FP8 backward (FlashAttention-3 neither)."""
    xs = [(n, x) for n, x in named.items() if x is not None and is_torch(x)]
    if not xs:
        return
    import torch
    if not torch.is_grad_enabled():
        return
    for n, x in xs:
        if x.requires_grad:
            raise RuntimeError(f"{n} is {_dtype_name(x)} with requires_grad=True: FP8 attention "
                               f"is forward only (no FP8 backward, as in FlashAttention-3); "
                               f"detach the inputs or run under torch.no_grad()")


def descale_arrays(ops, descales, q, heads_k, batch):
    """The descales as the library reads them: (q_descale, k_descale, v_descale, batch_stride),
    each None or a contiguous fp32 (batch, heads_k) array on q's device; None when none is
    given. Wrong type, dtype, shape or device raise TypeError / ValueError naming it."""
    if descales is None or all(d is None for d in descales):
        return None
    out = []
    for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
        if d is None:
            out.append(None)
            continue
        if ops.name == "torch":
            if not is_torch(d):
                raise TypeError(f"{name} must be a torch tensor like q, got "
                                f"{type(d).__module__}.{type(d).__name__}")
            import torch
            if d.dtype != torch.float32:
                raise TypeError(f"{name} has dtype {d.dtype}: expected torch.float32")
            if d.device != q.device:
                raise ValueError(f"{name} is on {d.device} but q is on {q.device}: descales "
                                 f"live on the tensors' device")
            a = d.detach().contiguous()
        else:
            import numpy as np
            if not isinstance(d, np.ndarray):
                raise TypeError(f"{name} must be a numpy array like q, got "
                                f"{type(d).__module__}.{type(d).__name__}")
            if d.dtype != np.float32:
                raise TypeError(f"{name} has dtype {d.dtype}: expected float32")
            a = np.ascontiguousarray(d, dtype=np.dtype(np.float32).newbyteorder("="))
        if tuple(a.shape) != (batch, heads_k):
            raise ValueError(f"{name} has shape {tuple(a.shape)}: expected (batch, num_heads_k) "
                             f"= ({batch}, {heads_k}), one fp32 value per batch entry and kv "
                             f"head (FlashAttention-3's shape)")
        out.append(a)
    return (*out, heads_k)


def set_params(ops, params, arrays):
    """The descale fields of a ctypes fa_params from descale_arrays' result."""
    if arrays is None:
        return
    qd, kd, vd, stride = arrays
    params.q_descale = ops.ptr(qd) if qd is not None else None
    params.k_descale = ops.ptr(kd) if kd is not None else None
    params.v_descale = ops.ptr(vd) if vd is not None else None
    params.descale_batch_stride = stride
