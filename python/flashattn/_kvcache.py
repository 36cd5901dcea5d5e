"""Inference: attention against a (paged) KV cache with an in-place append (fa_fwd_kvcache),
and the merge of partial attention results (fa_merge_attn), on numpy arrays or torch tensors.

The cache is written in place, so it is never copied: a cache the library cannot address as
it is (last dimension not contiguous, broadcast, read-only) is an error when k/v are appended.
The small index arrays (cache_seqlens, block_table, cache_batch_idx) become contiguous int32
arrays on the tensors' device; one that already is one is used as it is (no copy).
"""

import ctypes

import numpy as np

from . import _context, _fp8, _lib, _native
from ._core import _Bound, _ctx_for, aux_arrays
from ._tensors import is_torch, ops_for


def _check_4d(**tensors):
    for name, t in tensors.items():
        if t is not None and t.ndim != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected 4 dimensions "
                             f"(batch, seqlen, heads, head_dim)"
                             + (" or, paged, (num_pages, page_size, heads_k, head_dim)"
                                if "cache" in name else ""))


def _writable_cache(ops, x, name):
    """x itself, which the library will write through; an error when it cannot be."""
    if ops.prepare(x) is not x:
        raise ValueError(
            f"{name} (shape {tuple(x.shape)}, strides {_strides(x)}) cannot be written in place: "
            f"the library needs a contiguous last dimension and positive strides in elements, "
            f"and the appended k/v must land in this very buffer (no copy is made)")
    if not is_torch(x) and not x.flags.writeable:
        raise ValueError(f"{name} is a read-only array: k/v are appended into it in place")
    return x


def _strides(x):
    return tuple(x.stride()) if is_torch(x) else tuple(s // x.itemsize for s in x.strides)


def _is_int_scalar(x):
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    return type(x).__module__ == "numpy" and getattr(x, "ndim", None) == 0 and \
        getattr(x, "dtype", None) is not None and x.dtype.kind in "iu"


def _host_values(a):
    """Values of a small int32 array if they live in host memory (else None: device arrays are
    checked by the library on the device)."""
    if is_torch(a):
        return a.tolist() if a.device.type == "cpu" else None
    return a.tolist()


def _rotary_tables(ops, q, rotary_cos, rotary_sin):
    """The rotary tables as the library reads them: 2-D, on q's device, q's dtype or float32
    (the library checks the rest: matching shapes, rotary_dim <= headdim, seqlen_ro)."""
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{'rotary_cos' if rotary_cos is not None else 'rotary_sin'} is given "
                         f"but {'rotary_sin' if rotary_cos is not None else 'rotary_cos'} is "
                         f"not: the rotary embedding needs both")
    tables = []
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if t.ndim != 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected (seqlen_ro, "
                             f"rotary_dim / 2)")
        if is_torch(t) != is_torch(q) or (is_torch(t) and t.device != q.device):
            raise ValueError(f"{name} must be on q's device ({q.device if is_torch(q) else 'numpy'})")
        tables.append(ops.prepare(t))
    return tables


