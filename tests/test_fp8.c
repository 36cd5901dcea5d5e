/*
 * test_fp8.c — FP8 inputs (src/fp8.h, the CPU forward and KV-cache kernels) and
 * fa_quantize_fp8 (src/quantize.c).
 *
 *  - the decode tables against a bit-level decoder; the encoder's round trip, ties, saturation
 *  - fa_fwd / fa_fwd_kvcache on FP8 inputs against the float64 reference of the dequantised
 *    inputs under the 2x rule (the baseline: the fp32 plain algorithm on the same values), odd
 *    sizes, GQA, masks, descales per (batch, kv head), every output dtype
 *  - refusals (nothing written), NaN encodings, the quantiser's contract
 *  - the accuracy experiment of the FlashAttention-3 paper: RMS error of O for per-tensor FP8,
 *    block scales, and block scales + Hadamard; `test_fp8 --table` prints the committed table.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "internal.h"
#include "sweep.h"

static const fa_dtype FP8[2] = {FA_DTYPE_F8_E4M3, FA_DTYPE_F8_E5M2};

/* An independent decoder: the formats' definitions evaluated on the bit fields. */
static double decode_bits(fa_dtype dt, unsigned c) {
    const int e4 = dt == FA_DTYPE_F8_E4M3, mb = e4 ? 3 : 2, eb = e4 ? 4 : 5, bias = e4 ? 7 : 15;
    const unsigned E = (c >> mb) & ((1u << eb) - 1), M = c & ((1u << mb) - 1);
    const double s = (c & 0x80) ? -1.0 : 1.0;
    if (e4 && E == 15 && M == 7) return NAN;
    if (!e4 && E == 31) return M ? NAN : s * INFINITY;
    if (E == 0) return s * ldexp((double)M, 1 - bias - mb);
    return s * ldexp(1.0 + (double)M / (1 << mb), (int)E - bias);
}

static void tables(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        const float *t = fa_fp8_table(FP8[f]);
        int nans = 0;
        for (unsigned c = 0; c < 256; c++) {
            const double want = decode_bits(FP8[f], c);
            if (isnan(want)) {
                assert_true(isnan(t[c]));
                nans++;
                continue;
            }
            assert_true((double)t[c] == want);
            assert_int_equal(signbit(t[c]) != 0, (c & 0x80) != 0);
            /* round trip: every finite value encodes to its own code */
            if (!isinf(want)) assert_int_equal(fa_fp8_encode(FP8[f], want), c);
        }
        assert_int_equal(nans, f == 0 ? 2 : 6); /* e4m3: 0x7f, 0xff only */
        const double max = fa_fp8_max(FP8[f]);
        assert_true(t[f == 0 ? 0x7e : 0x7b] == max);
        /* ties between neighbours go to the even code; past max saturates */
        for (unsigned c = 0; c + 1 < (f == 0 ? 0x7eu : 0x7bu); c++) {
            const double mid = 0.5 * ((double)t[c] + (double)t[c + 1]);
            assert_int_equal(fa_fp8_encode(FP8[f], mid), (c & 1) ? c + 1 : c);
            assert_int_equal(fa_fp8_encode(FP8[f], -mid), 0x80 | ((c & 1) ? c + 1 : c));
        }
        assert_int_equal(fa_fp8_encode(FP8[f], 1e30), f == 0 ? 0x7e : 0x7b);
        assert_int_equal(fa_fp8_encode(FP8[f], -max * 1.01), f == 0 ? 0xfe : 0xfb);
        assert_true(isnan(t[fa_fp8_encode(FP8[f], NAN)]));
    }
    assert_string_equal(fa_dtype_name(FA_DTYPE_F8_E5M2), "f8e5m2");
    assert_int_equal(fa_dtype_size(FA_DTYPE_F8_E5M2), 1);
}

/* ---- tensors ---- */

typedef struct buf {
    fa_tensor t;
    void *data;
} buf;

