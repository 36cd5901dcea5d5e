/*
 * test_fp8_cuda.c — the CUDA backend's FP8 (e4m3) forward, the sm90 kernel (src/cuda/fwd_sm90):
 * `test_fp8_cuda cuda` (exit 77 without a GPU).
 *
 *  - on sm_90: fa_fwd on e4m3 Q, K, V against the float64 reference of the dequantised inputs
 *    under the 2x rule (DESIGN.md), head dims 128 and 256, causal and not, a window, GQA,
 *    odd lengths (key tiles cut by the sequence's end, rows that see no key), descales != 1
 *    per (batch, kv head) with a gap between batch rows, bf16 and f16 outputs, LSE; outputs
 *    poisoned (NaN) before the call, and the selection record names the FP8 kernel.
 *  - everywhere with a GPU: what the kernel does not take is FA_ERR_DTYPE with a reason
 *    (e5m2, head dim 64, an f32 output; on other GPUs every FP8 call), nothing written.
 *
 * The baseline. The kernel, as FlashAttention-3's, rounds the probabilities P to e4m3 before
 * P V (the FP8 product's A operand): that rounding (relative 2^-4, and values under 2^-9
 * flushed to zero) dominates its error in O, and no fp32 or bf16 computation has it. And its
 * scores come from Hopper's FP8 tensor cores, whose sums keep about 13 fraction bits, not
 * fp32's 23 (fp8_wgmma_model.h: publicly measured, not documented by NVIDIA): ~1e-2 in the
 * exponent at these score sizes, which the LSE shows directly (an fp32 baseline's LSE errs by
 * ~1e-6; the first GPU run failed every case on the LSE alone, O within its bound). So the
 * baseline is the same computation in the same precision: scores of the FP8 values summed as
 * the model of the tensor cores sums them (descales in the scale, fp32), fp32 softmax
 * against the row's max, P rounded to e4m3, sum of P8 V8 in fp32, times v_descale / l,
 * rounded to the output dtype; LSE in fp32. The kernel's
 * P is taken against the running max (the max so far, as FlashAttention-3's; not the bf16
 * kernel's lazy reference, which put the row's largest probability at up to 2^8, rounded, and
 * failed this rule in 5-30% of draws: bench/probes/fp8_lazy.py).
 *
 * CUDA builds run the cases a second time on a grid of 3 blocks (the kernel's testing hook),
 * so that each block takes many work tiles: the ring of K/V/V^T stages and the Q buffers wrap
 * across tiles; and under the ping-pong turns (forced: not the FP8 default yet) on both
 * grids. A failing case prints where its errors lie (where_errs) before the test fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "fp8_wgmma_model.h"
#include "internal.h"
#include "sweep.h"
#ifdef FA_TEST_CUDA
#include "cuda/fwd_sm90_force.h"
#endif

typedef struct fcase {
    int64_t b, sq, sk, hq, hk, d;
    int causal;
    int64_t wl, wr; /* window (-1: none) */
    fa_dtype out;
} fcase;

