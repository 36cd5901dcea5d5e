#!/usr/bin/env python3
"""decode_host.py — why the decode row's host time differs between a contiguous and a paged
cache (bench/results/h200/door.md at 072c124: 20.6 against 14.4 us a call). Issue time per call
of flash_attn_with_kvcache (batch 1, 8k cache, GQA 32/8, d 128, bf16) for loops of 150 calls
(GPU idle at the start, median of R loops), the first and second halves apart (a slower second
half: the host waited for the GPU), and the loop's device time between CUDA events, for:
the cache with and without room past the cached tokens, one input set against 8 rotated sets,
and the paged cache. Lab probe for the PyTorch door (docs/perf/python_door.md); needs a CUDA
GPU and the installed package."""
import statistics
import time

import torch

import flashattn
from flashattn import _native

N, R = 150, 9
dev = torch.device("cuda", 0)
B, L, H, HK, D, PS, SETS = 1, 8192, 32, 8, 128, 256, 8
print("binding:", flashattn.binding(), "| torch", torch.__version__, "|",
      torch.cuda.get_device_name(0))
seqlens = torch.full((B,), L, device=dev, dtype=torch.int32)


def host(fn):
    ts, first, second, total = [], [], [], []
    for r in range(R + 2):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        for i in range(N // 2):
            fn(i)
        tm = time.perf_counter()
        for i in range(N // 2, N):
            fn(i)
        t1 = time.perf_counter()
        e1.record()
        e1.synchronize()
        if r >= 2:
            ts.append((t1 - t0) / N * 1e6)
            first.append((tm - t0) / (N // 2) * 1e6)
            second.append((t1 - tm) / (N - N // 2) * 1e6)
            total.append(e0.elapsed_time(e1) * 1e3 / N)
    m = statistics.median
    return m(ts), m(first), m(second), m(total)


def bf16(*shape):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16)


qs = [bf16(B, 1, H, D) for _ in range(SETS)]
cases = {}
for room in (0, 256):
    ks = [bf16(B, L + room, HK, D) for _ in range(SETS)]
    vs = [bf16(B, L + room, HK, D) for _ in range(SETS)]
    cases["contiguous, room %d, one set" % room] = (
        lambda i, ks=ks, vs=vs: flashattn.flash_attn_with_kvcache(
            qs[0], ks[0], vs[0], cache_seqlens=seqlens))
    cases["contiguous, room %d, %d sets" % (room, SETS)] = (
        lambda i, ks=ks, vs=vs: flashattn.flash_attn_with_kvcache(
            qs[i % SETS], ks[i % SETS], vs[i % SETS], cache_seqlens=seqlens))
pages = L // PS
kp, vp = bf16(SETS * pages, PS, HK, D), bf16(SETS * pages, PS, HK, D)
tables = [(torch.randperm(pages) + s * pages).to(torch.int32).reshape(1, pages).to(dev)
          for s in range(SETS)]
cases["paged, %d sets" % SETS] = lambda i: flashattn.flash_attn_with_kvcache(
    qs[i % SETS], kp, vp, cache_seqlens=seqlens, block_table=tables[i % SETS])
kv_args = (None, None, seqlens, None, None, None, False, None, False, (-1, -1), 0.0, None, 0)
k0, v0 = bf16(B, L, HK, D), bf16(B, L, HK, D)
cases["_ext.fwd_kvcache, contiguous, one set"] = lambda i: _native.ext.fwd_kvcache(
    qs[0], k0, v0, *kv_args)

for name, fn in cases.items():
    fn(0)
    torch.cuda.synchronize()
    h, a, b, t = host(fn)
    print("decode_host: %-44s host %6.2f us/call (halves %6.2f / %6.2f), total %6.2f  %s" % (
        name, h, a, b, t, flashattn.last_selection().kernel))
