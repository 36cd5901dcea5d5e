/*
 * fp8_wgmma_model.h — a model of the dot products Hopper's FP8 tensor cores compute
 * (`wgmma .e4m3` with an f32 accumulator), for the GPU tests' baselines.
 *
 * The rule: such a wgmma does not add in fp32. Public measurements (DeepSeek-V3 technical
 * report, section 3.3.2: "limited to retaining around 14 bits"; SageAttention2: an "FP22"
 * accumulator, e8m13; Khattak and Mikaitis, "Accurate Models of NVIDIA Tensor Cores",
 * arXiv 2512.07004) agree that the sum keeps about 13 fraction bits; NVIDIA does not document
 * it. Modelled here as the papers describe the alignment: per k-step of 32 products (one
 * `m64nNk32` instruction) the products (exact: 4-bit significands) and the accumulator are
 * aligned to the largest exponent among them, each truncated toward zero to 13 fraction bits
 * of it, summed exactly, and the sum truncated to 13 fraction bits of its own exponent.
 * Why it matters: the scores then err by up to ~2^-13 of the largest partial sum per k-step,
 * ~1e-2 in the exponent at the tests' score sizes, which the LSE (the row's max score plus a
 * log) shows directly; an fp32 baseline (errors ~1e-6) is not the same computation.
 * bench/probes/fp8_accum.py emulates the same model and the LSE errors it gives.
 */
#ifndef FA_TESTS_FP8_WGMMA_MODEL_H
#define FA_TESTS_FP8_WGMMA_MODEL_H

#include <math.h>
#include <stdint.h>

#define FP8_WGMMA_FRAC 13 /* fraction bits the accumulation keeps */
#define FP8_WGMMA_K 32    /* products per k-step (32 bytes of e4m3) */

/* x truncated toward zero to a multiple of ulp, a power of two (inv = 1 / ulp: exact) */
static inline double fp8_wgmma_trunc(double x, double ulp, double inv) {
    return trunc(x * inv) * ulp;
}

/* the ulp of FRAC fraction bits at the exponent of |big| (0 for 0) */
static inline double fp8_wgmma_ulp(double big) {
    int e;
    if (!(big > 0.0)) return 0.0;
    frexp(big, &e); /* big = f 2^e, f in [0.5, 1): its leading bit is 2^(e - 1) */
    return ldexp(1.0, e - 1 - FP8_WGMMA_FRAC);
}

/* sum over x < n of a[x] b[x] (values of e4m3 codes through tab), as the model above */
static inline double fp8_wgmma_dot(const float *tab, const uint8_t *a, const uint8_t *b,
                                   int64_t n) {
    double acc = 0.0;
    for (int64_t k0 = 0; k0 < n; k0 += FP8_WGMMA_K) {
        const int64_t k1 = k0 + FP8_WGMMA_K < n ? k0 + FP8_WGMMA_K : n;
        double big = fabs(acc);
        for (int64_t x = k0; x < k1; x++) {
            const double p = fabs((double)tab[a[x]] * (double)tab[b[x]]);
            if (p > big) big = p;
        }
        const double ulp = fp8_wgmma_ulp(big), inv = 1.0 / ulp;
        if (ulp == 0.0) continue; /* every term 0 */
        double s = fp8_wgmma_trunc(acc, ulp, inv);
        for (int64_t x = k0; x < k1; x++)
            s += fp8_wgmma_trunc((double)tab[a[x]] * (double)tab[b[x]], ulp, inv);
        const double u = fp8_wgmma_ulp(fabs(s));
        acc = u == 0.0 ? 0.0 : fp8_wgmma_trunc(s, u, 1.0 / u);
    }
    return acc;
}

#endif