static buf mk(fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d) {
    buf r;
    const size_t n = (size_t)(b * s * h * d) * fa_dtype_size(dt);
    r.data = malloc(n ? n : 1);
    assert_non_null(r.data);
    memset(r.data, 0xff, n); /* poison: NaN in every dtype */
    r.t = fa_tensor_bshd(r.data, dt, FA_DEVICE_CPU, b, s, h, d);
    return r;
}

static buf mk_lse(int64_t b, int64_t h, int64_t s, fa_dtype dt) {
    buf r;
    const size_t n = (size_t)(b * h * s) * fa_dtype_size(dt);
    r.data = malloc(n ? n : 1);
    assert_non_null(r.data);
    memset(r.data, 0xff, n);
    r.t = fa_tensor_3d(r.data, dt, FA_DEVICE_CPU, b, h, s);
    return r;
}

static int64_t numel(const fa_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Random finite FP8 codes: N(0, sigma) values rounded to the format. */
static void fill_codes(buf *x, fa_dtype dt, tk_rng *r, double sigma) {
    uint8_t *c = (uint8_t *)x->data;
    for (int64_t i = 0; i < numel(&x->t); i++)
        c[i] = fa_fp8_encode(dt, sigma * tk_rng_normal(r));
}

/* dst (f64 or f32, same shape) = descale(b, h / group) * decoded src. */
static void dequant(buf *dst, const buf *src, const float *ds, int64_t sb, int64_t group) {
    const fa_tensor *t = &src->t;
    const float *tab = fa_fp8_table(t->dtype);
    const int64_t B = t->shape[0], S = t->shape[1], H = t->shape[2], D = t->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t x = 0; x < D; x++) {
                    const int64_t i = ((b * S + s) * H + h) * D + x;
                    const double v = (ds ? ds[b * sb + h / group] : 1.0) *
                                     (double)tab[((const uint8_t *)src->data)[i]];
                    if (dst->t.dtype == FA_DTYPE_F64) ((double *)dst->data)[i] = v;
                    else ((float *)dst->data)[i] = (float)v;
                }
}

static fa_context *ctx_algo(fa_algo a) {
    fa_context *c = NULL;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_algo(c, a), FA_OK);
    return c;
}

/* ---- the kernel against the reference of its dequantised inputs ---- */

typedef struct fcase {
    int64_t b, sq, sk, hq, hk, d;
    int causal, kvcache, stride0;
    fa_dtype in, out;
} fcase;

