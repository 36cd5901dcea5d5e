/*
 * test_dropout.c — dropout on the CPU backend, and with `cuda` on the CUDA backend.
 *
 * The sweep: forward and backward of the tiled kernels against the float64 reference under
 * the 2x rule (testkit: kernel, reference and baseline all drop with one seed and offset, so
 * the rule compares one function), for p 0.1, 0.5, 0.9 with and without masks, GQA, varlen
 * with empty sequences, odd sizes and strides; outputs poisoned by the kit.
 * The extras: Philox4x32-10 against its published known answers (src/dropout.h is included
 * for this alone: the rule is the contract that a CUDA kernel must reproduce bit for bit); the
 * kept fraction of a large mask; the mask a kernel applied, read back from its output, equal to
 * fa_dropout_mask's at 1 and 2 threads (CTest runs this file once per instruction-set level
 * too); seeds and offsets; the record's name; fa_dropout_mask's errors.
 * On the GPU (`test_dropout cuda`: the sweep below on the sm80 dropout kernels, head dims 32
 * to 256 and the deterministic backward; the extras, which run in the plain invocation and
 * skip without a GPU: the mask each GPU kernel applied, read back, equal to fa_dropout_mask's,
 * the record, and seeds and offsets).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dropout.h"
#include "sweep.h"

/* an offset with both words set: the high one goes into the key, the low one the counter */
#define DROP(P, S)                                                                            \
    .dropout_p = (P), .dropout_seed = (S), .dropout_offset = ((uint64_t)(S) << 33) + 7

static const tk_case cases[] = {
    {.batch = 2, .sq = 113, .sk = 113, .hq = 4, .hkv = 4, .d = 64, .dtype = FA_DTYPE_F32,
     .bwd = 1, DROP(0.1f, 11)},
    {.batch = 2, .sq = 113, .sk = 113, .hq = 4, .hkv = 4, .d = 64, .dtype = FA_DTYPE_F32,
     .bwd = 1, DROP(0.5f, 12)},
    {.batch = 2, .sq = 113, .sk = 113, .hq = 4, .hkv = 4, .d = 64, .dtype = FA_DTYPE_F32,
     .bwd = 1, DROP(0.9f, 13)},
    {.batch = 1, .sq = 77, .sk = 200, .hq = 6, .hkv = 2, .d = 40, .dtype = FA_DTYPE_BF16,
     .causal = 1, .bwd = 1, DROP(0.1f, 21)},
    {.batch = 1, .sq = 200, .sk = 77, .hq = 6, .hkv = 2, .d = 40, .dtype = FA_DTYPE_F16,
     .causal = 1, .bwd = 1, DROP(0.5f, 22)},
    {.batch = 2, .sq = 130, .sk = 130, .hq = 4, .hkv = 1, .d = 96, .dtype = FA_DTYPE_F32,
     .causal = 1, .bwd = 1, DROP(0.9f, 23)},
    {.batch = 3, .hq = 4, .hkv = 2, .d = 32, .dtype = FA_DTYPE_F16, .varlen = 1,
     .lens_q = {17, 0, 70}, .lens_k = {33, 5, 70}, .causal = 1, .bwd = 1, DROP(0.5f, 31)},
    {.batch = 3, .hq = 3, .hkv = 3, .d = 17, .dtype = FA_DTYPE_F32, .varlen = 1,
     .lens_q = {1, 65, 9}, .lens_k = {66, 0, 129}, .bwd = 1, DROP(0.1f, 32)},
    {.batch = 2, .sq = 1, .sk = 65, .hq = 2, .hkv = 2, .d = 17, .dtype = FA_DTYPE_F32,
     .strided = 1, .bwd = 1, DROP(0.9f, 41)},
    {.batch = 2, .sq = 65, .sk = 129, .hq = 4, .hkv = 2, .d = 64, .dtype = FA_DTYPE_BF16,
     .window = 1, .wl = 20, .wr = 5, .softcap = 30.0f, .alibi = TK_ALIBI_HEAD, .strided = 1,
     .bwd = 1, DROP(0.5f, 42)},
};

/* The GPU's sweep: d a multiple of 8 (the CUDA kernels' rule), odd lengths across tiles, causal
   both ways round, GQA and MQA, varlen with an empty sequence, windows with softcap and ALiBi,
   strides, the deterministic dQ kernel; f16 and bf16 (fp32 cases run in bf16 there). */
