"""flashattn as an attention implementation of Hugging Face transformers.

    from flashattn.integrations import transformers as fa_transformers
    name = fa_transformers.register()                       # "fa_attn"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)

register() adds two entries under one name: `attention_forward` to transformers'
AttentionInterface (the function every attention layer calls) and `padding_mask` to its
AttentionMaskInterface (what the model builds as `attention_mask` for that function). Without a
mask entry transformers would hand a custom implementation no mask at all, so padded batches
would attend to padding.

The mask we ask for is the flash-attention kind: None when no token is padding, else the 2D
(batch, kv_len) boolean padding mask. Causality, sliding windows and softcapping come from the
layer's arguments and map onto the library's own options; padded batches go through
flash_attn_varlen_func with the padding removed.
"""

import torch

from .. import flash_attn_func, flash_attn_varlen_func

__all__ = ["DEFAULT_NAME", "register", "attention_forward", "padding_mask"]

DEFAULT_NAME = "fa_attn"


def register(name=DEFAULT_NAME):
    """Registers flashattn with transformers under `name`; returns the name, to pass as
    `attn_implementation=` (from_pretrained, from_config, or model.set_attn_implementation)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("flashattn.integrations.transformers needs transformers with "
                          "AttentionInterface and masking_utils.AttentionMaskInterface "
                          "(written against 5.17)") from e
    _check_name(name, AttentionInterface)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


def _check_name(name, interface):
    # transformers (5.x) sends every implementation whose name contains "flash" to its own
    # flash-attention loader, which looks for the flash_attn package or a Hub kernel of that
    # name and fails; "paged|" names go to its continuous-batching cache.
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, not {name!r}")
    if "flash" in name.lower() or name.startswith("paged|"):
        raise ValueError(f"{name!r}: transformers treats names containing 'flash' or starting with "
                         f"'paged|' specially; choose another (the default is {DEFAULT_NAME!r})")
    taken = interface._global_mapping.get(name)
    if name == "eager" or (taken is not None and taken is not attention_forward):
        raise ValueError(f"{name!r} is already an attention implementation of transformers")


# ---- the mask transformers builds for us ----

def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, config=None, **kwargs):
    """AttentionMaskInterface entry: None when nothing is padding, else the (batch, kv_len) bool
    padding mask of the keys this layer will see. The model's mask_function (causal, sliding)
    is not materialised: attention_forward gets the same pattern from is_causal and
    sliding_window."""
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk and kv_length + kv_offset > chunk:
        raise NotImplementedError(
            f"chunked attention (attention_chunk_size={chunk}) over {kv_length + kv_offset} "
            f"tokens: flashattn has no chunked mask; use attn_implementation='sdpa'")
    if attention_mask is None:
        return None
    # The 2D mask covers every token seen so far; a sliding-window cache keeps only the last
    # kv_length of them. A static cache may be longer than the mask: then the mask stays
    # shorter than the keys, which tells attention_forward how many cache slots are filled.
    mask = attention_mask[:, -kv_length:].bool()
    if mask.shape[1] == kv_length and bool(mask.all()):
        return None
    return mask


# ---- the attention function ----

def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """AttentionInterface entry. query (batch, heads, q_len, d), key/value (batch, kv_heads,
    kv_len, d); returns (output (batch, q_len, heads, d), None): flashattn computes no
    attention weights."""
    _refuse_unsupported(kwargs)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # transformers passes the config's attention_dropout in training and 0 in eval(); the
    # mask's seed comes from torch's generator, as flash_attn_func draws it
    options = dict(softmax_scale=scaling, causal=bool(is_causal),
                   window_size=_window(sliding_window), softcap=float(softcap or 0.0),
                   dropout_p=float(dropout or 0.0))
    # transformers' layout is (batch, heads, seq, d), ours (batch, seq, heads, d): the library
    # reads strided views, so a transpose costs nothing. GQA needs no repeat either: heads may
    # be any multiple of kv_heads.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    v, v_dim = _match_value_dim(q, v)
    if attention_mask is not None:
        out = _attend_padded(q, k, v, attention_mask, options, sliding_window)
    else:
        cu = _packed_boundaries(q, k, kwargs)
        out = flash_attn_func(q, k, v, **options) if cu is None else _attend_packed(q, k, v, cu,
                                                                                     options)
    return (out if v_dim is None else out[..., :v_dim]), None


def _refuse_unsupported(kwargs):
    """Errors for what the library can't compute, rather than a silently different result."""
    if kwargs.get("output_attentions"):
        raise NotImplementedError(
            "output_attentions=True: flashattn computes no attention weights; load the model "
            "with attn_implementation='eager' to get them")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("s_aux (learned attention sinks) is not supported by flashattn; "
                                  "use attn_implementation='eager'")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("position_bias (an additive bias on the scores) is not "
                                  "supported by flashattn; use attn_implementation='sdpa'")