static void run_case(const fcase *c, uint64_t seed) {
    tk_rng r;
    tk_rng_init(&r, seed);
    const int64_t group = c->hq / c->hk;
    buf q = mk(c->in, c->b, c->sq, c->hq, c->d), k = mk(c->in, c->b, c->sk, c->hk, c->d),
        v = mk(c->in, c->b, c->sk, c->hk, c->d);
    fill_codes(&q, c->in, &r, 2.0);
    fill_codes(&k, c->in, &r, 2.0);
    fill_codes(&v, c->in, &r, 1.0);
    /* descales per (batch, kv head), rows a gap apart (or one row for every batch entry) */
    const int64_t sb = c->stride0 ? 0 : c->hk + 1;
    float *ds[3];
    for (int w = 0; w < 3; w++) {
        ds[w] = malloc(sizeof(float) * (size_t)(c->b * (c->hk + 1)));
        for (int64_t i = 0; i < c->b * (c->hk + 1); i++)
            ds[w][i] = (float)(0.25 + 1.5 * tk_rng_uniform(&r));
    }
    fa_params p = fa_params_default();
    p.causal = c->causal;
    p.q_descale = ds[0];
    p.k_descale = ds[1];
    p.v_descale = ds[2];
    p.descale_batch_stride = sb;
    p.softmax_scale = 0.3f;

    buf o = mk(c->out, c->b, c->sq, c->hq, c->d), lse = mk_lse(c->b, c->hq, c->sq, FA_DTYPE_F32);
    fa_context *ctx = ctx_algo(FA_ALGO_AUTO);
    fa_status st;
    int32_t *seqlens = malloc(sizeof(int32_t) * (size_t)c->b);
    for (int64_t i = 0; i < c->b; i++) seqlens[i] = (int32_t)c->sk;
    if (c->kvcache) {
        /* the last (up to) 3 keys arrive as k_new/v_new: copies of what the cache holds there,
           so the append path runs and the reference stays that of the whole K, V */
        const int64_t nn = c->sk < 3 ? c->sk : 3;
        buf kn = mk(c->in, c->b, nn, c->hk, c->d), vn = mk(c->in, c->b, nn, c->hk, c->d);
        const size_t row = (size_t)(c->hk * c->d);
        for (int64_t b = 0; b < c->b; b++) {
            seqlens[b] = (int32_t)(c->sk - nn);
            memcpy((uint8_t *)kn.data + (size_t)b * nn * row,
                   (uint8_t *)k.data + ((size_t)b * c->sk + (size_t)(c->sk - nn)) * row, nn * row);
            memcpy((uint8_t *)vn.data + (size_t)b * nn * row,
                   (uint8_t *)v.data + ((size_t)b * c->sk + (size_t)(c->sk - nn)) * row, nn * row);
            memset((uint8_t *)k.data + ((size_t)b * c->sk + (size_t)(c->sk - nn)) * row, 0x7f,
                   nn * row); /* NaN until the append overwrites them */
        }
        fa_kvcache kc = {k.t, v.t, seqlens, NULL, 0, 0};
        st = fa_fwd_kvcache(ctx, &q.t, &kc, &kn.t, &vn.t, &p, 0, &o.t, &lse.t);
        /* the append wrote k_new over the NaN rows (the reference reads k as it is now) */
        for (int64_t b = 0; st == FA_OK && b < c->b; b++)
            assert_memory_equal((uint8_t *)k.data + ((size_t)b * c->sk + (size_t)(c->sk - nn)) * row,
                                (uint8_t *)kn.data + (size_t)b * nn * row, nn * row);
        free(kn.data), free(vn.data);
    } else {
        st = fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, &lse.t);
    }
    if (st != FA_OK) fail_msg("%s", fa_last_error(ctx));
    const fa_selection *sel = fa_last_selection(ctx);
    assert_non_null(sel);
    assert_non_null(strstr(sel->kernel, fa_dtype_name(c->in)));

    /* reference: f64 naive on the dequantised values; baseline: fp32 plain on them */
    buf q64 = mk(FA_DTYPE_F64, c->b, c->sq, c->hq, c->d), k64 = mk(FA_DTYPE_F64, c->b, c->sk, c->hk, c->d),
        v64 = mk(FA_DTYPE_F64, c->b, c->sk, c->hk, c->d);
    buf q32 = mk(FA_DTYPE_F32, c->b, c->sq, c->hq, c->d), k32 = mk(FA_DTYPE_F32, c->b, c->sk, c->hk, c->d),
        v32 = mk(FA_DTYPE_F32, c->b, c->sk, c->hk, c->d);
    dequant(&q64, &q, ds[0], sb, group);
    dequant(&k64, &k, ds[1], sb, 1);
    dequant(&v64, &v, ds[2], sb, 1);
    dequant(&q32, &q, ds[0], sb, group);
    dequant(&k32, &k, ds[1], sb, 1);
    dequant(&v32, &v, ds[2], sb, 1);
    fa_params pr = fa_params_default();
    pr.causal = c->causal;
    pr.softmax_scale = 0.3f;
    buf o64 = mk(FA_DTYPE_F64, c->b, c->sq, c->hq, c->d), l64 = mk_lse(c->b, c->hq, c->sq, FA_DTYPE_F64);
    buf o32 = mk(FA_DTYPE_F32, c->b, c->sq, c->hq, c->d), l32 = mk_lse(c->b, c->hq, c->sq, FA_DTYPE_F32);
    fa_context *naive = ctx_algo(FA_ALGO_NAIVE), *plain = ctx_algo(FA_ALGO_PLAIN);
    assert_int_equal(fa_fwd(naive, &q64.t, &k64.t, &v64.t, &pr, &o64.t, &l64.t), FA_OK);
    assert_int_equal(fa_fwd(plain, &q32.t, &k32.t, &v32.t, &pr, &o32.t, &l32.t), FA_OK);
    /* the baseline's output in the kernel's output dtype (rounded once, as the kernel's) */
    buf ob = mk(c->out, c->b, c->sq, c->hq, c->d);
    for (int64_t i = 0; i < numel(&ob.t); i++) tk_set(&ob.t, i, tk_get(&o32.t, i));

    const tk_err ek = tk_compare(&o.t, &o64.t), eb = tk_compare(&ob.t, &o64.t);
    const tk_err lk = tk_compare(&lse.t, &l64.t), lb = tk_compare(&l32.t, &l64.t);
    double slack, lslack;
    const int ok = tk_rule(&ek, &eb, c->out, 0, &slack);
    const int lok = tk_rule(&lk, &lb, FA_DTYPE_F32, 0, &lslack);
    if (!ok || !lok || ek.count != numel(&o.t))
        fail_msg("%s %s->%s b%lld sq%lld sk%lld hq%lld hk%lld d%lld causal%d kv%d: O max %.3g "
                 "(base %.3g) mean %.3g (base %.3g) nonfinite %d; LSE max %.3g (base %.3g)",
                 c->kvcache ? "fa_fwd_kvcache" : "fa_fwd", fa_dtype_name(c->in),
                 fa_dtype_name(c->out), (long long)c->b, (long long)c->sq, (long long)c->sk,
                 (long long)c->hq, (long long)c->hk, (long long)c->d, c->causal, c->kvcache,
                 ek.max_abs, eb.max_abs, ek.mean_abs, eb.mean_abs, ek.nonfinite, lk.max_abs,
                 lb.max_abs);
    buf *all[] = {&q, &k, &v, &o, &lse, &q64, &k64, &v64, &q32, &k32, &v32, &o64, &l64, &o32, &l32, &ob};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]->data);
    for (int w = 0; w < 3; w++) free(ds[w]);
    free(seqlens);
    fa_context_destroy(ctx);
    fa_context_destroy(naive);
    fa_context_destroy(plain);
}

