"""context_parallel_attn: exact attention over a sequence sharded across a process group (ring
attention), with autograd.

Forward, on rank r of n: the K/V shards go round the ring (step t holds the shard of rank
s = r - t mod n). The next shard's send/receive is posted before the current shard's attention,
so that on a GPU the transfer overlaps the compute (two buffers: one read, one being filled).
Each step runs the calls of _schedule.blocks through fa_fwd, which returns out and the LSE,
and merges them into fp32 accumulators by their LSEs (an online merge: exact up to rounding).
Backward: the same ring again. Given the final out and LSE of the rank's queries, fa_bwd on one
K/V shard yields exactly that shard's share of dQ, dK and dV (the softmax is rebuilt from the
global LSE, and D = rowsum(dO * O) from the global out). dQ is summed locally; each shard's
dK/dV sum (fp32) travels behind its K/V shard, each rank adding its share before passing it
on, and after the n-th hop it is back on the shard's owner.
"""

from .. import _core
from . import _layout, _schedule
from ._ring import TAG_DKV, TAG_KV, Ring

_function = None


class _Shards:
    """Sizes of every rank's shard, and K and V of one shard packed in one flat buffer (one
    message per hop instead of two)."""

    def __init__(self, size, k, v, seqlen, layout):
        self.layout = layout
        self.seqlen = seqlen
        self.lengths = _layout.shard_lengths(seqlen, size, layout)
        self.kshape = (k.shape[0], k.shape[2], k.shape[3])
        self.vshape = (v.shape[0], v.shape[2], v.shape[3])

    def numel(self, s):
        b, h, d = self.kshape
        _, _, dv = self.vshape
        return b * self.lengths[s] * h * (d + dv)

    def max_numel(self):
        return max(self.numel(s) for s in range(len(self.lengths)))

    def unpack(self, buf, s):
        """(k, v) views of shard s in a flat buffer."""
        n = self.lengths[s]
        b, h, d = self.kshape
        nk = b * n * h * d
        k = buf[:nk].view(b, n, h, d)
        v = buf[nk:self.numel(s)].view(b, n, h, self.vshape[2])
        return k, v

    def pack(self, torch, k, v, s):
        buf = torch.empty(self.max_numel(), dtype=k.dtype, device=k.device)
        kb, vb = self.unpack(buf, s)
        kb.copy_(k)
        vb.copy_(v)
        return buf


def _merge(torch, acc_out, acc_lse, q0, q1, o, lse):
    """acc := the attention over the union of acc's keys and o's (rows q0:q1), by their LSEs.
    As a lerp (acc + w * (o - acc), w = exp(lse_o - lse_new), one pass over acc instead of
    three): the two weights sum to 1, and lerp is exact at w = 0 and w = 1. A row with no key
    in either keeps out 0 and LSE -inf (w = 0, no 0 * inf)."""
    a = acc_lse[:, :, q0:q1]
    new = torch.logaddexp(a, lse)
    base = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    w = torch.exp(lse - base).transpose(1, 2).unsqueeze(-1)
    acc_out[:, q0:q1].lerp_(o.float(), w)
    acc_lse[:, :, q0:q1] = new


def _covers(b, nq, nk):
    """The block is the whole (queries x keys) square of the step."""
    return (b.q0, b.q1, b.k0, b.k1) == (0, nq, 0, nk)


def _opts(scale, causal):
    return _core.Options(scale, causal)


def _forward(torch, ring, sh, q, k, v, causal, scale):
    n, r = ring.size, ring.rank
    acc_out = acc_lse = None  # the first call over every row and key sets them (no zero pass)
    bufs = [sh.pack(torch, k, v, r), torch.empty(sh.max_numel(), dtype=k.dtype, device=k.device)]
    for t in range(n):
        s, nxt = (r - t) % n, (r - t - 1) % n
        cur, spare = bufs[t % 2], bufs[(t + 1) % 2]
        # Posted before this step's compute, waited on only before the next step reads it: on
        # NCCL the transfer runs on NCCL's stream, which waits for what the current stream has
        # queued so far (the previous step read `spare`), and overlaps this step's attention.
        if t + 1 < n:
            works = ring.shift(cur[:sh.numel(s)], spare[:sh.numel(nxt)], TAG_KV)
        ks, vs = sh.unpack(cur, s)
        for b in _schedule.blocks(sh.seqlen, n, r, s, causal, sh.layout):
            o, lse = _core.attention_forward(q[:, b.q0:b.q1], ks[:, b.k0:b.k1],
                                             vs[:, b.k0:b.k1], _opts=_opts(scale, b.causal))
            if acc_out is None and _covers(b, q.shape[1], ks.shape[1]):
                acc_out, acc_lse = o.float(), lse.contiguous()
                continue
            if acc_out is None:
                acc_out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
                acc_lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"),
                                     dtype=torch.float32, device=q.device)
            _merge(torch, acc_out, acc_lse, b.q0, b.q1, o, lse)
        if t + 1 < n:
            ring.wait(works)  # on NCCL: the current stream waits, the host does not
    if acc_out is None:  # no call at all (an empty shard)
        acc_out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        acc_lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"),
                             dtype=torch.float32, device=q.device)
    return acc_out.to(q.dtype), acc_lse