static float *dev_copy(const void *host, size_t bytes) {
    float *p = (float *)tk_device_copy_array(host, bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* the key range [lo, hi) of query row i (bottom-right aligned, as fa_params says) */
static void key_range(const fcase *c, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t diag = i + c->sk - c->sq;
    const int64_t wr = c->causal ? 0 : c->wr;
    *lo = c->wl >= 0 ? diag - c->wl : 0;
    *hi = wr >= 0 ? diag + wr + 1 : c->sk;
    if (*lo < 0) *lo = 0;
    if (*hi > c->sk) *hi = c->sk;
}

/* The float64 reference (o64, l64) and the baseline (ob in the output dtype, lb fp32) of
   the case: see the top of this file. */
static void reference(const fcase *c, const uint8_t *q, const uint8_t *k, const uint8_t *v,
                      const float *ds[3], int64_t sb, float scale, double *o64, double *l64,
                      double *ob, double *lb) {
    const float *tab = fa_fp8_table(FA_DTYPE_F8_E4M3);
    const int64_t D = c->d, group = c->hq / c->hk;
    double *s64 = malloc(sizeof(double) * (size_t)c->sk);
    float *s32 = malloc(sizeof(float) * (size_t)c->sk);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->hq; h++) {
            const int64_t hk = h / group;
            const double qd = ds[0][b * sb + hk], kd = ds[1][b * sb + hk], vd = ds[2][b * sb + hk];
            const float mul = scale * (float)qd * (float)kd;
            for (int64_t i = 0; i < c->sq; i++) {
                const uint8_t *qr = q + ((b * c->sq + i) * c->hq + h) * D;
                double *o = o64 + ((b * c->sq + i) * c->hq + h) * D;
                double *obr = ob + ((b * c->sq + i) * c->hq + h) * D;
                const int64_t li = (b * c->hq + h) * c->sq + i;
                int64_t lo, hi;
                key_range(c, i, &lo, &hi);
                if (hi <= lo) { /* no key: O 0, LSE -inf */
                    for (int64_t x = 0; x < D; x++) o[x] = obr[x] = 0.0;
                    l64[li] = lb[li] = -INFINITY;
                    continue;
                }
                double m64 = -INFINITY;
                float m32 = -INFINITY;
                for (int64_t j = lo; j < hi; j++) {
                    const uint8_t *kr = k + ((b * c->sk + j) * c->hk + hk) * D;
                    double a = 0.0;
                    for (int64_t x = 0; x < D; x++) a += (double)tab[qr[x]] * (double)tab[kr[x]];
                    /* the tensor cores' sum: 14 significant bits, exact in fp32 */
                    const float hw = (float)fp8_wgmma_dot(tab, qr, kr, D);
                    s64[j] = a * qd * kd * (double)scale;
                    s32[j] = hw * mul;
                    if (s64[j] > m64) m64 = s64[j];
                    if (s32[j] > m32) m32 = s32[j];
                }
                double l = 0.0;
                float l32 = 0.f;
                for (int64_t x = 0; x < D; x++) o[x] = obr[x] = 0.0;
                float *acc = calloc((size_t)D, sizeof(float));
                for (int64_t j = lo; j < hi; j++) {
                    const uint8_t *vr = v + ((b * c->sk + j) * c->hk + hk) * D;
                    const double p = exp(s64[j] - m64);
                    const float p32 = expf(s32[j] - m32);
                    const float p8 = tab[fa_fp8_encode(FA_DTYPE_F8_E4M3, p32)];
                    l += p;
                    l32 += p32;
                    for (int64_t x = 0; x < D; x++) {
                        o[x] += p * vd * (double)tab[vr[x]];
                        acc[x] += p8 * tab[vr[x]];
                    }
                }
                for (int64_t x = 0; x < D; x++) {
                    o[x] /= l;
                    obr[x] = tk_round_to(c->out, (double)(acc[x] * ((float)vd / l32)));
                }
                free(acc);
                l64[li] = m64 + log(l);
                lb[li] = (double)(m32 + logf(l32));
            }
        }
    free(s64);
    free(s32);
}

/* a tensor of doubles viewed as f64 for tk_compare */
static fa_tensor view64(double *x, int64_t b, int64_t s, int64_t h, int64_t d) {
    return fa_tensor_bshd(x, FA_DTYPE_F64, FA_DEVICE_CPU, b, s, h, d);
}

/* Where a failing case's output errs (for the lead's GPU run): the elements whose error
   exceeds the rule's bound on the max (2 x the baseline's max + slack), counted by batch,
   head, the kernel's 128-row block (aligned to the sequence's end, as tile_of cuts them), the
   16-row warp slice in the block (consumer = slice / 4) and 16-column group; the worst
   element; and per block the kernel's and the baseline's max error, for the worst blocks. */
static int worse(double e, double than) { /* NaN is the worst error */
    return isnan(e) ? !isnan(than) : e > than;
}
static void where_errs(const fcase *c, const fa_tensor *ho, const double *o64, const double *ob,
                       double bound) {
    const int64_t D = c->d, nb = (c->sq + 127) / 128, shift = nb * 128 - c->sq;
    int64_t by_b[8] = {0}, by_h[32] = {0}, by_slice[8] = {0}, by_col[16] = {0}, nbad = 0;
    int64_t *by_blk = calloc((size_t)(c->b * c->hq * nb), sizeof(int64_t));
    double *ek_blk = calloc((size_t)(c->b * c->hq * nb), sizeof(double));
    double *eb_blk = calloc((size_t)(c->b * c->hq * nb), sizeof(double));
    int64_t worst = -1;
    double worst_e = -1;
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t i = 0; i < c->sq; i++)
            for (int64_t h = 0; h < c->hq; h++)
                for (int64_t x = 0; x < D; x++) {
                    const int64_t at = ((b * c->sq + i) * c->hq + h) * D + x;
                    const int64_t blk = (b * c->hq + h) * nb + (i + shift) / 128;
                    const double e = fabs(tk_get(ho, at) - o64[at]), eb = fabs(ob[at] - o64[at]);
                    if (worse(e, worst_e)) worst_e = e, worst = at;
                    if (worse(e, ek_blk[blk])) ek_blk[blk] = e;
                    if (eb > eb_blk[blk]) eb_blk[blk] = eb;
                    if (e <= bound) continue;
                    nbad++;
                    by_blk[blk]++;
                    by_b[b < 8 ? b : 7]++;
                    by_h[h < 32 ? h : 31]++;
                    by_slice[((i + shift) % 128) / 16]++;
                    by_col[x / 16 < 16 ? x / 16 : 15]++;
                }
    printf("    where: %lld elements over the bound %.3g; worst at b %lld row %lld head %lld col "
           "%lld: got %.6g ref %.6g base %.6g\n",
           (long long)nbad, bound, (long long)(worst / D / c->hq / c->sq),
           (long long)(worst / D / c->hq % c->sq), (long long)(worst / D % c->hq),
           (long long)(worst % D), tk_get(ho, worst), o64[worst], ob[worst]);
    printf("    by batch:");
    for (int64_t b = 0; b < c->b && b < 8; b++) printf(" %lld", (long long)by_b[b]);
    printf("\n    by head:");
    for (int64_t h = 0; h < c->hq && h < 32; h++) printf(" %lld", (long long)by_h[h]);
    printf("\n    by 16-row slice of the 128-row block (consumer 0: 0-3, 1: 4-7):");
    for (int k = 0; k < 8; k++) printf(" %lld", (long long)by_slice[k]);
    printf("\n    by 16-column group:");
    for (int64_t k = 0; k < D / 16 && k < 16; k++) printf(" %lld", (long long)by_col[k]);
    printf("\n    blocks (b, h, block: rows; bad elements, kernel max err, baseline max err), "
           "the 12 worst of %lld:\n", (long long)(c->b * c->hq * nb));
    for (int n = 0; n < 12; n++) {
        int64_t best = -1;
        for (int64_t k = 0; k < c->b * c->hq * nb; k++) /* listed ones are -1; NaN first */
            if (!(ek_blk[k] < 0) && (best < 0 || worse(ek_blk[k], ek_blk[best]))) best = k;
        if (best < 0) break;
        const int64_t m = best % nb, lo = m * 128 - shift;
        printf("      b %lld h %lld block %lld: rows %lld..%lld; %lld, %.3g, %.3g\n",
               (long long)(best / nb / c->hq), (long long)(best / nb % c->hq), (long long)m,
               (long long)(lo < 0 ? 0 : lo), (long long)(lo + 127), (long long)by_blk[best],
               ek_blk[best], eb_blk[best]);
        ek_blk[best] = -1;
    }
    free(by_blk), free(ek_blk), free(eb_blk);
}

