"""Dropout's seed and offset, drawn per call, and the keep mask (fa_dropout_mask).

The library's mask is a pure function of (seed, offset, batch, head, query row, key column)
(src/dropout.h): a call needs only the two numbers, and its backward, given the same two,
regenerates the forward's mask. As flash_attn takes them from torch's generator, a call here
draws a fresh 64-bit seed from a generator (offset 0), so torch.manual_seed (or a numpy
seed) makes a run repeatable and successive calls independent:
  generator None   torch tensors: torch.default_generator; numpy arrays: numpy's global
                   generator (numpy.random.seed)
  torch.Generator, numpy.random.Generator: drawn from it
  an int           the seed itself (offset 0): the same mask on every call
"""

import ctypes
import sys

from . import _context, _lib


def _draw_seed(generator, torch_tensors):
    if isinstance(generator, int) and not isinstance(generator, bool):
        return generator
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(generator, torch.Generator) or
                              (generator is None and torch_tensors)):
        gen = generator if generator is not None else torch.default_generator
        # a uniform int64 over its whole range, then read as uint64
        x = torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64, generator=gen)
        return int(x) & ((1 << 64) - 1)
    import numpy as np
    if generator is None:
        return int(np.random.randint(0, 1 << 64, dtype=np.uint64))
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, 1 << 64, dtype=np.uint64))
    raise TypeError(f"generator = {generator!r}: expected None, an int seed, a torch.Generator "
                    f"or a numpy.random.Generator")


def draw(dropout_p, tensors, generator=None):
    """None for dropout_p 0, else (dropout_p, seed, offset) for this call."""
    if not dropout_p:
        return None
    torch = sys.modules.get("torch")
    torch_tensors = torch is not None and any(isinstance(t, torch.Tensor) for t in tensors)
    return (float(dropout_p), _draw_seed(generator, torch_tensors), 0)


def dropout_mask(seed, offset, dropout_p, batch, nheads, seqlen_q, seqlen_k):
    """The keep mask of fa_fwd / fa_bwd with this dropout: a numpy uint8 array
    (batch, nheads, seqlen_q, seqlen_k), 1 where element (b, h, i, j) is kept (and scaled by
    1 / (1 - dropout_p)), 0 where dropped; i and j count within sequence b (varlen: the mask of
    sequence b is the top-left corner of its block). Whether a causal or window mask hides an
    element does not enter."""
    import numpy as np
    _lib.require("fa_dropout_mask", "dropout_mask")
    shape = tuple(int(x) for x in (batch, nheads, seqlen_q, seqlen_k))
    out = np.empty(shape, dtype=np.uint8)
    ctx = _context.context(_lib.BACKEND_CPU, 0, 0)
    # not through _context.call: this runs no kernel, and the record of the attention call
    # that return_attn_probs follows stays the one last_selection() shows
    status = ctx._lib.fa_dropout_mask(ctx.handle, ctypes.c_uint64(int(seed)),
                                      ctypes.c_uint64(int(offset)),
                                      ctypes.c_float(float(dropout_p)), *shape,
                                      out.ctypes.data_as(ctypes.c_void_p))
    if status != 0:
        _context._raise(status, ctx.last_error())
    return out