static const tk_case cuda_cases[] = {
    {.batch = 2, .sq = 113, .sk = 113, .hq = 4, .hkv = 4, .d = 64, .dtype = FA_DTYPE_F16,
     .bwd = 1, DROP(0.1f, 51)},
    {.batch = 2, .sq = 197, .sk = 261, .hq = 4, .hkv = 4, .d = 128, .dtype = FA_DTYPE_BF16,
     .bwd = 1, DROP(0.5f, 52)},
    {.batch = 1, .sq = 300, .sk = 300, .hq = 2, .hkv = 2, .d = 128, .dtype = FA_DTYPE_F16,
     .bwd = 1, DROP(0.9f, 53)},
    {.batch = 1, .sq = 77, .sk = 200, .hq = 6, .hkv = 2, .d = 40, .dtype = FA_DTYPE_BF16,
     .causal = 1, .bwd = 1, DROP(0.1f, 54)},
    {.batch = 1, .sq = 200, .sk = 77, .hq = 6, .hkv = 2, .d = 96, .dtype = FA_DTYPE_F16,
     .causal = 1, .bwd = 1, DROP(0.5f, 55)},
    {.batch = 2, .sq = 130, .sk = 130, .hq = 4, .hkv = 1, .d = 32, .dtype = FA_DTYPE_BF16,
     .causal = 1, .bwd = 1, DROP(0.3f, 56)},
    {.batch = 1, .sq = 150, .sk = 170, .hq = 2, .hkv = 1, .d = 192, .dtype = FA_DTYPE_F16,
     .bwd = 1, DROP(0.2f, 57)},
    {.batch = 1, .sq = 129, .sk = 129, .hq = 2, .hkv = 2, .d = 256, .dtype = FA_DTYPE_BF16,
     .causal = 1, .bwd = 1, DROP(0.1f, 58)},
    {.batch = 3, .hq = 4, .hkv = 2, .d = 64, .dtype = FA_DTYPE_F16, .varlen = 1,
     .lens_q = {17, 0, 170}, .lens_k = {33, 5, 170}, .causal = 1, .bwd = 1, DROP(0.5f, 59)},
    {.batch = 3, .hq = 3, .hkv = 3, .d = 128, .dtype = FA_DTYPE_BF16, .varlen = 1,
     .lens_q = {1, 65, 139}, .lens_k = {66, 0, 129}, .bwd = 1, DROP(0.1f, 60)},
    {.batch = 2, .sq = 65, .sk = 129, .hq = 4, .hkv = 2, .d = 64, .dtype = FA_DTYPE_BF16,
     .window = 1, .wl = 20, .wr = 5, .softcap = 30.0f, .alibi = TK_ALIBI_HEAD, .strided = 1,
     .bwd = 1, DROP(0.5f, 61)},
    {.batch = 2, .sq = 145, .sk = 145, .hq = 4, .hkv = 2, .d = 128, .dtype = FA_DTYPE_F16,
     .causal = 1, .strided = 1, .deterministic = 1, .bwd = 1, DROP(0.3f, 62)},
    {.batch = 2, .sq = 1, .sk = 65, .hq = 2, .hkv = 2, .d = 24, .dtype = FA_DTYPE_F16,
     .strided = 1, .bwd = 1, DROP(0.9f, 63)},
};

/* ---- the generator ---- */

static void philox_known_answers(void **state) {
    (void)state;
    /* Random123's kat_vectors for philox4x32-10: counter, key, result */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        fa_philox4 c = {{kat[t][0], kat[t][1], kat[t][2], kat[t][3]}};
        const fa_philox4 r = fa_philox4x32_10(c, kat[t][4], kat[t][5]);
        for (int e = 0; e < 4; e++) assert_int_equal(r.v[e], kat[t][6 + e]);
    }
}

/* fa_dropout_mask is dropout.h's rule in the documented layout, word for word. */
static void mask_is_the_rule(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    enum { B = 2, H = 3, SQ = 5, SK = 11 };
    uint8_t m[B * H * SQ * SK];
    const uint64_t seed = 0x0123456789abcdefull, off = 0xfedcba9876543210ull;
    assert_int_equal(fa_dropout_mask(ctx, seed, off, 0.5f, B, H, SQ, SK, m), FA_OK);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < SQ; i++)
                for (int j = 0; j < SK; j++) {
                    fa_philox4 c = {{(uint32_t)(j / 4), (uint32_t)i, (uint32_t)(b * H + h),
                                     (uint32_t)off}};
                    const fa_philox4 r = fa_philox4x32_10(c, (uint32_t)seed,
                                                          (uint32_t)(seed >> 32) ^
                                                              (uint32_t)(off >> 32));
                    const int keep = r.v[j % 4] >= 0x80000000u; /* floor(0.5 * 2^32) */
                    assert_int_equal(m[((b * H + h) * SQ + i) * SK + j], keep);
                }
    fa_context_destroy(ctx);
}