static void fwd_matches_reference(void **state) {
    (void)state;
    static const int64_t sizes[][3] = {{1, 1, 8}, {17, 17, 40}, {100, 100, 72},
                                       {64, 130, 64}, {33, 200, 128}, {5, 77, 256}};
    static const fa_dtype outs[3] = {FA_DTYPE_F32, FA_DTYPE_BF16, FA_DTYPE_F16};
    uint64_t seed = tk_seed();
    int n = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int f = 0; f < 2; f++)
            for (int kv = 0; kv < 2; kv++) {
                fcase c = {2, sizes[s][0], sizes[s][1], 4, (s & 1) ? 2 : 4, sizes[s][2],
                           (int)((s + f) & 1), kv, (int)(s % 3 == 0), FP8[f], outs[(s + f + kv) % 3]};
                if (kv && c.sq > c.sk) c.sq = c.sk; /* decoding shapes */
                run_case(&c, seed + (uint64_t)n++);
            }
    printf("fp8 forward: %d cases within the 2x rule (seed %llu)\n", n, (unsigned long long)seed);
}

/* ---- refusals, special values ---- */

static void refusals(void **state) {
    (void)state;
    fa_context *ctx = ctx_algo(FA_ALGO_AUTO);
    buf q = mk(FA_DTYPE_F8_E4M3, 1, 8, 2, 16), k = mk(FA_DTYPE_F8_E4M3, 1, 8, 2, 16),
        v = mk(FA_DTYPE_F8_E4M3, 1, 8, 2, 16);
    buf o = mk(FA_DTYPE_F32, 1, 8, 2, 16), o8 = mk(FA_DTYPE_F8_E4M3, 1, 8, 2, 16);
    buf kb = mk(FA_DTYPE_BF16, 1, 8, 2, 16), of = mk(FA_DTYPE_F32, 1, 8, 2, 16);
    memset(q.data, 0x38, 256), memset(k.data, 0x38, 256), memset(v.data, 0x38, 256); /* 1.0 */
    memset(kb.data, 0, 512);
    fa_params p = fa_params_default();
    const float one[2] = {1, 1}, bad[4][2] = {{1, 0}, {1, -1}, {1, NAN}, {INFINITY, 1}};
    /* output must be wider than FP8; inputs must agree */
    assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o8.t, NULL), FA_ERR_DTYPE);
    assert_int_equal(fa_fwd(ctx, &q.t, &kb.t, &v.t, &p, &o.t, NULL), FA_ERR_DTYPE);
    /* descales: FP8 only, each finite and > 0, stride 0 or >= heads_kv */
    p.k_descale = one;
    assert_int_equal(fa_fwd(ctx, &kb.t, &kb.t, &kb.t, &p, &o.t, NULL), FA_ERR_DTYPE); /* bf16 out f32 */
    buf ob = mk(FA_DTYPE_BF16, 1, 8, 2, 16);
    assert_int_equal(fa_fwd(ctx, &kb.t, &kb.t, &kb.t, &p, &ob.t, NULL), FA_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 4; i++) {
        p.k_descale = bad[i];
        assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, NULL), FA_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(fa_last_error(ctx), "k_descale"));
    }
    p.k_descale = one;
    p.descale_batch_stride = 1;
    assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, NULL), FA_ERR_INVALID_ARGUMENT);
    for (int64_t i = 0; i < 256; i++) assert_true(isnan(((float *)o.data)[i])); /* untouched */
    /* no FP8 backward; no FP8 reference algorithms */
    buf dq = mk(FA_DTYPE_F8_E4M3, 1, 8, 2, 16), lse = mk_lse(1, 2, 8, FA_DTYPE_F32);
    fa_params d = fa_params_default();
    assert_int_equal(fa_bwd(ctx, &q.t, &k.t, &v.t, &o8.t, &o8.t, &lse.t, &d, &dq.t, &dq.t, &dq.t),
                     FA_ERR_DTYPE);
    assert_non_null(strstr(fa_last_error(ctx), "backward"));
    fa_context *naive = ctx_algo(FA_ALGO_NAIVE);
    assert_int_equal(fa_fwd(naive, &q.t, &k.t, &v.t, &d, &o.t, NULL), FA_ERR_DTYPE);
    /* the workspace query takes FP8 (its out is a stand-in) */
    size_t bytes = 0;
    assert_int_equal(fa_fwd_workspace_size(ctx, &q.t, &k.t, &v.t, &d, &bytes), FA_OK);
    /* a valid call runs and is finite: all-ones inputs give O = 1 */
    assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &d, &of.t, NULL), FA_OK);
    for (int64_t i = 0; i < 256; i++) assert_true(((float *)of.data)[i] == 1.0f);
    buf *all[] = {&q, &k, &v, &o, &o8, &kb, &of, &ob, &dq, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]->data);
    fa_context_destroy(ctx);
    fa_context_destroy(naive);
}