def kvcache_forward(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
                    cache_batch_idx=None, block_table=None, num_splits=0, return_lse=False,
                    _opts=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                    cache_leftpad=None):
    """fa_fwd_kvcache on numpy arrays or torch tensors; see flash_attn_with_kvcache.
    Returns (out, softmax_lse or None)."""
    opts = _opts
    num_splits = _lib.c_int(num_splits, "num_splits", 32)  # an int in C: no silent wrap
    if _is_int_scalar(cache_seqlens):
        cache_seqlens = _lib.c_int(cache_seqlens, "cache_seqlens", 32)
    ext = _native.ext
    if ext is not None and cache_batch_idx is None and opts.descales is None:
        r = ext.fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, None, None,
                            return_lse, *opts.ext_scalars(), opts.alibi_slopes, num_splits,
                            None, rotary_cos, rotary_sin, rotary_interleaved, cache_leftpad)
        if r is not NotImplemented:
            return r
    if ext is None:
        _lib.require("fa_fwd_kvcache", "flash_attn_with_kvcache")
    if (k is None) != (v is None):
        raise ValueError(f"{'k' if k is not None else 'v'} is given but "
                         f"{'v' if k is not None else 'k'} is not: an append needs both")
    ops = ops_for(q, k_cache, v_cache, k, v)
    _check_4d(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    fp8 = _fp8.check_inputs(ops, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k,
                                  "v": v}, opts.descales)
    batch = q.shape[0]
    append = k is not None and k.shape[1] > 0
    if k is not None and not append:
        k = v = None  # zero new tokens: nothing to append (the library wants seqlen_new >= 1)

    if cache_batch_idx is not None and cache_leftpad is not None:
        # cache_batch_idx runs as a block table of one page per sequence, and the library
        # takes left padding for contiguous caches only
        raise ValueError("cache_batch_idx with cache_leftpad is not supported: gather the "
                         "cache rows (k_cache[cache_batch_idx]) first")
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("cache_batch_idx selects rows of a contiguous cache; a paged cache "
                         "(block_table given) has no batch rows to select (flash_attn refuses "
                         "the pair too)")
    if block_table is None and cache_batch_idx is None and k_cache.shape[0] > batch:
        # flash_attn reads batch entry b of a larger cache at row b: the leading rows
        k_cache, v_cache = k_cache[:batch], v_cache[:batch]

    q = ops.prepare(q)
    if append:
        k_cache = _writable_cache(ops, k_cache, "k_cache")
        v_cache = _writable_cache(ops, v_cache, "v_cache")
        k, v = ops.prepare(k), ops.prepare(v)
    else:
        k_cache, v_cache = ops.prepare(k_cache), ops.prepare(v_cache)

    out = ops.empty(tuple(q.shape), q, _fp8.OUT_DTYPE if fp8 else None)
    lse = ops.empty((batch, q.shape[2], q.shape[1]), q, "float32") if return_lse else None
    if batch == 0:
        _context.clear_selection()
        return out, lse
    if q.shape[1] == 0:
        if append:
            raise ValueError("q has seqlen 0: flash_attn_with_kvcache needs at least one query "
                             "token per sequence to append k/v")
        _context.clear_selection()
        return out, lse

    with ops.guard(q):
        # The index arrays: a paged table, or cache_batch_idx as a table of one page per
        # sequence whose pages are the rows of the contiguous cache (page_size = max_len).
        table = None
        if block_table is not None:
            table = ops.small(block_table, "int32", q, "block_table")
            if table.ndim != 2 or table.shape[0] != batch or table.shape[1] < 1:
                raise ValueError(f"block_table has shape {tuple(table.shape)}: expected "
                                 f"(batch, max_pages) = ({batch}, >= 1) int32, with k_cache a "
                                 f"page pool (num_pages, page_size, heads_k, head_dim)")
        elif cache_batch_idx is not None:
            idx = ops.small(cache_batch_idx, "int32", q, "cache_batch_idx")
            if tuple(idx.shape) != (batch,):
                raise ValueError(f"cache_batch_idx has shape {tuple(idx.shape)}: expected "
                                 f"({batch},) (one cache row per batch entry of q)")
            host = _host_values(idx)
            rows = k_cache.shape[0]
            for b, r in enumerate(host or ()):
                if not 0 <= r < rows:
                    raise ValueError(f"cache_batch_idx[{b}] = {r} is outside the cache's "
                                     f"{rows} rows")
            table = idx.reshape(batch, 1)

        if cache_seqlens is None:
            if append:
                raise ValueError("k/v are appended at cache_seqlens: pass cache_seqlens (the "
                                 "tokens already in the cache of each sequence)")
            capacity = k_cache.shape[1] * (table.shape[1] if block_table is not None else 1)
            seqlens = ops.full((batch,), q, _lib.c_int(capacity, "the cache's capacity", 32),
                               "int32")
        elif _is_int_scalar(cache_seqlens):
            seqlens = ops.full((batch,), q, int(cache_seqlens), "int32")
        else:
            seqlens = ops.small(cache_seqlens, "int32", q, "cache_seqlens")
            if seqlens.ndim == 0:  # one length for every sequence, kept where it is
                seqlens = (seqlens.reshape(1).repeat(batch) if is_torch(seqlens)
                           else np.repeat(seqlens.reshape(1), batch))
            if tuple(seqlens.shape) != (batch,):
                raise ValueError(f"cache_seqlens has shape {tuple(seqlens.shape)}: expected "
                                 f"({batch},) int32, or an int")

        tables = (_rotary_tables(ops, q, rotary_cos, rotary_sin)
                  if rotary_cos is not None or rotary_sin is not None else None)
        leftpad = None
        if cache_leftpad is not None:
            leftpad = ops.small(cache_leftpad, "int32", q, "cache_leftpad")
            if tuple(leftpad.shape) != (batch,):
                raise ValueError(f"cache_leftpad has shape {tuple(leftpad.shape)}: expected "
                                 f"({batch},) int32")
        if ext is not None:
            alibi = aux_arrays(ops, opts, q)[0]
            desc = _fp8.descale_arrays(ops, opts.descales, q, k_cache.shape[2], batch)
            r = ext.fwd_kvcache(q, k_cache, v_cache, k if append else None,
                                v if append else None, seqlens, table, out, lse, return_lse,
                                *opts.ext_scalars(), alibi, num_splits, desc,
                                *(tables if tables is not None else (None, None)),
                                rotary_interleaved, leftpad)
            if r is NotImplemented:
                raise RuntimeError("flashattn._ext declined fwd_kvcache after the arguments "
                                   "were normalised: a bug in flashattn, please report it")
            return r
        bound = _Bound(ops, opts, q, backward=False, heads_k=k_cache.shape[2])
        ctx = _ctx_for(ops, q)
        cache = _lib.KVCache()
        cache.k, cache.v = ops.view(k_cache), ops.view(v_cache)
        cache.seqlens = ops.ptr(seqlens)
        if table is not None:
            cache.block_table = ops.ptr(table)
            cache.max_pages = table.shape[1]
            cache.block_table_stride = table.shape[1]
        r = ctypes.byref
        if tables is not None:
            # the views live in locals until the call returns; params holds their addresses
            cos_v, sin_v = ops.view(tables[0]), ops.view(tables[1])
            bound.params.rotary_cos = ctypes.addressof(cos_v)
            bound.params.rotary_sin = ctypes.addressof(sin_v)
            bound.params.rotary_interleaved = int(bool(rotary_interleaved))
        if leftpad is not None:
            bound.params.cache_leftpad = ops.ptr(leftpad)
        qv, ov = ops.view(q), ops.view(out)
        kv = (r(ops.view(k)), r(ops.view(v))) if append else (None, None)
        lv = r(ops.view(lse)) if lse is not None else None
        _context.call(ctx, ctx._lib.fa_fwd_kvcache, r(qv), r(cache), *kv, r(bound.params),
                      num_splits, r(ov), lv)
    return out, lse


