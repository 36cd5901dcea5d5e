"""The body of one rank in test_distributed: gloo on the CPU or NCCL on the GPUs (one GPU per
rank, rank r on cuda:r), every case of the run in one process group (spawning costs seconds, a
case milliseconds). Each case's inputs come from the parent's file; each rank saves its shard
of out, lse, dq, dk, dv (fp32 tensors on the CPU, exact for every dtype tested) for the parent
to put together and check."""

import datetime
import os

# The device rules for NCCL: no NVLink SHARP / multicast (set before torch initialises NCCL;
# the parent sets them too, these cover a worker started some other way).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def _broken_schedule(schedule):
    """The causal schedule with every block full: the diagonal chunks lose their mask. The
    parent checks that its comparison catches it (a test that cannot fail proves nothing)."""
    real = schedule.blocks

    def blocks(*args, **kw):
        return [b._replace(causal=False) for b in real(*args, **kw)]
    return blocks


def _init(rank, world_size, workdir, backend):
    """The process group; returns the device of this rank's tensors."""
    import torch
    import torch.distributed as dist
    # a rank that hangs (a mismatched send/receive) fails the test instead of stalling it
    timeout = datetime.timedelta(seconds=60)
    init = f"file://{workdir}/store"
    if backend == "nccl":
        os.environ.update(NCCL_ENV)
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world_size,
                                timeout=timeout, device_id=device)
        return device
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size,
                            timeout=timeout)
    return torch.device("cpu")


def _single(torch, q, k, v, dout, causal):
    """flash_attn_func on the whole sequence on this device (world size 1 on a GPU: the parent
    compares it bit for bit with the ring of one rank there)."""
    import flashattn
    tq, tk, tv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o, lse, _ = flashattn.flash_attn_func(tq, tk, tv, causal=causal, return_attn_probs=True)
    o.backward(dout)
    return [t.detach().float().cpu() for t in (o, lse, tq.grad, tk.grad, tv.grad)]


def run(rank, world_size, workdir, cases, backend="gloo"):
    """cases: [(name, causal, layout, torch dtype name, broken, pass seqlen, halves)]; every
    rank passes seqlen or none does (None costs an all_gather, which all ranks must join).
    halves: the ranks form two groups (0 .. n/2-1 and n/2 .. n-1), each running the case on
    its own, so that group ranks differ from global ranks in the second."""
    import torch
    import torch.distributed as dist
    device = _init(rank, world_size, workdir, backend)
    import flashattn.distributed as fd
    half = world_size // 2
    # every rank creates every group, in the same order (torch.distributed's rule); only when
    # a case asks for them (on NCCL each group is a communicator to set up)
    groups = [dist.new_group(list(range(i * half, i * half + half))) for i in range(2)] \
        if world_size % 2 == 0 and any(c[6] for c in cases) else None
    from flashattn.distributed import _schedule
    real_blocks = _schedule.blocks
    results = {}
    for name, causal, layout, dtype, broken, give_seqlen, halves in cases:
        group, n, r = None, world_size, rank
        if halves:
            group, n, r = groups[rank // half], half, rank % half
        q, k, v, dout = (x.to(device=device, dtype=getattr(torch, dtype))
                         for x in torch.load(os.path.join(workdir, f"{name}.pt")))
        qs, ks, vs = (fd.shard(x, n, r, layout).requires_grad_() for x in (q, k, v))
        _schedule.blocks = _broken_schedule(_schedule) if broken else real_blocks
        out, lse = fd.context_parallel_attn(qs, ks, vs, group=group, causal=causal,
                                            layout=layout, return_lse=True,
                                            seqlen=q.shape[1] if give_seqlen else None)
        out.backward(fd.shard(dout, n, r, layout))
        results[name] = [t.detach().float().cpu() for t in (out, lse, qs.grad, ks.grad, vs.grad)]
        if world_size == 1 and device.type == "cuda" and not broken:
            results[name + "#single"] = _single(torch, q, k, v, dout, causal)
    _schedule.blocks = real_blocks
    torch.save(results, os.path.join(workdir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