/* The mean signed LSE error over the rows that see a key: the model's truncation toward zero
   makes a baseline's LSE fall below the reference (scores shrink); the kernel's should too,
   by about as much, if the model describes the tensor cores (printed for the GPU run). */
static double lse_bias(const float *lf, const double *ld, const double *ref, int64_t n) {
    double s = 0.0;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i])) s += (lf ? (double)lf[i] : ld[i]) - ref[i], c++;
    return c ? s / (double)c : 0.0;
}

/* 1: ran and passed; 0: the GPU refused FP8 as not sm_90 (checked here); -1: ran and failed
   the rule (printed with where_errs) */
static int run_case(const fcase *c, uint64_t seed) {
    tk_rng r;
    tk_rng_init(&r, seed);
    const int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hk * c->d;
    const int64_t nl = c->b * c->hq * c->sq;
    uint8_t *q = malloc((size_t)nq), *k = malloc((size_t)nk), *v = malloc((size_t)nk);
    for (int64_t i = 0; i < nq; i++) q[i] = fa_fp8_encode(FA_DTYPE_F8_E4M3, 2.0 * tk_rng_normal(&r));
    for (int64_t i = 0; i < nk; i++) k[i] = fa_fp8_encode(FA_DTYPE_F8_E4M3, 2.0 * tk_rng_normal(&r));
    for (int64_t i = 0; i < nk; i++) v[i] = fa_fp8_encode(FA_DTYPE_F8_E4M3, tk_rng_normal(&r));
    /* descales per (batch, kv head), batch rows hk + 1 apart (a gap the kernel must skip) */
    const int64_t sb = c->hk + 1, nds = c->b * sb;
    float *dsh[3];
    for (int w = 0; w < 3; w++) {
        dsh[w] = malloc(sizeof(float) * (size_t)nds);
        for (int64_t i = 0; i < nds; i++) dsh[w][i] = (float)(0.25 + 1.5 * tk_rng_uniform(&r));
    }
    const size_t osz = fa_dtype_size(c->out);
    void *poison = malloc((size_t)nq * osz + (size_t)nl * 4);
    memset(poison, 0xff, (size_t)nq * osz + (size_t)nl * 4); /* NaN in f16, bf16 and f32 */
    void *dq = dev_copy(q, (size_t)nq), *dk = dev_copy(k, (size_t)nk), *dv = dev_copy(v, (size_t)nk);
    void *dout = dev_copy(poison, (size_t)nq * osz), *dlse = dev_copy(poison, (size_t)nl * 4);
    float *dds[3];
    for (int w = 0; w < 3; w++) dds[w] = dev_copy(dsh[w], sizeof(float) * (size_t)nds);

    fa_tensor tq = fa_tensor_bshd(dq, FA_DTYPE_F8_E4M3, FA_DEVICE_CUDA, c->b, c->sq, c->hq, c->d);
    fa_tensor tk = fa_tensor_bshd(dk, FA_DTYPE_F8_E4M3, FA_DEVICE_CUDA, c->b, c->sk, c->hk, c->d);
    fa_tensor tv = fa_tensor_bshd(dv, FA_DTYPE_F8_E4M3, FA_DEVICE_CUDA, c->b, c->sk, c->hk, c->d);
    fa_tensor to = fa_tensor_bshd(dout, c->out, FA_DEVICE_CUDA, c->b, c->sq, c->hq, c->d);
    fa_tensor tl = fa_tensor_3d(dlse, FA_DTYPE_F32, FA_DEVICE_CUDA, c->b, c->hq, c->sq);
    fa_params p = fa_params_default();
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->causal ? -1 : c->wr;
    p.softmax_scale = 0.09f;
    p.q_descale = dds[0];
    p.k_descale = dds[1];
    p.v_descale = dds[2];
    p.descale_batch_stride = sb;
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_OK);
    const fa_status st = fa_fwd(ctx, &tq, &tk, &tv, &p, &to, &tl);
    int ran = 1;
    char what[200];
    snprintf(what, sizeof what, "b%lld sq%lld sk%lld hq%lld hk%lld d%lld causal%d win(%lld,%lld) out %s",
             (long long)c->b, (long long)c->sq, (long long)c->sk, (long long)c->hq,
             (long long)c->hk, (long long)c->d, c->causal, (long long)c->wl, (long long)c->wr,
             fa_dtype_name(c->out));
    if (st == FA_ERR_DTYPE && strstr(fa_last_error(ctx), "sm_90 GPUs only")) {
        ran = 0; /* another GPU: refused with the reason, nothing written */
        void *back = malloc((size_t)nq * osz);
        assert_int_equal(tk_device_read_array(back, dout, (size_t)nq * osz), 0);
        assert_memory_equal(back, poison, (size_t)nq * osz);
        free(back);
    } else {
        if (st != FA_OK) fail_msg("%s: %s", what, fa_last_error(ctx));
        const fa_selection *sel = fa_last_selection(ctx);
        assert_non_null(sel);
        if (!strstr(sel->kernel, "sm90_fwd_f8e4m3")) fail_msg("%s: ran %s", what, sel->kernel);
        void *oh = malloc((size_t)nq * osz);
        float *lh = malloc((size_t)nl * 4);
        assert_int_equal(tk_device_read_array(oh, dout, (size_t)nq * osz), 0);
        assert_int_equal(tk_device_read_array(lh, dlse, (size_t)nl * 4), 0);
        double *o64 = malloc(sizeof(double) * (size_t)nq), *ob = malloc(sizeof(double) * (size_t)nq);
        double *l64 = malloc(sizeof(double) * (size_t)nl), *lb = malloc(sizeof(double) * (size_t)nl);
        const float *ds[3] = {dsh[0], dsh[1], dsh[2]};
        reference(c, q, k, v, ds, sb, p.softmax_scale, o64, l64, ob, lb);
        const fa_tensor ho = fa_tensor_bshd(oh, c->out, FA_DEVICE_CPU, c->b, c->sq, c->hq, c->d);
        const fa_tensor hl = fa_tensor_3d(lh, FA_DTYPE_F32, FA_DEVICE_CPU, c->b, c->hq, c->sq);
        const fa_tensor r64 = view64(o64, c->b, c->sq, c->hq, c->d), b64 = view64(ob, c->b, c->sq, c->hq, c->d);
        const fa_tensor rl = fa_tensor_3d(l64, FA_DTYPE_F64, FA_DEVICE_CPU, c->b, c->hq, c->sq);
        const fa_tensor bl = fa_tensor_3d(lb, FA_DTYPE_F64, FA_DEVICE_CPU, c->b, c->hq, c->sq);
        const tk_err ek = tk_compare(&ho, &r64), eb = tk_compare(&b64, &r64);
        const tk_err lk = tk_compare(&hl, &rl), lbe = tk_compare(&bl, &rl);
        double slack, lslack;
        const int ok = tk_rule(&ek, &eb, c->out, 0, &slack);
        const int lok = tk_rule(&lk, &lbe, FA_DTYPE_F32, 0, &lslack);
        printf("  %s: %s O max %.3g (base %.3g) mean %.3g (base %.3g); LSE max %.3g (base %.3g) "
               "signed mean %.3g (base %.3g)\n",
               what, sel->kernel, ek.max_abs, eb.max_abs, ek.mean_abs, eb.mean_abs, lk.max_abs,
               lbe.max_abs, lse_bias(lh, NULL, l64, nl), lse_bias(NULL, lb, l64, nl));
        if (!ok || !lok || ek.nonfinite || lk.nonfinite) {
            printf("  FAILED %s (seed %llu): O max %.3g (base %.3g) mean %.3g (base %.3g) "
                   "nonfinite %d (first %lld); LSE max %.3g (base %.3g) nonfinite %d\n",
                   what, (unsigned long long)seed, ek.max_abs, eb.max_abs, ek.mean_abs,
                   eb.mean_abs, ek.nonfinite, (long long)ek.first_nonfinite, lk.max_abs,
                   lbe.max_abs, lk.nonfinite);
            where_errs(c, &ho, o64, ob, 2.0 * eb.max_abs + slack);
            ran = -1;
        }
        free(oh), free(lh), free(o64), free(ob), free(l64), free(lb);
    }
    fa_context_destroy(ctx);
    void *devs[] = {dq, dk, dv, dout, dlse, dds[0], dds[1], dds[2]};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) tk_device_free_array(devs[i]);
    free(q), free(k), free(v), free(poison);
    for (int w = 0; w < 3; w++) free(dsh[w]);
    return ran;
}

