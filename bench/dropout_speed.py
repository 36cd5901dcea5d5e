#!/usr/bin/env python3
"""Dropout speed: flashattn.flash_attn_func with dropout_p against PyTorch SDPA's FlashAttention-2
backend with the same dropout_p, in one process, forward and forward+backward; the no-dropout
flashattn time beside them shows what the mask costs. Prints a markdown table (and --json).

Each row: bf16 (--dtype), batch = tokens / seqlen, heads = model dim / head dim, causal or not
(--masks). Times are the median of CUDA-event timed calls after warm-up; TFLOPS count the
attention matmuls (4 b h sq sk d forward, 2.5 times that for the backward; half with causal).

    python3 bench/dropout_speed.py                         # d 128, seqlen 2048 and 8192, p 0.1
    python3 bench/dropout_speed.py --seqlens 512,2048 --masks none,causal --json /tmp/d.json
"""

import argparse
import json
import statistics


def time_ms(torch, call, warmup, reps):
    """Median milliseconds per call, each call between two CUDA events."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def row(torch, F, fa, args, d, sq, causal):
    dt = getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[args.dtype])
    b, h = max(1, args.tokens // sq), max(1, args.model_dim // d)
    mk = lambda: torch.randn(b, sq, h, d, dtype=dt, device="cuda", requires_grad=True)
    q, k, v = mk(), mk(), mk()
    dout = torch.randn(b, sq, h, d, dtype=dt, device="cuda")
    # SDPA takes (b, h, s, d): the transposed views of the same data, as a PyTorch model has
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    dout_t = dout.transpose(1, 2)
    flash = torch.nn.attention.SDPBackend.FLASH_ATTENTION

    def ours(p):
        return lambda: fa.flash_attn_func(q, k, v, dropout_p=p, causal=causal)

    def sdpa(p):
        def call():
            with torch.nn.attention.sdpa_kernel(flash):
                return F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal)
        return call

    def with_bwd(f, g):
        def call():
            out = f()
            out.backward(g)
        return call

    flops = 4.0 * b * h * sq * sq * d * (0.5 if causal else 1.0)
    res = {"d": d, "seqlen": sq, "batch": b, "heads": h, "causal": causal, "p": args.p}
    impls = (("flashattn p=%g" % args.p, ours(args.p), dout), ("flashattn p=0", ours(0.0), dout),
             ("sdpa-flash p=%g" % args.p, sdpa(args.p), dout_t))
    for name, f, g in impls:
        try:
            fwd = time_ms(torch, f, args.warmup, args.reps)
            both = time_ms(torch, with_bwd(f, g), args.warmup, args.reps)
            res[name] = {"fwd_ms": fwd, "fwdbwd_ms": both, "fwd_tflops": flops / fwd / 1e9,
                         "fwdbwd_tflops": 3.5 * flops / both / 1e9}
        except Exception as e:  # recorded, not fatal: one backend refusing leaves the others
            res[name] = {"error": str(e).splitlines()[0][:200]}
    res["kernel"] = fa.last_selection().kernel if hasattr(fa, "last_selection") else ""
    return res, [n for n, _, _ in impls]


def markdown(rows, names):
    head = "| d | seqlen | batch x heads | mask | " + " | ".join(
        f"{n} fwd ms (TFLOPS) | {n} fwd+bwd ms (TFLOPS)" for n in names) + " |"
    lines = [head, "|" + "---|" * (4 + 2 * len(names))]
    for r in rows:
        cells = [str(r["d"]), str(r["seqlen"]), f"{r['batch']} x {r['heads']}",
                 "causal" if r["causal"] else "none"]
        for n in names:
            x = r[n]
            if "error" in x:
                cells += ["error: " + x["error"][:60], ""]
            else:
                cells += [f"{x['fwd_ms']:.3f} ({x['fwd_tflops']:.0f})",
                          f"{x['fwdbwd_ms']:.3f} ({x['fwdbwd_tflops']:.0f})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--p", type=float, default=0.1, help="dropout_p (both sides)")
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--masks", default="none", help="none, causal (comma list)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    ap.add_argument("--model-dim", type=int, default=2048, help="heads = model dim / head dim")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import flashattn as fa
    rows, names = [], []
    for d in (int(x) for x in args.head_dims.split(",")):
        for sq in (int(x) for x in args.seqlens.split(",")):
            for m in args.masks.split(","):
                r, names = row(torch, F, fa, args, d, sq, m == "causal")
                rows.append(r)
    print(f"dropout speed, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashattn kernel {rows[-1]['kernel'] if rows else ''}")
    print(markdown(rows, names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