/* The kept fraction of 4M elements within 5 sigma of 1 - p (sigma = sqrt(p (1 - p) / n)). */
static void kept_fraction(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    enum { B = 2, H = 4, SQ = 512, SK = 1000 };
    const size_t n = (size_t)B * H * SQ * SK;
    uint8_t *m = malloc(n);
    assert_non_null(m);
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int t = 0; t < 3; t++) {
        assert_int_equal(fa_dropout_mask(ctx, tk_seed() + (uint64_t)t, 5, ps[t], B, H, SQ, SK, m),
                         FA_OK);
        size_t kept = 0;
        for (size_t e = 0; e < n; e++) kept += m[e];
        const double p = ps[t], frac = (double)kept / (double)n;
        const double sigma = sqrt(p * (1 - p) / (double)n);
        print_message("p %.1f: kept %.6f, expected %.6f (5 sigma %.1e)\n", p, frac, 1 - p,
                      5 * sigma);
        if (!(fabs(frac - (1 - p)) <= 5 * sigma))
            fail_msg("p %g: kept fraction %.6f, not 1 - p within 5 sigma", p, frac);
    }
    free(m);
    fa_context_destroy(ctx);
}

/* ---- the mask a kernel applied ---- */

/*
 * Q = 0 makes every score 0 and P = 1/sk; V row j = e_j (d = sk) makes O[i][j] = Z_ij / sk, so
 * the output of row i is its mask scaled by 1 / ((1 - p) sk). In the backward, dO row i = e_i
 * (d >= sq) makes dV[j][i] = P_ij Z_ij: the mask again, transposed. fp32, no mask, group 1.
 */
enum { RB = 2, RH = 3, RSQ = 70, RSK = 200, RD = 200 };

/* dev: the CUDA backend, in f16 (its dtypes; d = 200 is a multiple of 8), with the kept
   values checked to f16 accuracy instead of fp32's. The record must name a dropout kernel. */
static void revealed_on(fa_context *ctx, int dev, float p, uint64_t seed, uint64_t off,
                        uint8_t *fwd, uint8_t *bwd) {
    tk_rng r;
    tk_rng_init(&r, 1);
    const fa_dtype dt = dev ? FA_DTYPE_F16 : FA_DTYPE_F32;
    const int64_t qs[4] = {RB, RSQ, RH, RD}, ks[4] = {RB, RSK, RH, RD}, ls[3] = {RB, RH, RSQ};
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
    tk_buf *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv};
    const int64_t *shapes[] = {qs, ks, ks, qs, ls, qs, qs, ks, ks};
    for (int i = 0; i < 9; i++)
        assert_int_equal(tk_buf_alloc(all[i], i == 4 ? FA_DTYPE_F32 : dt, i == 4 ? 3 : 4,
                                      shapes[i], 0, &r),
                         0);
    memset(q.base, 0, q.bytes);
    memset(v.base, 0, v.bytes);
    memset(dout.base, 0, dout.bytes);
    tk_fill_normal(&k, &r, 1);
    for (int b = 0; b < RB; b++)
        for (int h = 0; h < RH; h++) {
            for (int j = 0; j < RSK; j++) tk_set(&v.t, ((b * RSK + j) * RH + h) * RD + j, 1.0);
            for (int i = 0; i < RSQ; i++) tk_set(&dout.t, ((b * RSQ + i) * RH + h) * RD + i, 1.0);
        }
    fa_params prm = fa_params_default();
    prm.dropout_p = p;
    prm.dropout_seed = seed;
    prm.dropout_offset = off;
    tk_poison(&o);
    tk_poison(&dv);
    fa_tensor t[9];
    for (int i = 0; i < 9; i++) {
        if (dev) assert_int_equal(tk_device_upload(all[i]), 0);
        t[i] = dev ? tk_device_view(all[i]) : all[i]->t;
    }
    assert_int_equal(fa_fwd(ctx, &t[0], &t[1], &t[2], &prm, &t[3], &t[4]), FA_OK);
    assert_non_null(strstr(fa_last_selection(ctx)->kernel, "_dropout"));
    assert_int_equal(fa_bwd(ctx, &t[0], &t[1], &t[2], &t[3], &t[5], &t[4], &prm, &t[6], &t[7],
                            &t[8]),
                     FA_OK);
    assert_non_null(strstr(fa_last_selection(ctx)->kernel, "_dropout"));
    if (dev) {
        /* on every GPU the sm80 kernels (the sm90 ones have no dropout) */
        assert_true(strncmp(fa_last_selection(ctx)->kernel, "sm80_", 5) == 0);
        assert_int_equal(tk_device_download(&o), 0);
        assert_int_equal(tk_device_download(&dv), 0);
    }
    const double kept = 1.0 / ((1.0 - p) * RSK);
    /* fp32: its rounding; f16: P (1 / (1 - p)) packed to f16, the sum, O rounded to f16 */
    const double tol = dev ? 4e-3 : 1e-5;
    for (int b = 0; b < RB; b++)
        for (int h = 0; h < RH; h++)
            for (int i = 0; i < RSQ; i++)
                for (int j = 0; j < RSK; j++) {
                    const double x = tk_get(&o.t, ((b * RSQ + i) * RH + h) * RD + j);
                    const double y = tk_get(&dv.t, ((b * RSK + j) * RH + h) * RD + i);
                    /* each either 0 (dropped) or the kept value to the dtype's accuracy */
                    assert_true(x == 0 || fabs(x - kept) <= tol * kept);
                    assert_true(y == 0 || fabs(y - kept) <= tol * kept);
                    const size_t e = (((size_t)b * RH + h) * RSQ + i) * RSK + j;
                    fwd[e] = x != 0;
                    bwd[e] = y != 0;
                }
    for (int i = 0; i < 9; i++) {
        if (dev) tk_device_free(all[i]);
        tk_buf_free(all[i]);
    }
}

