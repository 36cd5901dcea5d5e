"""The functions of the flash_attn package, with its names, arguments, defaults and returns.

`from flashattn import flash_attn_func` (or `from flashattn.flash_attn_interface import ...`)
replaces `from flash_attn import flash_attn_func`. They take torch tensors (CPU or CUDA, with
autograd) and numpy arrays (CPU, forward only; see attention_backward for gradients).

Differences from flash_attn, all explicit:
  - dropout_p > 0 runs on both backends (on the GPU the sm80 kernels, sm_90 included; the
    KV-cache function has none). Each call takes its mask's seed from a generator
    (_dropout.py): for CUDA tensors the device's CUDA generator, whose seed and offset it takes
    and advances, as flash_attn; torch's default generator for CPU tensors (torch.manual_seed
    makes either repeatable), numpy's for numpy arrays, or the keyword-only generator= (a
    torch.Generator, a numpy Generator, or an int seed); autograd keeps seed and offset for
    the backward, which regenerates the same mask.
  - return_attn_probs=True returns (out, softmax_lse, S): S is None without dropout (as
    flash_attn, whose S_dmask exists only with dropout); with dropout S is the keep mask,
    uint8 (batch, nheads, seqlen_q, seqlen_k) [varlen: max_seqlen_q, max_seqlen_k, sequence b
    in the top-left corner of its block], 1 kept (scaled by 1 / (1 - dropout_p)), 0 dropped,
    as a tensor on q's device for torch inputs, else a numpy array. flash_attn's S_dmask carries
    the probabilities too, with the sign as the mask; here the probabilities are
    exp(scores - softmax_lse).
  - A row that sees no key gets out = 0 and softmax_lse = -inf (flash_attn leaves its LSE
    unspecified / +inf for an empty key set).
  - flash_attn_varlen_func(block_table=...) runs packed queries against a paged cache as one
    fa_fwd_kvcache call on bottom-aligned padded queries (forward only). flash_attn_with_kvcache takes
    rotary_cos / rotary_sin / rotary_interleaved and cache_leftpad with flash_attn's meaning
    (cache_leftpad for contiguous caches only, as flash_attn; rotary_dim any even number).
  - softmax_scale = 0 is rejected (ValueError); None means 1/sqrt(head_dim).
  - FP8 (FlashAttention-3's interface): flash_attn_func, flash_attn_varlen_func and
    flash_attn_with_kvcache take float8_e4m3fn / float8_e5m2 q, k, v (one dtype for all) and
    the keyword-only q_descale, k_descale, v_descale: fp32 (batch, num_heads_k) on q's device,
    None meaning 1. The forward only (no FP8 backward, as in FlashAttention-3): a call that
    autograd would record (grad mode on, an input with requires_grad) raises RuntimeError.
    The library writes the output in the dtype of the out it is given (f32, f16, bf16); these
    functions give it bfloat16, FlashAttention-3's choice (attention_forward(out=...) picks
    another). The CPU backend runs it; the CUDA backend runs e4m3 at head dims 128 and 256 on
    sm_90 GPUs (the Hopper kernel, flash_attn_func only) and refuses the rest
    (FlashAttnArgumentError, FA_ERR_DTYPE naming why; docs/fp8.md). Descales given with non-FP8 inputs
    raise ValueError (they would mean nothing there). Finer scales than one per (batch, kv
    head), such as quantize_fp8(block_rows > 0) makes, are not taken (see quantize_fp8).

Each function first offers its arguments as they are to the C extension, which takes the common
case (torch tensors on one device, no autograd to record, index arrays already int32 on that
device) with no Python work per argument; what it declines goes through the general path
below, which converts the arguments and calls again. While torch.compile or torch.export
traces a function, it calls the torch.library ops of _torch_ops instead.
"""

import sys

from . import _autograd, _core, _dropout, _fa3, _fp8, _kvcache, _native, _tensors

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
]


def _check_packed(name, t, nd, n):
    if t.ndim != nd or t.shape[-3] != n:
        what = {3: "qkv", 2: "kv"}[n]
        lead = "(total, " if nd == 4 else "(batch, seqlen, "
        raise ValueError(f"{name} has shape {tuple(t.shape)}: expected {lead}{n}, heads, "
                         f"head_dim) for packed {what}")


