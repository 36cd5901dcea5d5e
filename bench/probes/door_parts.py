#!/usr/bin/env python3
"""door_parts.py — where a small forward's host time goes through the Python package: the
issue time per call (N back-to-back calls, GPU idle at the start, median of R loops) of
flash_attn_func, of the extension's fwd with and without a preallocated output, and of the
torch pieces a call uses (new_empty, the current-stream query, the caching allocator's raw
alloc/delete, tensor attribute reads), beside SDPA flash and cuDNN. Lab probe for the
PyTorch door (docs/perf/python_door.md); needs a CUDA GPU and the installed package."""
import statistics
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn import _native, flash_attn_func

N, R = 50, 21
dev = torch.device("cuda", 0)
q, k, v = (torch.randn(1, 128, 16, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
out = torch.empty_like(q)
ext = _native.ext
print("binding:", flashattn.binding(), "| torch", torch.__version__, "|",
      torch.cuda.get_device_name(0))


def host(fn):
    ts = []
    for r in range(R + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        t1 = time.perf_counter()
        if r >= 3:
            ts.append((t1 - t0) / N * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def sdpa(backend):
    from torch.nn.attention import sdpa_kernel
    def f():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return f


raw_stream = torch._C._cuda_getCurrentRawStream
alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
delete = torch._C._cuda_cudaCachingAllocator_raw_delete
stream = raw_stream(0)
args = (None, None, False, None, True, (-1, -1), 0.0, None, None, None, None, None, False)
parts = [
    ("flash_attn_func(q, k, v, causal=True)", lambda: flash_attn_func(q, k, v, causal=True)),
    ("_ext.fwd, out allocated by it", lambda: ext.fwd(q, k, v, *args)),
    ("_ext.fwd, out given", lambda: ext.fwd(q, k, v, out, *args[1:])),
    ("q.new_empty(shape)", lambda: q.new_empty((1, 128, 16, 64))),
    ("torch.empty_like(q)", lambda: torch.empty_like(q)),
    ("current raw stream", lambda: raw_stream(0)),
    ("raw_alloc + raw_delete (4 KiB)", lambda: delete(alloc(4096, stream))),
    ("q.data_ptr(), q.stride(), q.shape, q.dtype, q.is_cuda, q.get_device()",
     lambda: (q.data_ptr(), q.stride(), q.shape, q.dtype, q.is_cuda, q.get_device())),
    ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
    ("SDPA (default backend choice)", lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)),
]
from torch.nn.attention import SDPBackend
parts += [("SDPA flash (inside sdpa_kernel)", sdpa(SDPBackend.FLASH_ATTENTION)),
          ("SDPA cuDNN (inside sdpa_kernel)", sdpa(SDPBackend.CUDNN_ATTENTION)),
          ("sdpa_kernel(FLASH) context alone", lambda: sdpa_kernel_only())]
from torch.nn.attention import sdpa_kernel


def sdpa_kernel_only():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        pass


for name, fn in parts:
    fn()
    print("door_parts: %-72s %7.2f us/call" % (name, host(fn)))
print("door_parts: %-72s %7.2f us/call" % ("flash_attn_func again (noise check)",
                                         host(lambda: flash_attn_func(q, k, v, causal=True))))
print("last selection:", flashattn.last_selection())

# Decode (batch 1, 8k cache, GQA 32/8, d 128): the host time per call for loops of 10, 50 and
# 150 calls (a per-call time that grows with the loop means the host waited for the GPU), and
# the extension's fwd_kvcache without the Python wrapper.
kc, vc = (torch.randn(1, 8192, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
qd = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
seqlens = torch.full((1,), 8192, device=dev, dtype=torch.int32)
kv_args = (None, None, seqlens, None, None, None, False, None, False, (-1, -1), 0.0, None, 0)
for n in (10, 50, 150):
    N = n
    print("door_parts: %-72s %7.2f us/call" % (
        "flash_attn_with_kvcache, loop of %d" % n,
        host(lambda: flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens))))
    print("door_parts: %-72s %7.2f us/call" % (
        "_ext.fwd_kvcache, loop of %d" % n, host(lambda: ext.fwd_kvcache(qd, kc, vc, *kv_args))))
print("last selection:", flashattn.last_selection())
