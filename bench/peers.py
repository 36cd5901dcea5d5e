#!/usr/bin/env python3
"""Times the peers of flashattn on the sweep of `flashattn bench --sweep`: PyTorch's
scaled_dot_product_attention restricted to its FlashAttention-2 backend ("flash") and to its
cuDNN fused backend ("cudnn"), forward and backward.

The method is the tool's, so the two JSON files can be joined row by row (bench/table.py):
standard normal inputs, BSHD memory (as flashattn reads it; SDPA gets [B, H, S, D] views of
it), several input sets rotated so that their bytes exceed the L2 several times over, warm-up
calls, then CUDA events around each call and the median. The forward runs as in training
(inputs require grad), so every implementation writes the softmax statistics as flashattn's
forward writes its LSE; the backward is timed alone, by torch.autograd.grad on a graph kept
with retain_graph.

    python3 bench/peers.py --json peers.json            # the whole sweep, both peers
    python3 bench/peers.py --impls cudnn --head-dim 128 --seqlens 2048 --op fwd

The sweep options share their names with `flashattn bench` (--head-dim, --seqlens, --masks,
--op, --dtype, --tokens, --model-dim, --heads, --heads-kv, --warmup, --reps, --min-time,
--max-time, --rotate, --pause), so one set of options narrows both. GQA rows (--heads 32
--heads-kv 8) run SDPA with enable_gqa where the backend takes it, else with K/V repeated to
the query heads before timing (the row's kernel says which).
"""
import argparse
import datetime
import itertools
import json
import math
import socket
import statistics
import sys
import time


DEVICE = "cuda"  # where the inputs are made (a test may point it at the CPU)


def parse_list(text):
    """'64,128' or '512..16384' (doubling), as the tool parses its lists."""
    if ".." in text:
        lo, hi = (int(x) for x in text.split(".."))
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 2
        return out
    return [int(x) for x in text.split(",") if x]


def parse_bytes(text):
    """'200M', '1G', '4096' (binary units), as the tool's --rotate."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    mul = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    return float(t[:-1] if mul > 1 else t) * mul


def fwd_flops(b, h, d, sq, sk, causal):
    """4*B*H*Nq*Nk*d, a causal square counting half: the tool's rule (bench/c/bench_flops.c)."""
    full = 4.0 * b * h * d * sq * sk
    return 0.5 * full if causal else full


def rep_count(args, est):
    """At least --reps calls and --min-time seconds of them, at most --max-time seconds
    (never fewer than 3): the tool's rule (bench/c/bench_run.c)."""
    reps = float(args.reps)
    if est > 0 and args.min_time > 0:
        reps = max(reps, math.ceil(args.min_time / est))
    if est > 0 and args.max_time > 0 and reps * est > args.max_time:
        reps = max(3.0, math.floor(args.max_time / est))
    return int(min(max(reps, 1), 1000))


def configs(args):
    for d in args.head_dims:
        for causal in args.masks:
            for n in args.seqlens:
                yield d, causal, n


def shape_of(args, d, n):
    """(batch, heads, kv heads): batch = tokens / seqlen, heads = --heads or model_dim / d, kv
    heads = --heads-kv or heads; None when they do not divide."""
    h = args.heads or (args.model_dim // d if args.model_dim % d == 0 else 0)
    hk = args.heads_kv or h
    if args.tokens % n or not h or h % hk:
        return None
    return args.tokens // n, h, hk


class Timer:
    """CUDA events around each call, read after all calls are queued."""

    def __init__(self, torch):
        self.torch = torch

    def run(self, fn, first, count):
        ev = [(self.torch.cuda.Event(enable_timing=True),
               self.torch.cuda.Event(enable_timing=True)) for _ in range(count)]
        for i in range(count):
            ev[i][0].record()
            fn(first + i)
            ev[i][1].record()
        ev[-1][1].synchronize()
        per_call = [s.elapsed_time(e) * 1e-3 for s, e in ev]
        span = ev[0][0].elapsed_time(ev[-1][1]) * 1e-3 / count
        return per_call, span


def make_sets(torch, args, b, h, hk, d, n, dtype, need_bwd):
    """Input sets of BSHD memory presented as [B, H, S, D] views (K and V with hk heads),
    enough of them that together they exceed --rotate-bytes (at least two)."""
    elem = torch.finfo(dtype).bits // 8
    per_set = b * n * d * elem * (2 * h + 2 * hk) * (2 if need_bwd else 1) + b * h * n * 4
    nsets = max(2, math.ceil(args.rotate_bytes / per_set)) if args.rotate_bytes else 1
    nsets = min(nsets, 256)
    sets = []
    for _ in range(nsets):
        qkv = []
        for heads in (h, hk, hk):
            t = torch.randn(b, n, heads, d, device="cuda", dtype=dtype).transpose(1, 2)
            qkv.append(t.detach().requires_grad_(True))
        sets.append(qkv)
    return sets


def gqa_mode(torch, F, sets, h, hk, causal):
    """How the peer takes GQA: natively (enable_gqa) when its backend accepts it, else with K
    and V repeated to the query heads beforehand (untimed, and their gradients left per
    repeated head: both in the peer's favour). Returns the mode and the sets to time."""
    if h == hk:
        return "", sets
    q, k, v = sets[0]
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=True)
        return "gqa", sets
    except RuntimeError:
        g = h // hk
        rep = [[q] + [t.detach().repeat_interleave(g, dim=1).requires_grad_(True) for t in (k, v)]
               for q, k, v in sets]
        return "repeat_kv", rep