def _tracing():
    """True while torch.compile / torch.export trace the caller (torch imported only then)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _mask_of(opts, q, k, torch_out):
    """The keep mask that return_attn_probs returns with dropout (see the top)."""
    if opts.varlen:
        cq = [int(x) for x in _tensors.ops_for(q).to_host_list(opts.cu_seqlens_q)]
        ck = [int(x) for x in _tensors.ops_for(q).to_host_list(opts.cu_seqlens_k)]
        batch = len(cq) - 1
        sq = max(b - a for a, b in zip(cq, cq[1:]))
        sk = max(b - a for a, b in zip(ck, ck[1:]))
    else:
        batch, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    p, seed, offset = opts.dropout
    m = _dropout.dropout_mask(seed, offset, p, batch, q.shape[-2], sq, sk)
    if torch_out:
        return _tensors._import_torch().from_numpy(m).to(q.device)
    return m


def _run(layout, tensors, opts, return_attn_probs):
    ops = _tensors.ops_for(*tensors)
    q, k, v = _autograd.unpack(layout, tensors)
    # FP8: one dtype, descales only with it, and forward only (autograd must not record it)
    fp8 = _fp8.check_inputs(ops, {"q": q, "k": k, "v": v}, opts.descales, grad_check=True)
    if _tracing():
        if opts.dropout is not None:
            raise NotImplementedError("dropout_p > 0 under torch.compile / torch.export is not "
                                      "supported yet; call the function eagerly")
        from . import _torch_ops
        res = _torch_ops.attention(q, k, v, opts, return_attn_probs)
        return (res[0], res[1], None) if return_attn_probs else res
    torch_out = ops is _tensors.TorchOps
    if torch_out and not fp8:
        res = _autograd.function().apply(layout, opts, bool(return_attn_probs), *tensors)
        out, lse = (res[0], res[1]) if return_attn_probs else (res, None)
    else:
        out, lse = _core.attention_forward(q, k, v, return_lse=bool(return_attn_probs),
                                           _opts=opts)
    if not return_attn_probs:
        return out
    s = _mask_of(opts, q, k, torch_out) if opts.dropout is not None else None
    return out, lse, s


_RETURNS = """

    Returns out (batch, seqlen_q, nheads, headdim) [varlen: (total_q, nheads, headdim)], or with
    return_attn_probs=True the tuple (out, softmax_lse, S), S None without dropout and the
    keep mask with it (see the top of flash_attn_interface): softmax_lse fp32
    (batch, nheads, seqlen_q) [varlen: (nheads, total_q)], the natural-log log-sum-exp of each
    row's scaled (capped, biased, masked) scores, -inf for a row that sees no key.
