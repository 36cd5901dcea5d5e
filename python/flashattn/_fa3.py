"""FlashAttention-3's interface arguments on top of the library's calls: seqused_q/seqused_k,
paged KV cache in varlen (block_table with cu_seqlens_q), the performance hints (num_splits,
pack_gqa, sm_margin) and flash_attn_combine. Each is built from existing library calls:

  - seqused: the used rows of each sequence are gathered into packed q, k, v with new
    cu_seqlens (one copy of the used rows, differentiable under torch autograd), the varlen call
    runs on them, and the output is scattered back; rows past seqused_q get out 0 and
    softmax_lse -inf (FA3 leaves them unwritten; a defined value cannot be mistaken for data).
  - paged varlen: sequence b's queries are placed at the bottom of a (batch, max_seqlen_q)
    padded q so that fa_fwd_kvcache's bottom-right alignment (query i of seqlen_q on key
    seqlen_k - seqlen_q + i) equals varlen's per-sequence alignment; one fa_fwd_kvcache call
    reads the pages, and the used rows are gathered back. Forward only (as flash_attn).
The index arrays are read on the host (one device synchronisation per call on CUDA): the
row counts decide the packed shapes.
"""

from ._tensors import is_torch


def _host(x, name):
    if x is None:
        return None
    if is_torch(x):
        return [int(v) for v in x.detach().cpu().reshape(-1).tolist()]
    import numpy as np
    return [int(v) for v in np.asarray(x).reshape(-1)]  # numpy arrays and plain sequences


def _index(like, rows):
    """rows as an int64 index array on like's device."""
    if is_torch(like):
        import torch
        return torch.tensor(rows, dtype=torch.int64, device=like.device)
    import numpy as np
    return np.asarray(rows, dtype=np.int64)


def _take(x, idx, dim=0):
    if is_torch(x):
        return x.index_select(dim, idx)
    import numpy as np
    return np.take(x, idx, axis=dim)


