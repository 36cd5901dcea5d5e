#!/usr/bin/env python3
"""flashattn's CPU kernels against PyTorch's CPU scaled_dot_product_attention, in one run.

Runs `flashattn bench --cpu` (B 1, H 8, d 64/128, seqlen 512/2048/8192, causal and not,
fp32 and bf16, forward and backward, GFLOP/s and % of the FMA peak the tool measures), then
the same shapes through torch SDPA at the same thread count, with the tool's method: standard
normal inputs in BSHD memory (SDPA gets [B, H, S, D] views), warm-up calls, the median of the
timed calls; the forward runs with inputs that require grad (as in training, so both sides
write the softmax statistics), the backward alone by torch.autograd.grad on a retained graph.
FLOPs: forward 4 B H N^2 d (half when causal), backward 2.5x forward. Prints one row per shape
with both rates and ours / torch.

    /tmp/torchvenv/bin/python bench/cpu_vs_torch.py --tool build/tools/flashattn \\
        --json /tmp/cpu.json
    ... --head-dim 128 --seqlens 2048 --dtype f32 --op fwd     # narrower

torch is not a dependency of the project: use a scratch venv with the CPU wheel.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def flops(row):
    f = 4.0 * row["batch"] * row["heads_q"] * row["seqlen_q"] * row["seqlen_k"] * row["head_dim"]
    if row["causal"]:
        f *= 0.5
    return f * (2.5 if row["op"] == "bwd" else 1.0)


def time_torch(torch, row, threads, warmup, reps, min_time):
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[row["dtype"]]
    b, h, n, d = row["batch"], row["heads_q"], row["seqlen_k"], row["head_dim"]
    g = torch.Generator().manual_seed(1234)

    def bshd():
        x = torch.randn(b, n, h, d, generator=g).to(dt)
        return x.transpose(1, 2).requires_grad_(True)  # [B, H, S, D] view of BSHD memory

    q, k, v = bshd(), bshd(), bshd()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal = bool(row["causal"])
    if row["op"] == "fwd":
        def call():
            sdpa(q, k, v, is_causal=causal)
    else:
        out = sdpa(q, k, v, is_causal=causal)
        dout = torch.randn(out.shape, generator=g).to(dt)

        def call():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(warmup):
        call()
    times = []
    start = time.perf_counter()
    while len(times) < reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", default="build/tools/flashattn")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--head-dim")
    ap.add_argument("--seqlens")
    ap.add_argument("--dtype")
    ap.add_argument("--op")
    ap.add_argument("--masks")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.json")
        cmd = [a.tool, "bench", "--cpu", "--threads", str(a.threads), "--warmup", str(a.warmup),
               "--reps", str(a.reps), "--json", path]
        for opt in ("head_dim", "seqlens", "dtype", "op", "masks"):
            if getattr(a, opt):
                cmd += ["--" + opt.replace("_", "-"), getattr(a, opt)]
        if a.min_time > 0:
            cmd += ["--min-time", str(a.min_time)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with open(path) as f:
            ours = json.load(f)
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f}")
    hdr = (f"{'op':3} {'type':5} {'d':>4} {'N':>6} {'mask':6} {'ours ms':>9} {'GFLOP/s':>8} "
           f"{'%peak':>6} {'torch ms':>9} {'GFLOP/s':>8} {'%peak':>6} {'ratio':>6}")
    print(hdr)
    rows = []
    for r in ours["rows"]:
        if r.get("status") != "ok" and r.get("status") != "FA_OK" and r.get("median_s", 0) <= 0:
            continue
        t = time_torch(torch, r, a.threads, a.warmup, a.reps, a.min_time)
        tg = flops(r) / t * 1e-9
        peak = r.get("peak_gflops") or 0
        ratio = r["median_s"] and t / r["median_s"]
        pct = lambda g: f"{100 * g / peak:5.1f}%" if peak else "     -"
        print(f"{r['op']:3} {r['dtype']:5} {r['head_dim']:4} {r['seqlen_k']:6} "
              f"{'causal' if r['causal'] else 'none':6} {r['median_s'] * 1e3:9.2f} "
              f"{r['gflops']:8.1f} {pct(r['gflops'])} {t * 1e3:9.2f} {tg:8.1f} {pct(tg)} "
              f"{ratio:6.2f}", flush=True)
        rows.append({**r, "torch_median_s": t, "torch_gflops": tg, "speedup_vs_torch": ratio})
    worst = min((x["speedup_vs_torch"] for x in rows), default=0)
    print(f"\nlowest ours / torch: {worst:.2f}x over {len(rows)} rows")
    if a.json:
        out = dict(ours, rows=rows, torch_version=torch.__version__,
                   torch_threads=torch.get_num_threads(), loadavg_end=os.getloadavg()[0])
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print("wrote", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
