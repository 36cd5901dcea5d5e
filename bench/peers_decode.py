#!/usr/bin/env python3
"""Times the peers of `flashattn bench --decode`: PyTorch's scaled_dot_product_attention with
enable_gqa=True, restricted to its FlashAttention-2 backend ("flash"), its cuDNN backend
("cudnn") and its memory-efficient backend ("efficient"), on the same decode rows: one query
token per sequence against a full KV cache, batch x cache length, GQA heads_q/heads_kv.

The method is the tool's (bench/c/bench_decode.c), so bench/table_decode.py can join the two
files row by row: standard normal values; one pool of K and one of V, sized for the largest row and
viewed by every row with its own shape, BSHD memory as flashattn reads it ([B, H, S, D] views
for SDPA; --layout bhsd gives SDPA contiguous [B, H, S, D] instead); calls rotate over disjoint
sets of the pool that together exceed four times the L2, so no call finds its cache there;
warm-up calls; CUDA events around each call (median); then as many calls back to back between
one pair of events (loop_s); and a device-to-device copy measured before and after the rows
(the higher is the reference). K/V bytes per call: 2 * B * len * heads_kv * d * element size.

Masks: flashattn's decode is causal with the query aligned bottom-right, so the one query row
sees every key; SDPA's is_causal aligns top-left (it would see key 0 only), so the peers run
unmasked, which is the same attention. SDPA has no paged cache: its rows are contiguous, and
the table compares our paged rows against them too. A backend that refuses a row (or runs out
of memory) gets a row with status "refused" / "error" and the reason.

    python3 bench/peers_decode.py --json peers_decode.json
    python3 bench/peers_decode.py --impls cudnn --batches 1 --cache-lens 8192

The options share their names with `flashattn bench --decode` (--batches, --cache-lens,
--heads, --heads-kv, --head-dim, --dtype, --warmup, --reps, --min-time, --max-time, --rotate,
--copy-bytes, --seed); the tool's --paged/--contiguous/--checks/--page-size/--splits are
accepted and ignored, so one set of options narrows both.
"""
import argparse
import datetime
import json
import math
import socket
import statistics
import sys
import time
import warnings

from peers import Timer, parse_bytes, parse_list, rep_count

IMPLS = ("flash", "cudnn", "efficient")
MAX_SETS = 256


def sets_wanted(rotate, set_bytes):
    """The tool's rule: sets together >= rotate bytes, one when a set alone is that big."""
    if rotate <= 0 or set_bytes >= rotate:
        return 1
    return min(MAX_SETS, math.ceil(rotate / set_bytes))


def first_line(e):
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:400]