/* b, sq, sk, hq, hk, d, causal, window, out */
static const fcase cases[] = {
    {2, 200, 333, 4, 2, 128, 0, -1, -1, FA_DTYPE_BF16}, /* GQA 2, partial key tile */
    {2, 131, 200, 4, 2, 128, 0, -1, -1, FA_DTYPE_BF16}, /* test_fp8.py's d 128 unmasked */
    /* 144 tiles: on 132 SMs blocks take two (the ring and Q buffers across tiles) */
    {2, 1100, 700, 8, 2, 128, 0, -1, -1, FA_DTYPE_BF16},
    {2, 333, 333, 4, 4, 128, 1, -1, -1, FA_DTYPE_F16},  /* causal, odd */
    {1, 1, 257, 8, 2, 128, 1, -1, -1, FA_DTYPE_BF16},   /* one query row, GQA 4 */
    {2, 130, 77, 4, 1, 128, 1, -1, -1, FA_DTYPE_BF16},  /* rows with no key (LSE -inf) */
    {1, 257, 1000, 2, 2, 128, 0, 64, 16, FA_DTYPE_F16}, /* a window */
    {1, 1100, 1100, 2, 1, 128, 1, -1, -1, FA_DTYPE_BF16}, /* many key tiles */
    {1, 300, 513, 2, 2, 256, 0, -1, -1, FA_DTYPE_BF16}, /* d 256 */
    {2, 190, 190, 4, 2, 256, 1, -1, -1, FA_DTYPE_F16},
};
#define NCASES (sizeof cases / sizeof *cases)

