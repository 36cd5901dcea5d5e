"""The LSE of the FP8 forward under Hopper's FP8 tensor-core accumulation, emulated on the CPU
(numpy, ml_dtypes), on tests/test_fp8_cuda.c's inputs: e4m3 Q, K = 2 N(0,1), V = N(0,1),
descales uniform in [0.25, 1.75], softmax scale 0.09.

    python bench/probes/fp8_accum.py [draws]

Hopper's wgmma with e4m3 inputs and an f32 accumulator does not add in fp32: the sum keeps
about 13 fraction bits (an "fp22", e8m13; DeepSeek-V3's report: "around 14 bits"; SageAttention2
and Khattak & Mikaitis 2025 model it as alignment to the largest term and truncation). The
scores S = Q K^T then carry a relative error near 2^-13 of the largest partial sum, i.e. up to
~1e-2 in the exponent at the test's score sizes; the LSE carries the row's max score directly.

Models of the accumulation of one dot product over d (k-steps of 32 e4m3 products, as one
`wgmma m64nNk32` instruction):
  exact    the fp64 sum (the float64 reference)
  fp32     fp32 sums (the test's baseline)
  t13/kN   products exact, summed exactly in blocks of N, each block added to the accumulator
           and the result truncated toward zero to 13 fraction bits (1 + 13 significant bits)
  a13/kN   the block's products and the accumulator aligned to the largest exponent among
           them and each truncated to 13 fraction bits of it, then summed exactly (the
           alignment model of the papers)
  p/k128   as a13/k32, with the kernel's partial sum promoted to fp32 every 128 products
           (DeepSeek's promotion: here d 128 is one promotion, so d 256 alone changes)
Prints per model the LSE max |error| against the float64 LSE over the case's rows, for the
shapes the GPU run printed (its LSE max errors: 2.6e-6 baseline, kernel 1e-3..2e-2).

Result (2026-11-28, one draw each; GPU kernel in brackets): b2 sq200 sk333 d128: fp32 1.1e-6,
a13/k32 8.9e-3 (6.9e-3); b1 sq1 sk257 causal: 2e-10, 9.6e-3 (1.2e-3); b1 sq300 sk513 d256:
1.2e-6, 1.9e-2 (7.7e-3); b2 sq1100 sk700 hq8 and b1 sq1100 sk1100 causal (other draws): a13/k32
2.5e-2 (1.5e-2) and 1.5e-2 (1.6e-3). t13 gives 0.6-0.8x of a13; k16 the same as k32; p/k32
the same at d 128, 0.74x at d 256. The 13-bit sums reproduce the GPU's LSE errors; fp32 sums
(the old baseline) are 3-4 orders below them (docs/fp8.md)."""
import sys

import ml_dtypes
import numpy as np

E4 = np.dtype(ml_dtypes.float8_e4m3fn)
FRAC = 13


def trunc(x, frac=FRAC, ref=None):
    """x truncated toward zero to `frac` fraction bits of 2^floor(log2 |ref|) (ref: x)."""
    r = np.abs(x if ref is None else ref)
    e = np.floor(np.log2(np.where(r > 0, r, 1.0)))
    ulp = np.exp2(e - frac)
    return np.where(r > 0, np.trunc(x / ulp) * ulp, x)


def scores(q, k, model):
    """raw dot products q (sq, d) . k (sk, d) under an accumulation model."""
    if model == "exact":
        return q @ k.T
    if model == "fp32":
        acc = np.zeros((q.shape[0], k.shape[0]), np.float32)
        for x in range(q.shape[1]):  # one product at a time, as the baseline's loop
            acc += (q[:, x:x + 1] * k[None, :, x]).astype(np.float32)
        return acc.astype(np.float64)
    kind, blk = model.split("/")
    n = int(blk[1:])
    d = q.shape[1]
    acc = np.zeros((q.shape[0], k.shape[0]))
    promoted = np.zeros_like(acc)
    for k0 in range(0, d, n):
        prod = q[:, None, k0:k0 + n] * k[None, :, k0:k0 + n]  # exact in fp64
        if kind == "t13":
            acc = trunc(acc + prod.sum(-1))
        else:  # a13 and p: align to the largest of the block's terms and the accumulator
            big = np.maximum(np.abs(prod).max(-1), np.abs(acc))
            acc = trunc(acc, ref=big) + trunc(prod, ref=big[..., None]).sum(-1)
            acc = trunc(acc)  # the sum normalised to 13 fraction bits
        if kind == "p" and (k0 + n) % 128 == 0:
            promoted, acc = promoted + acc, np.zeros_like(acc)
    return promoted + acc


def lse_errors(rng, b, sq, sk, hq, hk, d, causal, models):
    q = (2 * rng.standard_normal((b, sq, hq, d))).astype(E4).astype(np.float64)
    k = (2 * rng.standard_normal((b, sk, hk, d))).astype(E4).astype(np.float64)
    ds = 0.25 + 1.5 * rng.random((2, b, hk))
    mask = (np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)) if causal else \
        np.zeros((sq, sk), bool)
    worst = {m: 0.0 for m in models}
    for bi in range(b):
        for h in range(hq):
            j = h // (hq // hk)
            mul = 0.09 * ds[0, bi, j] * ds[1, bi, j]
            ref = None
            for m in ["exact"] + models:
                s = scores(q[bi, :, h], k[bi, :, j], m) * mul
                s[mask] = -np.inf
                mx = s.max(1, keepdims=True)
                ok = np.isfinite(mx[:, 0])
                lse = (mx + np.log(np.exp(s - mx).sum(1, keepdims=True)))[:, 0]
                if m == "exact":
                    ref = lse
                else:
                    worst[m] = max(worst[m], np.abs(lse - ref)[ok].max(initial=0.0))
    return worst


CASES = [  # b, sq, sk, hq, hk, d, causal: the GPU run's printed cases
    (2, 200, 333, 4, 2, 128, 0),
    (1, 1, 257, 8, 2, 128, 1),
    (1, 300, 513, 2, 2, 256, 0),
]
MODELS = ["fp32", "t13/k32", "t13/k16", "a13/k32", "a13/k16", "p/k32"]

if __name__ == "__main__":
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rng = np.random.default_rng(38)
    print("LSE max |error| vs float64 (per draw); GPU: baseline ~3e-6, kernel 1e-3..2e-2")
    for c in CASES:
        for _ in range(draws):
            w = lse_errors(rng, *c, MODELS)
            print(c, "  ".join(f"{m} {w[m]:.3g}" for m in MODELS), flush=True)