class Decode:
    """The pools and the rows of one run."""

    def __init__(self, torch, F, args, dtype):
        self.torch, self.F, self.args, self.dtype = torch, F, args, dtype
        self.elem = torch.finfo(dtype).bits // 8
        self.row_elems = args.heads_kv * args.head_dim
        tokens = 0
        for b in args.batches:
            for n in args.cache_lens:
                t = b * n
                sets = sets_wanted(args.rotate_bytes, 2 * t * self.row_elems * self.elem)
                tokens = max(tokens, t * sets)
        self.tokens = tokens
        self.max_b = max(args.batches)
        t0 = time.time()
        self.k = self.normal(tokens * self.row_elems)
        self.v = self.normal(tokens * self.row_elems)
        self.q = self.normal(self.max_b * args.heads * args.head_dim)
        torch.cuda.synchronize()
        print("# cache pools: K and V of %.1f MiB each (%d rows), normal random values, ready in "
              "%.1f s" % (tokens * self.row_elems * self.elem / 2**20, tokens, time.time() - t0),
              flush=True)

    def normal(self, n):
        """n standard normal values, drawn in pieces: the pools hold billions of elements."""
        t = self.torch.empty(n, device="cuda", dtype=self.dtype)
        step = 1 << 28
        for lo in range(0, n, step):
            t[lo:lo + step].normal_()
        return t

    def views(self, b, n):
        """Sets of (q, k, v) for SDPA, [B, H, S, D] views of the pools."""
        a = self.args
        per_set = b * n
        nsets = min(sets_wanted(a.rotate_bytes, 2 * per_set * self.row_elems * self.elem),
                    self.tokens // per_set)
        q = self.q[: b * a.heads * a.head_dim].view(b, 1, a.heads, a.head_dim).transpose(1, 2)
        sets = []
        for s in range(nsets):
            lo, hi = s * per_set * self.row_elems, (s + 1) * per_set * self.row_elems
            kv = []
            for pool in (self.k, self.v):
                flat = pool[lo:hi]
                if a.layout == "bhsd":
                    kv.append(flat.view(b, a.heads_kv, n, a.head_dim))
                else:
                    kv.append(flat.view(b, n, a.heads_kv, a.head_dim).transpose(1, 2))
            sets.append((q, kv[0], kv[1]))
        return sets


def time_copy(torch, nbytes, timer):
    """Median seconds of a device-to-device copy of nbytes (2 warm-up copies, 10 timed)."""
    src = torch.randint(0, 255, (nbytes,), device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    times, _ = timer.run(lambda i: dst.copy_(src), 0, 12)
    del src, dst
    return statistics.median(times[2:])


def time_impl(torch, F, args, impl, backend, sets, base, timer):
    from torch.nn.attention import sdpa_kernel

    nsets = len(sets)
    row = dict(base, impl=impl, kernel="torch.sdpa/" + impl, sets=nsets)

    def call(i):
        q, k, v = sets[i % nsets]
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([backend]):
                warm, _ = timer.run(call, 0, args.warmup) if args.warmup else ([], 0)
                reps = rep_count(args, min(warm) if warm else 0)
                times, span = timer.run(call, args.warmup, reps)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                h0 = time.perf_counter()
                for i in range(reps):
                    call(args.warmup + reps + i)
                h1 = time.perf_counter()
                end.record()
                end.synchronize()
                loop = start.elapsed_time(end) * 1e-3 / reps
        except (RuntimeError, ValueError) as e:  # out of memory is a RuntimeError too
            why = first_line(e)
            # SDPA says only "No available kernel"; the reasons come as warnings
            reasons = [first_line(w.message) for w in caught
                       if "sdp" in str(w.message).lower() or "kernel" in str(w.message).lower()]
            if reasons:
                why += " (" + "; ".join(dict.fromkeys(reasons)) + ")"
            refused = "no available kernel" in why.lower()
            row.update(status="refused" if refused else "error", error=why[:800])
            return row
    med = statistics.median(times)
    bps = base["kv_bytes"] / med
    row.update(status="ok", reps=reps, median_s=med, min_s=min(times), max_s=max(times),
               span_mean_s=span, loop_s=loop, host_loop_s=(h1 - h0) / reps,
               kv_bytes_per_s=bps, kv_tbps=bps * 1e-12)
    return row


def fmt_row(r):
    head = "%-9s %5d %7d" % (r["impl"], r["batch"], r["seqlen_k"])
    if r["status"] != "ok":
        return head + "  %s: %s" % (r["status"], r.get("error", ""))
    frac = r.get("fraction_of_copy")
    return head + "  %4d %4d %10.1f %10.1f %10.1f %8.3f %6s" % (
        r["reps"], r["sets"], r["median_s"] * 1e6, r["loop_s"] * 1e6, r["host_loop_s"] * 1e6,
        r["kv_tbps"], "%.1f%%" % (100 * frac) if frac else "-")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default=",".join(IMPLS), help="flash, cudnn, efficient (comma list)")
    ap.add_argument("--batches", type=parse_list, default=[1, 8, 64])
    ap.add_argument("--cache-lens", type=parse_list, default=[8192, 32768, 131072])
    ap.add_argument("--heads", type=int, default=32, help="query heads")
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--layout", default="bshd", choices=["bshd", "bhsd"],
                    help="memory of K/V: bshd as flashattn's (default), or contiguous bhsd")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20, help="at least this many timed calls")
    ap.add_argument("--min-time", type=float, default=0.2, help="and this many seconds")
    ap.add_argument("--max-time", type=float, default=2.0, help="but at most this many")
    ap.add_argument("--rotate-bytes", "--rotate", type=parse_bytes, default=-1,
                    help="cache sets together exceed this (default 4x the L2; 0: one set)")
    ap.add_argument("--copy-bytes", type=parse_bytes, default=2**30,
                    help="size of the device copy measured (default 1G)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", help="write the rows here")
    # the tool's decode-only options, so that one set of options serves both
    for flag in ("--paged", "--contiguous"):
        ap.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--checks", "--page-size", "--splits"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.impls = [x for x in args.impls.split(",") if x]
    for x in args.impls:
        if x not in IMPLS:
            ap.error("unknown implementation %r" % x)
    if args.heads % args.heads_kv:
        ap.error("--heads %d is not a multiple of --heads-kv %d" % (args.heads, args.heads_kv))
    ignored = [f for f in ("paged", "contiguous", "checks", "page_size", "splits")
               if getattr(args, f) not in (None, False)]

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend
        why = None if torch.cuda.is_available() else "no CUDA device visible to PyTorch"
    except ImportError as e:
        why = "cannot import torch: %s" % e
    if why:
        print("peers_decode.py: " + why, file=sys.stderr)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"tool": "bench/peers_decode.py", "error": why, "rows": []}, f)
        return 1
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    if args.rotate_bytes < 0:
        args.rotate_bytes = 4 * l2
    args.rotate_bytes = int(args.rotate_bytes)
    args.copy_bytes = int(args.copy_bytes)
    seed = args.seed if args.seed is not None else int(time.time() * 1e6) & 0x7FFFFFFF
    torch.manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    machine = {
        "hostname": socket.gethostname(),
        "device": torch.cuda.get_device_name(0),
        "compute_capability": "%d.%d" % (prop.major, prop.minor),
        "sms": prop.multi_processor_count,
        "l2_bytes": l2,
        "memory_bytes": prop.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    print("peers_decode.py: %s, torch %s, CUDA %s, cuDNN %s; warm-up %d, median of >= %d calls "
          "and >= %g s (at most %g s), cache sets rotated over >= %.0f MiB, seed %d%s" % (
              machine["device"], machine["torch"], machine["cuda"], machine["cudnn"],
              args.warmup, args.reps, args.min_time, args.max_time,
              args.rotate_bytes / 2**20, seed,
              "; ignored (SDPA has no paged cache or checks): " + ", ".join(ignored)
              if ignored else ""), flush=True)
    timer = Timer(torch)
    copy = {"bytes": args.copy_bytes, "reps": 10}
    t = time_copy(torch, args.copy_bytes, timer)
    copy.update(start_median_s=t, start_bytes_per_s=2 * args.copy_bytes / t)
    print("# copy bandwidth (before the rows): %.3f TB/s read + write" %
          (copy["start_bytes_per_s"] * 1e-12), flush=True)
    copy_bps = copy["start_bytes_per_s"]

    rows = []
    t0 = time.time()
    fatal = None
    try:
        pools = Decode(torch, F, args, dtype)
    except RuntimeError as e:  # out of memory, most likely
        fatal = "cannot make the cache pools: " + first_line(e)
        print("peers_decode.py: " + fatal, file=sys.stderr)
        args.batches = []
    print("%-9s %5s %7s  %4s %4s %10s %10s %10s %8s %6s" % (
        "impl", "B", "cache", "reps", "sets", "median us", "loop us", "host us", "KV TB/s",
        "%copy"))
    for b in args.batches:
        for n in args.cache_lens:
            sets = pools.views(b, n)
            kv_bytes = 2.0 * b * n * args.heads_kv * args.head_dim * pools.elem
            base = {"op": "decode", "dtype": args.dtype, "batch": b, "heads_q": args.heads,
                    "heads_kv": args.heads_kv, "head_dim": args.head_dim, "seqlen_q": 1,
                    "seqlen_k": n, "causal": True, "cache": "contiguous", "page_size": 0,
                    "device_checks": None, "kv_bytes": kv_bytes, "layout": args.layout}
            for impl in args.impls:
                r = time_impl(torch, F, args, impl, backends[impl], sets, base, timer)
                if r["status"] == "ok":
                    r["fraction_of_copy"] = r["kv_bytes_per_s"] / copy_bps
                rows.append(r)
                print(fmt_row(r), flush=True)
                torch.cuda.empty_cache()
            sets = None
    pools = None
    torch.cuda.empty_cache()
    t = time_copy(torch, args.copy_bytes, timer)
    copy.update(end_median_s=t, end_bytes_per_s=2 * args.copy_bytes / t)
    copy["bytes_per_s"] = max(copy["start_bytes_per_s"], copy["end_bytes_per_s"])
    copy["tbps"] = copy["bytes_per_s"] * 1e-12
    for r in rows:
        if r["status"] == "ok":
            r["fraction_of_copy"] = r["kv_bytes_per_s"] / copy["bytes_per_s"]
    print("# copy bandwidth (after the rows): %.3f TB/s; reference %.3f TB/s" % (
        copy["end_bytes_per_s"] * 1e-12, copy["tbps"]))
    print("peers_decode.py: %d rows in %.1f s" % (len(rows), time.time() - t0))
    if args.json:
        doc = {
            "tool": "bench/peers_decode.py",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(sys.argv),
            "machine": machine,
            "config": {
                "mode": "decode", "warmup": args.warmup, "reps": args.reps,
                "min_time_s": args.min_time, "max_time_s": args.max_time,
                "rotate_bytes": args.rotate_bytes, "seed": str(seed), "layout": args.layout,
                "kv_bytes_rule": "2 * batch * cache_len * heads_kv * head_dim * element size "
                                 "(K and V read once per call)",
                "time_rule": "median over calls of CUDA event pairs around each call, after "
                             "warm-up calls, cache sets rotated; loop_s: the same number of "
                             "calls back to back between one pair of events, per call",
                "copy_rule": "torch copy_ of a uint8 tensor on the device, 2 * bytes / median "
                             "time (read + write)",
                "call": "F.scaled_dot_product_attention(q, k, v, enable_gqa=True) under "
                        "sdpa_kernel([backend]); no mask (one query row bottom-right sees "
                        "every key; SDPA's is_causal is top-left)",
                "inputs": "standard normal",
                "ignored_options": ignored,
            },
            "copy": copy,
            "rows": rows,
        }
        if fatal:
            doc["error"] = fatal
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote %s" % args.json)
    # a refusal is an answer, not a failure of this script
    return 0 if not fatal and all(r["status"] in ("ok", "refused") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
