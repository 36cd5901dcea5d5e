/*
 * quantize.c — fa_quantize_fp8 (flashattn.h): BSHD f32/f16/bf16 to FP8 with one scale per
 * block of rows of each head, optionally after a Hadamard rotation of the head dim. CPU only.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <omp.h>

#include "fp8.h"
#include "validate.h"

/* The rotation of one row in double: y = (x H / sqrt(d)) D, H the Walsh-Hadamard matrix of
   order d (a power of two), D = diag(signs) or I. In place on y, which holds x. */
static void rotate(double *y, int64_t d, const signed char *signs) {
    for (int64_t len = 1; len < d; len <<= 1)
        for (int64_t i = 0; i < d; i += len << 1)
            for (int64_t j = i; j < i + len; j++) {
                const double a = y[j], b = y[j + len];
                y[j] = a + b;
                y[j + len] = a - b;
            }
    const double norm = 1.0 / sqrt((double)d);
    for (int64_t i = 0; i < d; i++) y[i] *= signs ? norm * signs[i] : norm;
}

/* splitmix64: the +-1 diagonal's signs, a pure function of (seed, index) so that Q and K
   quantised in separate calls with one seed get the same rotation. */
static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct quant_job {
    const fa_tensor *x, *x8, *sc;
    int64_t batch, seqlen, heads, d, block_rows, nblocks;
    int hadamard;
    const signed char *signs;
} quant_job;

/* Row (b, t, h) of x as doubles in y, rotated when asked. */
static void load_row(const quant_job *j, int64_t b, int64_t t, int64_t h, double *y) {
    const fa_tensor *x = j->x;
    const char *row = (const char *)x->data +
                      (size_t)(b * x->stride[0] + t * x->stride[1] + h * x->stride[2]) *
                          fa_dtype_size(x->dtype);
    for (int64_t i = 0; i < j->d; i++) y[i] = fa_load(row, x->dtype, i);
    if (j->hadamard) rotate(y, j->d, j->signs);
}

/* Block k of rows of (b, h): its amax, then its scale and its FP8 rows. */
static void quant_block(const quant_job *j, int64_t b, int64_t h, int64_t k, double *y) {
    const int64_t t0 = k * j->block_rows;
    const int64_t t1 = t0 + j->block_rows < j->seqlen ? t0 + j->block_rows : j->seqlen;
    double amax = 0;
    for (int64_t t = t0; t < t1; t++) {
        load_row(j, b, t, h, y);
        for (int64_t i = 0; i < j->d; i++) amax = fabs(y[i]) > amax ? fabs(y[i]) : amax;
    }
    const fa_dtype dt = j->x8->dtype;
    /* the block's largest magnitude maps to the format's largest value; an all-zero block
       keeps scale 1, and a tiny amax a normal scale (descales must be > 0) */
    float scale = amax > 0 ? (float)(amax / fa_fp8_max(dt)) : 1.0f;
    if (scale < FLT_MIN) scale = FLT_MIN;
    const fa_tensor *sc = j->sc;
    ((float *)sc->data)[b * sc->stride[0] + h * sc->stride[1] + k * sc->stride[2]] = scale;
    for (int64_t t = t0; t < t1; t++) {
        load_row(j, b, t, h, y);
        uint8_t *out = (uint8_t *)j->x8->data + b * j->x8->stride[0] + t * j->x8->stride[1] +
                       h * j->x8->stride[2];
        for (int64_t i = 0; i < j->d; i++) out[i] = fa_fp8_encode(dt, y[i] / (double)scale);
    }
}

