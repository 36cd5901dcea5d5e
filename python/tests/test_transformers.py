"""flashattn inside Hugging Face transformers models (flashattn.integrations.transformers).

Tiny randomly initialised Llama (GQA), Mistral (sliding window shorter than the sequence) and
Gemma 2 (logit softcapping, query_pre_attn_scalar scaling, alternating sliding/full layers) run
with the same weights under our implementation and under a transformers baseline; both are
measured against the baseline model in float64, run on each sequence alone (no padding). The
rule is the project's: our max and mean errors at most twice the baseline's, plus a few units of
roundoff. Checked: logits with and without padding (left and right), greedy generate() through
the KV cache (dynamic and static caches, prompts with and without padding), the gradients of a
training step, packed sequences, and the attention function on its own against the project's
yardstick (non-causal, windows, decoding shapes, padding). fp32 on the CPU; bf16 on CUDA when
the library has a CUDA backend.

The baseline is sdpa, except for Gemma 2: transformers' sdpa path drops `softcap` without a word,
so Gemma 2 is compared against eager (a test below checks that the softcap matters there).
"""

import copy
import os

import numpy as np
import pytest

import reference as R

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashattn  # noqa: E402
from flashattn.integrations import transformers as fa_hf  # noqa: E402

NAME = fa_hf.register()

UNIT = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


def _cuda_ok():
    try:
        return torch.cuda.is_available() and flashattn.has_cuda()
    except Exception:  # no library, or one without CUDA
        return False


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda_ok(), reason="needs a CUDA device and a library built with CUDA"))]


def dtype_for(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


@pytest.fixture
def torch_seed(seed):
    s = (seed[0] << 32 | seed[1]) % (2**63)
    torch.manual_seed(s)
    return seed


# ---- the models ----

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              # a wider init than the default 0.02: peaked attention (the softcap and the
              # windows change the result) and logits with clear winners for greedy decoding
              initializer_range=0.2, attention_dropout=0.0,
              bos_token_id=None, eos_token_id=None, pad_token_id=0)


def config(kind):
    if kind == "llama":
        return transformers.LlamaConfig(head_dim=16, **COMMON)
    if kind == "mistral":
        return transformers.MistralConfig(head_dim=16, sliding_window=8, **COMMON)
    if kind == "gemma2":
        # scaling = query_pre_attn_scalar**-0.5 = 1/sqrt(8), not 1/sqrt(head_dim)
        return transformers.Gemma2Config(head_dim=16, sliding_window=8, attn_logit_softcapping=2.0,
                                          query_pre_attn_scalar=8, **COMMON)
    raise ValueError(kind)


MODELS = ["llama", "mistral", "gemma2"]
BASELINE = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager"}


def build(kind, device, **overrides):
    """(ours, baseline, float64 reference): one set of random weights under three models."""
    cfg = config(kind)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    auto = transformers.AutoModelForCausalLM
    base = auto.from_config(copy.deepcopy(cfg), attn_implementation=BASELINE[kind])
    ours = auto.from_config(copy.deepcopy(cfg), attn_implementation=NAME)
    ours.load_state_dict(base.state_dict())
    ref = copy.deepcopy(base).to(device, torch.float64)
    dt = dtype_for(device)
    return ours.to(device, dt).eval(), base.to(device, dt).eval(), ref.eval()


def batch(device, kind, b=3, s=40, vocab=128):
    """Token ids (b, s) and a padding mask: None, or rows of lengths s, 3s/4 and s/2 padded on
    the left or on the right (with s=40 every row is longer than the sliding window of 8)."""
    ids = torch.randint(1, vocab, (b, s), device=device)
    if kind == "none":
        return ids, None
    mask = torch.ones(b, s, dtype=torch.long, device=device)
    for row in range(1, b):
        pad = row * s // 4
        if kind == "left":
            mask[row, :pad] = 0
        else:
            mask[row, s - pad:] = 0
    return ids.masked_fill(mask == 0, 0), mask


# ---- the rule ----

def errors(x, ref):
    d = (x.double() - ref).abs()
    return d.max().item(), d.mean().item()