def _cu_like(like, lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    if is_torch(like):
        import torch
        return torch.tensor(cu, dtype=torch.int32, device=like.device)
    import numpy as np
    return np.asarray(cu, dtype=np.int32)


def check_hints(num_splits, pack_gqa, sm_margin):
    """The hints change speed only, never the result: accepted when well-formed (FA3's types),
    so a wrong type still fails loudly instead of being ignored."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits must be an int (<= 0 or 1: one chunk / the library's "
                        f"choice, n > 1: a hint), got {num_splits!r}")
    if pack_gqa not in (None, True, False):
        raise TypeError(f"pack_gqa must be None, True or False, got {pack_gqa!r}")
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise TypeError(f"sm_margin must be an int >= 0, got {sm_margin!r}")


def refuse(**args):
    """FA3 arguments the library cannot honour: an error naming each, never a silent ignore."""
    for name, (value, idle) in args.items():
        given = value is not None if idle is None else value != idle
        if given:
            shown = f"<{type(value).__name__}>" if hasattr(value, "shape") else repr(value)
            raise NotImplementedError(
                f"{name}={shown} (FlashAttention-3) is not supported by flashattn; only "
                f"{name}={idle!r} is")


def _lens(cu, name):
    lens = [b - a for a, b in zip(cu, cu[1:])]
    if any(n < 0 for n in lens):
        raise ValueError(f"{name} is not non-decreasing: {cu}")
    return lens


def _used(span, used, name):
    if used is None:
        return span
    if len(used) != len(span):
        raise ValueError(f"{name} has {len(used)} values: expected batch = {len(span)} (one per "
                         f"sequence)")
    for b, (u, n) in enumerate(zip(used, span)):
        if not 0 <= u <= n:
            raise ValueError(f"{name}[{b}] = {u} is outside 0..{n} (sequence {b}'s rows in "
                             f"cu_seqlens)")
    return used


def _used_rows(q, k, cu_q, cu_k, seqused_q, seqused_k):
    """The used rows of the packed q and k: (uq, uk) the used counts per sequence, (iq, ik)
    their row indices."""
    hq, hk = _host(cu_q, "cu_seqlens_q"), _host(cu_k, "cu_seqlens_k")
    if len(hq) != len(hk) or len(hq) < 1:
        raise ValueError(f"cu_seqlens_q has {len(hq)} values and cu_seqlens_k {len(hk)}: "
                         f"expected batch + 1 each")
    uq = _used(_lens(hq, "cu_seqlens_q"), _host(seqused_q, "seqused_q"), "seqused_q")
    uk = _used(_lens(hk, "cu_seqlens_k"), _host(seqused_k, "seqused_k"), "seqused_k")
    rows_q = [hq[b] + j for b in range(len(uq)) for j in range(uq[b])]
    rows_k = [hk[b] + j for b in range(len(uk)) for j in range(uk[b])]
    return uq, uk, _index(q, rows_q), _index(k, rows_k)


def seqused_backward(bwd, dout, q, k, v, out, lse, cu_q, cu_k, seqused_q, seqused_k):
    """The gradients of varlen_seqused (torch tensors): the used rows of dout, q, k, v, out
    and lse gathered, bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k) -> (dq, dk, dv)
    on them (the packed varlen backward), scattered into zeros (unused rows have no
    gradient: they were not read)."""
    uq, uk, iq, ik = _used_rows(q, k, cu_q, cu_k, seqused_q, seqused_k)
    dq_c, dk_c, dv_c = bwd(_take(dout, iq), _take(q, iq), _take(k, ik), _take(v, ik),
                           _take(out, iq), _take(lse, iq, 1), _cu_like(cu_q, uq),
                           _cu_like(cu_k, uk), max(uq, default=0), max(uk, default=0))
    return (q.new_zeros(q.shape).index_copy(0, iq, dq_c),
            k.new_zeros(k.shape).index_copy(0, ik, dk_c),
            v.new_zeros(v.shape).index_copy(0, ik, dv_c))


def varlen_seqused(call, q, k, v, cu_q, cu_k, seqused_q, seqused_k, return_lse):
    """Varlen attention over the first seqused rows of each sequence. call(q, k, v, cu_q, cu_k,
    max_q, max_k) runs the packed varlen attention and returns (out, lse or None)."""
    uq, uk, iq, ik = _used_rows(q, k, cu_q, cu_k, seqused_q, seqused_k)
    out_c, lse_c = call(_take(q, iq), _take(k, ik), _take(v, ik), _cu_like(cu_q, uq),
                        _cu_like(cu_k, uk), max(uq, default=0), max(uk, default=0))
    total = q.shape[0]
    if is_torch(q):
        import torch
        out = out_c.new_zeros((total,) + tuple(out_c.shape[1:])).index_copy(0, iq, out_c)
        lse = None
        if return_lse:
            lse = torch.full((lse_c.shape[0], total), float("-inf"), dtype=lse_c.dtype,
                             device=lse_c.device).index_copy(1, iq, lse_c)
        return out, lse
    import numpy as np
    out = np.zeros((total,) + out_c.shape[1:], dtype=out_c.dtype)
    out[iq] = out_c
    lse = None
    if return_lse:
        lse = np.full((lse_c.shape[0], total), -np.inf, dtype=lse_c.dtype)
        lse[:, iq] = lse_c
    return out, lse


def paged_varlen(kvcache, q, k_cache, v_cache, cu_q, cu_k, max_seqlen_q, seqused_k, seqused_q,
                 block_table, return_lse):
    """Packed queries against a paged cache. kvcache(q_padded, cache_seqlens) runs
    flash_attn_with_kvcache(..., return_softmax_lse=True) on (batch, sq, heads, d) queries."""
    if is_torch(q):
        import torch
        if torch.is_grad_enabled() and any(
                t.requires_grad for t in (q, k_cache, v_cache) if t is not None):
            raise RuntimeError("flash_attn_varlen_func(block_table=...) has no backward (an "
                               "inference call, as in flash_attn): run it under torch.no_grad() "
                               "or detach the inputs")
    hq = _host(cu_q, "cu_seqlens_q")
    batch = len(hq) - 1
    if batch < 0:
        raise ValueError("cu_seqlens_q is empty: expected batch + 1 values")
    lq = _used(_lens(hq, "cu_seqlens_q"), _host(seqused_q, "seqused_q"), "seqused_q")
    if seqused_k is not None:
        seqlens = seqused_k
    elif cu_k is not None:
        hk = _host(cu_k, "cu_seqlens_k")
        if len(hk) != batch + 1:
            raise ValueError(f"cu_seqlens_k has {len(hk)} values: expected batch + 1 = "
                             f"{batch + 1}")
        seqlens = _host_lens_array(q, _lens(hk, "cu_seqlens_k"))
    else:
        raise ValueError("flash_attn_varlen_func(block_table=...) needs the keys of each "
                         "sequence: seqused_k (int32 (batch,)) or cu_seqlens_k")
    sq = max(lq, default=0)
    if max_seqlen_q is not None and sq > max_seqlen_q:
        raise ValueError(f"a sequence has {sq} queries, more than max_seqlen_q = {max_seqlen_q}")
    rows = [b * sq + sq - lq[b] + j for b in range(batch) for j in range(lq[b])]
    idx = _index(q, rows)
    shape = (batch * sq,) + tuple(q.shape[1:])
    total = q.shape[0]
    if sq == 0 or batch == 0:
        out = _zeros(q, (total,) + tuple(q.shape[1:]))
        return out, (_full_neg_inf(q, (q.shape[1], total)) if return_lse else None)
    padded = _zeros(q, shape)
    qu = _take(q, _index(q, [hq[b] + j for b in range(batch) for j in range(lq[b])]))
    if is_torch(q):
        padded.index_copy_(0, idx, qu)
    else:
        padded[idx] = qu
    out_p, lse_p = kvcache(padded.reshape((batch, sq) + tuple(q.shape[1:])), seqlens)
    out_c = _take(out_p.reshape(shape), idx)
    lse_c = None
    if return_lse:
        h = lse_p.shape[1]
        flat = (lse_p.permute(1, 0, 2) if is_torch(lse_p) else lse_p.transpose(1, 0, 2))
        lse_c = _take(flat.reshape(h, batch * sq), idx, 1)
    if seqused_q is None:
        return out_c, lse_c
    # scatter back into the full packed rows (rows past seqused_q: 0 and -inf)
    full_rows = _index(q, [hq[b] + j for b in range(batch) for j in range(lq[b])])
    out = _zeros(out_c, (total,) + tuple(out_c.shape[1:]))
    lse = _full_neg_inf(q, (q.shape[1], total)) if return_lse else None
    if is_torch(q):
        out.index_copy_(0, full_rows, out_c)
        if return_lse:
            lse.index_copy_(1, full_rows, lse_c)
    else:
        out[full_rows] = out_c
        if return_lse:
            lse[:, full_rows] = lse_c
    return out, lse


def _host_lens_array(like, lens):
    if is_torch(like):
        import torch
        return torch.tensor(lens, dtype=torch.int32, device=like.device)
    import numpy as np
    return np.asarray(lens, dtype=np.int32)


def _zeros(like, shape):
    if is_torch(like):
        return like.new_zeros(shape)
    import numpy as np
    return np.zeros(shape, dtype=like.dtype)


def _full_neg_inf(like, shape):
    if is_torch(like):
        import torch
        return torch.full(shape, float("-inf"), dtype=torch.float32, device=like.device)
    import numpy as np
    return np.full(shape, -np.inf, dtype=np.float32)


def combine(merge_attn, out_partial, lse_partial, out=None, out_dtype=None):
    """FA3's flash_attn_combine on merge_attn: out_partial (num_splits, batch, seqlen, nheads,
    headdim) or (num_splits, total, nheads, headdim), lse_partial (num_splits, batch, seqlen,
    nheads) or (num_splits, total, nheads) fp32. Returns (out, softmax_lse), softmax_lse
    (batch, seqlen, nheads) [(total, nheads)] as FA3 returns it (a transposed view of the
    (batch, nheads, seqlen) buffer the library writes)."""
    nd = out_partial.ndim
    if nd not in (4, 5) or lse_partial.ndim != nd - 1 \
            or tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise ValueError(f"out_partial {tuple(out_partial.shape)} and lse_partial "
                         f"{tuple(lse_partial.shape)}: expected (num_splits, batch, seqlen, "
                         f"nheads, headdim) and (num_splits, batch, seqlen, nheads), or varlen "
                         f"(num_splits, total, nheads, headdim) and (num_splits, total, nheads)")
    torch_in = is_torch(lse_partial)
    perm = (0, 1, 3, 2) if nd == 5 else (0, 2, 1)
    lse_parts = lse_partial.permute(*perm) if torch_in else lse_partial.transpose(perm)
    o, lse = merge_attn(out_partial, lse_parts, out=out, out_dtype=out_dtype)
    back = (0, 2, 1) if nd == 5 else (1, 0)
    return o, (lse.permute(*back) if torch_in else lse.transpose(back))
