"""quantize_fp8: f32/f16/bf16 attention inputs to FP8 with their scales, over fa_quantize_fp8."""

import ctypes

from . import _context, _lib
from ._core import _ctx_for
from ._tensors import _NP_DTYPES, ops_for

_NAMES = {"float8_e4m3fn": _lib.DTYPE_F8_E4M3, "float8_e5m2": _lib.DTYPE_F8_E5M2,
          "e4m3": _lib.DTYPE_F8_E4M3, "e5m2": _lib.DTYPE_F8_E5M2}


def _fp8_dtype(ops, dtype):
    """(fa dtype code, the array library's dtype object) of the requested FP8 format."""
    if dtype is None:
        dtype = "float8_e4m3fn"
    name = dtype if isinstance(dtype, str) else str(getattr(dtype, "name", dtype))
    name = name.replace("torch.", "")
    code = _NAMES.get(name)
    if code is None:
        raise TypeError(f"dtype = {dtype!r}: expected float8_e4m3fn or float8_e5m2 (torch's or "
                        f"ml_dtypes' dtype, or its name)")
    full = {_lib.DTYPE_F8_E4M3: "float8_e4m3fn", _lib.DTYPE_F8_E5M2: "float8_e5m2"}[code]
    if ops.name == "torch":
        import torch
        return code, getattr(torch, full)
    for np_dtype, c in _NP_DTYPES.items():
        if c == code:
            return code, np_dtype
    raise TypeError("FP8 numpy arrays need the ml_dtypes package")


def quantize_fp8(x, dtype=None, block_rows=0, hadamard=False, sign_seed=0):
    """Quantises x (batch, seqlen, heads, head_dim), float32 / float16 / bfloat16, to FP8 with
    one scale per block of rows (tokens) of each head, as FlashAttention-3 does
    (fa_quantize_fp8; docs/fp8.md). numpy arrays or torch tensors on the CPU (the GPU
    quantiser is not built yet: CUDA tensors raise FlashAttnArgumentError FA_ERR_DEVICE).

    dtype       float8_e4m3fn (default; max 448) or float8_e5m2 (max 57344): torch's or
                ml_dtypes' dtype, or its name
    block_rows  0 (default): one scale per (batch, head); n > 0: one per n rows
    hadamard    True: each row is first rotated by the normalised Walsh-Hadamard matrix times
                a +-1 diagonal drawn from sign_seed (sign_seed 0: no signs); head_dim must be a
                power of two. Quantise q and k with the same (hadamard, sign_seed): q k^T is
                unchanged in exact arithmetic while outliers spread over the row (incoherent
                processing). Never rotate v (its rows come out in the output).

    Returns (x8, scales): x8 like x in the FP8 dtype (contiguous), scales fp32
    (batch, heads, ceil(seqlen / block_rows)) (one column with block_rows 0). The real value
    of x8[b, t, h, i] is scales[b, h, t // block_rows] * x8[b, t, h, i]; a block's scale is
    its largest magnitude / the format's max (1 for an all-zero block), values round to
    nearest even. x must be finite (FlashAttnArgumentError otherwise).

    As descales: the attention functions take one value per (batch, kv head), so pass
    scales[..., 0] of a block_rows=0 quantisation as k_descale / v_descale. q_descale is
    indexed by kv head too: under GQA (heads_q > heads_k) quantise q with one scale per kv
    head yourself. Per-block scales (block_rows > 0) are not taken by the attention call:
    dequantise such blocks yourself (x8.float() * scales, repeated over the block's rows).
    last_selection() does not report this call (it is cleared: None after it).
    """
    if x is None:
        raise ValueError("quantize_fp8: x is None")
    ops = ops_for(x)
    if ops is None:
        raise TypeError(f"quantize_fp8: expected a numpy array or a torch tensor, got "
                        f"{type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"x has shape {tuple(x.shape)}: expected 4 dimensions "
                         f"(batch, seqlen, heads, head_dim)")
    block_rows = _lib.c_int(block_rows, "block_rows")
    if block_rows < 0:
        raise ValueError(f"block_rows = {block_rows}, must be >= 0 (0: one block per head)")
    sign_seed = int(sign_seed)
    if not 0 <= sign_seed < 1 << 64:
        raise ValueError(f"sign_seed = {sign_seed}, must be in [0, 2^64)")
    code, fp8_dtype = _fp8_dtype(ops, dtype)
    _lib.require("fa_quantize_fp8", "quantize_fp8")
    x = ops.prepare(x, last_unit=False)
    b, s, h, _ = x.shape
    nblocks = 1 if block_rows == 0 or s == 0 else -(-s // block_rows)
    if ops.name == "torch":
        import torch
        x8 = torch.empty(tuple(x.shape), dtype=fp8_dtype, device=x.device)
        scales = torch.empty((b, h, nblocks), dtype=torch.float32, device=x.device)
    else:
        import numpy as np
        x8 = np.empty(x.shape, dtype=fp8_dtype)
        scales = np.empty((b, h, nblocks), dtype=np.float32)
    _context.clear_selection()
    with ops.guard(x):
        ctx = _ctx_for(ops, x)
        xv, x8v, sv = ops.view(x), ops.view(x8), ops.view(scales)
        r = ctypes.byref
        _context.call(ctx, ctx._lib.fa_quantize_fp8, r(xv), r(x8v), r(sv), block_rows,
                      int(bool(hadamard)), sign_seed)
    _context.clear_selection()
    return x8, scales