/* every case; grid > 0: on a persistent grid of that many blocks; pingpong: under the
   ping-pong turns (CUDA builds: the kernel's testing hook) */
static void run_cases(int grid, int pingpong) {
#ifdef FA_TEST_CUDA
    const fa_sm90_fwd_force f = {grid, pingpong ? 2 : 0, 0, 0, 0};
    fa_sm90_fwd_force_set(grid > 0 || pingpong ? &f : NULL);
#else
    if (grid > 0 || pingpong) {
        printf("fp8 cuda forward, grid %d pingpong %d: not a CUDA build (skipped)\n", grid,
               pingpong);
        return;
    }
#endif
    const uint64_t seed = tk_seed();
    int ran = 0, failed = 0;
    for (size_t i = 0; i < NCASES; i++) {
        const int r = run_case(&cases[i], seed + i);
        ran += r != 0;
        failed += r < 0;
    }
#ifdef FA_TEST_CUDA
    fa_sm90_fwd_force_set(NULL);
#endif
    printf("fp8 cuda forward (grid %d, 0: one block per SM; pingpong %d): %d of %d cases run, "
           "%d failed the 2x rule (seed %llu)%s\n", grid, pingpong, ran, (int)NCASES, failed,
           (unsigned long long)seed,
           ran ? "" : "; not an sm_90 GPU: every case refused with FA_ERR_DTYPE");
    if (failed) fail_msg("%d of %d cases failed the 2x rule (above: where)", failed, ran);
}