static void revealed(fa_context *ctx, float p, uint64_t seed, uint64_t off, uint8_t *fwd,
                     uint8_t *bwd) {
    revealed_on(ctx, 0, p, seed, off, fwd, bwd);
}

static void kernels_apply_the_mask(void **state) {
    (void)state;
    const size_t n = (size_t)RB * RH * RSQ * RSK;
    uint8_t *want = malloc(n), *fwd = malloc(n), *bwd = malloc(n);
    assert_true(want && fwd && bwd);
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int t = 0; t < 3; t++) {
        const uint64_t seed = tk_seed() * 3 + (uint64_t)t, off = (uint64_t)t << 40 | 9;
        for (int threads = 1; threads <= 2; threads++) {
            fa_context *ctx;
            assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
            assert_int_equal(fa_context_set_threads(ctx, threads), FA_OK);
            assert_int_equal(fa_dropout_mask(ctx, seed, off, ps[t], RB, RH, RSQ, RSK, want),
                             FA_OK);
            revealed(ctx, ps[t], seed, off, fwd, bwd);
            assert_memory_equal(want, fwd, n);
            assert_memory_equal(want, bwd, n);
            fa_context_destroy(ctx);
        }
    }
    free(want);
    free(fwd);
    free(bwd);
}

/* ---- seeds, offsets, the record ---- */

/* One forward and backward of a fixed problem; returns O and dQ, dK, dV in one malloc'd block. */
static unsigned char *run_once(fa_context *ctx, uint64_t seed, uint64_t off, size_t *bytes) {
    tk_rng r;
    tk_rng_init(&r, 77);
    const int64_t qs[4] = {2, 45, 4, 32}, ks[4] = {2, 61, 2, 32}, ls[3] = {2, 4, 45};
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
    tk_buf *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv};
    const int64_t *shapes[] = {qs, ks, ks, qs, ls, qs, qs, ks, ks};
    for (int i = 0; i < 9; i++)
        assert_int_equal(tk_buf_alloc(all[i], FA_DTYPE_F32, i == 4 ? 3 : 4, shapes[i], 0, &r), 0);
    tk_fill_normal(&q, &r, 1);
    tk_fill_normal(&k, &r, 1);
    tk_fill_normal(&v, &r, 1);
    tk_fill_normal(&dout, &r, 1);
    fa_params p = fa_params_default();
    p.causal = 1;
    p.dropout_p = 0.3f;
    p.dropout_seed = seed;
    p.dropout_offset = off;
    assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, &lse.t), FA_OK);
    assert_non_null(strstr(fa_last_selection(ctx)->kernel, "_dropout"));
    assert_int_equal(fa_bwd(ctx, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t, &p, &dq.t, &dk.t,
                            &dv.t),
                     FA_OK);
    assert_non_null(strstr(fa_last_selection(ctx)->kernel, "_dropout"));
    tk_buf *out[] = {&o, &dq, &dk, &dv};
    *bytes = 0;
    for (int i = 0; i < 4; i++) *bytes += out[i]->bytes;
    unsigned char *all_out = malloc(*bytes), *w = all_out;
    assert_non_null(all_out);
    for (int i = 0; i < 4; i++) {
        memcpy(w, out[i]->base, out[i]->bytes);
        w += out[i]->bytes;
    }
    for (int i = 0; i < 9; i++) tk_buf_free(all[i]);
    return all_out;
}

