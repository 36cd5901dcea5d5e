"""gather: the whole sequence from every rank's shard, on every rank (an all_gather)."""

import torch
import torch.distributed as dist

from . import _layout


def gather(x, group=None, layout="zigzag", dim=1):
    """Every rank's shard of x (this rank's along dim) put back in sequence order. Shards may
    differ by a token (the remainder rule): each is padded to the longest for the all_gather
    (collectives move equal sizes), then trimmed."""
    dim = dim % x.ndim
    n = dist.get_world_size(group)
    mine = torch.tensor([x.shape[dim]], dtype=torch.int64, device=x.device)
    lens = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(lens, mine, group=group)
    lens = [int(t.item()) for t in lens]
    longest = max(lens)
    pad = list(x.shape)
    pad[dim] = longest - x.shape[dim]
    xp = torch.cat([x, x.new_zeros(pad)], dim).contiguous()
    parts = [torch.empty_like(xp) for _ in range(n)]
    dist.all_gather(parts, xp, group=group)
    return _layout.unsplit([p.narrow(dim, 0, m) for p, m in zip(parts, lens)], layout, dim)