static void fwd_matches_reference(void **state) {
    (void)state;
    run_cases(0, 0);
}

/* a grid of 3 blocks: each takes several work tiles (every case has 4 or more), so K/V/V^T
   stages and Q buffers are reused across tiles and the ring's phases wrap */
static void fwd_small_grid(void **state) {
    (void)state;
    run_cases(3, 0);
}

/* the ping-pong turns (forced only: the FP8 default is the free overlap), on every SM and on
   3 blocks */
static void fwd_pingpong(void **state) {
    (void)state;
    run_cases(0, 1);
    run_cases(3, 1);
}

/* What the kernel does not take: FA_ERR_DTYPE naming FP8, out untouched. */
static void refusals(void **state) {
    (void)state;
    static const struct {
        fa_dtype in, out;
        int64_t d;
        const char *why;
    } bad[] = {{FA_DTYPE_F8_E5M2, FA_DTYPE_BF16, 128, "e5m2"},
               {FA_DTYPE_F8_E4M3, FA_DTYPE_BF16, 64, "head dim"},
               {FA_DTYPE_F8_E4M3, FA_DTYPE_F32, 128, "output"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const int64_t n = 2 * 16 * 2 * bad[i].d;
        uint8_t *h = malloc((size_t)n * 4);
        memset(h, 0x38, (size_t)n); /* 1.0 */
        void *dq = dev_copy(h, (size_t)n);
        memset(h, 0xff, (size_t)n * 4);
        void *dout = dev_copy(h, (size_t)n * 4);
        fa_tensor tq = fa_tensor_bshd(dq, bad[i].in, FA_DEVICE_CUDA, 2, 16, 2, bad[i].d);
        fa_tensor to = fa_tensor_bshd(dout, bad[i].out, FA_DEVICE_CUDA, 2, 16, 2, bad[i].d);
        fa_params p = fa_params_default();
        fa_context *ctx = NULL;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_OK);
        const fa_status st = fa_fwd(ctx, &tq, &tq, &tq, &p, &to, NULL);
        if (st != FA_ERR_DTYPE || !strstr(fa_last_error(ctx), "FP8"))
            fail_msg("%s: status %d: %s", bad[i].why, (int)st, fa_last_error(ctx));
        printf("  refused (%s): %s\n", bad[i].why, fa_last_error(ctx));
        uint8_t *back = malloc((size_t)n * 4);
        assert_int_equal(tk_device_read_array(back, dout, (size_t)n * fa_dtype_size(bad[i].out)), 0);
        for (int64_t j = 0; j < n * (int64_t)fa_dtype_size(bad[i].out); j++)
            assert_int_equal(back[j], 0xff);
        free(back), free(h);
        fa_context_destroy(ctx);
        tk_device_free_array(dq);
        tk_device_free_array(dout);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "cuda") != 0) {
        fprintf(stderr, "usage: %s cuda\n", argv[0]);
        return 2;
    }
    if (!tk_device_available() || !sweep_have_cuda()) {
        printf("test_fp8_cuda: no CUDA device (skipped)\n");
        return SWEEP_SKIPPED;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fwd_matches_reference),
        cmocka_unit_test(fwd_small_grid),
        cmocka_unit_test(fwd_pingpong),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
