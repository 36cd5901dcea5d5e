"""FP8 (e4m3, sm90 kernel) forward against our bf16 forward, CUDA events (docs/fp8.md).

    python bench/fp8_vs_bf16.py [--seqlen 8192] [--d 128] [--batch 2] [--heads 16] [--iters 20]
                                [--only fp8|bf16] [--causal 0|1]

--only and --causal run one kernel and one mask (for a profiler: its launches are then that
kernel's alone, e.g. `ncu -k regex:fwd_sm90 --launch-skip 1 --launch-count 1 ...`).

Per causal/non-causal: ms and TFLOP/s (4 b h s^2 d, halved when causal) of each, the ratio, and
the kernel each ran (the selection record). Inputs N(0, 1); FP8 ones rounded to e4m3 with
descales of 1 (timing only, no accuracy claim).
"""
import argparse

import torch

import flashattn


def time_ms(fn, iters):
    fn()  # warm-up (tensor maps, smem attribute)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", choices=("fp8", "bf16"), default=None)
    ap.add_argument("--causal", type=int, choices=(0, 1), default=None)
    a = ap.parse_args()
    shape = (a.batch, a.seqlen, a.heads, a.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    ones = torch.ones(a.batch, a.heads, device="cuda", dtype=torch.float32)
    for causal in (False, True) if a.causal is None else (bool(a.causal),):
        flops = 4.0 * a.batch * a.heads * a.seqlen * a.seqlen * a.d / (2 if causal else 1)
        row = []
        for name, fn in (
                ("bf16", lambda: flashattn.flash_attn_func(q, k, v, causal=causal)),
                ("fp8", lambda: flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=ones,
                                                          k_descale=ones, v_descale=ones))):
            if a.only and name != a.only:
                continue
            ms = time_ms(fn, a.iters)
            sel = flashattn.last_selection()
            kernel = sel.kernel if sel else "?"
            row.append((name, ms, flops / ms / 1e9, kernel))
        print(f"d {a.d} seqlen {a.seqlen} b {a.batch} h {a.heads} causal {int(causal)}: " +
              "; ".join(f"{n} {ms:.3f} ms {tf:.0f} TFLOP/s ({kn})" for n, ms, tf, kn in row) +
              (f"; fp8/bf16 speed {row[0][1] / row[1][1]:.2f}x" if len(row) == 2 else ""))


if __name__ == "__main__":
    main()