static void seeds_and_offsets(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    size_t n, n2;
    unsigned char *a = run_once(ctx, 42, 0, &n), *b = run_once(ctx, 42, 0, &n2);
    assert_memory_equal(a, b, n); /* same seed and offset: the same bits */
    free(b);
    b = run_once(ctx, 43, 0, &n2); /* another seed */
    assert_memory_not_equal(a, b, n);
    free(b);
    b = run_once(ctx, 42, 1, &n2); /* another offset (low word) */
    assert_memory_not_equal(a, b, n);
    free(b);
    b = run_once(ctx, 42, (uint64_t)1 << 32, &n2); /* another offset (high word) */
    assert_memory_not_equal(a, b, n);
    free(b);
    free(a);
    fa_context_destroy(ctx);
}

static void mask_errors(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    uint8_t m[16], before[16];
    memset(m, 0xA5, sizeof m);
    memcpy(before, m, sizeof m);
    assert_int_equal(fa_dropout_mask(NULL, 1, 0, 0.5f, 1, 1, 4, 4, m), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 0.5f, 1, 1, 4, 4, NULL), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 1.0f, 1, 1, 4, 4, m), FA_ERR_INVALID_ARGUMENT);
    assert_true(fa_last_error(ctx)[0] != 0);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, -0.1f, 1, 1, 4, 4, m), FA_ERR_INVALID_ARGUMENT);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, NAN, 1, 1, 4, 4, m), FA_ERR_INVALID_ARGUMENT);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 0.5f, 1, -1, 4, 4, m), FA_ERR_SHAPE);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 0.5f, 1, 1, (int64_t)1 << 32, 1, m),
                     FA_ERR_OVERFLOW);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 0.5f, 1 << 16, 1 << 16, 1, 1, m),
                     FA_ERR_OVERFLOW);
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 0.5f, INT64_MAX, 1, 2, 2, m), FA_ERR_OVERFLOW);
    assert_memory_equal(m, before, sizeof m);
    /* p = 0 keeps everything */
    assert_int_equal(fa_dropout_mask(ctx, 1, 0, 0.0f, 1, 1, 4, 4, m), FA_OK);
    for (int e = 0; e < 16; e++) assert_int_equal(m[e], 1);
    fa_context_destroy(ctx);
}

/* The GPU kernels apply fa_dropout_mask's mask bit for bit, forward and backward, at three p
   and offsets with both words set, plain and deterministic (skipped without a GPU). */
static void cuda_applies_the_mask(void **state) {
    (void)state;
    if (!sweep_have_cuda()) skip();
    const size_t n = (size_t)RB * RH * RSQ * RSK;
    uint8_t *want = malloc(n), *fwd = malloc(n), *bwd = malloc(n);
    assert_true(want && fwd && bwd);
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int t = 0; t < 3; t++) {
        const uint64_t seed = tk_seed() * 3 + (uint64_t)t, off = (uint64_t)(t + 1) << 40 | 9;
        fa_context *ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_OK);
        assert_int_equal(fa_dropout_mask(ctx, seed, off, ps[t], RB, RH, RSQ, RSK, want), FA_OK);
        revealed_on(ctx, 1, ps[t], seed, off, fwd, bwd);
        assert_memory_equal(want, fwd, n);
        assert_memory_equal(want, bwd, n);
        fa_context_destroy(ctx);
    }
    free(want);
    free(fwd);
    free(bwd);
}

int main(int argc, char **argv) {
    static const struct CMUnitTest extra[] = {
        cmocka_unit_test(philox_known_answers), cmocka_unit_test(mask_is_the_rule),
        cmocka_unit_test(kept_fraction),        cmocka_unit_test(kernels_apply_the_mask),
        cmocka_unit_test(seeds_and_offsets),    cmocka_unit_test(mask_errors),
        cmocka_unit_test(cuda_applies_the_mask),
    };
    /* `cuda`: the GPU's own cases (sweep_main runs no extras there) */
    const int gpu = argc > 1 && strcmp(argv[1], "cuda") == 0;
    const tk_case *c = gpu ? cuda_cases : cases;
    const size_t n = gpu ? sizeof cuda_cases / sizeof *cuda_cases : sizeof cases / sizeof *cases;
    return sweep_main(argc, argv, "dropout", c, n, extra, sizeof extra / sizeof *extra);
}
