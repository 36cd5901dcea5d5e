"""Which attention calls a rank makes against one K/V shard of the ring.

Rule, per pair of chunks (query chunk i, key chunk j), with a causal mask: j > i is skipped
(every key lies after every query), j == i is causal (the same square chunk: its diagonal is the
chunk's own, whatever the chunk lengths), j < i is full (every key lies before every query).
Without a mask every pair is full. The pairs are then coalesced into as few calls as possible:
  - the rank's own shard (source == rank), causal: one causal call over the whole shard, because
    a shard is a run of increasing positions with sq == sk, so the local causal mask k <= q is
    exactly the global one (zigzag: chunk r's keys are full for chunk 2n-1-r, and the reverse
    pair is skipped, as the rule says);
  - otherwise (no pair is causal): consecutive query chunks that see the same key chunks share
    one call per contiguous run of those key chunks.
A zigzag rank thus makes one call per step: all queries against key chunk s (source s < rank)
or query chunk 2n-1-r against all keys (s > rank).
"""

import collections

from ._layout import chunk_sizes, n_chunks, rank_chunks

SKIP, CAUSAL, FULL = "skip", "causal", "full"

Block = collections.namedtuple("Block", "q0 q1 k0 k1 causal")
Block.__doc__ = ("One attention call: local query rows q0:q1 against local keys k0:k1 of the "
                 "source's shard, causal (bottom-right, here square) or not.")


def pair_kind(qc, kc, causal):
    """SKIP, CAUSAL or FULL for query chunk qc against key chunk kc (the rule above)."""
    if not causal or kc < qc:
        return FULL
    return CAUSAL if kc == qc else SKIP


def _local(seqlen, world_size, rank, layout):
    """[(chunk index, local start, length)] of rank's shard."""
    sizes = chunk_sizes(seqlen, n_chunks(world_size, layout))
    out, off = [], 0
    for c in rank_chunks(world_size, rank, layout):
        out.append((c, off, sizes[c]))
        off += sizes[c]
    return out


def blocks(seqlen, world_size, rank, source, causal, layout="zigzag"):
    """The calls of rank's queries against source's K/V shard: a list of Block (empty ones
    left out)."""
    qchunks = _local(seqlen, world_size, rank, layout)
    kchunks = _local(seqlen, world_size, source, layout)
    if source == rank:
        n = sum(c[2] for c in qchunks)
        return [Block(0, n, 0, n, causal)] if n else []
    groups = []  # [(q0, q1, visible key chunks)]
    for qc, q0, qn in qchunks:
        kinds = [pair_kind(qc, kc, causal) for kc, _, _ in kchunks]
        assert CAUSAL not in kinds  # distinct ranks hold distinct chunks
        seen = tuple(i for i, k in enumerate(kinds) if k == FULL and kchunks[i][2] > 0)
        if qn == 0 or not seen:
            continue
        if groups and groups[-1][1] == q0 and groups[-1][2] == seen:
            groups[-1] = (groups[-1][0], q0 + qn, seen)
        else:
            groups.append((q0, q0 + qn, seen))
    out = []
    for q0, q1, seen in groups:
        runs = []
        for i in seen:
            _, k0, kn = kchunks[i]
            if runs and runs[-1][1] == k0:
                runs[-1][1] = k0 + kn
            else:
                runs.append([k0, k0 + kn])
        out.extend(Block(q0, q1, k0, k1, False) for k0, k1 in runs)
    return out