def check_rule(what, got, base, ref, dtype, seed):
    """Our max and mean errors against ref at most 2x the baseline's + 4 units of roundoff."""
    assert torch.isfinite(got).all() and torch.isfinite(base).all(), f"{what}: non-finite"
    g_max, g_mean = errors(got, ref)
    b_max, b_mean = errors(base, ref)
    slack = 4 * UNIT[dtype] * max(1.0, ref.abs().max().item())
    lim_max, lim_mean = 2 * b_max + slack, 2 * b_mean + slack
    assert g_max <= lim_max and g_mean <= lim_mean, (
        f"{what} (seed {seed}): ours max {g_max:.3g} mean {g_mean:.3g}, baseline max {b_max:.3g} "
        f"mean {b_mean:.3g}, allowed max {lim_max:.3g} mean {lim_mean:.3g}")


# ---- the float64 reference: every sequence alone, unpadded ----
# A padded row must give what its tokens give alone. Running each sequence by itself, at the
# positions it has in the batch, also keeps the reference clear of the padding rows, where a
# float64 eager mask adds two float64 minima (-inf) and turns fully masked rows into NaN.

def alone(model, ids, keep):
    """The logits (n_kept, vocab) of model over each row's kept tokens, row after row."""
    out = []
    for row in range(ids.shape[0]):
        pos = keep[row].nonzero().flatten()
        out.append(model(ids[row, pos][None], position_ids=pos[None], use_cache=False).logits[0])
    return torch.cat(out)


def keep_of(ids, mask):
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


# ---- (a) logits ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("kind", MODELS)
def test_logits(kind, padding, device, torch_seed):
    ours, base, ref = build(kind, device)
    ids, mask = batch(device, padding)
    keep = keep_of(ids, mask)
    with torch.no_grad():
        got, want = (m(ids, attention_mask=mask).logits[keep] for m in (ours, base))
        exact = alone(ref, ids, keep)
    check_rule(f"{kind} logits, {padding} padding", got, want, exact, dtype_for(device),
               torch_seed)


def test_gemma2_softcap_matters(torch_seed):
    """Gemma 2's softcap changes these logits by far more than rounding: the Gemma 2 checks
    would catch a softcap that is ignored (as transformers' sdpa path ignores it)."""
    ours, base, _ = build("gemma2", "cpu")
    ids, _ = batch("cpu", "none")
    ignored = copy.deepcopy(base)
    ignored.set_attn_implementation("sdpa")
    with torch.no_grad():
        diff = (base(ids).logits - ignored(ids).logits).abs().max().item()
    assert diff > 1e-2, f"softcap moves the logits by only {diff:.3g} (seed {torch_seed})"


# ---- (b) greedy decoding through the model's cache ----

def generate(model, ids, mask, steps, cache):
    # disable_compile: on CUDA a static cache would make generate() torch.compile the model
    # (tens of seconds); the attention under test is the same either way
    out = model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                         cache_implementation=cache, disable_compile=True,
                         return_dict_in_generate=True, output_logits=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)   # (b, steps[, vocab])


def decode_reference(ref, ids, keep, new):
    """Float64 logits of every decoding step, teacher-forced: one forward of each row's kept
    prompt tokens followed by the generated ones (positions from 0, as generate() gives a
    left-padded row). Row r, step t: the logits after the t-th generated token's prefix."""
    out = []
    for row in range(ids.shape[0]):
        seq = torch.cat([ids[row, keep[row]], new[row]])[None]
        logits = ref(seq, use_cache=False).logits[0]
        start = int(keep[row].sum()) - 1
        out.append(logits[start:start + new.shape[1]])
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding,cache", [("none", "dynamic"), ("left", "dynamic"),
                                           ("left", "static")])
