/*
 * tk_tensor.c — seeds, random numbers, dtype rounding and strided host buffers of the testkit.
 *
 * The dtype conversions here are written arithmetically (frexp/ldexp/nearbyint on doubles)
 * rather than by bit manipulation, so that they are an independent check of the library's
 * bit-twiddling conversions in src/internal.h, not a copy of them.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _WIN32
#include <process.h>
#define tk_getpid _getpid
#else
#include <unistd.h>
#define tk_getpid getpid
#endif

#include "testkit.h"

/* ---- seeds and random numbers ---- */

static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tk_seed(void) {
    static int have;
    static uint64_t seed;
    if (have) return seed;
    const char *env = getenv("FLASHATTN_TEST_SEED");
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        timespec_get(&ts, TIME_UTC);
        seed = mix64((uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                     ((uint64_t)tk_getpid() << 32)) % 1000000000000ull;
    }
    have = 1;
    return seed;
}

void tk_rng_init(tk_rng *r, uint64_t seed) { r->s = mix64(seed ^ 0x6a09e667f3bcc909ull); }

uint64_t tk_rng_u64(tk_rng *r) { return mix64(r->s += 0x9e3779b97f4a7c15ull); }

double tk_rng_uniform(tk_rng *r) { return (double)(tk_rng_u64(r) >> 11) * 0x1p-53; }