def _parts(x, name):
    """A list of parts from a sequence, or from one array/tensor stacked along dimension 0."""
    if x is None:
        raise ValueError(f"{name} is None")
    if hasattr(x, "shape") and hasattr(x, "ndim"):
        return [x[i] for i in range(x.shape[0])]
    return list(x)


def _empty_like_dtype(ops, shape, like, dtype):
    if dtype is None:
        return ops.empty(shape, like)
    if is_torch(like):
        import torch
        return torch.empty(shape, dtype=dtype, device=like.device)
    import numpy as np
    return np.empty(shape, dtype=dtype)


def merge_attn(out_parts, lse_parts, out=None, softmax_lse=None, out_dtype=None):
    """Merges attention results computed over disjoint sets of keys (shards of a cache,
    chunks of a long context) into the result over their union (fa_merge_attn):

        lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * out_s

    out_parts  n >= 1 outputs, each (batch, seqlen, nheads, headdim) or varlen
               (total, nheads, headdim): a list, or one array/tensor stacked along dim 0
    lse_parts  their fp32 softmax_lse, (batch, nheads, seqlen) or (nheads, total), likewise
               (as flash_attn_with_kvcache(return_softmax_lse=True) and
               flash_attn_func(return_attn_probs=True) return them)
    out, softmax_lse  optional buffers to write (any strides)
    out_dtype  dtype of a new out (default: the parts'), e.g. fp32 parts into a bf16 out
    A part whose lse is -inf (it saw no key) carries no weight and its out is not read; a row
    no part saw gets out 0 and lse -inf. Returns (out, softmax_lse).
    """
    outs, lses = _parts(out_parts, "out_parts"), _parts(lse_parts, "lse_parts")
    if not outs:
        raise ValueError("merge_attn needs at least one part")
    if len(outs) != len(lses):
        raise ValueError(f"{len(outs)} out_parts but {len(lses)} lse_parts: one LSE per part")
    ops = ops_for(*outs, *lses, out, softmax_lse)
    ext = _native.ext
    if ext is None:
        _lib.require("fa_merge_attn", "merge_attn")
    outs = [ops.prepare(o) for o in outs]
    lses = [ops.prepare(s, last_unit=False) for s in lses]
    o0 = outs[0]
    if o0.ndim not in (3, 4):
        raise ValueError(f"out_parts[0] has shape {tuple(o0.shape)}: expected (batch, seqlen, "
                         f"nheads, headdim) or varlen (total, nheads, headdim)")
    thd = o0.ndim == 3
    if out is None:
        out = _empty_like_dtype(ops, tuple(o0.shape), o0, out_dtype)
    if softmax_lse is None:
        lse_shape = (o0.shape[1], o0.shape[0]) if thd else (o0.shape[0], o0.shape[2], o0.shape[1])
        softmax_lse = ops.empty(lse_shape, o0, "float32")
    rows = o0.shape[:1] if thd else o0.shape[:2]
    if any(n == 0 for n in rows) and o0.shape[-1] > 0 and o0.shape[-2] > 0:
        _context.clear_selection()
        return out, softmax_lse
    if ext is not None:
        for x in (out, softmax_lse):
            ops.view(x)  # raises for outputs the library cannot write
        if len(outs) > 64:
            raise ValueError(f"{len(outs)} parts: merge_attn takes at most 64 at once; merge "
                             f"them in groups (a merge of merges is exact)")
        r = ext.merge(outs, lses, out, softmax_lse)
        if r is NotImplemented:
            raise RuntimeError("flashattn._ext declined merge after the arguments were "
                               "normalised: a bug in flashattn, please report it")
        return r
    with ops.guard(o0):
        ctx = _ctx_for(ops, o0)
        n = len(outs)
        ov = (_lib.Tensor * n)(*[ops.view(o) for o in outs])
        lv = (_lib.Tensor * n)(*[ops.view(s) for s in lses])
        r = ctypes.byref
        _context.call(ctx, ctx._lib.fa_merge_attn, n, ov, lv, r(ops.view(out)),
                      r(ops.view(softmax_lse)))
    return out, softmax_lse