@pytest.mark.parametrize("kind", MODELS)
def test_generate(kind, padding, cache, device, torch_seed):
    """32 greedy tokens through the model's cache, against the baseline's. Every step's logits
    (each step a forward over the cache, queries shorter than keys) are held to the rule against
    a float64 teacher-forced forward over the same tokens. Tokens must be identical, except
    where the two models face a near tie: a row may part from the baseline's at a step whose
    logits still pass the rule (the two top logits then lie within rounding of each other);
    the row is compared up to that step and not after. The prompts (12 tokens) and the 32 steps
    run past the sliding windows (8)."""
    ours, base, ref = build(kind, device)
    ids, mask = batch(device, padding, b=3, s=12)
    keep = keep_of(ids, mask)
    steps = 32
    with torch.no_grad():
        tok_o, log_o = generate(ours, ids, mask, steps, cache)
        tok_b, log_b = generate(base, ids, mask, steps, cache)
        exact = decode_reference(ref, ids, keep, tok_o)
    got, want, truth, parted = [], [], [], []
    for row in range(ids.shape[0]):
        differ = (tok_o[row] != tok_b[row]).nonzero()
        end = differ[0].item() if len(differ) else steps   # first step whose token differs
        upto = min(end + 1, steps)                          # its logits: same prefix, compared
        got.append(log_o[row, :upto])
        want.append(log_b[row, :upto])
        truth.append(exact[row, :upto])
        if end < steps:
            parted.append((row, end, tok_o[row, end].item(), tok_b[row, end].item()))
    check_rule(f"{kind} decoding logits ({padding} padding, {cache} cache; rows parted at "
               f"(row, step, ours, baseline) {parted})", torch.cat(got), torch.cat(want),
               torch.cat(truth), dtype_for(device), torch_seed)
    # near ties are rare: most of the tokens must match
    compared = sum(len(g) for g in got)
    assert compared >= ids.shape[0] * steps // 2, (
        f"{kind}: tokens parted early at {parted} (seed {torch_seed})")


# ---- (c) gradients of a training step ----

def next_token_loss(logits, ids, keep):
    """Summed cross-entropy of each kept token predicted from a kept predecessor (the first
    token of a left-padded row follows padding, so it is not a target)."""
    pair = keep[:, 1:] & keep[:, :-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1][pair].double(), ids[:, 1:][pair],
                                             reduction="sum"), int(pair.sum())


def grads(model, ids, mask, keep, per_row):
    model.train()
    model.zero_grad(set_to_none=True)
    if per_row:                         # the reference: each sequence alone
        total, count = 0.0, 0
        for row in range(ids.shape[0]):
            pos = keep[row].nonzero().flatten()
            logits = model(ids[row, pos][None], position_ids=pos[None], use_cache=False).logits
            loss, n = next_token_loss(logits, ids[row, pos][None], keep[row, pos][None])
            total, count = total + loss, count + n
    else:
        logits = model(ids, attention_mask=mask, use_cache=False).logits
        total, count = next_token_loss(logits, ids, keep)
    (total / count).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("kind", MODELS)
def test_gradients(kind, padding, device, torch_seed):
    """One training step's parameter gradients, tensor by tensor."""
    ours, base, ref = build(kind, device)
    ids, mask = batch(device, padding, s=32)
    keep = keep_of(ids, mask)
    got, want = (grads(m, ids, mask, keep, False) for m in (ours, base))
    exact = grads(ref, ids, mask, keep, True)
    assert got.keys() == want.keys() == exact.keys() and len(got) > 0
    for name in exact:
        check_rule(f"{kind} grad {name}, {padding} padding", got[name], want[name], exact[name],
                   dtype_for(device), torch_seed)


# ---- packed sequences (position_ids restarting inside a row) ----

@pytest.mark.parametrize("kind", MODELS)
def test_packed_sequences(kind, torch_seed):
    """Three sequences in one row, told apart by position_ids restarting at 0 (as
    DataCollatorWithFlattening packs them). use_cache=False: only then does transformers' own
    mask separate them, for the baseline."""
    ours, base, ref = build(kind, "cpu")
    ids = torch.randint(1, 128, (1, 40))
    pos = torch.cat([torch.arange(n) for n in (17, 9, 14)])[None]
    with torch.no_grad():
        got, want = (m(ids, position_ids=pos, use_cache=False).logits[0] for m in (ours, base))
        exact = torch.cat([ref(ids[:, a:a + n], use_cache=False).logits[0]
                           for a, n in ((0, 17), (17, 9), (26, 14))])
    check_rule(f"{kind} packed logits", got, want, exact, torch.float32, torch_seed)


# ---- the attention function alone ----

class Layer(torch.nn.Module):
    def __init__(self, is_causal):
        super().__init__()
        self.is_causal = is_causal