"""


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, generator=None, q_descale=None, k_descale=None,
                    v_descale=None, num_splits=1, pack_gqa=None, sm_margin=0, qv=None,
                    attention_chunk=0):
    """Attention of q (batch, seqlen_q, nheads, headdim) over k, v
    (batch, seqlen_k, nheads_k, headdim); nheads a multiple of nheads_k (GQA/MQA).
    FP8 q, k, v with q/k/v_descale: see the top of flash_attn_interface (output bfloat16).
    FlashAttention-3 keywords: num_splits, pack_gqa, sm_margin are speed hints (checked,
    no effect on the result); qv and attention_chunk != 0 raise NotImplementedError."""
    _fa3.check_hints(num_splits, pack_gqa, sm_margin)
    _fa3.refuse(qv=(qv, None), attention_chunk=(attention_chunk, 0))
    ext = _native.ext
    if (ext is not None and not dropout_p and not return_attn_probs and not _tracing()
            and q_descale is None and k_descale is None and v_descale is None):
        r = ext.fwd(q, k, v, None, None, False, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, None, None, None, None, True, None, None)
        if r is not NotImplemented:
            return r[0]
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         deterministic=deterministic,
                         dropout=_dropout.draw(dropout_p, (q, k, v), generator),
                         descales=(q_descale, k_descale, v_descale))
    return _run("q,k,v", (q, k, v), opts, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, generator=None):
    """Self-attention of packed qkv (batch, seqlen, 3, nheads, headdim). The gradient comes back
    packed (one dqkv), with no concatenation."""
    _check_packed("qkv", qkv, 5, 3)
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         deterministic=deterministic,
                         dropout=_dropout.draw(dropout_p, (qkv,), generator))
    return _run("qkv", (qkv,), opts, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, generator=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over packed kv
    (batch, seqlen_k, 2, nheads_k, headdim)."""
    _check_packed("kv", kv, 5, 2)
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         deterministic=deterministic,
                         dropout=_dropout.draw(dropout_p, (q, kv), generator))
    return _run("q,kv", (q, kv), opts, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           generator=None, q_descale=None, k_descale=None, v_descale=None,
                           seqused_q=None, seqused_k=None, num_splits=1, pack_gqa=None,
                           sm_margin=0, qv=None, attention_chunk=0):
    """Variable-length attention: q (total_q, nheads, headdim), k, v (total_k, nheads_k,
    headdim), sequence b being rows cu_seqlens[b]..cu_seqlens[b+1]-1 (int32 prefix sums,
    batch + 1 values; empty sequences allowed). Masks align each sequence's own corner.
    max_seqlen_q / max_seqlen_k None or 0: the library takes them from the cu_seqlens.
    FP8 q, k, v with q/k/v_descale (batch, nheads_k), batch = len(cu_seqlens_q) - 1: see the
    top of flash_attn_interface (output bfloat16).

    FlashAttention-3 keywords:
    seqused_q, seqused_k  int32 (batch,): sequence b uses only its first seqused[b] rows
                   (<= its cu_seqlens span); the rest are not read. Output rows past
                   seqused_q[b] are 0 and their softmax_lse -inf. Runs as a gather of the
                   used rows, the varlen call, and a scatter (autograd flows through).
    block_table    int32 (batch, max_pages): k, v are a paged KV cache (num_pages, page_size,
                   nheads_k, headdim) as in flash_attn_with_kvcache; sequence b's keys are its
                   first seqused_k[b] tokens (or cu_seqlens_k[b+1] - cu_seqlens_k[b] when
                   seqused_k is None). Forward only; dropout is refused.
    num_splits, pack_gqa, sm_margin  speed hints, checked, no effect on the result.
    qv, attention_chunk != 0  NotImplementedError."""
    _fa3.check_hints(num_splits, pack_gqa, sm_margin)
    _fa3.refuse(qv=(qv, None), attention_chunk=(attention_chunk, 0))
    if _tracing() and (block_table is not None or seqused_q is not None
                       or seqused_k is not None):
        # these paths read the index arrays on the host to size the packed tensors, which a
        # traced graph cannot do: one op (_torch_fa3_ops) runs them whole, its output shapes
        # known from q
        if dropout_p:
            raise NotImplementedError("dropout_p > 0 with block_table / seqused_q / seqused_k "
                                      "is not supported")
        from . import _torch_fa3_ops
        return _torch_fa3_ops.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, seqused_q, seqused_k, block_table,
                                     softmax_scale, causal, window_size, softcap, alibi_slopes,
                                     deterministic, return_attn_probs,
                                     (q_descale, k_descale, v_descale))
    if block_table is not None:
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_q,
                             seqused_k, block_table, dropout_p, softmax_scale, causal,
                             window_size, softcap, alibi_slopes, return_attn_probs,
                             (q_descale, k_descale, v_descale))
    if cu_seqlens_k is None:
        raise ValueError("flash_attn_varlen_func needs cu_seqlens_k (or block_table with "
                         "seqused_k for a paged KV cache)")
    if seqused_q is not None or seqused_k is not None:
        if dropout_p:
            raise NotImplementedError("dropout_p > 0 with seqused_q / seqused_k is not "
                                      "supported (the keep mask would be the packed "
                                      "problem's); drop the unused rows yourself")

        def call(q2, k2, v2, cq, ck, mq, mk):
            r = flash_attn_varlen_func(q2, k2, v2, cq, ck, mq, mk, 0.0, softmax_scale, causal,
                                       window_size, softcap, alibi_slopes, deterministic,
                                       return_attn_probs, q_descale=q_descale,
                                       k_descale=k_descale, v_descale=v_descale)
            return (r[0], r[1]) if return_attn_probs else (r, None)

        out, lse = _fa3.varlen_seqused(call, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q,
                                       seqused_k, bool(return_attn_probs))
        return (out, lse, None) if return_attn_probs else out
    ext = _native.ext
    if (ext is not None and not dropout_p and not return_attn_probs
            and not _tracing() and q_descale is None and k_descale is None
            and v_descale is None):
        r = ext.fwd(q, k, v, None, None, False, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, True,
                    None, None)
        if r is not NotImplemented:
            return r[0]
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic,
                         _dropout.draw(dropout_p, (q, k, v), generator),
                         (q_descale, k_descale, v_descale))
    return _run("q,k,v", (q, k, v), opts, return_attn_probs)


