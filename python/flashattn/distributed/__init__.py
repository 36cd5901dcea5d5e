"""Context parallelism: attention over a sequence sharded across the ranks of a
torch.distributed process group (ring attention), and the shard layouts.

    from flashattn.distributed import context_parallel_attn, shard
    q_r = shard(q, world_size, rank)          # this rank's tokens (zigzag layout)
    out_r = context_parallel_attn(q_r, k_r, v_r, causal=True)

See python/README.md, "Context parallelism". Importing this module imports torch.
"""

from ._attn import context_parallel_attn
from ._layout import (LAYOUTS, chunk_sizes, rank_chunks, shard, shard_lengths, shard_positions,
                      split, unsplit, zigzag_split, zigzag_unsplit)
from ._schedule import CAUSAL, FULL, SKIP, Block, blocks, pair_kind
from ._gather import gather

__all__ = [
    "context_parallel_attn", "split", "unsplit", "zigzag_split", "zigzag_unsplit", "shard",
    "gather", "shard_lengths", "shard_positions", "chunk_sizes", "rank_chunks", "LAYOUTS",
    "blocks", "pair_kind", "Block", "SKIP", "CAUSAL", "FULL",
]