/* NaN encodings load as NaN: one in a key a row sees makes that row NaN (as for fa_fwd's
   special values); rows that do not see it (causal) stay finite. */
static void nan_codes(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        fa_context *ctx = ctx_algo(FA_ALGO_AUTO);
        const int64_t s = 17, h = 1, d = 8;
        buf q = mk(FP8[f], 1, s, h, d), k = mk(FP8[f], 1, s, h, d), v = mk(FP8[f], 1, s, h, d);
        buf o = mk(FA_DTYPE_BF16, 1, s, h, d);
        tk_rng r;
        tk_rng_init(&r, tk_seed());
        fill_codes(&q, FP8[f], &r, 1);
        fill_codes(&k, FP8[f], &r, 1);
        fill_codes(&v, FP8[f], &r, 1);
        ((uint8_t *)k.data)[9 * d + 3] = f == 0 ? 0x7f : 0x7e; /* key 9 */
        fa_params p = fa_params_default();
        p.causal = 1;
        assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, NULL), FA_OK);
        for (int64_t i = 0; i < s; i++)
            for (int64_t x = 0; x < d; x++) {
                const double y = tk_get(&o.t, i * d + x);
                if (i < 9) assert_true(isfinite(y));
                else assert_true(isnan(y));
            }
        free(q.data), free(k.data), free(v.data), free(o.data);
        fa_context_destroy(ctx);
    }
}