def _backward(torch, ring, sh, dout, q, k, v, out, lse, causal, scale):
    n, r = ring.size, ring.rank
    f32 = torch.float32
    dq = None  # the first call over every row sets it (no zero pass)
    bufs = [sh.pack(torch, k, v, r), torch.empty(sh.max_numel(), dtype=k.dtype, device=k.device)]
    sums = [torch.empty(sh.max_numel(), dtype=f32, device=q.device) for _ in range(2)]
    acc = None
    for t in range(n):
        s, nxt = (r - t) % n, (r - t - 1) % n
        cur, spare = bufs[t % 2], bufs[(t + 1) % 2]
        if t + 1 < n:
            kv_works = ring.shift(cur[:sh.numel(s)], spare[:sh.numel(nxt)], TAG_KV)
        ks, vs = sh.unpack(cur, s)
        bl = _schedule.blocks(sh.seqlen, n, r, s, causal, sh.layout)
        # one call over the whole square writes every element: no zero pass before it
        whole = len(bl) == 1 and _covers(bl[0], q.shape[1], ks.shape[1])
        part = (torch.empty if whole else torch.zeros)(sh.numel(s), dtype=f32, device=q.device)
        dks, dvs = sh.unpack(part, s)
        for b in bl:
            rows = slice(b.q0, b.q1)
            g = _core.attention_backward(dout[:, rows], q[:, rows], ks[:, b.k0:b.k1],
                                         vs[:, b.k0:b.k1], out[:, rows], lse[:, :, rows],
                                         _opts=_opts(scale, b.causal))
            if dq is None and whole:
                dq = g[0].float()
            else:
                if dq is None:
                    dq = torch.zeros(q.shape, dtype=f32, device=q.device)
                dq[:, rows] += g[0]
            if whole:
                dks.copy_(g[1])
                dvs.copy_(g[2])
            else:
                dks[:, b.k0:b.k1] += g[1]
                dvs[:, b.k0:b.k1] += g[2]
        if t == 0:
            acc = part
        else:  # shard s's sum so far arrived from the previous rank during the compute
            ring.wait(dkv_works)
            acc = sums[(t - 1) % 2][:sh.numel(s)].add_(part)
        if n > 1:  # to the next rank; at the last step the next rank is the shard's owner
            dkv_works = ring.shift(acc, sums[t % 2][:sh.numel(nxt)], TAG_DKV)
        if t + 1 < n:
            ring.wait(kv_works)
    if n > 1:
        ring.wait(dkv_works)
        acc = sums[(n - 1) % 2][:sh.numel(r)]
    if dq is None:  # no call at all (an empty shard)
        dq = torch.zeros(q.shape, dtype=f32, device=q.device)
    dk, dv = sh.unpack(acc, r)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def function():
    """The autograd Function, defined on first use (torch is imported only then)."""
    global _function
    if _function is not None:
        return _function
    import torch

    class ContextParallelAttn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, ring, sh, causal, scale):
            out, lse = _forward(torch, ring, sh, q, k, v, causal, scale)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.ring, ctx.sh, ctx.causal, ctx.scale = ring, sh, causal, scale
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _backward(torch, ctx.ring, ctx.sh, dout, q, k, v, out, lse,
                                   ctx.causal, ctx.scale)
            return dq, dk, dv, None, None, None, None

    _function = ContextParallelAttn
    return _function


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected the rank's shard "
                             f"(batch, seqlen_shard, heads, head_dim)")
    if k.shape[:2] != q.shape[:2] or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: the "
                         f"shards of one self-attention share batch and seqlen (k and v their "
                         f"heads too)")
    if k.dtype != v.dtype:
        raise ValueError(f"k is {k.dtype} and v {v.dtype}: they travel in one buffer, give "
                         f"them one dtype")


def context_parallel_attn(q, k, v, group=None, causal=False, softmax_scale=None,
                          layout="zigzag", seqlen=None, return_lse=False):
    """Attention of a sequence sharded over the ranks of a torch.distributed process group.

    q (batch, seqlen_shard, nheads, headdim), k, v (batch, seqlen_shard, nheads_k, headdim):
    this rank's shard of the whole sequence's q, k, v, as flashattn.distributed.split (or
    shard) cuts it with the same layout ("zigzag" or "contiguous"); nheads a multiple of
    nheads_k (GQA). Every rank of group calls it at once, with the same arguments otherwise.
    causal         causal mask over global positions (query p sees keys p' <= p)
    softmax_scale  None: 1/sqrt(headdim)
    seqlen         the whole sequence's length; None: found with one all_gather of the shard
                   lengths (pass it to save that collective)
    return_lse     also return softmax_lse, fp32 (batch, nheads, seqlen_shard)

    Returns out like q (this rank's rows of the whole sequence's attention), or (out, lse).
    Differentiable in q, k, v (torch autograd). K/V shards move by isend/irecv around the
    ring, so group may be NCCL (GPUs) or gloo (CPU).
    """
    _check(q, k, v)
    _layout.check_layout(layout)
    ring = Ring(group)
    if seqlen is None:
        seqlen = sum(ring.lengths(q.shape[1], q.device))
    expect = _layout.shard_lengths(seqlen, ring.size, layout)[ring.rank]
    if q.shape[1] != expect:
        raise ValueError(f"rank {ring.rank} holds {q.shape[1]} tokens, but its {layout} shard "
                         f"of {seqlen} over {ring.size} ranks has {expect}")
    scale = _core.Options(softmax_scale).scale_for(q.shape[-1])
    sh = _Shards(ring.size, k, v, seqlen, layout)
    out, lse = function().apply(q, k, v, ring, sh, bool(causal), scale)
    return (out, lse) if return_lse else out
