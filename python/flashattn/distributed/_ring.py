"""The ring of a process group: each rank sends to the next and receives from the previous,
with torch.distributed's batched point-to-point ops (isend/irecv through batch_isend_irecv,
which NCCL runs as one group call and gloo as plain asynchronous sends and receives)."""

import torch
import torch.distributed as dist

# Tags of the two kinds of message that may be in flight between the same pair of ranks at
# once (a K/V shard and a dK/dV sum): gloo matches a receive by (peer, tag); NCCL ignores tags
# and matches by order, which is the same on every rank.
TAG_KV, TAG_DKV = 17, 18


class Ring:
    def __init__(self, group):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("context parallel attention needs an initialised torch.distributed "
                               "process group (torch.distributed.init_process_group)")
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = self._global((self.rank + 1) % self.size)
        self.prev = self._global((self.rank - 1) % self.size)

    def _global(self, r):
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def shift(self, send, recv, tag):
        """Posts send -> next rank and recv <- previous rank; returns the works to wait on.
        NCCL: the transfer runs on NCCL's own stream, which first waits for what the current
        stream has queued so far (so send may be what the last kernel wrote, and recv what
        it read); the host returns at once. Post it before the compute it should overlap."""
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        return dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works):
        """NCCL: the current stream waits for the transfers (the host does not, unless
        TORCH_NCCL_BLOCKING_WAIT is set); gloo: the host waits. Call it just before the
        received buffer is read."""
        for w in works:
            w.wait()

    def lengths(self, n, device):
        """Every rank's n (one all_gather of an int64)."""
        mine = torch.tensor([n], dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(every, mine, group=self.group)
        return [int(x.item()) for x in every]