/* ---- the quantiser ---- */

static void quantizer(void **state) {
    (void)state;
    fa_context *ctx = ctx_algo(FA_ALGO_AUTO);
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    const int64_t B = 2, S = 37, H = 3, D = 16, BR = 8, NB = 5;
    buf x = mk(FA_DTYPE_F32, B, S, H, D), x8 = mk(FA_DTYPE_F8_E4M3, B, S, H, D);
    buf sc = mk_lse(B, H, NB, FA_DTYPE_F32);
    for (int64_t i = 0; i < numel(&x.t); i++) ((float *)x.data)[i] = (float)(3 * tk_rng_normal(&r));
    /* refusals write nothing */
    assert_int_equal(fa_quantize_fp8(ctx, &x.t, &x8.t, &sc.t, 7, 0, 0), FA_ERR_SHAPE);
    assert_int_equal(fa_quantize_fp8(ctx, &x.t, &x8.t, &sc.t, -1, 0, 0), FA_ERR_INVALID_ARGUMENT);
    assert_int_equal(fa_quantize_fp8(ctx, &x.t, &x.t, &sc.t, BR, 0, 0), FA_ERR_DTYPE);
    ((float *)x.data)[77] = NAN;
    assert_int_equal(fa_quantize_fp8(ctx, &x.t, &x8.t, &sc.t, BR, 0, 0), FA_ERR_INVALID_ARGUMENT);
    ((float *)x.data)[77] = 1.5f;
    buf x40 = mk(FA_DTYPE_F32, 1, 4, 1, 40), y40 = mk(FA_DTYPE_F8_E4M3, 1, 4, 1, 40);
    buf s40 = mk_lse(1, 1, 1, FA_DTYPE_F32);
    memset(x40.data, 0, 640);
    assert_int_equal(fa_quantize_fp8(ctx, &x40.t, &y40.t, &s40.t, 0, 1, 0), FA_ERR_HEAD_DIM);
    for (int64_t i = 0; i < numel(&x8.t); i++) assert_int_equal(((uint8_t *)x8.data)[i], 0xff);
    /* blocks: each block's max maps to 448 and every element to its nearest value */
    assert_int_equal(fa_quantize_fp8(ctx, &x.t, &x8.t, &sc.t, BR, 0, 0), FA_OK);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t k = 0; k < NB; k++) {
                const float s = ((float *)sc.data)[(b * H + h) * NB + k];
                double amax = 0;
                for (int64_t t = k * BR; t < S && t < (k + 1) * BR; t++)
                    for (int64_t i = 0; i < D; i++) {
                        const int64_t e = ((b * S + t) * H + h) * D + i;
                        const double xv = ((float *)x.data)[e];
                        amax = fabs(xv) > amax ? fabs(xv) : amax;
                        const uint8_t c = ((uint8_t *)x8.data)[e];
                        assert_int_equal(c, fa_fp8_encode(FA_DTYPE_F8_E4M3, xv / (double)s));
                    }
                assert_true(s == (float)(amax / 448.0));
            }
    /* Hadamard: orthogonal, so (Qh Kh^T) = (Q K^T) up to the quantisation; here checked on the
       dequantised rows' norms and dot products with e5m2 and with a sign seed */
    const int64_t Dh = 64;
    buf a = mk(FA_DTYPE_F32, 1, 2, 1, Dh), a8 = mk(FA_DTYPE_F8_E4M3, 1, 2, 1, Dh);
    buf as = mk_lse(1, 1, 2, FA_DTYPE_F32);
    for (int i = 0; i < 2 * Dh; i++) ((float *)a.data)[i] = (float)tk_rng_normal(&r);
    ((float *)a.data)[5] = 40; /* an outlier */
    assert_int_equal(fa_quantize_fp8(ctx, &a.t, &a8.t, &as.t, 1, 1, 99), FA_OK);
    double dot = 0, dot8 = 0, mx = 0, absdot = 0;
    const float *af = (const float *)a.data, *s2 = (const float *)as.data;
    for (int i = 0; i < Dh; i++) {
        dot += (double)af[i] * af[Dh + i];
        const double u = s2[0] * fa_fp8_e4m3_table[((uint8_t *)a8.data)[i]];
        const double w = s2[1] * fa_fp8_e4m3_table[((uint8_t *)a8.data)[Dh + i]];
        dot8 += u * w;
        absdot += fabs(u * w);
        mx = fabs(u) > mx ? fabs(u) : mx;
    }
    /* the dot product is kept to FP8 accuracy: each factor within 2^-4 relative of its
       rotated value (2^-4 / (1 - 2^-4) of the rounded one) in the normal range, plus the
       subnormals' absolute error (scale * 2^-10 each, bounded by 0.01 here) */
    assert_true(fabs(dot - dot8) <= 0.14 * absdot + 0.01);
    assert_true(mx < 20); /* the outlier spread over the row: 40/sqrt(64)-ish, not 40 */
    const fa_selection *sel = fa_last_selection(ctx);
    assert_non_null(sel);
    assert_string_equal(sel->kernel, "cpu_quantize_fp8_f8e4m3_hadamard");
    buf *all[] = {&x, &x8, &sc, &x40, &y40, &s40, &a, &a8, &as};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]->data);
    fa_context_destroy(ctx);
}

