#!/usr/bin/env python3
"""Times context-parallel attention over NCCL: flashattn.distributed.context_parallel_attn,
and PyTorch's torch.distributed.tensor.experimental.context_parallel (ring SDPA) as the peer,
on the same shapes, forward and forward + backward, with the 1-GPU time of the whole sequence
as the baseline of the scaling efficiency.

    torchrun --nproc-per-node 8 bench/cp_bench.py                 # 128k tokens, 32/8 heads, d 128
    torchrun --nproc-per-node 4 bench/cp_bench.py --json cp4.json
    python3 bench/cp_bench.py --help

Method: standard normal bf16 inputs, the whole sequence made on every rank from one seed and
cut with flashattn.distributed.shard (zigzag by default); warm-up calls, then each timed call
between CUDA events after a barrier; per rank the median, and the slowest rank's median as the
step time (a ring step waits for its slowest member). FLOPs: 4·B·H·S²·d (half when causal),
backward 2.5x the forward. Scaling efficiency = T(1 GPU, whole sequence) / (n · T(n GPUs)),
T(1) being flash_attn_func on rank 0 alone over the whole sequence (--no-baseline skips it;
it needs the whole sequence's activations on one GPU). The peer runs SDPA inside
context_parallel with k/v repeated to the query heads (its ring path is not documented for
enable_gqa), sharded by its own load balancer, so it moves 4x the K/V bytes of a GQA 32/8 ring:
the table says so next to its numbers.

Written before any GPU run: only `--help` and a syntax check have run (on a CPU machine).
"""
import argparse
import json
import os
import statistics
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=131072, help="whole sequence length (131072)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-k", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="full attention")
    p.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    p.add_argument("--ops", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both (default)")
    p.add_argument("--impls", default="flashattn,torch",
                   help="flashattn and/or torch (PyTorch's context_parallel)")
    p.add_argument("--torch-rotate", choices=("allgather", "alltoall"), default="alltoall",
                   help="the peer's K/V exchange (alltoall: its ring)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the 1-GPU whole-sequence time")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", help="write the results (rank 0) to this file")
    return p.parse_args(argv)


def flops(a, op):
    f = 4.0 * a.batch * a.heads * a.tokens * a.tokens * a.head_dim
    f *= 0.5 if a.causal else 1.0
    return f * (3.5 if op == "fwd+bwd" else 1.0)


class Timer:
    """Median of CUDA-event times of fn() on this rank, each call after a barrier."""

    def __init__(self, torch, dist, a):
        self.torch, self.dist, self.a = torch, dist, a

    def __call__(self, fn, group_wide=True):
        torch, dist = self.torch, self.dist
        for _ in range(self.a.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.a.reps):
            if group_wide:
                dist.barrier()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def slowest(self, ms):
        t = self.torch.tensor([ms], dtype=self.torch.float64, device="cuda")
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())


def inputs(torch, a, dtype):
    g = torch.Generator(device="cuda").manual_seed(1234)
    shape_q = (a.batch, a.tokens, a.heads, a.head_dim)
    shape_k = (a.batch, a.tokens, a.heads_k, a.head_dim)
    mk = lambda s: torch.randn(s, generator=g, device="cuda", dtype=dtype)  # noqa: E731
    return mk(shape_q), mk(shape_k), mk(shape_k), mk(shape_q)


def step(torch, fn, q, k, v, dout, op):
    """One timed call: the forward (inputs requiring grad, as in training) or forward and
    backward."""
    def run():
        if op == "fwd":
            fn(q, k, v)
        else:
            torch.autograd.backward(fn(q, k, v), dout)
    return run


def bench_flashattn(torch, dist, a, timer, full, op):
    from flashattn.distributed import context_parallel_attn, shard
    n, r = dist.get_world_size(), dist.get_rank()
    q, k, v, dout = (shard(x, n, r, a.layout).contiguous() for x in full)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def fn(q, k, v):
        return context_parallel_attn(q, k, v, causal=a.causal, layout=a.layout, seqlen=a.tokens)
    return timer.slowest(timer(step(torch, fn, q, k, v, dout, op)))


def bench_torch(torch, dist, a, timer, full, op):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    import torch.nn.functional as F
    set_rotate_method(a.torch_rotate)
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    rep = a.heads // a.heads_k
    # SDPA layout (batch, heads, seq, d); k/v repeated to the query heads (see the docstring)
    q, k, v, dout = (x.transpose(1, 2) for x in full)
    k, v = (x.repeat_interleave(rep, dim=1) for x in (k, v))
    bufs = [x.contiguous() for x in (q, k, v, dout)]
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2]):
        q, k, v = (x.detach().requires_grad_() for x in bufs[:3])

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
        ms = timer(step(torch, fn, q, k, v, bufs[3], op))
    return timer.slowest(ms)


def bench_single(torch, dist, a, timer, full, op):
    """flash_attn_func on the whole sequence, rank 0 alone (the others wait)."""
    from flashattn import flash_attn_func
    ms = 0.0
    if dist.get_rank() == 0:
        q, k, v = (x.detach().requires_grad_() for x in full[:3])

        def fn(q, k, v):
            return flash_attn_func(q, k, v, causal=a.causal)
        ms = timer(step(torch, fn, q, k, v, full[3], op), group_wide=False)
    dist.barrier()
    return timer.slowest(ms)


def main(argv=None):
    a = parse_args(argv)
    import torch
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n, rank = dist.get_world_size(), dist.get_rank()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    full = inputs(torch, a, dtype)
    timer = Timer(torch, dist, a)
    impls = {"flashattn": bench_flashattn, "torch": bench_torch}
    rows = []
    for op in a.ops.split(","):
        base = bench_single(torch, dist, a, timer, full, op) if a.baseline else None
        for name in a.impls.split(","):
            try:
                ms = impls[name](torch, dist, a, timer, full, op)
            except Exception as e:  # the peer is experimental: report, go on
                if rank == 0:
                    print(f"{name} {op}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            row = dict(impl=name, op=op, gpus=n, ms=ms,
                       tflops_per_gpu=flops(a, op) / n / (ms * 1e-3) / 1e12,
                       single_gpu_ms=base,
                       efficiency=(base / (n * ms)) if base else None)
            rows.append(row)
            if rank == 0:
                eff = f"{row['efficiency']:.2f}" if base else "-"
                note = " (k/v repeated to 32 heads)" if name == "torch" else ""
                print(f"{name:9s} {op:8s} {n} GPUs: {ms:9.2f} ms  "
                      f"{row['tflops_per_gpu']:6.1f} TFLOP/s per GPU  "
                      f"1 GPU {base if base else float('nan'):9.2f} ms  efficiency {eff}{note}",
                      flush=True)
    if rank == 0 and a.json:
        meta = {k: getattr(a, k) for k in ("tokens", "batch", "heads", "heads_k", "head_dim",
                                           "dtype", "causal", "layout", "torch_rotate")}
        meta.update(torch=torch.__version__, device=torch.cuda.get_device_name())
        with open(a.json, "w") as f:
            json.dump({"config": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
