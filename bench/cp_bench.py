#!/usr/bin/env python3
"""Times context-parallel attention over NCCL: flashattn.distributed.context_parallel_attn,
and PyTorch's torch.distributed.tensor.experimental.context_parallel (ring SDPA) as the peer,
on the same shapes, forward and forward + backward, with the 1-GPU time of the whole sequence
as the baseline of the scaling efficiency.

    torchrun --nproc-per-node 2 bench/cp_bench.py --json cp.json --md cp.md   # 128k, 32/8, d 128
    torchrun --nproc-per-node 2 bench/cp_bench.py --device cpu --tokens 512 --heads 4 \\
        --heads-k 2 --head-dim 32 --reps 2 --warmup 1        # gloo on the CPU: a smoke run
    python3 bench/cp_bench.py --help

Method: standard normal inputs, the whole sequence made on every rank from one seed and cut
with flashattn.distributed.shard (zigzag by default); warm-up calls, then each timed call
between CUDA events (--device cpu: wall clock) after a barrier; per rank the median, and the
slowest rank's median as the step time (a ring step waits for its slowest member); every
rank's median is in the JSON. Forward calls take inputs that require grad (as in training);
forward + backward is torch.autograd.grad of the output with a fixed upstream gradient (no
.grad accumulation). FLOPs: 4·B·H·S²·d (half when causal), backward 2.5x the forward.
Scaling efficiency = T(1 GPU, whole sequence) / (n · T(n GPUs)), T(1) being flash_attn_func on
rank 0 alone over the whole sequence while the other ranks wait (--no-baseline skips it; it
needs the whole sequence's activations on one GPU).
Check (--no-check skips it): after the forward timings, every implementation's output on the
whole sequence is gathered and compared with the 1-GPU flash_attn_func output (max and mean
|difference|, in the table's notes).
The peer: SDPA inside context_parallel with k/v repeated to the query heads (its ring calls
the SDPA kernels without enable_gqa), sharded by its own head-tail load balancer (the zigzag
layout), so it moves 4x the K/V bytes of a GQA 32/8 ring; --impls torch:<rotate>[:<sdpa>]
picks its K/V exchange (alltoall: the ring; allgather: its default, one all-gather) and SDPA
backend (auto, flash, efficient, cudnn).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

# The device rules: no NVLink SHARP / multicast, set before anything starts NCCL.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--tokens", type=int, default=131072, help="whole sequence length (131072)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-k", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="full attention")
    p.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    p.add_argument("--ops", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both (default)")
    p.add_argument("--impls", default="flashattn,torch:alltoall,torch:allgather",
                   help="comma-separated: flashattn, torch:<alltoall|allgather>[:<" +
                   "|".join(SDPA_BACKENDS) + ">] (PyTorch's context_parallel)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the 1-GPU whole-sequence time")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip comparing each output with the 1-GPU output")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: gloo and wall-clock times, to try the code paths on a machine "
                   "without GPUs (use small --tokens)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", help="write the results (rank 0) to this file, after every row")
    p.add_argument("--md", help="write the markdown table (rank 0) to this file, after every row")
    a = p.parse_args(argv)
    a.ops = a.ops.split(",")
    for op in a.ops:
        if op not in ("fwd", "fwd+bwd"):
            p.error(f"--ops: {op!r} is neither fwd nor fwd+bwd")
    a.impls = [parse_impl(p, s) for s in a.impls.split(",") if s]
    if a.heads % a.heads_k:
        p.error(f"--heads {a.heads} is not a multiple of --heads-k {a.heads_k}")
    return a


def parse_impl(p, spec):
    """'flashattn' or 'torch:<rotate>[:<sdpa backend>]' -> (name, rotate, sdpa)."""
    parts = spec.split(":")
    if parts == ["flashattn"]:
        return ("flashattn", None, None)
    if parts[0] == "torch" and 2 <= len(parts) <= 3 and parts[1] in ("alltoall", "allgather"):
        sdpa = parts[2] if len(parts) == 3 else "auto"
        if sdpa in SDPA_BACKENDS:
            return (spec, parts[1], sdpa)
    p.error(f"--impls: {spec!r} is not flashattn or torch:<alltoall|allgather>[:<sdpa>]")


def flops(a, op):
    f = 4.0 * a.batch * a.heads * a.tokens * a.tokens * a.head_dim
    f *= 0.5 if a.causal else 1.0
    return f * (3.5 if op == "fwd+bwd" else 1.0)


class Timer:
    """Median time of fn() on this rank, each call after a barrier (group_wide)."""

    def __init__(self, torch, dist, a):
        self.torch, self.dist, self.a = torch, dist, a
        self.cuda = a.device == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn, group_wide=True):
        torch, dist = self.torch, self.dist
        for _ in range(self.a.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.a.reps):
            if group_wide:
                dist.barrier()
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def per_rank(self, ms):
        """Every rank's ms, in rank order."""
        t = self.torch.tensor([ms], dtype=self.torch.float64, device=self.a.dev)
        every = [self.torch.empty_like(t) for _ in range(self.dist.get_world_size())]
        self.dist.all_gather(every, t)
        return [float(x.item()) for x in every]