def _paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_q,
                  seqused_k, block_table, dropout_p, softmax_scale, causal, window_size,
                  softcap, alibi_slopes, return_attn_probs, descales):
    """flash_attn_varlen_func(block_table=...): one fa_fwd_kvcache call on bottom-aligned
    padded queries (see _fa3.paged_varlen)."""
    if dropout_p:
        raise NotImplementedError("dropout_p > 0 with block_table (a paged KV cache) is not "
                                  "supported: the paged call is for inference, as in flash_attn")

    def kvcache(qp, seqlens):
        return flash_attn_with_kvcache(qp, k_cache, v_cache, cache_seqlens=seqlens,
                                       block_table=block_table, softmax_scale=softmax_scale,
                                       causal=causal, window_size=window_size, softcap=softcap,
                                       alibi_slopes=alibi_slopes, return_softmax_lse=True,
                                       q_descale=descales[0], k_descale=descales[1],
                                       v_descale=descales[2])

    out, lse = _fa3.paged_varlen(kvcache, q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, seqused_k, seqused_q, block_table,
                                 bool(return_attn_probs))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, generator=None):
    """Variable-length self-attention of packed qkv (total, 3, nheads, headdim)."""
    _check_packed("qkv", qkv, 4, 3)
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, deterministic,
                         _dropout.draw(dropout_p, (qkv,), generator))
    return _run("qkv", (qkv,), opts, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, generator=None):
    """Variable-length attention of q (total_q, nheads, headdim) over packed kv
    (total_k, 2, nheads_k, headdim)."""
    _check_packed("kv", kv, 4, 2)
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic,
                         _dropout.draw(dropout_p, (q, kv), generator))
    return _run("q,kv", (q, kv), opts, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, q_descale=None, k_descale=None,
                            v_descale=None, page_table=None, pack_gqa=None, sm_margin=0,
                            qv=None, attention_chunk=0, scheduler_metadata=None,
                            rotary_seqlens=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
                            max_seqlen_q=None):
    """Attention of a few new query tokens per sequence against a KV cache (decoding,
    speculative decoding, chunked prefill), appending k, v into the cache first (in place).

    q              (batch, seqlen_q, nheads, headdim)
    k_cache, v_cache  (batch_cache, seqlen_cache, nheads_k, headdim), batch_cache >= batch
                   (sequence b reads row b, or row cache_batch_idx[b]); with block_table a
                   page pool (num_pages, page_size, nheads_k, headdim), any page_size
    k, v           None, or (batch, seqlen_new, nheads_k, headdim): written into the cache at
                   positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of each
                   sequence (through block_table when paged); attention then covers
                   cache_seqlens[b] + seqlen_new keys. cache_seqlens is not advanced (as in
                   flash_attn): add seqlen_new yourself for the next step.
    cache_seqlens  int, or int32 (batch,) array/tensor (other integer dtypes are converted):
                   tokens already in each sequence's cache. None: the whole cache
                   (seqlen_cache, or max_pages * page_size) holds keys; required with k, v.
    cache_batch_idx  int32 (batch,): the cache row of each sequence (contiguous caches only)
    block_table    int32 (batch, max_pages): token t of sequence b is row t % page_size of
                   pool page block_table[b, t // page_size]. Pages may come in any order; only
                   the entries a call touches are read.
    softmax_scale, causal, window_size, softcap, alibi_slopes  as for flash_attn_func; masks
                   align bottom-right against each sequence's total length (query i of
                   seqlen_q sits on key cache_seqlens[b] + seqlen_new - seqlen_q + i).
    num_splits     0: the library chooses how many chunks of the keys run in parallel
                   (last_selection().num_splits says); n >= 1 forces n.
    return_softmax_lse  also return softmax_lse, fp32 (batch, nheads, seqlen_q)

    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse). A sequence whose
    cache is empty (and that appends nothing) gets out 0 and lse -inf.
    numpy arrays run on the CPU (float32, float16, bfloat16); torch tensors on their device, on
    the current CUDA stream, with cache_seqlens / block_table on that device (host arrays are
    copied there, which costs a copy per call: keep them on the device). On CUDA the kernels
    check cache_seqlens / block_table as they read them, with no synchronisation (the call can
    be captured in a CUDA graph): a bad element is clamped and reported by the next call or by
    flashattn.check(); set_options(device_checks=True) checks before the call instead, at the
    price of one stream synchronisation. There is no autograd: this is an inference call.

    q_descale, k_descale, v_descale  FP8 q, caches and k, v (one FP8 dtype): fp32
                   (batch, nheads_k) on q's device, None meaning 1; k_descale / v_descale
                   describe the whole cache (appended tokens included); out is bfloat16.
                   See the top of flash_attn_interface.

    rotary_cos, rotary_sin  None, or (seqlen_ro, rotary_dim / 2) tables of q's dtype or
                   float32 on q's device, rotary_dim even and <= headdim: the rotary embedding
                   applied to q and to k as k is appended (k, v required), as in flash_attn:
                   new key j of sequence b at position cache_seqlens[b] + j; query i at
                   cache_seqlens[b] + i when causal or window_size != (-1, -1), else every
                   query at cache_seqlens[b]. The first rotary_dim columns rotate; the cache
                   holds the rotated keys afterwards; q and k are not modified. seqlen_ro must
                   cover the cache's capacity (seqlen_cache, or max_pages * page_size), plus
                   seqlen_q - seqlen_new for causal/windowed calls with more queries than new
                   keys.
    rotary_interleaved  True: GPT-J pairs (0, 1), (2, 3), ...; False: GPT-NeoX halves
                   (i, i + rotary_dim / 2).
    cache_leftpad  None, or int32 (batch,): sequence b's keys start at cache row
                   cache_leftpad[b] (rows before it are not attended);
                   0 <= cache_leftpad[b] <= cache_seqlens[b]. Contiguous caches only (with
                   block_table flashattn refuses it, as flash_attn does). Rotary positions are
                   cache rows counted from 0, not from the pad (flash_attn's rule).
    """
    # FlashAttention-3 keywords: page_table is block_table's FA3 name; pack_gqa, sm_margin
    # are speed hints; the rest change the problem and are refused by name.
    if page_table is not None:
        if block_table is not None:
            raise ValueError("block_table and page_table are the same argument (FA2 / FA3 "
                             "names): pass one")
        block_table = page_table
    _fa3.check_hints(0, pack_gqa, sm_margin)  # num_splits is checked where it is used
    _fa3.refuse(qv=(qv, None), attention_chunk=(attention_chunk, 0),
                scheduler_metadata=(scheduler_metadata, None),
                rotary_seqlens=(rotary_seqlens, None), cu_seqlens_q=(cu_seqlens_q, None),
                cu_seqlens_k_new=(cu_seqlens_k_new, None), max_seqlen_q=(max_seqlen_q, None))
    ext = _native.ext
    tracing = _tracing()
    if (ext is not None and not tracing and cache_batch_idx is None and q_descale is None
            and k_descale is None and v_descale is None):
        r = ext.fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, None, None,
                            return_softmax_lse, softmax_scale, causal, window_size, softcap,
                            alibi_slopes, num_splits, None, rotary_cos, rotary_sin,
                            rotary_interleaved, cache_leftpad)
        if r is not NotImplemented:
            return r if return_softmax_lse else r[0]
    opts = _core.Options(softmax_scale, causal, window_size, softcap, alibi_slopes,
                         descales=(q_descale, k_descale, v_descale))
    if tracing:
        from . import _torch_ops
        return _torch_ops.kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                                  block_table, opts, num_splits, return_softmax_lse,
                                  rotary_cos, rotary_sin, rotary_interleaved, cache_leftpad)
    out, lse = _kvcache.kvcache_forward(q, k_cache, v_cache, k, v, cache_seqlens,
                                        cache_batch_idx, block_table, num_splits,
                                        bool(return_softmax_lse), _opts=opts,
                                        rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                        rotary_interleaved=rotary_interleaved,
                                        cache_leftpad=cache_leftpad)
    return (out, lse) if return_softmax_lse else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FlashAttention-3's combine of split results, on merge_attn (fa_merge_attn):
    out_partial (num_splits, batch, seqlen, nheads, headdim) or varlen (num_splits, total,
    nheads, headdim), lse_partial fp32 (num_splits, batch, seqlen, nheads) or (num_splits,
    total, nheads); out an optional buffer, out_dtype the dtype of a new out (default
    out_partial's). Returns (out, softmax_lse), softmax_lse (batch, seqlen, nheads)
    [(total, nheads)], a transposed view as in FA3. A split whose lse is -inf carries no
    weight; a row no split saw gets out 0 and lse -inf."""
    return _fa3.combine(_kvcache.merge_attn, out_partial, lse_partial, out, out_dtype)


for _f in (flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func,
           flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func,
           flash_attn_varlen_kvpacked_func):
    _f.__doc__ += _RETURNS + _core._OPTION_DOC
del _f
