"""Whether GPUs of one machine slow each other down: the same attention forward timed on GPU 0
alone, then on every GPU at once (one process each, started together by a barrier), with the SM
clock and power each GPU reported mid-run. No transfer between them: what is lost with n GPUs
busy is the machine's (clocks, power, cooling), and bounds any n-GPU scaling efficiency.

    python3 bench/probes/gpus_together.py [--tokens 65536] [--reps 10]

PyTorch SDPA (flash backend), bf16, 32 heads, d 128, causal, N(0,1) inputs; CUDA events around
each call after 3 warm-up calls, the median.
"""
import argparse
import statistics
import subprocess

import torch
import torch.multiprocessing as mp


def worker(dev, tokens, reps, barrier, out):
    import torch.nn.functional as F
    torch.cuda.set_device(dev)
    q, k, v = (torch.randn(1, 32, tokens, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        barrier.wait()
        ms = []
        for i in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
            if i == reps // 2 and dev == 0:
                out["smi"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=index,clocks.sm,power.draw,temperature.gpu",
                     "--format=csv,noheader"], capture_output=True, text=True).stdout
    out[dev] = statistics.median(ms)


def run(n, tokens, reps):
    ctx = mp.get_context("spawn")
    barrier, man = ctx.Barrier(n), ctx.Manager()
    out = man.dict()
    ps = [ctx.Process(target=worker, args=(d, tokens, reps, barrier, out)) for d in range(n)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return dict(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    n = torch.cuda.device_count()
    fl = 4 * a.tokens ** 2 * 32 * 128 * 0.5
    print(f"{n} x {torch.cuda.get_device_name()}: SDPA flash fwd, {a.tokens} tokens, 32 heads, "
          f"d 128, bf16, causal; median of {a.reps}")
    for k in (1, n):
        r = run(k, a.tokens, a.reps)
        ms = [r[d] for d in range(k)]
        print(f"{k} GPU(s) busy: ms " + " / ".join(f"{x:.2f}" for x in ms) +
              f"; TFLOP/s " + " / ".join(f"{fl / x * 1e-9:.0f}" for x in ms))
        print("  mid-run (index, SM clock, power, temperature):\n  " +
              r.get("smi", "?").strip().replace("\n", "\n  "))


if __name__ == "__main__":
    main()