def inputs(torch, a, dtype):
    g = torch.Generator(device=a.dev).manual_seed(1234)
    shape_q = (a.batch, a.tokens, a.heads, a.head_dim)
    shape_k = (a.batch, a.tokens, a.heads_k, a.head_dim)

    def mk(shape):
        return torch.randn(shape, generator=g, device=a.dev, dtype=torch.float32).to(dtype)
    return mk(shape_q), mk(shape_k), mk(shape_k), mk(shape_q)


def step(torch, fn, q, k, v, dout, op):
    """One timed call: the forward (inputs requiring grad, as in training) or forward and
    backward (autograd.grad: the gradients are returned, not accumulated into .grad)."""
    def run():
        out = fn(q, k, v)
        if op == "fwd+bwd":
            torch.autograd.grad(out, (q, k, v), dout)
    return run


def run_flashattn(torch, dist, a, full, body):
    """body(fn, q, k, v, dout, unshard) on this rank's shards; unshard(out) -> the whole
    sequence's out (BSHD)."""
    from flashattn.distributed import context_parallel_attn, gather, shard
    n, r = dist.get_world_size(), dist.get_rank()
    q, k, v, dout = (shard(x, n, r, a.layout).contiguous() for x in full)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def fn(q, k, v):
        return context_parallel_attn(q, k, v, causal=a.causal, layout=a.layout, seqlen=a.tokens)
    return body(fn, q, k, v, dout, lambda out: gather(out.detach(), layout=a.layout))


def run_torch(torch, dist, a, full, body, rotate, sdpa):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (context_parallel_unshard,
                                                                  set_rotate_method)
    import torch.nn.functional as F
    set_rotate_method(rotate)
    mesh = init_device_mesh(a.dev.type, (dist.get_world_size(),))
    rep = a.heads // a.heads_k
    # SDPA layout (batch, heads, seq, d); k/v repeated to the query heads (see the docstring)
    q, k, v, dout = (x.transpose(1, 2) for x in full)
    k, v = (x.repeat_interleave(rep, dim=1) for x in (k, v))
    bufs = [x.contiguous() for x in (q, k, v, dout)]
    kernel = None
    if sdpa != "auto":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kernel = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION}[sdpa]
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(bufs)):
        q, k, v = (x.detach().requires_grad_() for x in bufs[:3])

        def fn(q, k, v):
            if kernel is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
            with sdpa_kernel(kernel):
                return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)

        def unshard(out):
            whole = context_parallel_unshard(mesh, [out.detach()], [2])[0]
            return whole.transpose(1, 2)
        return body(fn, q, k, v, bufs[3], unshard)