/* ---- the accuracy experiment ---- */

/* RMS of O against the float64 reference for the paper's inputs (N(0,1), 0.1% of entries x10)
   quantised three ways: (a) one scale per (batch, head), (b) one per 64 rows, (c) (b) after a
   Hadamard rotation of Q and K. The attention runs in float64 on the dequantised inputs: what
   is measured is the quantisation's error. (a) also runs through fa_fwd with the scales as
   descales, whose own error against the same reference is returned in *kernel. */
static void accuracy(fa_dtype f8, int64_t S, int64_t D, uint64_t seed, double rms[3],
                     double *kernel) {
    const int64_t B = 1, H = 2, BR = 64;
    tk_rng r;
    tk_rng_init(&r, seed);
    fa_context *ctx = ctx_algo(FA_ALGO_AUTO), *naive = ctx_algo(FA_ALGO_NAIVE);
    buf x[3], x64[3];
    for (int w = 0; w < 3; w++) {
        x[w] = mk(FA_DTYPE_F32, B, S, H, D);
        x64[w] = mk(FA_DTYPE_F64, B, S, H, D);
        for (int64_t i = 0; i < B * S * H * D; i++) {
            double v = tk_rng_normal(&r);
            if (tk_rng_uniform(&r) < 0.001) v *= 10;
            ((float *)x[w].data)[i] = (float)v;
            ((double *)x64[w].data)[i] = (double)(float)v;
        }
    }
    fa_params p = fa_params_default();
    buf ref = mk(FA_DTYPE_F64, B, S, H, D), o = mk(FA_DTYPE_F64, B, S, H, D);
    assert_int_equal(fa_fwd(naive, &x64[0].t, &x64[1].t, &x64[2].t, &p, &ref.t, NULL), FA_OK);
    const int64_t n = B * S * H * D;
    for (int mode = 0; mode < 3; mode++) {
        const int64_t br = mode == 0 ? 0 : BR, nb = mode == 0 ? 1 : (S + BR - 1) / BR;
        buf q8[3], sc[3], dq[3];
        for (int w = 0; w < 3; w++) {
            q8[w] = mk(f8, B, S, H, D);
            sc[w] = mk_lse(B, H, nb, FA_DTYPE_F32);
            dq[w] = mk(FA_DTYPE_F64, B, S, H, D);
            const int had = mode == 2 && w < 2; /* V is never rotated */
            assert_int_equal(fa_quantize_fp8(ctx, &x[w].t, &q8[w].t, &sc[w].t, br, had, 7), FA_OK);
            const float *tab = fa_fp8_table(f8), *s = (const float *)sc[w].data;
            for (int64_t t = 0; t < S; t++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < D; i++) {
                        const int64_t e = (t * H + h) * D + i;
                        ((double *)dq[w].data)[e] = (double)s[h * nb + (mode ? t / BR : 0)] *
                                                    tab[((uint8_t *)q8[w].data)[e]];
                    }
        }
        assert_int_equal(fa_fwd(naive, &dq[0].t, &dq[1].t, &dq[2].t, &p, &o.t, NULL), FA_OK);
        double ss = 0;
        for (int64_t i = 0; i < n; i++) {
            const double e = ((double *)o.data)[i] - ((double *)ref.data)[i];
            ss += e * e;
        }
        rms[mode] = sqrt(ss / (double)n);
        if (mode == 0) { /* the kernel with the per-(batch, head) scales as descales */
            fa_params pk = fa_params_default();
            pk.q_descale = (const float *)sc[0].data;
            pk.k_descale = (const float *)sc[1].data;
            pk.v_descale = (const float *)sc[2].data;
            pk.descale_batch_stride = H;
            buf ok = mk(FA_DTYPE_F32, B, S, H, D);
            assert_int_equal(fa_fwd(ctx, &q8[0].t, &q8[1].t, &q8[2].t, &pk, &ok.t, NULL), FA_OK);
            ss = 0;
            for (int64_t i = 0; i < n; i++) {
                const double e = ((float *)ok.data)[i] - ((double *)ref.data)[i];
                ss += e * e;
            }
            *kernel = sqrt(ss / (double)n);
            free(ok.data);
        }
        for (int w = 0; w < 3; w++) free(q8[w].data), free(sc[w].data), free(dq[w].data);
    }
    for (int w = 0; w < 3; w++) free(x[w].data), free(x64[w].data);
    free(ref.data), free(o.data);
    fa_context_destroy(ctx);
    fa_context_destroy(naive);
}

