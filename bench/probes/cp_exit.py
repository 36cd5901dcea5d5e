#!/usr/bin/env python3
"""Where do NCCL ranks crash at the end? (2 x H200, 8c688b6: every rank of test_distributed's
NCCL world of 2 and of cp_bench.py ended with SIGSEGV after its work; bench/results/h200-x2/cp.md.)
Each mode adds one thing to the one before it; every phase prints a line before it starts, and
faulthandler prints the Python stack of a crash, so the last line names the phase:

    nccl   init (device_id), all_reduce, destroy_process_group, exit: no flashattn at all
    import + import flashattn (loads the extension and the library), nothing called
    fwd    + flash_attn_func forward on this rank's GPU
    bwd    + its backward (the autograd device thread runs our kernel)
    ring   + context_parallel_attn forward and backward over the group

bench/probes/cp_exit.sh runs every mode (after building and installing the package) with
bench/probes/segv_trace.c preloaded, which adds the native frames of a crash.
"""
import argparse
import atexit
import os
import sys

for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[k] = v  # the device rules: no multicast, whatever the caller's environment

MODES = ["nccl", "import", "fwd", "bwd", "ring"]


def say(rank, what):
    print(f"[rank {rank}] {what}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES, default="ring")
    ap.add_argument("--no-destroy", action="store_true",
                    help="exit without destroy_process_group (does the crash move?)")
    a = ap.parse_args()
    level = MODES.index(a.mode)
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    atexit.register(say, rank, "atexit handlers (interpreter shutting down)")
    say(rank, "init_process_group")
    dist.init_process_group("nccl", device_id=dev)
    x = torch.ones(4, device=dev)
    dist.all_reduce(x)
    say(rank, f"all_reduce gave {x[0].item()}")
    if level >= 1:
        import flashattn
        say(rank, f"imported flashattn from {flashattn.__file__}")
    if level >= 2:
        q, k, v = (torch.randn(1, 256, 8, 64, device=dev, dtype=torch.bfloat16,
                               requires_grad=level >= 3) for _ in range(3))
        o = flashattn.flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize()
        say(rank, f"forward ran: {flashattn.last_selection()}")
        if level >= 3:
            o.sum().backward()
            torch.cuda.synchronize()
            say(rank, "backward ran")
        if level >= 4:
            import flashattn.distributed as fd
            qs, ks, vs = (fd.shard(t.detach(), 2, rank).requires_grad_() for t in (q, k, v))
            out = fd.context_parallel_attn(qs, ks, vs, causal=True)
            out.sum().backward()
            torch.cuda.synchronize()
            say(rank, "ring forward and backward ran")
    dist.barrier()
    if not a.no_destroy:
        say(rank, "destroy_process_group")
        dist.destroy_process_group()
    say(rank, "leaving main")
    return 0


if __name__ == "__main__":
    sys.exit(main())