double tk_rng_normal(tk_rng *r) { /* Box-Muller; 1 - u keeps the log argument in (0, 1] */
    double u = 1.0 - tk_rng_uniform(r), v = tk_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int64_t tk_rng_range(tk_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tk_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* ---- dtype rounding ---- */

/* x rounded to a binary format with p significand bits (implicit one included), smallest
   normal exponent emin and largest finite value maxval: ties to even, overflow to inf. */
static double round_format(double x, int p, int emin, double maxval) {
    if (isnan(x) || isinf(x) || x == 0) return x;
    double ax = fabs(x);
    int e;
    frexp(ax, &e); /* ax in [2^(e-1), 2^e) */
    int lead = e - 1 < emin ? emin : e - 1;
    double quantum = ldexp(1.0, lead - (p - 1));
    double r = nearbyint(ax / quantum) * quantum; /* default rounding mode: to nearest even */
    if (r > maxval) r = INFINITY;
    return copysign(r, x);
}

#define F16_MAX 65504.0
#define BF16_MAX 0x1.fep127

static uint16_t encode(double x, int p, int emin, double maxval, int ebits) {
    uint16_t sign = signbit(x) ? (uint16_t)0x8000u : 0;
    int mbits = p - 1, bias = (1 << (ebits - 1)) - 1;
    uint16_t expmask = (uint16_t)(((1u << ebits) - 1) << mbits);
    if (isnan(x)) return (uint16_t)(sign | expmask | (1u << (mbits - 1)));
    double r = fabs(round_format(x, p, emin, maxval));
    if (isinf(r)) return (uint16_t)(sign | expmask);
    if (r < ldexp(1.0, emin)) /* subnormal or zero: an integer count of the smallest step */
        return (uint16_t)(sign | (uint16_t)(r / ldexp(1.0, emin - mbits)));
    int e;
    frexp(r, &e);
    int lead = e - 1;
    uint32_t mant = (uint32_t)(r / ldexp(1.0, lead - mbits)) - (1u << mbits);
    return (uint16_t)(sign | (uint32_t)(lead + bias) << mbits | mant);
}

static double decode(uint16_t h, int p, int ebits) {
    int mbits = p - 1, bias = (1 << (ebits - 1)) - 1;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    double m = h & ((1u << mbits) - 1);
    double s = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == (1 << ebits) - 1) return m != 0 ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp(m, 1 - bias - mbits);
    return s * ldexp(m + ldexp(1.0, mbits), e - bias - mbits);
}

uint16_t tk_f16_bits(double x) { return encode(x, 11, -14, F16_MAX, 5); }
uint16_t tk_bf16_bits(double x) { return encode(x, 8, -126, BF16_MAX, 8); }
double tk_f16_value(uint16_t h) { return decode(h, 11, 5); }
double tk_bf16_value(uint16_t h) { return decode(h, 8, 8); }

double tk_round_to(fa_dtype dt, double x) {
    switch (dt) {
    case FA_DTYPE_F32: return (double)(float)x;
    case FA_DTYPE_F16: return round_format(x, 11, -14, F16_MAX);
    case FA_DTYPE_BF16: return round_format(x, 8, -126, BF16_MAX);
    default: return x;
    }
}

double tk_unit_roundoff(fa_dtype dt) {
    switch (dt) {
    case FA_DTYPE_F16: return 0x1p-11;
    case FA_DTYPE_BF16: return 0x1p-8;
    case FA_DTYPE_F64: return 0x1p-53;
    default: return 0x1p-24;
    }
}

/* ---- strided buffers ---- */

int64_t tk_numel(const fa_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int tk_buf_alloc(tk_buf *b, fa_dtype dt, int ndim, const int64_t *shape, int strided,
                 tk_rng *r) {
    return tk_buf_alloc_aligned(b, dt, ndim, shape, strided, 1, r);
}

int tk_buf_alloc_aligned(tk_buf *b, fa_dtype dt, int ndim, const int64_t *shape, int strided,
                         int align, tk_rng *r) {
    memset(b, 0, sizeof *b);
    if (ndim < 1 || ndim > 4) return 1;
    fa_tensor *t = &b->t;
    t->dtype = dt;
    t->device = FA_DEVICE_CPU;
    t->ndim = ndim;
    int perm[4] = {0, 1, 2, 3};
    if (strided) /* shuffle the outer dimensions' memory order */
        for (int i = ndim - 2; i > 0; i--) {
            int j = (int)tk_rng_range(r, 0, i), tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    /* Inner to outer: each dimension's stride is the span of what it contains plus a gap. */
    if (align < 1) align = 1;
    int64_t span = shape[ndim - 1] + (strided ? tk_rng_range(r, 1, 3) * align : 0);
    span = (span + align - 1) / align * align;
    t->stride[ndim - 1] = 1;
    for (int k = ndim - 2; k >= 0; k--) {
        int dim = perm[k];
        t->stride[dim] = span;
        span = span * (shape[dim] > 0 ? shape[dim] : 1) + (strided ? tk_rng_range(r, 0, 3) * align : 0);
    }
    if (ndim == 1) span = shape[0];
    int64_t lead = strided ? tk_rng_range(r, 1, 3) * align : 0; /* gap before the first element */
    size_t esz = fa_dtype_size(dt);
    b->bytes = (size_t)(lead + span) * esz;
    if (b->bytes == 0) b->bytes = esz;
    b->base = malloc(b->bytes);
    if (!b->base) return 1;
    t->data = (char *)b->base + lead * esz;
    tk_poison(b);
    return 0;
}

void tk_buf_free(tk_buf *b) {
    tk_device_free(b);
    free(b->base);
    memset(b, 0, sizeof *b);
}

static int64_t elem_offset(const fa_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->stride[d];
        i /= n;
    }
    return off;
}

static double load_raw(const void *p, fa_dtype dt) {
    uint16_t h;
    switch (dt) {
    case FA_DTYPE_F16: memcpy(&h, p, 2); return tk_f16_value(h);
    case FA_DTYPE_BF16: memcpy(&h, p, 2); return tk_bf16_value(h);
    case FA_DTYPE_F64: { double v; memcpy(&v, p, 8); return v; }
    default: { float v; memcpy(&v, p, 4); return v; }
    }
}

double tk_get(const fa_tensor *t, int64_t i) {
    return load_raw((const char *)t->data + elem_offset(t, i) * (int64_t)fa_dtype_size(t->dtype),
                    t->dtype);
}

void tk_set(fa_tensor *t, int64_t i, double x) {
    char *p = (char *)t->data + elem_offset(t, i) * (int64_t)fa_dtype_size(t->dtype);
    uint16_t h;
    switch (t->dtype) {
    case FA_DTYPE_F16: h = tk_f16_bits(x); memcpy(p, &h, 2); break;
    case FA_DTYPE_BF16: h = tk_bf16_bits(x); memcpy(p, &h, 2); break;
    case FA_DTYPE_F64: memcpy(p, &x, 8); break;
    default: { float f = (float)x; memcpy(p, &f, 4); } break;
    }
}

void tk_fill_normal(tk_buf *b, tk_rng *r, double sigma) {
    int64_t n = tk_numel(&b->t);
    for (int64_t i = 0; i < n; i++) tk_set(&b->t, i, sigma * tk_rng_normal(r));
}

void tk_copy(tk_buf *dst, const tk_buf *src) {
    int64_t n = tk_numel(&src->t);
    for (int64_t i = 0; i < n; i++) tk_set(&dst->t, i, tk_get(&src->t, i));
}

void tk_scale_pow2(tk_buf *b, int e) {
    int64_t n = tk_numel(&b->t);
    for (int64_t i = 0; i < n; i++) tk_set(&b->t, i, ldexp(tk_get(&b->t, i), e));
}

int tk_scaled_normal_pair(tk_buf *x, tk_buf *x64, int ndim, const int64_t *shape, int e,
                          tk_rng *r) {
    if (tk_buf_alloc(x, FA_DTYPE_F32, ndim, shape, 0, r)) return 1;
    if (tk_buf_alloc(x64, FA_DTYPE_F64, ndim, shape, 0, r)) {
        tk_buf_free(x);
        return 1;
    }
    tk_fill_normal(x, r, 1);
    tk_scale_pow2(x, e);
    tk_copy(x64, x);
    return 0;
}

void tk_poison(tk_buf *b) {
    if (b->base) memset(b->base, 0xff, b->bytes);
}

static int is_poison(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xff) return 0;
    return 1;
}

int tk_check_written(const tk_buf *b, const char *what, char *msg, size_t msglen) {
    const fa_tensor *t = &b->t;
    size_t esz = fa_dtype_size(t->dtype), nelem = b->bytes / esz;
    int64_t lead = ((const char *)t->data - (const char *)b->base) / (int64_t)esz;
    unsigned char *in_view = calloc(nelem, 1);
    if (!in_view) {
        snprintf(msg, msglen, "%s: out of memory checking writes", what);
        return 1;
    }
    int64_t n = tk_numel(t);
    int bad = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        int64_t e = lead + elem_offset(t, i);
        in_view[e] = 1;
        const unsigned char *p = (const unsigned char *)b->base + (size_t)e * esz;
        if (is_poison(p, esz)) {
            snprintf(msg, msglen, "%s: element %lld (of %lld) was never written", what,
                     (long long)i, (long long)n);
            bad = 1;
        } else if (isnan(load_raw(p, t->dtype))) {
            snprintf(msg, msglen, "%s: element %lld is NaN", what, (long long)i);
            bad = 1;
        }
    }
    for (size_t e = 0; e < nelem && !bad; e++)
        if (!in_view[e] && !is_poison((const unsigned char *)b->base + e * esz, esz)) {
            snprintf(msg, msglen, "%s: wrote outside the view, %lld elements from its start",
                     what, (long long)((int64_t)e - lead));
            bad = 1;
        }
    free(in_view);
    return bad;
}

/* ---- comparisons ---- */

tk_err tk_compare(const fa_tensor *x, const fa_tensor *ref) {
    tk_err e;
    memset(&e, 0, sizeof e);
    e.argmax = -1;
    e.first_nonfinite = -1;
    double sum = 0;
    int64_t n = tk_numel(ref);
    for (int64_t i = 0; i < n; i++) {
        double r = tk_get(ref, i), v = tk_get(x, i);
        int bad;
        if (!isfinite(r))
            bad = !(r == -INFINITY && v == -INFINITY); /* only -inf (empty row LSE) is legal */
        else
            bad = !isfinite(v);
        if (bad) {
            if (e.nonfinite++ == 0) e.first_nonfinite = i;
            continue;
        }
        if (!isfinite(r)) continue;
        double d = fabs(v - r);
        sum += d;
        e.count++;
        if (d > e.max_abs || e.argmax < 0) {
            e.max_abs = d;
            e.argmax = i;
        }
        if (fabs(r) > e.ref_max) e.ref_max = fabs(r);
    }
    e.mean_abs = e.count ? sum / (double)e.count : 0;
    return e;
}
