"""The ring's compute alone, on one GPU: per rank of a world of n, the forward (and backward)
calls of flashattn.distributed's schedule (the blocks each ring step runs), timed one after the
other with no transfer and no merge, against the whole sequence's call divided by n. What this
sum loses against whole / n is the kernels' own loss on the smaller shapes; what the ring loses
beyond it (bench_cp, cp_bench.py) is the transfers, the merges and their interference.

    python3 bench/probes/cp_steps.py [--tokens 131072] [--worlds 2,4] [--reps 5]

bf16 N(0,1) inputs, 32/8 heads, d 128, causal, zigzag; CUDA events around each call after a
warm-up call, the median of --reps.
"""
import argparse
import statistics

import torch

import flashattn
from flashattn import _core
from flashattn.distributed import _schedule


def timed(fn, reps):
    fn()
    ms = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    S, H, HK, D = a.tokens, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda h: torch.randn(1, S, h, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(H), mk(HK), mk(HK), mk(H)

    def fwd(qq, kk, vv, causal):
        return _core.attention_forward(qq, kk, vv, _opts=_core.Options(D ** -0.5, causal))

    whole_f = timed(lambda: fwd(q, k, v, True), a.reps)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

    def fb(qq, kk, vv, dd, causal):
        out = flashattn.flash_attn_func(qq, kk, vv, causal=causal)
        torch.autograd.grad(out, (qq, kk, vv), dd)

    whole_fb = timed(lambda: fb(qg, kg, vg, do, True), a.reps)
    print(f"{torch.cuda.get_device_name()}: {S} tokens, heads {H}/{HK}, d {D}, bf16, causal, "
          f"zigzag; whole sequence fwd {whole_f:.2f} ms, fwd+bwd {whole_fb:.2f} ms")
    print("| world | rank | blocks (q x k, causal) | fwd ms | whole/n | ratio | fwd+bwd ms | "
          "whole/n | ratio |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in a.worlds.split(",")):
        for r in range(n):
            qs = [(b, s) for t in range(n) for s in [(r - t) % n]
                  for b in _schedule.blocks(S, n, r, s, True, "zigzag")]
            tf = tfb = 0.0
            shapes = []
            for b, s in qs:
                sq, sk = b.q1 - b.q0, b.k1 - b.k0
                shapes.append(f"{sq // 1024}k x {sk // 1024}k{' c' if b.causal else ''}")
                qq, kk, vv, dd = q[:, :sq], k[:, :sk], v[:, :sk], do[:, :sq]
                tf += timed(lambda: fwd(qq, kk, vv, b.causal), a.reps)
                qq2, kk2, vv2 = (x.detach().requires_grad_() for x in (qq, kk, vv))
                tfb += timed(lambda: fb(qq2, kk2, vv2, dd, b.causal), a.reps)
            print(f"| {n} | {r} | {', '.join(shapes)} | {tf:.2f} | {whole_f / n:.2f} | "
                  f"{whole_f / n / tf:.3f} | {tfb:.2f} | {whole_fb / n:.2f} | "
                  f"{whole_fb / n / tfb:.3f} |")


if __name__ == "__main__":
    main()
