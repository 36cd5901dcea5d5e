#!/usr/bin/env python3
"""The PyTorch door: what a PyTorch user pays per call for flashattn's Python functions, against
PyTorch SDPA restricted to its cuDNN and FlashAttention-2 ("flash") backends, on two shapes
where the per-call cost matters more than the kernel: a small causal forward and one decode
step against an 8k KV cache. Writes door.md (a table per row) and door.json, and prints the
markdown last.

Rows (--rows, comma list):
  small   forward, batch 1, 128 tokens, 16 heads, d 64, bf16, causal: flashattn.flash_attn_func
          on (batch, seq, heads, d) tensors against F.scaled_dot_product_attention(is_causal=True)
          on contiguous (batch, heads, seq, d) ones
  decode  batch 1, cache 8192 tokens, GQA 32 query heads over 8 kv heads, d 128, bf16, one new
          query token: flashattn.flash_attn_with_kvcache(q, k_cache, v_cache,
          cache_seqlens=<int32 CUDA tensor>) against SDPA(enable_gqa=True) on (1, 8, 8192, 128)
  paged   the decode row with a paged cache (pages of 256 tokens, block table a random
          permutation); SDPA has no paged cache: its figures are the decode row's
  append  the decode row with the new token's k/v appended by the call (cache_seqlens 8191 + 1);
          the peers append with index_copy_ into a static cache, then SDPA, as a PyTorch user
          would

Columns, per implementation:
  host   wall time of N back-to-back calls without synchronising, / N, started with the GPU
         idle (median of R repeats); N is small enough that the launch queue does not fill, so
         this is what the host spends per call (the thread's CPU time is in the JSON)
  total  the same loop between two CUDA events, one synchronise at the end, / N: what a loop
         of calls costs
  graph  K calls captured in one torch.cuda.CUDAGraph (warm-up on the side stream first),
         replays timed with events, / K; a capture that fails is recorded, not fatal
  kernel device time per call from the PyTorch profiler (CUPTI: every kernel, memset and copy
         the call ran), which also checks that the SDPA backend named really ran; for the C
         tool rows (`flashattn bench`, no Python), the tool's median of CUDA events per call

Inputs are standard normal; the decode caches rotate over enough sets to exceed 4x the L2 (a
1 x 8k cache is 32 MiB and would stay in a 50 MiB L2), so every call reads from HBM as in
serving. Every implementation's output is checked once against float32 math.

    python3 bench/torch_door.py --tool build-gpu/tools/flashattn --commit abc1234 --out /tmp/door
    python3 bench/torch_door.py --dry-run --out /tmp/door     # fake numbers: tests the tables
    python3 bench/torch_door.py --device cpu --rows small     # real calls on the CPU, no GPU

--binding ctypes sets FLASHATTN_BINDING=ctypes before flashattn is imported (the package's
switch to its ctypes path, where it honours it); the table says which binding ran.
"""
import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

# ---------------------------------------------------------------------------------------------
# The shapes and the labels of the rows, shared by the measurement and the dry run.

SMALL = dict(batch=1, seqlen=128, heads=16, head_dim=64, causal=True)
DECODE = dict(batch=1, cache_len=8192, heads=32, heads_kv=8, head_dim=128)

ROW_TITLES = {
    "small": "small forward: batch 1, 128 tokens, 16 heads, d 64, bf16, causal",
    "decode": "decode: batch 1, cache 8192 tokens, GQA 32/8 heads, d 128, bf16, 1 query token",
    "paged": "decode, paged cache (pages of 256 tokens in a random order), otherwise as decode",
    "append": "decode with append: the new token's k/v written into the cache by the call "
              "(8191 cached + 1), otherwise as decode",
}
ROW_ORDER = ("small", "decode", "paged", "append")

OURS_DEFAULT = "ours (defaults)"                     # the defaults of the flash_attn API
OURS_SYNC = "ours, device_checks=True"               # checks before the call, one sync
SDPA_CUDNN = "SDPA cuDNN"
SDPA_FLASH = "SDPA flash"


def first_line(e, limit=300):
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:limit]


def error_text(e, limit=600):
    """An exception and the one it replaced (torch.cuda.graph's exit raises its own error over
    the one that broke the capture; both say something)."""
    text = "%s: %s" % (type(e).__name__, str(e).strip())
    inner = e.__context__ or e.__cause__
    if inner is not None and inner is not e:
        text += " [during: %s: %s]" % (type(inner).__name__, str(inner).strip())
    return " ".join(text.split())[:limit]


def median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------
# Timing. Each function takes call(i), which runs one call on input set i (the implementation
# rotates the sets), and returns plain numbers in microseconds.

class Device:
    """What differs between a CUDA run and the CPU try-out: synchronisation and events."""

    def __init__(self, torch, name):
        self.torch = torch
        self.cuda = name == "cuda"
        self.name = name

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def events(self):
        if not self.cuda:
            return None, None
        E = self.torch.cuda.Event
        return E(enable_timing=True), E(enable_timing=True)


def time_loop(dev, call, n, repeats):
    """N back-to-back calls, R times. Per repeat: the GPU idle first (synchronised), then the
    host clock and the thread's CPU clock around the loop, with CUDA events recorded before
    and after it (one synchronise, at the end). The host time of the loop's halves is kept
    too: if the second half is much slower, the launch queue filled and the host waited on the
    GPU, so the host figure would not be host time."""
    host, cpu, total, first, second = [], [], [], [], []
    half = n // 2
    for _ in range(repeats):
        dev.sync()
        start, end = dev.events()
        if start is not None:
            start.record()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        for i in range(half):
            call(i)
        tm = time.perf_counter()
        for i in range(half, n):
            call(i)
        t1 = time.perf_counter()
        c1 = time.thread_time()
        if end is not None:
            end.record()
            end.synchronize()
            total.append(start.elapsed_time(end) * 1e3 / n)
        host.append((t1 - t0) * 1e6 / n)
        cpu.append((c1 - c0) * 1e6 / n)
        first.append((tm - t0) * 1e6 / half)
        second.append((t1 - tm) * 1e6 / (n - half))
    dev.sync()
    out = {"host_us": median(host), "host_cpu_us": median(cpu), "total_us": median(total),
           "host_first_half_us": median(first), "host_second_half_us": median(second),
           "host_us_all": host, "total_us_all": total, "calls": n, "repeats": repeats}
    # the second half slower by a third: the host waited for room in the launch queue (on
    # the CPU there is no queue: the calls run where they are made)
    out["queue_filled"] = dev.cuda and out["host_second_half_us"] > \
        1.33 * out["host_first_half_us"]
    return out


