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
CUDA tensors, as flash_attn: the generator is the device's CUDA generator (None: torch's default
one for that device, or a CUDA torch.Generator), and the call takes its current seed and Philox
offset and advances the offset (no draw, so no device-to-host copy), so torch.manual_seed and
torch.cuda.manual_seed make runs repeatable and successive calls get different masks. Under
CUDA-graph capture that would bake one mask into every replay: refused (NotImplementedError).
"""

import ctypes
import sys

from . import _context, _lib


# How far a call advances a CUDA generator's offset: torch's CUDA generators take offsets in
# multiples of 4 (one Philox call's outputs), and any step gives the next call another mask.
_CUDA_OFFSET_STEP = 4


def _cuda_state(torch, generator, tensors):
    """(seed, offset) from a CUDA generator, its offset advanced; None when the call is not a
    CUDA one (CPU tensors, or a CPU generator given)."""
    cuda = next((t for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if cuda is None:
        return None
    if generator is None:
        index = cuda.device.index if cuda.device.index is not None else torch.cuda.current_device()
        gen = torch.cuda.default_generators[index]
    elif isinstance(generator, torch.Generator) and generator.device.type == "cuda":
        gen = generator
    else:
        return None
    if torch.cuda.is_current_stream_capturing():
        raise NotImplementedError("dropout_p > 0 while capturing a CUDA graph: the seed and "
                                  "offset would be fixed in the graph (every replay the same "
                                  "mask); call it outside the capture")
    seed, offset = int(gen.initial_seed()), int(gen.get_offset())
    gen.set_offset(offset + _CUDA_OFFSET_STEP)
    return seed & ((1 << 64) - 1), offset & ((1 << 64) - 1)


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
    if torch_tensors:
        state = _cuda_state(torch, generator, tensors)
        if state is not None:
            return (float(dropout_p), state[0], state[1])
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