static void accuracy_rule(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{512, 64}, {512, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        double rms[3], kernel;
        const uint64_t seed = tk_seed() + s;
        accuracy(FA_DTYPE_F8_E4M3, shapes[s][0], shapes[s][1], seed, rms, &kernel);
        printf("e4m3 s%lld d%lld: rms (a) %.3e (b) %.3e (c) %.3e, kernel (a) %.3e\n",
               (long long)shapes[s][0], (long long)shapes[s][1], rms[0], rms[1], rms[2], kernel);
        /* the kernel adds only fp32 rounding to the quantisation's error */
        assert_true(fabs(kernel - rms[0]) <= 0.01 * rms[0]);
        /* Block scales + Hadamard must beat per-tensor scaling. The paper's factor (2.6x) is
           not asserted: it does not reproduce here (docs/fp8.md, bench/results/cpu/
           fp8_accuracy.md: (c)/(a) 0.48 to 0.80). FP8's rounding error is relative, so a finer scale
           changes little unless values fall into the subnormals, which outliers of 10x do
           not cause; the rotation's gain is the outliers' share of the score errors. */
        if (!(rms[2] < rms[0]))
            fail_msg("block + Hadamard rms %.3e is not below per-tensor %.3e (seed %llu)",
                     rms[2], rms[0], (unsigned long long)seed);
    }
}

/* `test_fp8 --table`: the committed table (bench/results/cpu/fp8_accuracy.md). */
static int table(void) {
    static const int64_t S[] = {512, 1024, 2048}, D[] = {64, 128, 256};
    printf("| format | seqlen | d | (a) per-tensor | (b) block 64 | (c) block 64 + Hadamard | "
           "(c)/(a) | fa_fwd on (a) |\n|---|---|---|---|---|---|---|---|\n");
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                double rms[3], kernel;
                accuracy(FP8[f], S[i], D[j], 1000 + (uint64_t)(i * 3 + j), rms, &kernel);
                printf("| %s | %lld | %lld | %.3e | %.3e | %.3e | %.2f | %.3e |\n",
                       fa_dtype_name(FP8[f]), (long long)S[i], (long long)D[j], rms[0], rms[1],
                       rms[2], rms[2] / rms[0], kernel);
                fflush(stdout);
            }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--table") == 0) return table();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tables),
        cmocka_unit_test(fwd_matches_reference),
        cmocka_unit_test(refusals),
        cmocka_unit_test(nan_codes),
        cmocka_unit_test(quantizer),
        cmocka_unit_test(accuracy_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL) != 0;
}