def _window(sliding_window):
    """transformers' sliding_window W means a key is visible when it is fewer than W positions
    from the query (W keys including the query's own under causal masking, 2W-1 when
    bidirectional), i.e. our window (W-1, W-1); causal=True then cuts the right side to 0."""
    if sliding_window is None or sliding_window <= 0:
        return (-1, -1)
    return (sliding_window - 1, sliding_window - 1)


def _match_value_dim(q, v):
    """Models with a smaller value head (e.g. MLA) get v zero-padded to the query's head size;
    the padded output columns are dropped afterwards."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv == d:
        return v, None
    if dv > d:
        raise NotImplementedError(f"value head size {dv} larger than the query's {d}")
    return torch.nn.functional.pad(v, (0, d - dv)), dv


# ---- padded batches: drop the padding, run varlen, put it back ----

def _attend_padded(q, k, v, mask, options, sliding_window):
    if mask.dim() != 2:
        raise ValueError(
            f"flashattn takes a 2D padding mask (batch, kv_len), got shape {tuple(mask.shape)}: "
            f"a 4D mask passed to the model is not supported; pass the 2D attention_mask")
    kv_len = k.shape[1]
    if mask.shape[1] < kv_len:          # a static cache: only the first slots hold tokens
        k, v = k[:, :mask.shape[1]], v[:, :mask.shape[1]]
    keep_k = mask[:, -kv_len:].bool()
    if options["window_size"][0] >= 0:
        _check_window_padding(keep_k, sliding_window)
    # The queries are the newest tokens, the last q_len columns of the mask. Their kept rows are
    # then the last kept keys of each sequence, so the library's bottom-right causal alignment
    # puts every query on its own key, cache or not.
    keep_q = keep_k[:, -q.shape[1]:]
    rows_q, cu_q, max_q = _ragged(keep_q)
    rows_k, cu_k, max_k = _ragged(keep_k)
    out = flash_attn_varlen_func(q[rows_q], k[rows_k], v[rows_k], cu_q, cu_k, max_q, max_k,
                                 **options)
    # Padding rows get zeros; nothing downstream reads them except the model's own padding.
    return out.new_zeros(q.shape[:2] + out.shape[1:]).index_put(rows_q, out)


def _check_window_padding(keep, sliding_window):
    """Without padding the library's window counts the same keys as transformers' positional
    one; padding removed from the start or the end of a row (left or right padding) shifts every
    position alike, so nothing changes either. Padding between kept tokens (right-padded prompts
    during generate) would make the window reach further back than W positions: refused, unless
    the row's tokens span no more than W positions, where the window excludes nothing."""
    pos = torch.arange(keep.shape[1], device=keep.device)
    count = keep.sum(1)
    first = torch.where(keep, pos, keep.shape[1]).amin(1)
    last = torch.where(keep, pos, -1).amax(1)
    span = last - first + 1
    if bool(((span != count) & (span > sliding_window)).any()):
        raise NotImplementedError(
            f"a sliding window ({sliding_window}) with padding between the tokens of a sequence "
            f"(e.g. right-padded prompts in generate()): flashattn counts the window over the "
            f"tokens that are not padding, transformers over positions. Pad on the left "
            f"(tokenizer.padding_side = 'left') or use attn_implementation='sdpa'")


def _ragged(keep):
    """For a (batch, len) bool mask: the (batch, position) indices of the kept tokens, in order,
    their int32 cu_seqlens (batch + 1) and the longest sequence."""
    lengths = keep.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return keep.nonzero(as_tuple=True), cu, int(lengths.max()) if lengths.numel() else 0


# ---- packed sequences: several sequences in one row, no padding mask ----

def _packed_boundaries(q, k, kwargs):
    """cu_seqlens (q, k, max_q, max_k) when one row holds several sequences, else None.

    Two ways transformers says so: cu_seq_lens_q/k kwargs (DataCollatorWithFlattening), or
    position_ids that restart inside a row. The latter only on a pass without cached history
    (q_len == kv_len): while decoding, positions continue the cache and are never a restart."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        return (cu_q, cu_k, _max_len(cu_q, max_q), _max_len(cu_k, max_k))
    pos = kwargs.get("position_ids")
    if pos is None or pos.dim() != 2 or q.shape[1] != k.shape[1] or q.shape[1] < 2:
        return None
    pos = pos.expand(q.shape[0], -1)
    # A new sequence starts wherever the position does not continue the previous one by 1,
    # the rule transformers' sdpa/eager masks use for packed rows; each row starts one too.
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
    if int(starts.sum()) == pos.shape[0]:
        return None
    first = starts.flatten().nonzero().flatten().to(torch.int32)
    cu = torch.cat([first, first.new_tensor([starts.numel()])])
    return (cu, cu, _max_len(cu, None), _max_len(cu, None))


def _max_len(cu, given):
    if given is not None:
        return int(given)
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _attend_packed(q, k, v, cu, options):
    cu_q, cu_k, max_q, max_k = cu
    flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    out = flash_attn_varlen_func(*flat, cu_q, cu_k, max_q, max_k, **options)
    return out.view(q.shape[0], -1, *out.shape[1:])