class Bench:
    def __init__(self, torch, dist, a):
        self.torch, self.dist, self.a = torch, dist, a
        self.timer = Timer(torch, dist, a)
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.rows, self.notes, self.comm = [], [], []
        self.single_out = None

    def peak_reset(self):
        if self.a.device == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self):
        if self.a.device != "cuda":
            return None
        return self.torch.cuda.max_memory_allocated() / 2**30

    def single(self, full, op):
        """flash_attn_func on the whole sequence, rank 0 alone (the others wait); the output
        is kept on rank 0 for the checks."""
        from flashattn import flash_attn_func
        a, torch = self.a, self.torch
        ms = 0.0
        if self.rank == 0:
            q, k, v = (x.detach().requires_grad_() for x in full[:3])

            def fn(q, k, v):
                return flash_attn_func(q, k, v, causal=a.causal)
            ms = self.timer(step(torch, fn, q, k, v, full[3], op), group_wide=False)
            if a.check and self.single_out is None:
                with torch.no_grad():
                    self.single_out = fn(q, k, v).float()
        self.dist.barrier()
        return max(self.timer.per_rank(ms))

    def compare(self, whole):
        """max and mean |out - the 1-GPU out| on rank 0 (None without the baseline)."""
        if self.rank != 0 or self.single_out is None:
            return None
        d = (whole.float() - self.single_out).abs()
        return [float(d.max().item()), float(d.mean().item())]

    def measure(self, name, runner, full, op, base):
        a = self.a

        def body(fn, q, k, v, dout, unshard):
            self.peak_reset()
            ms = self.timer(step(self.torch, fn, q, k, v, dout, op))
            peak = self.peak_gib()
            diff = None
            if a.check and op == "fwd":
                try:  # a failed check costs the check, not the timing
                    with self.torch.no_grad():
                        diff = self.compare(unshard(fn(q, k, v)))
                except Exception as e:
                    self.fail(name, "check", e)
            return ms, peak, diff
        ms, peak, diff = runner(body)
        per_rank = self.timer.per_rank(ms)
        slow = max(per_rank)
        row = dict(impl=name, op=op, gpus=self.n, ms=slow, ms_per_rank=per_rank,
                   tflops_per_gpu=flops(a, op) / self.n / (slow * 1e-3) / 1e12,
                   single_gpu_ms=base, efficiency=(base / (self.n * slow)) if base else None,
                   peak_gib_rank=peak, max_abs_diff=diff[0] if diff else None,
                   mean_abs_diff=diff[1] if diff else None)
        self.add(row)

    def add(self, row):
        self.rows.append(row)
        if self.rank != 0:
            return
        eff = f"{row['efficiency']:.3f}" if row.get("efficiency") else "-"
        print(f"{row['impl']:22s} {row['op']:8s} {row['gpus']} GPUs: {row['ms']:9.2f} ms  "
              f"{row['tflops_per_gpu']:6.1f} TFLOP/s per GPU  efficiency {eff}", flush=True)
        self.write()

    def fail(self, name, op, e):
        msg = f"{name} {op}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.notes.append(msg)
        if self.rank == 0:
            print(msg, file=sys.stderr, flush=True)
            self.write()

    def meta(self):
        a, torch = self.a, self.torch
        m = {k: getattr(a, k) for k in ("tokens", "batch", "heads", "heads_k", "head_dim",
                                        "dtype", "causal", "layout", "warmup", "reps",
                                        "device")}
        m.update(torch=torch.__version__, gpus=self.n,
                 impls=[i[0] for i in a.impls], ops=a.ops,
                 card=torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                 nccl=nccl_version(torch) if a.device == "cuda" else None,
                 env={k: os.environ.get(k) for k in NCCL_ENV})
        return m

    def write(self):
        a = self.a
        if a.json:
            tmp = a.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"config": self.meta(), "rows": self.rows, "comm": self.comm,
                           "errors": self.notes}, f,
                          indent=1)
            os.replace(tmp, a.json)
        if a.md:
            with open(a.md, "w") as f:
                f.write(table(self.meta(), self.rows, self.notes, self.comm))


def time_hops(torch, dist, a, b, dtype):
    """One hop of the ring alone (send to the next rank, receive from the previous one, as
    context_parallel_attn posts it): the K/V message of the longest shard in the input dtype,
    and the dK/dV message of the backward in fp32; the slowest rank's median."""
    from flashattn.distributed import shard_lengths
    from flashattn.distributed._ring import TAG_DKV, TAG_KV, Ring
    ring = Ring(None)
    numel = a.batch * max(shard_lengths(a.tokens, ring.size, a.layout)) * a.heads_k * \
        a.head_dim * 2
    for what, dt, tag in (("K/V " + a.dtype, dtype, TAG_KV), ("dK/dV fp32", torch.float32,
                                                             TAG_DKV)):
        send = torch.zeros(numel, dtype=dt, device=a.dev)
        recv = torch.empty_like(send)
        ms = b.timer(lambda: ring.wait(ring.shift(send, recv, tag)))
        slow = max(b.timer.per_rank(ms))
        mb = numel * send.element_size() / 1e6
        b.comm.append(dict(what=what, mb=mb, ms=slow, gbps=mb / 1e3 / (slow * 1e-3)))
        del send, recv
    if b.rank == 0:
        b.write()


def nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # the table says so rather than failing the run
        return f"unknown ({type(e).__name__})"


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def table(m, rows, notes, comm=()):
    lines = [f"# Context-parallel attention: {m['gpus']} x {m['card']}", "",
             f"- shape: batch {m['batch']}, {m['tokens']} tokens, {m['heads']} query heads over "
             f"{m['heads_k']} kv heads, d {m['head_dim']}, {m['dtype']}, "
             f"{'causal' if m['causal'] else 'no mask'}, layout {m['layout']}",
             f"- torch {m['torch']}, NCCL {m['nccl']}; env {m['env']}",
             f"- timing: median of {m['reps']} calls after {m['warmup']} warm-up calls, each after "
             "a barrier, CUDA events per rank (--device cpu: wall clock); ms = the slowest "
             "rank's median; FLOPs 4·B·H·S²·d (half causal), fwd+bwd 3.5x; "
             "efficiency = T(1 GPU) / (n · T(n))",
             "- torch:<rotate>[:<sdpa>] = torch.distributed.tensor.experimental.context_parallel "
             "around SDPA, k/v repeated to the query heads (4x the K/V bytes of the GQA ring)",
             "- diff: max / mean |out - flash_attn_func(whole sequence) on 1 GPU|, forward",
             "- efficiency of every row is against flash_attn_func's 1-GPU time (the torch rows "
             "too: the peer's own 1-GPU SDPA time is not measured)", "",
             "| impl | op | GPUs | ms | ms per rank | TFLOP/s per GPU | 1-GPU ms | efficiency "
             "| peak GiB (rank 0) | diff max / mean |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        per = " / ".join(f"{x:.2f}" for x in r["ms_per_rank"])
        diff = "–" if r["max_abs_diff"] is None else \
            f"{r['max_abs_diff']:.3g} / {r['mean_abs_diff']:.3g}"
        lines.append(f"| {r['impl']} | {r['op']} | {r['gpus']} | {r['ms']:.2f} | {per} | "
                     f"{r['tflops_per_gpu']:.1f} | {fmt(r['single_gpu_ms'], '.2f')} | "
                     f"{fmt(r['efficiency'], '.3f')} | {fmt(r['peak_gib_rank'], '.1f')} | "
                     f"{diff} |")
    lines.append("")
    ours = {r["op"]: r["ms"] for r in rows if r["impl"] == "flashattn"}
    for r in rows:
        if r["impl"].startswith("torch") and r["op"] in ours:
            lines.append(f"- {r['op']}: {r['impl']} / flashattn time = "
                         f"{r['ms'] / ours[r['op']]:.2f}")
    for c in comm:
        lines.append(f"- one ring hop alone, {c['what']}: {c['mb']:.4g} MB per rank in "
                     f"{c['ms']:.2f} ms ({c['gbps']:.3g} GB/s each way), what the overlap hides")
    for e in notes:
        lines.append(f"- error: {e}")
    return "\n".join(lines) + "\n"


def init(torch, dist, a):
    """The process group: torchrun's environment, or one process alone (world size 1)."""
    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if a.device == "cuda":
        a.dev = torch.device("cuda", local)
        torch.cuda.set_device(a.dev)
        dist.init_process_group("nccl", device_id=a.dev)
    else:
        a.dev = torch.device("cpu")
        dist.init_process_group("gloo")


def main(argv=None):
    a = parse_args(argv)
    os.environ.update(NCCL_ENV)
    import torch
    import torch.distributed as dist
    init(torch, dist, a)
    b = Bench(torch, dist, a)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    full = inputs(torch, a, dtype)
    for x in full:  # every rank cuts its shard from the same whole sequence: rank 0's
        dist.broadcast(x, 0)
    runners = {}
    for name, rotate, sdpa in a.impls:
        if name == "flashattn":
            runners[name] = lambda body: run_flashattn(torch, dist, a, full, body)
        else:
            runners[name] = (lambda r, s: lambda body: run_torch(torch, dist, a, full, body, r, s))(
                rotate, sdpa)
    # ours (and the baselines) for every op first, then the peer: an experimental peer that
    # hangs or fails cannot cost our rows (each row is written to --json/--md at once)
    bases = {}
    ours = [i[0] for i in a.impls if i[0] == "flashattn"]
    peers = [i[0] for i in a.impls if i[0] != "flashattn"]
    for names in (ours, peers):
        for op in a.ops:
            if a.baseline and op not in bases:
                b.peak_reset()
                bases[op] = base = b.single(full, op)
                b.add(dict(impl="flash_attn_func (1 GPU, whole sequence)", op=op, gpus=1,
                           ms=base, ms_per_rank=[base],
                           tflops_per_gpu=flops(a, op) / (base * 1e-3) / 1e12,
                           single_gpu_ms=base, efficiency=1.0, peak_gib_rank=b.peak_gib(),
                           max_abs_diff=None, mean_abs_diff=None))
            for name in names:
                try:
                    b.measure(name, runners[name], full, op, bases.get(op))
                except Exception as e:  # the peer is experimental: report, go on
                    b.fail(name, op, e)
                dist.barrier()  # a rank that failed early waits here for the others
        if names is ours and b.n > 1:
            try:
                time_hops(torch, dist, a, b, dtype)
            except Exception as e:
                b.fail("ring hop", "alone", e)
            dist.barrier()
    if b.rank == 0:
        print()
        print(table(b.meta(), b.rows, b.notes, b.comm), flush=True)
    dist.destroy_process_group()
    return 1 if b.notes and not b.rows else 0


if __name__ == "__main__":
    sys.exit(main())