def calls(torch, F, sets, causal, gqa, need_bwd):
    """The timed calls on input set i % len(sets): the forward, and the backward alone
    (autograd.grad on a graph built once per set and kept)."""
    nsets = len(sets)

    def attend(q, k, v):
        kw = {"enable_gqa": True} if gqa else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), **kw)

    def fwd(i):
        return attend(*sets[i % nsets])

    graphs = []
    if need_bwd:
        for q, k, v in sets:
            out = attend(q, k, v)
            graphs.append((out, torch.randn_like(out), (q, k, v)))

    def bwd(i):
        out, dout, inputs = graphs[i % nsets]
        return torch.autograd.grad(out, inputs, dout, retain_graph=True)

    return fwd, bwd


def measure(args, timer, fn, flops):
    """Warm-up calls, then enough timed ones (rep_count); the row's timing fields."""
    warm, _ = timer.run(fn, 0, args.warmup) if args.warmup else ([], 0)
    reps = rep_count(args, min(warm) if warm else 0)
    times, span = timer.run(fn, args.warmup, reps)
    med = statistics.median(times)
    return dict(status="ok", reps=reps, median_s=med, min_s=min(times), max_s=max(times),
                span_mean_s=span, flops=flops, gflops=flops / med * 1e-9,
                tflops=flops / med * 1e-12)


def time_impl(torch, F, args, impl, backend, d, causal, n, dtype, timer):
    """Rows (fwd and/or bwd) of one implementation on one configuration."""
    from torch.nn.attention import sdpa_kernel

    shape = shape_of(args, d, n)
    rows = []
    base = {"impl": impl, "dtype": args.dtype, "head_dim": d, "seqlen_q": n, "seqlen_k": n,
            "causal": bool(causal), "mask": "causal" if causal else "none",
            "window_left": -1, "window_right": -1, "kernel": "torch.sdpa/" + impl}
    ops = [op for op in ("fwd", "bwd") if op in args.ops]
    if shape is None:
        for op in ops:
            rows.append(dict(base, op=op, batch=0, heads_q=0, heads_kv=0, status="bad shape",
                             error="tokens %d / seqlen %d or model dim %d / head dim %d do not "
                                   "divide" % (args.tokens, n, args.model_dim, d)))
        return rows
    b, h, hk = shape
    base.update(batch=b, heads_q=h, heads_kv=hk)
    flops = fwd_flops(b, h, d, n, n, causal)
    sets = None
    try:
        with sdpa_kernel([backend]):
            sets = make_sets(torch, args, b, h, hk, d, n, dtype, "bwd" in ops)
            mode, sets = gqa_mode(torch, F, sets, h, hk, causal)
            if mode:
                base["kernel"] += "+" + mode
            nsets = len(sets)
            fwd, bwd = calls(torch, F, sets, causal, mode == "gqa", "bwd" in ops)

            for op in ops:
                fn = fwd if op == "fwd" else bwd
                row = dict(base, op=op, sets=nsets)
                try:
                    if args.pause > 0:  # the inputs' fill done, then idle: every row alike
                        torch.cuda.synchronize()
                        time.sleep(args.pause)
                    row.update(measure(args, timer, fn, flops * (2.5 if op == "bwd" else 1.0)))
                except RuntimeError as e:
                    row.update(status="error", error=str(e).strip().splitlines()[0][:400])
                rows.append(row)
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[0][:400]
        done = {r["op"] for r in rows}
        for op in ops:
            if op not in done:
                rows.append(dict(base, op=op, status="error", error=msg))
    finally:
        sets = fwd = bwd = None  # the closures hold the sets' graphs
    return rows