def plain_attention(q, k, v, keep, causal, window, softcap, scale):
    """Materialised reference in transformers' terms: the q_len queries are the last positions of
    the kv_len keys; key j visible to query at position p when kept, j <= p if causal, and
    |p - j| < window; scores scaled then softcapped."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    k = k.repeat_interleave(h // k.shape[1], 1)
    v = v.repeat_interleave(h // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    p = torch.arange(sk - sq, sk)[:, None]
    j = torch.arange(sk)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        vis &= j <= p
    if window:
        vis &= (p - j).abs() < window
    vis = vis[None, None] & keep[:, None, None, :]
    s = s.masked_fill(~vis, float("-inf"))
    w = torch.nan_to_num(torch.softmax(s, -1))          # a row that sees nothing gives 0
    return (w @ v).transpose(1, 2)


SHAPES = [  # (causal, q_len, kv_len, window, softcap)
    (False, 20, 20, None, 0.0),
    (False, 20, 20, 5, 3.0),      # bidirectional window: |i - j| < 5
    (True, 20, 20, 6, 0.0),
    (True, 1, 30, None, 0.0),     # decoding one token against a cache
    (True, 1, 30, 8, 0.0),
    (True, 4, 30, 7, 2.0),        # several new tokens (speculative / chunked prefill)
    (True, 3, 6, 7, 0.0),         # a window longer than the keys: excludes nothing
]


def yardstick(q, k, v, keep, causal, window, softcap, scale):
    """The project's plain fp32 attention (tests/reference.py, the yardstick of the rule) over
    each row's kept tokens: (n_kept_queries, heads, d). Rows are contiguous here or the window
    excludes nothing, so dropping the padding keeps the positional pattern."""
    q_len = q.shape[2]
    rows_q = [q[r].transpose(0, 1)[keep[r, -q_len:]] for r in range(q.shape[0])]
    rows_k = [(k[r].transpose(0, 1)[keep[r]], v[r].transpose(0, 1)[keep[r]])
              for r in range(q.shape[0])]
    cu = lambda xs: np.cumsum([0] + [len(x) for x in xs]).astype(np.int32)  # noqa: E731
    res = R.attention(torch.cat(rows_q).numpy(), torch.cat([x for x, _ in rows_k]).numpy(),
                      torch.cat([y for _, y in rows_k]).numpy(), scale=scale, causal=causal,
                      window=(window - 1, window - 1) if window else (-1, -1),
                      softcap=softcap, cu_q=cu(rows_q), cu_k=cu([x for x, _ in rows_k]),
                      prec=np.float32)
    return torch.from_numpy(res["out"])


def attend(causal, q_len, kv_len, window, softcap, keep, seed):
    """attention_forward on random fp32 inputs against plain_attention in float64."""
    b, h, hk, d = keep.shape[0], 4, 2, 16
    q = torch.randn(b, h, q_len, d) * 2
    k = torch.randn(b, hk, kv_len, d) * 2
    v = torch.randn(b, hk, kv_len, d)
    scale = float(np.float32(0.3))
    mask = fa_hf.padding_mask(b, q_len, kv_len, attention_mask=keep)
    got, weights = fa_hf.attention_forward(Layer(is_causal=causal), q, k, v, mask, scaling=scale,
                                           sliding_window=window, softcap=softcap)
    assert weights is None and got.shape == (b, q_len, h, d) and got.dtype == torch.float32
    exact = plain_attention(q.double(), k.double(), v.double(), keep, causal, window, softcap,
                            scale)
    rows = keep[:, -q_len:]         # padding query rows are left unspecified (ours gives 0)
    base = yardstick(q, k, v, keep, causal, window, softcap, scale)
    check_rule("attention_forward", got[rows], base, exact[rows], torch.float32, seed)


def padding(kind, b, kv_len, q_len):
    keep = torch.ones(b, kv_len, dtype=torch.bool)
    if kind == "left":              # rows 1 and 2 left-padded
        keep[1, :kv_len // 3] = False
        keep[2, :kv_len // 2] = False
    elif kind == "holes":           # e.g. right-padded prompts followed by generated tokens
        keep[1, kv_len // 2 - 2:kv_len // 2] = False
        keep[2, 1:-1:3] = False
    return keep


@pytest.mark.parametrize("pad", ["none", "left", "holes"])
@pytest.mark.parametrize("causal,q_len,kv_len,window,softcap", SHAPES)
def test_attention_function(causal, q_len, kv_len, window, softcap, pad, torch_seed):
    keep = padding(pad, 3, kv_len, q_len)
    if pad == "holes" and window and window < kv_len:
        # the window would count positions differently: refused, not silently changed
        with pytest.raises(NotImplementedError, match="sliding window"):
            attend(causal, q_len, kv_len, window, softcap, keep, torch_seed)
    else:
        attend(causal, q_len, kv_len, window, softcap, keep, torch_seed)


def test_smaller_value_head(torch_seed):
    """Values with fewer dimensions than queries and keys (MLA-style): padded, then cropped."""
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)  # row 0 padded by 3, row 1 by 4
    v = torch.randn(2, 2, 9, 8)
    keep = padding("left", 3, 9, 9)[1:]
    got, _ = fa_hf.attention_forward(Layer(is_causal=True), q, k, v,
                                     fa_hf.padding_mask(2, 9, 9, attention_mask=keep))
    exact = plain_attention(q.double(), k.double(), v.double(), keep, True, None, 0.0, 0.25)
    assert got.shape == (2, 9, 4, 8)
    assert (got[keep].double() - exact[keep]).abs().max().item() < 1e-5


def test_padding_mask_function():
    keep = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    assert fa_hf.padding_mask(2, 4, 4, attention_mask=None) is None
    assert fa_hf.padding_mask(2, 1, 2, attention_mask=keep) is None      # window: last 2 kept
    assert fa_hf.padding_mask(1, 4, 4, attention_mask=keep[:1]) is None
    assert torch.equal(fa_hf.padding_mask(2, 4, 4, attention_mask=keep), keep)
    # a static cache longer than the tokens seen: the mask is kept, shorter than the keys
    assert torch.equal(fa_hf.padding_mask(1, 1, 8, attention_mask=keep[:1]), keep[:1])


# ---- what is refused, and how ----

@pytest.mark.parametrize("pad", ["left", "none"])
def test_attention_dropout_in_training(torch_seed, pad):
    """attention_dropout reaches the library in train(): the logits depend on torch's seed
    (the same seed, the same logits), differ from eval()'s, and the backward runs; eval()
    drops nothing."""
    ours, _, _ = build("llama", "cpu", attention_dropout=0.5)
    ids, mask = batch("cpu", pad, s=16)
    with torch.no_grad():
        e1, e2 = (ours.eval()(ids, attention_mask=mask).logits for _ in range(2))
    assert torch.equal(e1, e2)
    ours.train()
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(ours(ids, attention_mask=mask).logits)
    assert torch.equal(runs[0], runs[1])
    assert not torch.allclose(runs[0], runs[2]) and not torch.allclose(runs[0], e1)
    runs[0].float().pow(2).mean().backward()
    grads = [p.grad for p in ours.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_output_attentions_refused(torch_seed):
    ours, _, _ = build("llama", "cpu")
    with pytest.raises(NotImplementedError, match="attn_implementation='eager'"):
        ours(torch.randint(1, 128, (1, 8)), output_attentions=True)


def test_4d_mask_refused(torch_seed):
    ours, _, _ = build("llama", "cpu")
    mask4d = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="2D"):
        ours(torch.randint(1, 128, (1, 8)), attention_mask=mask4d)


def test_register_names():
    assert fa_hf.register() == NAME and "flash" not in NAME
    assert fa_hf.register("my_fa") == "my_fa"
    for bad in ("flashattn", "flash_attention_2", "sdpa", "eager", "paged|x", ""):
        with pytest.raises(ValueError):
            fa_hf.register(bad)


def test_readme_example():
    """The example of python/README.md's "Hugging Face transformers" section runs as written."""
    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "README.md")
    if not os.path.exists(readme):
        pytest.skip("python/README.md is not beside the tests")
    text = open(readme, encoding="utf-8").read()
    section = text[text.index("### Hugging Face transformers"):]
    code = section[section.index("```python\n") + 10:]
    code = code[:code.index("\n```")]
    exec(compile(code, "README.md (Hugging Face transformers)", "exec"), {})
