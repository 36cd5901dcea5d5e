"""How a sequence is cut into shards for context parallelism, and put back together.

A sequence of S tokens is cut into chunks along its sequence dimension; rank r of n holds:
  zigzag      chunks r and 2n-1-r of 2n chunks (so that, with a causal mask, every rank holds
              one early and one late chunk and does the same amount of work);
  contiguous  chunk r of n chunks.
Remainder rule: S = q * c + m (c chunks): chunks 0 .. m-1 get q + 1 tokens, the others q.
Shards therefore differ by at most one token, any S works (chunks may be empty when S < c),
and every shard is a run of increasing positions (the causal schedule relies on it).
"""

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout = {layout!r}: expected one of {', '.join(LAYOUTS)}")


def n_chunks(world_size, layout):
    check_layout(layout)
    return 2 * world_size if layout == "zigzag" else world_size


def chunk_sizes(seqlen, n):
    """Token counts of n chunks of seqlen tokens (the remainder rule above)."""
    q, m = divmod(int(seqlen), n)
    return [q + 1 if i < m else q for i in range(n)]


def rank_chunks(world_size, rank, layout):
    """Indices of the chunks rank holds, in the order its shard stores them."""
    check_layout(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0 .. {world_size - 1}")
    if layout == "zigzag":
        return (rank, 2 * world_size - 1 - rank)
    return (rank,)


def chunk_starts(sizes):
    starts, s = [], 0
    for n in sizes:
        starts.append(s)
        s += n
    return starts


def shard_spans(seqlen, world_size, rank, layout):
    """[(global start, length)] of rank's chunks, in shard order."""
    sizes = chunk_sizes(seqlen, n_chunks(world_size, layout))
    starts = chunk_starts(sizes)
    return [(starts[c], sizes[c]) for c in rank_chunks(world_size, rank, layout)]


def shard_lengths(seqlen, world_size, layout="zigzag"):
    """Tokens of every rank's shard."""
    return [sum(n for _, n in shard_spans(seqlen, world_size, r, layout))
            for r in range(world_size)]


def shard_positions(seqlen, world_size, rank, layout="zigzag"):
    """The global positions (token indices) rank holds, in shard order: a list of ints (e.g.
    torch.tensor(...) of it for rotary position ids)."""
    return [p for start, n in shard_spans(seqlen, world_size, rank, layout)
            for p in range(start, start + n)]


def _dim(x, dim):
    return dim % x.ndim


def split(x, world_size, layout="zigzag", dim=1):
    """The shards of x (the whole sequence along dim), one per rank: a list of tensors
    (contiguous copies for zigzag, views for contiguous)."""
    import torch
    dim = _dim(x, dim)
    seqlen = x.shape[dim]
    shards = []
    for r in range(world_size):
        parts = [x.narrow(dim, s, n) for s, n in shard_spans(seqlen, world_size, r, layout)]
        shards.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim))
    return shards


def unsplit(shards, layout="zigzag", dim=1):
    """The whole sequence from every rank's shard (the inverse of split)."""
    import torch
    world_size = len(shards)
    dim = _dim(shards[0], dim)
    seqlen = sum(s.shape[dim] for s in shards)
    lengths = shard_lengths(seqlen, world_size, layout)
    got = [s.shape[dim] for s in shards]
    if got != lengths:
        raise ValueError(f"shard lengths {got} along dim {dim} are not those of a {layout} "
                         f"split of {seqlen} tokens over {world_size} ranks ({lengths})")
    pieces = {}
    for r, x in enumerate(shards):
        off = 0
        for (start, n), c in zip(shard_spans(seqlen, world_size, r, layout),
                                 rank_chunks(world_size, r, layout)):
            pieces[c] = x.narrow(dim, off, n)
            off += n
    return torch.cat([pieces[c] for c in sorted(pieces)], dim)


def zigzag_split(x, world_size, dim=1):
    """split(x, world_size, "zigzag", dim): rank r gets chunks r and 2n-1-r of 2n."""
    return split(x, world_size, "zigzag", dim)


def zigzag_unsplit(shards, dim=1):
    """unsplit(shards, "zigzag", dim)."""
    return unsplit(shards, "zigzag", dim)


def shard(x, world_size, rank, layout="zigzag", dim=1):
    """Rank's shard of x alone (what split(...)[rank] holds)."""
    import torch
    dim = _dim(x, dim)
    parts = [x.narrow(dim, s, n) for s, n in shard_spans(x.shape[dim], world_size, rank, layout)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)