def time_varlen(torch, F, args, impl, backend, d, causal, dtype, timer):
    """Rows of one implementation on the packed batch of --varlen: SDPA on a nested (jagged)
    tensor, and, causal only, on the batch padded to its longest sequence (right padding: under
    the causal mask every real row sees only real keys); each path timed, the faster kept, the
    row's kernel naming it. FLOPs count the real sequences only, as flashattn bench does."""
    from torch.nn.attention import sdpa_kernel

    lens = args.varlen
    total, longest, nseq = sum(lens), max(lens), len(lens)
    h = args.heads or (args.model_dim // d if args.model_dim % d == 0 else 0)
    hk = args.heads_kv or h
    base = {"impl": impl, "dtype": args.dtype, "head_dim": d, "seqlen_q": total,
            "seqlen_k": total, "causal": bool(causal), "mask": "causal" if causal else "none",
            "varlen": True, "window_left": -1, "window_right": -1, "batch": nseq,
            "heads_q": h, "heads_kv": hk}
    ops = [op for op in ("fwd", "bwd") if op in args.ops]
    flops = sum(fwd_flops(1, h, d, n, n, causal) for n in lens)
    offsets = torch.tensor([0] + list(itertools.accumulate(lens)), device=DEVICE)

    def packed(heads):
        return torch.randn(total, heads, d, device=DEVICE, dtype=dtype)

    def as_nested(t):
        nt = torch.nested.nested_tensor_from_jagged(t, offsets)  # [B, j, H, d]
        return nt.transpose(1, 2).detach().requires_grad_(True)

    def as_padded(t):
        out = t.new_zeros(nseq, longest, t.shape[1], d)
        for i, n in enumerate(lens):
            out[i, :n] = t[offsets[i]:offsets[i] + n]
        return out.transpose(1, 2).detach().requires_grad_(True)

    per_set = total * d * (2 * h + 2 * hk) * (torch.finfo(dtype).bits // 8) * 2
    nsets = min(64, max(2, math.ceil(args.rotate_bytes / per_set))) if args.rotate_bytes else 1
    raw = [(packed(h), packed(hk), packed(hk)) for _ in range(nsets)]
    best = {}
    with sdpa_kernel([backend]):
        # padding is the same attention only under the causal mask (no real row reaches a pad)
        paths = (("nested", as_nested), ("padded", as_padded)) if causal else (("nested", as_nested),)
        for path, make in paths:
            try:
                sets = [tuple(make(t) for t in qkv) for qkv in raw]
                fwd, bwd = calls(torch, F, sets, causal, h != hk, "bwd" in ops)
                for op in ops:
                    fn = fwd if op == "fwd" else bwd
                    m = measure(args, timer, fn, flops * (2.5 if op == "bwd" else 1.0))
                    if op not in best or m["median_s"] < best[op]["median_s"]:
                        best[op] = dict(base, op=op, sets=nsets, kernel="torch.sdpa/%s:%s" % (
                            impl, path), **m)
            except (RuntimeError, NotImplementedError) as e:
                for op in ops:
                    best.setdefault("err:" + op, "%s: %s" % (
                        path, str(e).strip().splitlines()[0][:300]))
            finally:
                sets = fwd = bwd = None
    rows = []
    for op in ops:
        if op in best:
            if "err:" + op in best:  # the other path failed: say why, beside the one that ran
                best[op]["other_path_error"] = best["err:" + op]
            rows.append(best[op])
        else:
            rows.append(dict(base, op=op, status="error", kernel="torch.sdpa/" + impl,
                             error=best.get("err:" + op, "no path ran")))
    return rows


def fmt_row(r):
    mask = "causal" if r["causal"] else "none"
    head = "%-5s %-3s %4d %5d/%-3d %5d %6s" % (r["impl"], r["op"], r["head_dim"], r["batch"],
                                              r["heads_q"], r["seqlen_k"], mask)
    if r["status"] != "ok":
        return head + "  error: " + r.get("error", "")
    return head + "  %4d %4d %10.1f us %10.1f us %8.1f TFLOP/s" % (
        r["reps"], r["sets"], r["median_s"] * 1e6, r["span_mean_s"] * 1e6, r["tflops"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default="flash,cudnn", help="flash, cudnn (comma list)")
    ap.add_argument("--ops", "--op", default="fwd,bwd", help="fwd, bwd (comma list) or both")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    ap.add_argument("--model-dim", type=int, default=2048, help="heads = model dim / head dim")
    ap.add_argument("--heads", type=int, default=0, help="query heads (instead of --model-dim)")
    ap.add_argument("--heads-kv", type=int, default=0,
                    help="key/value heads (default: the query heads; fewer is GQA)")
    ap.add_argument("--head-dims", "--head-dim", type=parse_list, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=parse_list, default=parse_list("512..16384"))
    ap.add_argument("--masks", default="none,causal", help="none, causal (comma list)")
    ap.add_argument("--varlen", type=parse_list, default=None,
                    help="one packed batch of these sequence lengths instead of --seqlens "
                         "(bench/varlen_lengths.py)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20, help="at least this many timed calls")
    ap.add_argument("--min-time", type=float, default=0.2, help="and this many seconds")
    ap.add_argument("--max-time", type=float, default=2.0, help="but at most this many")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds the GPU idles before each row's warm-up (as flashattn bench)")
    ap.add_argument("--rotate-bytes", "--rotate", type=parse_bytes, default=-1,
                    help="input sets together exceed this (default 4x the L2; 0: one set)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    args.impls = [x for x in args.impls.split(",") if x]
    args.ops = ["fwd", "bwd"] if args.ops == "both" else [x for x in args.ops.split(",") if x]
    masks = {"none": 0, "causal": 1}
    args.masks = [masks[x] for x in args.masks.split(",") if x]
    for x in args.impls:
        if x not in ("flash", "cudnn"):
            ap.error("unknown implementation %r" % x)
    for x in args.ops:
        if x not in ("fwd", "bwd"):
            ap.error("unknown op %r" % x)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    if not torch.cuda.is_available():
        print("peers.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    if args.rotate_bytes < 0:
        args.rotate_bytes = 4 * l2
    args.rotate_bytes = int(args.rotate_bytes)
    seed = args.seed if args.seed is not None else int(time.time() * 1e6) & 0x7FFFFFFF
    torch.manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    machine = {
        "hostname": socket.gethostname(),
        "device": torch.cuda.get_device_name(0),
        "compute_capability": "%d.%d" % (prop.major, prop.minor),
        "sms": prop.multi_processor_count,
        "l2_bytes": l2,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    print("peers.py: %s, torch %s, CUDA %s, cuDNN %s; warm-up %d, median of >= %d calls and "
          ">= %g s (at most %g s), %g s idle before each row, inputs rotated over >= %.0f MiB, "
          "seed %d" % (machine["device"], machine["torch"], machine["cuda"], machine["cudnn"],
                       args.warmup, args.reps, args.min_time, args.max_time, args.pause,
                       args.rotate_bytes / 2**20, seed), flush=True)
    print("%-5s %-3s %4s %9s %5s %6s  %4s %4s %13s %13s" % (
        "impl", "op", "d", "B/H", "N", "mask", "reps", "sets", "median", "span mean"))
    timer = Timer(torch)
    rows = []
    t0 = time.time()
    if args.varlen:
        todo = [(d, causal, None) for d in args.head_dims for causal in args.masks]
    else:
        todo = list(configs(args))
    for d, causal, n in todo:
        for impl in args.impls:
            if n is None:
                got = time_varlen(torch, F, args, impl, backends[impl], d, causal, dtype, timer)
            else:
                got = time_impl(torch, F, args, impl, backends[impl], d, causal, n, dtype, timer)
            for r in got:
                rows.append(r)
                print(fmt_row(r), flush=True)
    print("peers.py: %d rows in %.1f s" % (len(rows), time.time() - t0))
    if args.json:
        doc = {
            "tool": "bench/peers.py",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(sys.argv),
            "machine": machine,
            "config": {
                "warmup": args.warmup, "reps": args.reps, "min_time_s": args.min_time,
                "max_time_s": args.max_time, "pause_s": args.pause,
                "rotate_bytes": args.rotate_bytes,
                "tokens": args.tokens, "model_dim": args.model_dim, "heads": args.heads,
                "heads_kv": args.heads_kv, "varlen_lens": args.varlen, "seed": str(seed),
                "flops_rule": "fwd 4*B*H*d per visible (query, key) pair, causal square = "
                              "half; bwd 2.5x fwd",
                "time_rule": "median over calls of CUDA event pairs around each call, after "
                             "warm-up calls, inputs rotated over sets; forward with inputs "
                             "requiring grad, backward alone by autograd.grad",
                "inputs": "standard normal",
            },
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote %s" % args.json)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