static fa_status validate_quant(fa_call *c, const fa_tensor *x, fa_tensor *x8, fa_tensor *sc,
                                int64_t block_rows, int hadamard, quant_job *j) {
    fa_context *ctx = c->ctx;
    if (!x || !x8 || !sc)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: %s is NULL", c->fn,
                       !x ? "x" : !x8 ? "x8" : "scales");
    fa_arg a[3] = {{"x", x, 0, 0, {0, 0}}, {"x8", x8, 1, 0, {0, 0}},
                   {"scales", sc, 2, 1, {0, 0}}};
    FA_TRY(fa_check_tensors(c, a, 3, 4));
    if (x->dtype != FA_DTYPE_F32 && x->dtype != FA_DTYPE_F16 && x->dtype != FA_DTYPE_BF16)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: x is %s, must be f32, f16 or bf16", c->fn,
                       fa_dtype_name(x->dtype));
    if (!fa_dtype_is_fp8(x8->dtype))
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: x8 is %s, must be f8e4m3 or f8e5m2", c->fn,
                       fa_dtype_name(x8->dtype));
    if (sc->dtype != FA_DTYPE_F32)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: scales is %s, must be f32", c->fn,
                       fa_dtype_name(sc->dtype));
    for (int i = 0; i < 3; i++)
        if (a[i].t->device != FA_DEVICE_CPU)
            return fa_fail(ctx, FA_ERR_DEVICE,
                           "%s: %s is on cuda; the quantiser runs on CPU tensors only (the GPU "
                           "quantiser is not built yet)", c->fn, a[i].name);
    FA_TRY(fa_check_same_shape(c, "x", x, "x8", x8));
    if (block_rows < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: block_rows = %lld, must be >= 0 (0: "
                       "one block per (batch, head))", c->fn, (long long)block_rows);
    if (hadamard != 0 && hadamard != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: hadamard = %d, must be 0 or 1", c->fn,
                       hadamard);
    j->batch = x->shape[0];
    j->seqlen = x->shape[1];
    j->heads = x->shape[2];
    j->d = x->shape[3];
    if (hadamard && (j->d & (j->d - 1)) != 0)
        return fa_fail(ctx, FA_ERR_HEAD_DIM,
                       "%s: head_dim = %lld; the Hadamard rotation needs a power of two", c->fn,
                       (long long)j->d);
    j->block_rows = block_rows == 0 || block_rows > j->seqlen ? j->seqlen : block_rows;
    j->nblocks = (j->seqlen + j->block_rows - 1) / j->block_rows;
    if (sc->shape[0] != j->batch || sc->shape[1] != j->heads || sc->shape[2] != j->nblocks)
        return fa_fail(ctx, FA_ERR_SHAPE, "%s: scales must be [batch, heads, nblocks] = [%lld, "
                       "%lld, %lld] (block_rows %lld)", c->fn, (long long)j->batch,
                       (long long)j->heads, (long long)j->nblocks, (long long)block_rows);
    FA_TRY(fa_check_overlaps(c, a, 3));
    /* x must be finite: a NaN or Inf has no scale that represents it, and one would poison
       its whole block (and, rotated, its rows); checked before anything is written */
    for (int64_t b = 0; b < j->batch; b++)
        for (int64_t t = 0; t < j->seqlen; t++)
            for (int64_t h = 0; h < j->heads; h++) {
                const void *row = fa_at(&(fa_operand){x->data, x->stride[0], x->stride[1],
                                                      x->stride[2]},
                                        x->dtype, b, t, h);
                for (int64_t i = 0; i < j->d; i++)
                    if (!isfinite(fa_load(row, x->dtype, i)))
                        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                                       "%s: x[%lld, %lld, %lld, %lld] = %g; x must be finite",
                                       c->fn, (long long)b, (long long)t, (long long)h,
                                       (long long)i, (double)fa_load(row, x->dtype, i));
            }
    j->x = x;
    j->x8 = x8;
    j->sc = sc;
    j->hadamard = hadamard;
    return FA_OK;
}

static fa_status quantize(fa_call *c, const fa_tensor *x, fa_tensor *x8, fa_tensor *sc,
                          int64_t block_rows, int hadamard, uint64_t seed) {
    quant_job j;
    FA_TRY(validate_quant(c, x, x8, sc, block_rows, hadamard, &j));
    signed char *signs = NULL;
    if (hadamard && seed && !(signs = malloc((size_t)j.d)))
        return fa_fail(c->ctx, FA_ERR_OUT_OF_MEMORY, "%s: out of memory", c->fn);
    if (signs)
        for (int64_t i = 0; i < j.d; i++) signs[i] = (mix(seed ^ mix((uint64_t)i)) >> 63) ? -1 : 1;
    j.signs = signs;
    const int64_t items = j.batch * j.heads * j.nblocks;
    /* every thread's row buffer taken before anything is written: nothing written on error */
    const int nt = omp_get_max_threads();
    double *ybuf = malloc((size_t)nt * (size_t)j.d * sizeof(double));
    if (!ybuf) {
        free(signs);
        return fa_fail(c->ctx, FA_ERR_OUT_OF_MEMORY, "%s: out of memory", c->fn);
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int64_t w = 0; w < items; w++)
        quant_block(&j, w / (j.heads * j.nblocks), w / j.nblocks % j.heads, w % j.nblocks,
                    ybuf + (size_t)omp_get_thread_num() * (size_t)j.d);
    free(ybuf);
    free(signs);
    char name[48];
    snprintf(name, sizeof name, "cpu_quantize_fp8_%s%s", fa_dtype_name(x8->dtype),
             hadamard ? "_hadamard" : "");
    fa_select(c->ctx, "cpu", "quantize", name);
    fa_call_done(c->ctx);
    return FA_OK;
}

fa_status fa_quantize_fp8(fa_context *ctx, const fa_tensor *x, fa_tensor *x8, fa_tensor *scales,
                          int64_t block_rows, int hadamard, uint64_t sign_seed) {
    fa_call c = {ctx, "fa_quantize_fp8", NULL, NULL, NULL, x8, NULL, NULL, NULL, NULL, NULL,
                 NULL, 0, 0};
    fa_params params;
    FA_TRY(fa_call_begin(&c, &params));
    return fa_call_end(&c, quantize(&c, x, x8, scales, block_rows, hadamard, sign_seed));
}