def time_graph(torch, call, k, replays, repeats, check):
    """K calls captured into one CUDA graph; replays between events, / (K * replays), median
    of R repeats. The warm-up runs on the capture's side stream first, as PyTorch's docs ask
    (libraries make per-stream state, workspaces, handles on first use). The captured output
    of the last call is poisoned before one replay and checked after it, so a graph that
    recorded no work (kernels launched outside the capture stream) is seen. Raises on a
    capture failure; the caller records it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs = []
    with torch.cuda.graph(graph, stream=side):
        for i in range(k):
            outs.append(call(i))
    last = outs[-1]
    last.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    checked = check(k - 1, last)
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (k * replays))
    del graph, outs, last
    return {"graph_us": median(times), "graph_us_all": times, "graph_calls": k,
            "graph_replays": replays, "graph_check": checked}


def profile_kernels(torch, call, m):
    """Device time per call over m calls, from the PyTorch profiler (CUPTI sees every kernel
    of the process, ours from libflashattn too), and the names with their count per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(m):
                call(i)
            torch.cuda.synchronize()
    total = 0.0
    names = {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        total += e.time_range.elapsed_us()
        names[e.name] = names.get(e.name, 0) + 1
    if not names:
        return {"kernel_us": None, "kernels": {},
                "kernel_error": "the profiler recorded no device activity (CUPTI unavailable?)"}
    return {"kernel_us": total / m, "kernels": {n: c / m for n, c in names.items()},
            "profiled_calls": m}


def backend_ran(kind, kernels):
    """Whether the profiled kernel names show the SDPA backend asked for: cuDNN's fused
    attention kernels are named cudnn_... / ...sdpa..., PyTorch's FlashAttention-2 kernels
    flash_fwd_... (pytorch_flash::)."""
    low = [n.lower() for n in kernels]
    cudnn = any("cudnn" in n or "sdpa" in n for n in low)
    flash = any("flash_fwd" in n or "pytorch_flash" in n for n in low)
    if kind == "sdpa-cudnn":
        return cudnn and not flash
    if kind == "sdpa-flash":
        return flash and not cudnn
    return None


# ---------------------------------------------------------------------------------------------
# The implementations of a row.

class Impl:
    """One implementation of a row: call(i) runs one call on input set i and returns its
    output; bshd(out) gives that output as (batch, seq, heads, d); context() is entered once
    around each phase (the sdpa_kernel restriction, or flashattn's options), never inside a
    timed loop."""

    def __init__(self, label, kind, call, bshd=None, context=None, syncs=False, notes=()):
        self.label, self.kind, self.call = label, kind, call
        self.bshd = bshd or (lambda out: out)
        self.context = context or contextlib.nullcontext
        self.syncs = syncs  # synchronises inside the call: expect its graph capture to fail
        self.res = {"impl": label, "kind": kind, "notes": list(notes)}


class Row:
    def __init__(self, key, shape, nsets, reference):
        self.key, self.shape, self.nsets = key, shape, nsets
        self.reference = reference  # reference(i): float32 BSHD output for input set i
        self.impls = []
        self.refs = {}

    def ref(self, i):
        i %= self.nsets
        if i not in self.refs:
            self.refs[i] = self.reference(i)
        return self.refs[i]

    def compare(self, i, out_bshd):
        """max |out - ref| and ||out - ref|| / ||ref|| against float32 math; bf16 operands
        land between 1e-3 and 1e-2 relative, NaN never passes."""
        ref = self.ref(i)
        d = out_bshd.float() - ref
        rel = (d.norm() / ref.norm()).item()
        mx = d.abs().max().item()
        ok = math.isfinite(rel) and rel < 2e-2
        return {"max_abs": mx, "rel": rel, "ok": ok}


def reference(torch, q, k, v, causal):
    """Attention in float32 on (batch, seq, heads, d) tensors, GQA by repeating k/v heads, the
    causal mask aligned bottom-right (flash_attn's rule; the same as top-left when square)."""
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    if kf.shape[1] != qf.shape[1]:
        rep = qf.shape[1] // kf.shape[1]
        kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = (qf @ kf.transpose(-1, -2)) * qf.shape[-1] ** -0.5
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        i = torch.arange(sq, device=s.device)[:, None]
        j = torch.arange(sk, device=s.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    return (torch.softmax(s, -1) @ vf).transpose(1, 2)


def sdpa_impls(torch, F, label_suffix, make_call, probe):
    """SDPA under its cuDNN and flash backends. make_call(expand) builds (call(i), notes), or
    (None, None) where there is nothing to expand (no GQA); probe(call) runs it once. A backend
    that refuses GQA (enable_gqa=True) is retried with k/v expanded to the query heads outside
    the timed region, and labelled so."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for kind, label, backend in (("sdpa-cudnn", SDPA_CUDNN, SDPBackend.CUDNN_ATTENTION),
                                 ("sdpa-flash", SDPA_FLASH, SDPBackend.FLASH_ATTENTION)):
        ctx = (lambda b=backend: sdpa_kernel([b]))
        impl = None
        reasons = []
        for expand in (False, True):
            call, notes = make_call(expand)
            if call is None:
                break
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with ctx():
                        probe(call)
                except RuntimeError as e:
                    why = first_line(e)
                    hints = [first_line(w.message) for w in caught
                             if "sdp" in str(w.message).lower()
                             or "kernel" in str(w.message).lower()]
                    if hints:
                        why += " (" + "; ".join(dict.fromkeys(hints))[:400] + ")"
                    reasons.append(("expanded k/v: " if expand else "") + why)
                    continue
            impl = Impl(label + label_suffix + (" (k/v expanded)" if expand else ""), kind,
                        call, bshd=lambda o: o.transpose(1, 2), context=ctx,
                        notes=notes + (["refused enable_gqa=True: " + reasons[0]] if expand
                                       else []))
            break
        if impl is None:
            impl = Impl(label + label_suffix, kind, None, context=ctx)
            impl.res["error"] = "refused: " + " | ".join(reasons) if reasons else "not run"
        out.append(impl)
    return out


def ours_options(fa, **opts):
    """flashattn.set_options(...) for the duration of a phase, the previous values restored
    (a previous device_checks None, the library's default, comes back as "default")."""
    @contextlib.contextmanager
    def ctx():
        old = fa.set_options(**opts)
        try:
            yield
        finally:
            fa.set_options(**{k: ("default" if k == "device_checks" and old[k] is None
                                  else old[k]) for k in opts})
    return ctx


def build_small(torch, F, fa, dev, args):
    s = SMALL
    dt = torch.bfloat16
    shape = (s["batch"], s["seqlen"], s["heads"], s["head_dim"])
    # One input set: 3 x 256 KiB stays in L2 anyway, and a small forward's inputs were just
    # written by the projection before it.
    q, k, v = (torch.randn(shape, device=dev.name, dtype=dt) for _ in range(3))
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    row = Row("small", dict(s, dtype="bf16", layout_ours="bshd", layout_sdpa="bhsd"), 1,
              lambda i: reference(torch, q, k, v, True))
    row.impls.append(Impl("ours: flash_attn_func", "ours",
                          lambda i: fa.flash_attn_func(q, k, v, causal=True)))

    def make_call(expand):
        if expand:
            return None, None  # no GQA here: nothing to expand
        return (lambda i: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)), []
    row.impls += sdpa_impls(torch, F, "", make_call, lambda c: c(0))
    return row


class DecodeData:
    """The decode inputs, one reference set of values seen three ways: ours' contiguous caches
    (1, 8192 + room, 8, 128) with cache_seqlens; a paged pool whose pages hold the same tokens
    under a shuffled block table; SDPA's contiguous (1, 8, 8192, 128) caches. Sets rotate, so
    that they exceed --rotate-bytes (4x the L2) together."""

    def __init__(self, torch, dev, args, l2_bytes):
        d = DECODE
        self.torch = torch
        b, n, h, hkv, hd = d["batch"], d["cache_len"], d["heads"], d["heads_kv"], d["head_dim"]
        dt = torch.bfloat16
        set_bytes = 2 * b * n * hkv * hd * 2
        rotate = args.rotate_bytes if args.rotate_bytes >= 0 else 4 * l2_bytes
        self.nsets = max(2, math.ceil(rotate / set_bytes)) if rotate > 0 else 1
        self.set_bytes = set_bytes
        room, ps = args.room, args.page_size
        self.pages = -(-n // ps)
        g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
        self.q, self.k, self.v, self.kh, self.vh = [], [], [], [], []
        self.k_new, self.v_new, self.tables = [], [], []
        self.k_pool = torch.randn((self.nsets * self.pages, ps, hkv, hd), device=dev.name,
                                  dtype=dt)
        self.v_pool = torch.randn_like(self.k_pool)
        for s in range(self.nsets):
            self.q.append(torch.randn((b, 1, h, hd), device=dev.name, dtype=dt))
            # the room past the cached tokens holds random values too (never zeros)
            k = torch.randn((b, n + room, hkv, hd), device=dev.name, dtype=dt)
            v = torch.randn_like(k)
            self.k.append(k)
            self.v.append(v)
            self.kh.append(k[:, :n].transpose(1, 2).contiguous())
            self.vh.append(v[:, :n].transpose(1, 2).contiguous())
            # append: the new token is the cache's last one, so writing it leaves the cache as
            # it was and every call of every variant computes the same attention
            self.k_new.append(k[:, n - 1:n].clone())
            self.v_new.append(v[:, n - 1:n].clone())
            # paged: this set's pages of the pool in a random order; page j of the sequence
            # holds tokens j*ps .. (j+1)*ps-1 of the contiguous cache
            perm = torch.randperm(self.pages, generator=g) + s * self.pages
            table = perm.to(torch.int32).reshape(1, self.pages).to(dev.name)
            kp = torch.zeros((self.pages * ps, hkv, hd), device=dev.name, dtype=dt)
            vp = torch.zeros_like(kp)
            kp[:n] = k[0, :n]
            vp[:n] = v[0, :n]
            if self.pages * ps > n:  # a last page partly beyond the cache: random, not zeros
                kp[n:].normal_()
                vp[n:].normal_()
            self.k_pool[perm.to(dev.name)] = kp.view(self.pages, ps, hkv, hd)
            self.v_pool[perm.to(dev.name)] = vp.view(self.pages, ps, hkv, hd)
            self.tables.append(table)
        self.seqlens = torch.full((b,), n, device=dev.name, dtype=torch.int32)
        self.seqlens_append = torch.full((b,), n - 1, device=dev.name, dtype=torch.int32)
        self.pos = torch.tensor([n - 1], device=dev.name, dtype=torch.long)
        self.expanded = None
        dev.sync()

    def ref(self, i):
        n = DECODE["cache_len"]
        return reference(self.torch, self.q[i], self.k[i][:, :n], self.v[i][:, :n], True)

    def expand(self):
        """SDPA's caches with k/v repeated to the query heads (for a backend that refuses
        enable_gqa), made once, outside any timed region."""
        if self.expanded is None:
            rep = DECODE["heads"] // DECODE["heads_kv"]
            self.expanded = ([k.repeat_interleave(rep, 1) for k in self.kh],
                             [v.repeat_interleave(rep, 1) for v in self.vh])
        return self.expanded

    def qh(self, i):
        return self.q[i].transpose(1, 2)  # (1, 32, 1, 128): one token, so contiguous anyway


def build_decode(torch, F, fa, dev, args, data, key):
    n = data.nsets
    shape = dict(DECODE, dtype="bf16", page_size=args.page_size if key == "paged" else 0,
                 room=args.room, sets=n, set_bytes=data.set_bytes)
    row = Row(key, shape, n, data.ref)
    sync = ours_options(fa, device_checks=True)

    if key == "decode":
        def ours(i):
            i %= n
            return fa.flash_attn_with_kvcache(data.q[i], data.k[i], data.v[i],
                                              cache_seqlens=data.seqlens)
    elif key == "paged":
        def ours(i):
            i %= n
            return fa.flash_attn_with_kvcache(data.q[i], data.k_pool, data.v_pool,
                                              cache_seqlens=data.seqlens,
                                              block_table=data.tables[i])
    else:  # append
        def ours(i):
            i %= n
            return fa.flash_attn_with_kvcache(data.q[i], data.k[i], data.v[i], k=data.k_new[i],
                                              v=data.v_new[i],
                                              cache_seqlens=data.seqlens_append)
    # The defaults: no set_options call. With the extension the kernels check
    # cache_seqlens/block_table as they read them (no synchronisation); the sync variant below
    # checks before the call and waits (set_options(device_checks=True)).
    row.impls.append(Impl(OURS_DEFAULT, "ours", ours, context=ours_options(fa),
                          notes=["library defaults"] if dev.cuda else []))
    row.impls.append(Impl(OURS_SYNC, "ours", ours, context=sync, syncs=dev.cuda))

    if key == "paged":
        return row  # SDPA has no paged cache: the decode row's peers stand for it

    def make_call(expand):
        if expand:
            ks, vs = data.expand()
            gqa = {}
            notes = ["k/v repeated to %d heads outside the timed region" % DECODE["heads"]]
        else:
            ks, vs = data.kh, data.vh
            gqa = {"enable_gqa": True}
            notes = []
        # no mask: one query row aligned bottom-right sees every key, and SDPA's is_causal
        # aligns top-left (it would see key 0 only)
        if key == "decode":
            def call(i):
                i %= n
                return F.scaled_dot_product_attention(data.qh(i), ks[i], vs[i], **gqa)
        else:
            khn = [x.transpose(1, 2) for x in data.k_new]  # (1, 8, 1, 128) views
            vhn = [x.transpose(1, 2) for x in data.v_new]
            if expand:
                rep = DECODE["heads"] // DECODE["heads_kv"]
                khn = [x.repeat_interleave(rep, 1) for x in khn]
                vhn = [x.repeat_interleave(rep, 1) for x in vhn]

            def call(i):
                i %= n
                ks[i].index_copy_(2, data.pos, khn[i])
                vs[i].index_copy_(2, data.pos, vhn[i])
                return F.scaled_dot_product_attention(data.qh(i), ks[i], vs[i], **gqa)
            notes = notes + ["k/v written with index_copy_ (2 launches) before SDPA"]
        return call, notes
    suffix = " + index_copy_" if key == "append" else ""
    row.impls += sdpa_impls(torch, F, suffix, make_call, lambda c: c(0))
    return row


# ---------------------------------------------------------------------------------------------
# `flashattn bench`, the C tool: the same shapes without Python.

def run_tool(args, argv, label):
    """Runs the tool with --json into a temporary file; returns a record with its rows."""
    rec = {"label": label, "command": " ".join(shlex.quote(a) for a in [args.tool] + argv)}
    if not os.path.isfile(args.tool) or not os.access(args.tool, os.X_OK):
        rec["error"] = "no executable tool at %s (--tool)" % args.tool
        rec["seconds"] = 0.0
        return rec
    fd, path = tempfile.mkstemp(suffix=".json", prefix="door-tool-")
    os.close(fd)
    t0 = time.time()
    try:
        p = subprocess.run([args.tool] + argv + ["--json", path], capture_output=True,
                           text=True, timeout=args.tool_timeout)
        rec["rc"] = p.returncode
        rec["output_tail"] = (p.stdout + p.stderr)[-1500:]
        with open(path) as f:
            doc = json.load(f)
        rec["rows"] = doc.get("rows", [])
        rec["machine"] = doc.get("machine", {})
        if doc.get("error"):
            rec["error"] = doc["error"]
        elif p.returncode != 0:
            rec["error"] = "exit %d" % p.returncode
    except subprocess.TimeoutExpired:
        rec["error"] = "timed out after %d s" % args.tool_timeout
    except (OSError, ValueError) as e:
        rec["error"] = "%s (exit %s)" % (first_line(e), rec.get("rc"))
    finally:
        rec["seconds"] = round(time.time() - t0, 1)
        try:
            os.remove(path)
        except OSError:
            pass
    return rec


def tool_runs(args):
    backend = "cuda" if args.device == "cuda" else "cpu"
    runs = {}
    wanted = set(args.rows)
    if "small" in wanted:
        s = SMALL
        # --rotate 0: one input set, as this script's small row
        runs["fwd"] = run_tool(args, ["bench", "--backend", backend, "--batch", str(s["batch"]),
                                      "--heads", str(s["heads"]), "--head-dim",
                                      str(s["head_dim"]), "--seqlens", str(s["seqlen"]),
                                      "--dtype", "bf16", "--causal", "--op", "fwd",
                                      "--no-peak", "--rotate", "0"], "forward")
    if wanted & {"decode", "paged"}:
        d = DECODE
        # --checks both: synchronous checks (on) and the in-kernel ones (off); the caches rotate
        # over 4x the L2, the tool's default, as here
        runs["decode"] = run_tool(args, ["bench", "--backend", backend, "--decode",
                                         "--batches", str(d["batch"]), "--cache-lens",
                                         str(d["cache_len"]), "--heads", str(d["heads"]),
                                         "--heads-kv", str(d["heads_kv"]), "--head-dim",
                                         str(d["head_dim"]), "--dtype", "bf16",
                                         "--page-size", str(args.page_size),
                                         "--checks", "both"], "decode")
    return runs


def tool_results(runs, key):
    """The C tool's rows of one table row, as result records (µs)."""
    out = []
    if key == "small" and "fwd" in runs:
        rec = runs["fwd"]
        rows = [r for r in rec.get("rows", []) if r.get("op") == "fwd"]
        res = {"impl": "C tool: flashattn bench", "kind": "tool", "command": rec["command"],
               "notes": ["C API, no Python; kernel: median of CUDA events around each call; "
                         "total: span of those calls / count"]}
        if rows and rows[0].get("status") == "ok":
            r = rows[0]
            res.update(kernel_us=r["median_s"] * 1e6, total_us=r["span_mean_s"] * 1e6,
                       kernel_name=r.get("kernel"))
        else:
            res["error"] = (rows[0].get("error") if rows else None) or rec.get("error") or \
                "no row"
        out.append(res)
    if key in ("decode", "paged") and "decode" in runs:
        rec = runs["decode"]
        cache = "paged" if key == "paged" else "contiguous"
        for checks in (True, False):
            res = {"impl": "C tool, %s checks" % ("sync" if checks else "in-kernel"),
                   "kind": "tool", "command": rec["command"],
                   "notes": ["C API, no Python; host: the C loop's issue time per call; "
                             "kernel: median of CUDA events around each call"]}
            rows = [r for r in rec.get("rows", []) if r.get("cache") == cache
                    and bool(r.get("device_checks")) == checks]
            if rows and rows[0].get("status") == "ok":
                r = rows[0]
                res.update(host_us=r["host_loop_s"] * 1e6, total_us=r["loop_s"] * 1e6,
                           kernel_us=r["median_s"] * 1e6, kernel_name=r.get("kernel"),
                           num_splits=r.get("num_splits"))
            else:
                res["error"] = (rows[0].get("error") if rows else None) or \
                    rec.get("error") or "no row"
            out.append(res)
    return out


# ---------------------------------------------------------------------------------------------
# The run.

def measure_impl(torch, fa, dev, args, row, impl):
    """Phase 1 of an implementation: check against the reference, warm up, the host/total
    loop. Graphs and the profiler come later, for every implementation at once."""
    res = impl.res
    if impl.kind == "ours" and isinstance(fa, Exception):
        res["error"] = "flashattn could not be imported: " + first_line(fa)
    if impl.call is None or "error" in res:
        return
    try:
        with impl.context():
            out = impl.call(0)
            dev.sync()
            res["check"] = row.compare(0, impl.bshd(out))
            if impl.kind == "ours":
                sel = fa.last_selection()
                res["kernel_name"] = sel.kernel if sel else None
                res["num_splits"] = sel.num_splits if sel else None
            for i in range(args.warmup):
                impl.call(i)
            dev.sync()
            res.update(time_loop(dev, impl.call, args.calls, args.repeats))
    except Exception as e:  # a broken path is a result, not the end of the run
        res["error"] = error_text(e)
    c = res.get("check", {})
    print("  %-40s host %8s  total %8s  check max|d| %s rel %s%s" % (
        impl.label, fmt(res.get("host_us")), fmt(res.get("total_us")),
        "%.2e" % c["max_abs"] if c else "-", "%.2e" % c["rel"] if c else "-",
        "  ERROR " + res["error"] if "error" in res else ""), flush=True)


def graph_impl(torch, args, row, impl):
    res = impl.res
    if impl.call is None or "error" in res:
        return
    try:
        with impl.context():
            res.update(time_graph(torch, impl.call, args.graph_calls, args.graph_replays,
                                  args.repeats,
                                  lambda i, out: row.compare(i, impl.bshd(out))))
    except Exception as e:
        res["graph_error"] = error_text(e)
        try:  # is CUDA still usable after the failed capture?
            torch.cuda.synchronize()
        except Exception as e2:
            res["graph_error"] += " [afterwards: %s]" % first_line(e2)
    print("  %-40s graph %8s%s" % (impl.label, fmt(res.get("graph_us")),
                                   "  capture failed: " + res["graph_error"][:200]
                                   if "graph_error" in res else ""), flush=True)


def profile_impl(torch, args, impl):
    res = impl.res
    if impl.call is None or "error" in res:
        return
    try:
        with impl.context():
            res.update(profile_kernels(torch, impl.call, args.profile_calls))
    except Exception as e:
        res["kernel_error"] = error_text(e)
    ok = backend_ran(impl.kind, res.get("kernels", {}))
    if ok is not None:
        res["backend_verified"] = ok
        if not ok:
            res["notes"].append("**backend not seen in the profile**: kernels " +
                                ", ".join(short_name(n) for n in res.get("kernels", {})))
    print("  %-40s kernel %7s  %s%s" % (
        impl.label, fmt(res.get("kernel_us")),
        ", ".join("%s x%g" % (short_name(n, 50), round(c, 2))
                  for n, c in res.get("kernels", {}).items())[:200],
        "  " + res["kernel_error"] if "kernel_error" in res else ""), flush=True)


def environment(torch, fa, args):
    env = {"python": platform.python_version(), "hostname": socket.gethostname(),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
           else None, "device": args.device}
    if args.device == "cuda":
        prop = torch.cuda.get_device_properties(0)
        env.update(card=torch.cuda.get_device_name(0),
                   compute_capability="%d.%d" % (prop.major, prop.minor),
                   sms=prop.multi_processor_count,
                   l2_bytes=getattr(prop, "L2_cache_size", 50 << 20))
    else:
        env.update(card="CPU (%s)" % (platform.processor() or platform.machine()),
                   l2_bytes=0)
    info = {"FLASHATTN_BINDING": os.environ.get("FLASHATTN_BINDING"),
            "FLASHATTN_DEVICE_CHECKS": os.environ.get("FLASHATTN_DEVICE_CHECKS")}
    if isinstance(fa, Exception):  # the import failed: the peers still run, ours say why
        info.update(binding="none (import failed)", import_error=error_text(fa))
        return env, info
    binding = getattr(fa, "binding", None)
    info.update(binding_function=callable(binding), module=getattr(fa, "__file__", None))
    try:
        info["binding"] = binding() if callable(binding) else "ctypes"
        reason = getattr(fa, "binding_reason", None)  # why that binding, where the package says
        if callable(reason):
            info["binding_reason"] = str(reason())
    except Exception as e:
        info["binding"] = "binding() failed: " + first_line(e)
    for name in ("library_version", "library_path", "has_cuda", "get_options"):
        try:
            info[name] = getattr(fa, name)()
        except Exception as e:
            info[name] = "error: " + first_line(e)
    return env, info


def run(args):
    if args.binding != "auto":
        os.environ["FLASHATTN_BINDING"] = args.binding  # before the import, which reads it
    import torch
    import torch.nn.functional as F

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_door.py: no CUDA device visible to PyTorch (use --device cpu "
                         "for the CPU try-out or --dry-run for the tables)")
    try:
        import flashattn as fa
    except Exception as e:  # e.g. a package mid-change: measure the peers all the same
        fa = e
        print("torch_door.py: cannot import flashattn: %s" % error_text(e), flush=True)

    torch.manual_seed(args.seed)
    dev = Device(torch, args.device)
    env, info = environment(torch, fa, args)
    print("torch_door.py: %s; torch %s, CUDA %s, cuDNN %s; flashattn binding %s%s" % (
        env["card"], env["torch"], env["cuda"], env["cudnn"], info["binding"],
        " (FLASHATTN_BINDING=%s)" % info["FLASHATTN_BINDING"] if info["FLASHATTN_BINDING"]
        else ""), flush=True)
    t0 = time.time()
    # The C tool first, while this process holds no GPU memory yet.
    runs = tool_runs(args) if args.tool else {}
    for r in runs.values():
        print("tool %s: %s (%.1f s)" % (r["label"], r.get("error", "ok"), r["seconds"]),
              flush=True)

    rows = []
    data = None
    with torch.no_grad():
        for key in args.rows:
            print("== %s" % ROW_TITLES[key], flush=True)
            try:
                if key == "small":
                    row = build_small(torch, F, fa, dev, args)
                else:
                    if data is None:
                        data = DecodeData(torch, dev, args, env["l2_bytes"])
                        print("  decode inputs: %d sets of %.0f MiB K+V rotated" % (
                            data.nsets, data.set_bytes / 2**20), flush=True)
                    row = build_decode(torch, F, fa, dev, args, data, key)
            except Exception as e:
                rows.append({"key": key, "error": error_text(e), "impls": []})
                print("  cannot build the row: %s" % error_text(e), flush=True)
                continue
            for impl in row.impls:
                gc.collect()
                measure_impl(torch, fa, dev, args, row, impl)
            rows.append(row)
        if dev.cuda:
            # Graphs, then the profiler (once CUPTI is on it may stay on in the process, so
            # nothing is timed after it), then the graphs of the implementations that
            # synchronise inside the call (our defaults, with the device checks): their capture
            # is expected to fail, and a failed capture must not spoil anything measured after.
            jobs = [(r, impl) for r in rows if isinstance(r, Row) for impl in r.impls]
            print("== CUDA graphs (%d calls captured, %d replays)" % (args.graph_calls,
                                                                      args.graph_replays))
            for r, impl in jobs:
                if not impl.syncs:
                    graph_impl(torch, args, r, impl)
            if not args.no_profile:
                print("== device time per call (PyTorch profiler, %d calls)" %
                      args.profile_calls, flush=True)
                for r, impl in jobs:
                    profile_impl(torch, args, impl)
            print("== CUDA graphs of the calls that synchronise", flush=True)
            for r, impl in jobs:
                if impl.syncs:
                    graph_impl(torch, args, r, impl)
    out_rows = []
    for r in rows:
        if not isinstance(r, Row):
            out_rows.append(r)
            continue
        res = [i.res for i in r.impls]
        res += tool_results(runs, r.key)
        out_rows.append({"key": r.key, "title": ROW_TITLES[r.key], "shape": r.shape,
                         "sets": r.nsets, "impls": res})
    print("measured in %.1f s" % (time.time() - t0), flush=True)
    return env, info, runs, out_rows


# ---------------------------------------------------------------------------------------------
# The dry run: the same documents with fake numbers, to test the tables without a GPU.

def dry_run_rows(args):
    fake = [11.0, 23.0, 9.5, 8.25, 30.0, 17.5]
    rows = []
    for key in args.rows:
        labels = {"small": ["ours: flash_attn_func", SDPA_CUDNN, SDPA_FLASH],
                  "decode": [OURS_DEFAULT, OURS_SYNC, SDPA_CUDNN, SDPA_FLASH],
                  "paged": [OURS_DEFAULT, OURS_SYNC],
                  "append": [OURS_DEFAULT, OURS_SYNC, SDPA_CUDNN + " + index_copy_",
                             SDPA_FLASH + " + index_copy_"]}[key]
        impls = []
        for j, label in enumerate(labels):
            kind = "ours" if label.startswith("ours") else \
                ("sdpa-cudnn" if "cuDNN" in label else "sdpa-flash")
            x = fake[(j + len(key)) % len(fake)]
            r = {"impl": label, "kind": kind, "notes": ["FAKE (dry run)"],
                 "host_us": x, "host_cpu_us": x * 0.9, "total_us": x * 1.5,
                 "graph_us": x * 0.5, "kernel_us": x * 0.4,
                 "check": {"max_abs": 3.9e-3, "rel": 4.1e-3, "ok": True}}
            if kind == "ours":
                r["kernel_name"] = "fake_kernel"
            if label == OURS_DEFAULT and key != "small":
                del r["graph_us"]
                r["graph_error"] = "FAKE: capture failed (a synchronisation inside capture)"
            if kind == "sdpa-flash" and key == "append":
                r = {"impl": label, "kind": kind, "notes": ["FAKE (dry run)"],
                     "error": "FAKE: refused: No available kernel"}
            impls.append(r)
        if key in ("decode", "paged"):
            impls += [{"impl": "C tool, device checks on", "kind": "tool", "host_us": 6.0,
                       "total_us": 36.0, "kernel_us": 37.0, "notes": ["FAKE (dry run)"]},
                      {"impl": "C tool, device checks off", "kind": "tool", "host_us": 4.0,
                       "total_us": 19.0, "kernel_us": 20.8, "notes": ["FAKE (dry run)"]}]
        if key == "small":
            impls.append({"impl": "C tool: flashattn bench", "kind": "tool", "total_us": 7.0,
                          "kernel_us": 6.0, "notes": ["FAKE (dry run)"]})
        shape = SMALL if key == "small" else DECODE
        rows.append({"key": key, "title": ROW_TITLES[key], "shape": dict(shape),
                     "sets": 1 if key == "small" else 7,
                     "impls": impls})
    env = {"card": "FAKE CARD (dry run)", "torch": "-", "cuda": "-", "cudnn": "-",
           "python": platform.python_version(), "device": args.device}
    info = {"binding": "FAKE", "FLASHATTN_BINDING": os.environ.get("FLASHATTN_BINDING")}
    return env, info, {}, rows


# ---------------------------------------------------------------------------------------------
# The documents.

def fmt(x, digits=1):
    return "-" if x is None else "%.*f" % (digits, x)


def short_name(name, limit=60):
    """A kernel name for the table: the function name without its template arguments."""
    base = name.split("(")[0]
    if "<" in base:
        base = base.split("<")[0] + "<...>"
    base = base.replace("void ", "")
    return base if len(base) <= limit else base[:limit - 3] + "..."


def cell_notes(r):
    notes = list(r.get("notes", []))
    if r.get("kernel_name"):
        notes.insert(0, "kernel %s%s" % (r["kernel_name"], "/%s splits" % r["num_splits"]
                                         if r.get("num_splits") else ""))
    c = r.get("check")
    if c:
        notes.append("max|Δ| %.1e, rel %.1e vs fp32%s" % (c["max_abs"], c["rel"],
                                                            "" if c["ok"] else " **MISMATCH**"))
    gc_ = r.get("graph_check")
    if gc_ and not gc_["ok"]:
        notes.append("**graph replay output wrong** (rel %.1e)" % gc_["rel"])
    if r.get("backend_verified"):
        notes.append("backend seen in the profile")
    if r.get("kernels"):  # what the profiler saw per call, most frequent first
        ks = sorted(r["kernels"].items(), key=lambda kv: -kv[1])
        notes.append("device: " + ", ".join("%s ×%g" % (short_name(n, 48), round(c, 2))
                                            for n, c in ks[:4]))
    if r.get("host_cpu_us") is not None:
        notes.append("host CPU %.1f µs" % r["host_cpu_us"])
    if r.get("queue_filled"):
        notes.append("**launch queue filled** (2nd half %.1f µs/call vs 1st %.1f): host "
                     "figure includes waiting" % (r["host_second_half_us"],
                                                  r["host_first_half_us"]))
    if r.get("graph_error"):
        notes.append("graph capture: " + r["graph_error"][:300])
    if r.get("kernel_error"):
        notes.append("profiler: " + r["kernel_error"][:120])
    if r.get("error"):
        notes.append("**error**: " + r["error"][:300])
    return "; ".join(notes).replace("|", "\\|")


def graph_cell(r):
    if r.get("graph_us") is not None:
        return fmt(r["graph_us"])
    if r.get("graph_error"):
        return "capture failed"
    return "-"


def ratio_line(ours, peer, peer_where=""):
    parts = []
    for col, key in (("host", "host_us"), ("total", "total_us"), ("graph", "graph_us"),
                     ("kernel", "kernel_us")):
        a, b = ours.get(key), peer.get(key)
        parts.append("%s %s" % (col, "%.2f" % (a / b) if a and b else "-"))
    return "- %s / %s%s: %s" % (ours["impl"], peer["impl"], peer_where, ", ".join(parts))


def markdown(doc):
    env, info = doc["environment"], doc["flashattn"]
    lines = []
    if doc.get("dry_run"):
        lines += ["# DRY RUN — FAKE NUMBERS, NOT MEASUREMENTS", ""]
    lines += ["# The PyTorch door: flashattn through PyTorch against SDPA, per call", ""]
    cc = (", sm %s, %s SMs, L2 %d MiB" % (env["compute_capability"], env["sms"],
                                          env["l2_bytes"] >> 20)
          if env.get("compute_capability") else "")
    lines.append("- card: %s%s; torch %s, CUDA %s, cuDNN %s; Python %s" % (
        env["card"], cc, env["torch"], env["cuda"], env["cudnn"], env["python"]))
    lines.append("- date: %s; commit: %s" % (doc["date"], doc["commit"]))
    lines.append("- command: `%s`" % doc["command"])
    b = info.get("binding")
    lines.append("- flashattn: binding **%s**%s%s%s%s" % (
        b, "" if info.get("binding_function", True) else " (no flashattn.binding(): ctypes)",
        " (%s)" % info["binding_reason"] if info.get("binding_reason") else "",
        "; FLASHATTN_BINDING=%s" % info["FLASHATTN_BINDING"]
        if info.get("FLASHATTN_BINDING")
        and "FLASHATTN_BINDING" not in info.get("binding_reason", "") else "",
        "; library %s at %s" % (info.get("library_version"), info.get("library_path"))
        if info.get("library_path") and not str(info["library_path"]).startswith("error")
        else "; library: %s" % info["library_path"][:200] if info.get("library_path")
        else ""))
    if info.get("import_error"):
        lines.append("- **flashattn could not be imported**: %s" % info["import_error"])
    c = doc["config"]
    lines.append("- host µs: wall time of %d back-to-back calls without synchronising / %d, "
                 "started with the GPU idle, median of %d repeats; total µs: the same loop "
                 "between two CUDA events (one synchronise at the end) / %d; graph µs: %d calls "
                 "captured in one torch.cuda.CUDAGraph, %d replays between events / (%d × %d); "
                 "kernel µs: device time per call (kernels, memsets, copies) from the PyTorch "
                 "profiler over %d calls, or for the C tool its median of CUDA events around "
                 "each call" % (c["calls"], c["calls"], c["repeats"], c["calls"],
                                c["graph_calls"], c["graph_replays"], c["graph_calls"],
                                c["graph_replays"], c["profile_calls"]))
    lines.append("- inputs: standard normal; ours (batch, seq, heads, d), SDPA contiguous "
                 "(batch, heads, seq, d) under sdpa_kernel([backend]) entered outside the "
                 "timed loops;%s every output checked once against float32 math; under "
                 "torch.no_grad()" % (" decode caches rotated over %d sets (together ≥ 4× "
                                      "the L2);" % c["decode_sets"] if c.get("decode_sets")
                                      else ""))
    lines.append("")
    cudnn_decode = None
    for row in doc["rows"]:
        lines += ["## " + row.get("title", row["key"]), ""]
        if row.get("error"):
            lines += ["the row could not be built: " + row["error"], ""]
            continue
        lines.append("| impl | host µs/call | total µs/call | graph µs/call | kernel µs | notes |")
        lines.append("|---|---:|---:|---:|---:|---|")
        for r in row["impls"]:
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                r["impl"], fmt(r.get("host_us")), fmt(r.get("total_us")), graph_cell(r),
                fmt(r.get("kernel_us")), cell_notes(r)))
        lines.append("")
        peers = [r for r in row["impls"] if r["kind"] == "sdpa-cudnn" and "error" not in r]
        where = ""
        if row["key"] == "decode" and peers:
            cudnn_decode = peers[0]
        if row["key"] == "paged" and cudnn_decode:
            peers, where = [cudnn_decode], " (contiguous cache, decode row)"
        ours = [r for r in row["impls"] if r["kind"] == "ours" and "error" not in r]
        if peers and ours:
            lines.append("Ratios (below 1: ours costs less):")
            lines.append("")
            lines += [ratio_line(o, peers[0], where) for o in ours]
            lines.append("")
    tools = doc.get("tool_runs", {})
    if tools:
        lines.append("C tool commands:")
        lines.append("")
        for r in tools.values():
            lines.append("- `%s --json ...`%s" % (r["command"], " — **%s**" % r["error"]
                                                  if r.get("error") else ""))
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", help="directory for door.json and door.md (created)")
    ap.add_argument("--tool", default="build-gpu/tools/flashattn",
                    help="the flashattn tool for the C rows ('' skips them)")
    ap.add_argument("--commit", default="unknown", help="the commit measured, for the header")
    ap.add_argument("--binding", default="auto", choices=["auto", "ctypes", "extension"],
                    help="sets FLASHATTN_BINDING before flashattn is imported (auto: leave it)")
    ap.add_argument("--rows", default=",".join(ROW_ORDER),
                    help="comma list of small, decode, paged, append")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the CPU try-out (real calls on CPU tensors; no events, graphs "
                         "or profiler)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no measurement: the documents with fake numbers, clearly marked")
    ap.add_argument("--calls", type=int, default=150,
                    help="N, calls per timed loop (small enough that the launch queue never "
                         "fills)")
    ap.add_argument("--repeats", type=int, default=7, help="R, repeats of each loop (median)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls first")
    ap.add_argument("--graph-calls", type=int, default=20, help="K, calls in one CUDA graph")
    ap.add_argument("--graph-replays", type=int, default=10, help="replays between events")
    ap.add_argument("--profile-calls", type=int, default=20, help="calls under the profiler")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiler pass")
    ap.add_argument("--rotate-bytes", type=float, default=-1,
                    help="decode sets together exceed this many bytes (default 4x the L2; 0: "
                         "one set)")
    ap.add_argument("--room", type=int, default=256,
                    help="free tokens past the 8192 cached in ours' contiguous caches")
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--tool-timeout", type=int, default=90)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    args.rows = [x for x in args.rows.split(",") if x]
    for x in args.rows:
        if x not in ROW_TITLES:
            ap.error("unknown row %r (small, decode, paged, append)" % x)
    args.rows = [x for x in ROW_ORDER if x in args.rows]
    if args.calls < 2 or args.repeats < 1 or args.graph_calls < 1 or args.graph_replays < 1 \
            or args.profile_calls < 1:
        ap.error("--calls >= 2 and --repeats, --graph-calls, --graph-replays, --profile-calls "
                 ">= 1")
    if args.page_size < 1 or args.room < 0:
        ap.error("--page-size >= 1 and --room >= 0")

    t0 = time.time()
    if args.dry_run:
        env, info, runs, rows = dry_run_rows(args)
    else:
        env, info, runs, rows = run(args)
    decode_sets = next((r.get("sets") for r in rows if r.get("key") != "small"), None)
    doc = {
        "tool": "bench/torch_door.py",
        "dry_run": bool(args.dry_run),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": args.commit,
        "command": " ".join(shlex.quote(a) for a in ["python3"] + sys.argv),
        "environment": env,
        "flashattn": info,
        "config": {"calls": args.calls, "repeats": args.repeats, "warmup": args.warmup,
                   "graph_calls": args.graph_calls, "graph_replays": args.graph_replays,
                   "profile_calls": args.profile_calls, "rotate_bytes": args.rotate_bytes,
                   "room": args.room, "page_size": args.page_size, "seed": args.seed,
                   "device": args.device, "decode_sets": decode_sets,
                   "units": "microseconds per call"},
        "tool_runs": runs,
        "rows": rows,
        "seconds": round(time.time() - t0, 1),
    }
    md = markdown(doc)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "door.json"), "w") as f:
            json.dump(doc, f, indent=1, default=str)
        with open(os.path.join(args.out, "door.md"), "w") as f:
            f.write(md + "\n")
        print("wrote %s and %s" % (os.path.join(args.out, "door.json"),
                                   os.path.join(args.out, "door.md")))
    print()
    print(md)
    bad = [r for row in rows for r in row.get("impls", [])
           if r.get("kind") == "ours" and ("error" in r or not r.get("check", {}).get("ok", True))]
    return 1 if bad or any(row.get("error") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
