/*
 * cpu/tile_math.h — shared by the CPU kernels (fwd_tiled.c, bwd_tiled.c, kvcache.c, merge.c):
 * tile shape, workspace carving, dtype <-> fp32 rows, the register-blocked matmul every tile
 * product is made of, and the per-element score transform (softcap, ALiBi, mask).
 *
 * Everything is static and always inlined, so each FA_TM_HOT work-item function (one per
 * instruction-set clone) gets its own copy of these loops compiled for its target.
 */
#ifndef FA_CPU_TILE_MATH_H
#define FA_CPU_TILE_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../fp8.h"
#include "kernels.h"
#include "simd.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

#define FA_TM_BQ FA_CPU_TILE
#define FA_TM_BK FA_CPU_TILE

#if defined(__GNUC__)
#define FA_TM_INLINE static inline __attribute__((always_inline))
#else
#define FA_TM_INLINE static inline
#endif

/*
 * FA_TM_HOT marks a kernel's work-item function. Each of these files is compiled once per
 * instruction-set level (isa.h), so the marker only has to keep the hot loops out of the
 * callers' frames; the level's -m flags and -ffp-contract=fast (contracting a*b+c into one
 * FMA, as any BLAS does: the build is ISO C11, where GCC would otherwise keep a multiply and
 * an add) come from CMake.
 */
#if defined(__GNUC__)
#define FA_TM_HOT __attribute__((noinline))
#else
#define FA_TM_HOT
#endif

/* Promise of independent iterations; only on loops without calls (no vector libm here). */
#ifdef _OPENMP
#define FA_TM_SIMD _Pragma("omp simd")
#else
#define FA_TM_SIMD
#endif

FA_TM_INLINE int fa_tm_tid(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

FA_TM_INLINE int fa_tm_pad4(int n) { return (n + 3) & ~3; }
FA_TM_INLINE int fa_tm_pad16(int n) { return (n + 15) & ~15; }

/* Workspace carving: buffers of n floats, each starting on a 64-byte boundary. With base NULL
   only the offset advances, so one layout function both sizes and places the buffers. */
FA_TM_INLINE float *fa_tm_take(float *base, size_t *off, size_t n) {
    float *r = base ? base + *off : NULL;
    *off += (n + 15) & ~(size_t)15;
    return r;
}

/* The caller's workspace need not be aligned: round up, and count the slack in the size. */
#define FA_TM_WS_SLACK 64
FA_TM_INLINE float *fa_tm_align(void *ws) {
    return (float *)(((uintptr_t)ws + (FA_TM_WS_SLACK - 1)) & ~(uintptr_t)(FA_TM_WS_SLACK - 1));
}

/* ---- dtype rows ---- */

/* Row (b, t, h) of an operand whose elements are es bytes: fa_at without the size lookup. */
FA_TM_INLINE void *fa_tm_row(const fa_operand *a, size_t es, int64_t b, int64_t t, int64_t h) {
    return (char *)a->data + (size_t)(b * a->sb + t * a->st + h * a->sh) * es;
}

/* Rows of the next tile of two operands (K and V, or Q and dO), asked for one row at a time
   from inside a loop of the current tile: rows of one head sit heads*d elements apart, a
   stride the hardware prefetchers do not follow across a tile, and a burst of a whole tile of
   prefetches would stall on the core's miss buffers. */
typedef struct fa_tm_ahead {
    const char *a, *b; /* row 0 of the next tile in each operand */
    ptrdiff_t sa, sb;  /* bytes between rows */
    int64_t n;         /* rows to fetch (<= 0: none) */
    size_t bytes;      /* bytes per row */
} fa_tm_ahead;

FA_TM_INLINE void fa_tm_ahead_init(fa_tm_ahead *f, const fa_operand *a, const fa_operand *b,
                                   size_t es, int64_t bi, int64_t t0, int64_t n, int64_t h,
                                   int64_t d) {
    f->n = n;
    f->sa = (ptrdiff_t)(a->st * (int64_t)es);
    f->sb = (ptrdiff_t)(b->st * (int64_t)es);
    f->bytes = (size_t)d * es;
    f->a = f->b = NULL;
    if (n <= 0) return;
    f->a = (const char *)fa_tm_row(a, es, bi, t0, h);
    f->b = (const char *)fa_tm_row(b, es, bi, t0, h);
}

FA_TM_INLINE void fa_tm_ahead_row(const fa_tm_ahead *f, int64_t r) {
#if defined(__GNUC__)
    if (r >= f->n) return;
    const char *ra = f->a + r * f->sa, *rb = f->b + r * f->sb;
    for (size_t x = 0; x < f->bytes; x += 64) {
        __builtin_prefetch(ra + x, 0, 1);
        __builtin_prefetch(rb + x, 0, 1);
    }
    __builtin_prefetch(ra + f->bytes - 1, 0, 1);
    __builtin_prefetch(rb + f->bytes - 1, 0, 1);
#else
    (void)f, (void)r;
#endif
}

/* IEEE half to float without branches or FP tricks that DAZ would break, so the loop that
   calls it vectorises: rebias the exponent in the integer domain, and build subnormals exactly
   from their integer mantissa. */
FA_TM_INLINE float fa_tm_h2f(uint16_t h) {
    uint32_t mag = h & 0x7fffu;
    uint32_t exp = mag >> 10;
    uint32_t bits = (mag << 13) + (112u << 23);
    if (exp == 31) bits += 112u << 23; /* inf / nan: exponent field all ones */
    float f;
    memcpy(&f, &bits, 4);
    if (exp == 0) f = (float)mag * 0x1p-24f;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

FA_TM_INLINE float fa_tm_bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* dst[x] = mul * src[x] for x < n, then zeros up to npad (padding feeds matmuls: keep it 0). */
FA_TM_INLINE void fa_tm_load_row(float *restrict dst, const void *restrict src, fa_dtype dt, int n,
                                 int npad, float mul) {
    switch (dt) {
    case FA_DTYPE_F16: {
        const uint16_t *restrict s = (const uint16_t *)src;
        int x = 0;
#if defined(__F16C__)
        const __m256 m8 = _mm256_set1_ps(mul);
        for (; x + 8 <= n; x += 8)
            _mm256_storeu_ps(dst + x, _mm256_mul_ps(m8, _mm256_cvtph_ps(_mm_loadu_si128(
                                                            (const __m128i *)(s + x)))));
#endif
        for (; x < n; x++) dst[x] = mul * fa_tm_h2f(s[x]);
        break;
    }
    case FA_DTYPE_BF16: {
        const uint16_t *restrict s = (const uint16_t *)src;
        FA_TM_SIMD
        for (int x = 0; x < n; x++) dst[x] = mul * fa_tm_bf2f(s[x]);
        break;
    }
    case FA_DTYPE_F64: { /* never dispatched to tiled kernels; kept total */
        const double *restrict s = (const double *)src;
        for (int x = 0; x < n; x++) dst[x] = mul * (float)s[x];
        break;
    }
    case FA_DTYPE_F8_E4M3:
    case FA_DTYPE_F8_E5M2: { /* exact: every FP8 value is an fp32 value (fp8.h) */
        const uint8_t *restrict s = (const uint8_t *)src;
        const float *restrict tab = fa_fp8_table(dt);
        for (int x = 0; x < n; x++) dst[x] = mul * tab[s[x]];
        break;
    }
    default: {
        const float *restrict s = (const float *)src;
        for (int x = 0; x < n; x++) dst[x] = mul * s[x];
        break;
    }
    }
    for (int x = n; x < npad; x++) dst[x] = 0.0f;
}

/* The same row written down a column: dst[x * ld] (transposed tiles, once per work item). */
FA_TM_INLINE void fa_tm_load_col(float *restrict dst, ptrdiff_t ld, const void *restrict src,
                                 fa_dtype dt, int n, float mul) {
    for (int x = 0; x < n; x++) {
        float v;
        switch (dt) {
        case FA_DTYPE_F16: v = fa_tm_h2f(((const uint16_t *)src)[x]); break;
        case FA_DTYPE_BF16: v = fa_tm_bf2f(((const uint16_t *)src)[x]); break;
        case FA_DTYPE_F64: v = (float)((const double *)src)[x]; break;
        case FA_DTYPE_F8_E4M3:
        case FA_DTYPE_F8_E5M2: v = fa_fp8_table(dt)[((const uint8_t *)src)[x]]; break;
        default: v = ((const float *)src)[x]; break;
        }
        dst[x * ld] = mul * v;
    }
}

/*
 * Rows t0 .. t0 + n - 1 (n <= FA_CPU_TILE) of head h of operand o, transposed into a tile of
 * FA_CPU_TILE columns: dst[x * FA_CPU_TILE + i] = element x of row i for x < d, 0 for i >= n
 * (the Q^T, K^T and V^T tiles of the kernels). AVX-512 transposes 16 x 16 blocks in registers:
 * a scalar loop's stores would land a column apart each.
 */
FA_TM_INLINE void fa_tm_load_tile_t(float *restrict dst, const fa_operand *o, fa_dtype dt,
                                    int64_t bi, int64_t t0, int n, int64_t h, int d) {
    const size_t es = fa_dtype_size(dt);
#if defined(__AVX512F__)
    for (int i0 = 0; i0 < FA_CPU_TILE; i0 += 16)
        for (int x0 = 0; x0 < d; x0 += 16) {
            const int nx = d - x0 < 16 ? d - x0 : 16;
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                r[i] = _mm512_setzero_si512();
                if (i0 + i >= n) continue;
                const char *row = (const char *)fa_tm_row(o, es, bi, t0 + i0 + i, h) + x0 * es;
                if (dt == FA_DTYPE_F32) {
                    r[i] = _mm512_castps_si512(
                        _mm512_maskz_loadu_ps((__mmask16)((1u << nx) - 1), row));
                } else {
                    float tmp[16];
                    fa_tm_load_row(tmp, row, dt, nx, 16, 1.0f);
                    r[i] = _mm512_loadu_si512(tmp);
                }
            }
            fa_transpose16(r);
            for (int t = 0; t < nx; t++)
                _mm512_storeu_si512(dst + (ptrdiff_t)(x0 + t) * FA_CPU_TILE + i0, r[t]);
        }
#else
    for (int i = 0; i < n; i++)
        fa_tm_load_col(dst + i, FA_CPU_TILE, fa_tm_row(o, es, bi, t0 + i, h), dt, d, 1.0f);
    for (int x = 0; x < d; x++)
        for (int i = n; i < FA_CPU_TILE; i++) dst[(ptrdiff_t)x * FA_CPU_TILE + i] = 0.0f;
#endif
}

/* dst[x] = mul * src[x] in dtype dt (round to nearest even). */
FA_TM_INLINE void fa_tm_store_row(void *restrict dst, fa_dtype dt, const float *restrict src, int n,
                                  float mul) {
    switch (dt) {
    case FA_DTYPE_F16:
        for (int x = 0; x < n; x++) ((uint16_t *)dst)[x] = fa_f32_to_f16(mul * src[x]);
        break;
    case FA_DTYPE_BF16:
        for (int x = 0; x < n; x++) ((uint16_t *)dst)[x] = fa_f32_to_bf16(mul * src[x]);
        break;
    case FA_DTYPE_F64:
        for (int x = 0; x < n; x++) ((double *)dst)[x] = mul * src[x];
        break;
    default:
        for (int x = 0; x < n; x++) ((float *)dst)[x] = mul * src[x];
        break;
    }
}

/* All-zero bits are +0 in every dtype. */
FA_TM_INLINE void fa_tm_store_zero(void *dst, fa_dtype dt, int n) {
    memset(dst, 0, (size_t)n * fa_dtype_size(dt));
}

/* ---- matmul ---- */

/*
 * Register blocking of the micro-kernel: mr rows by FA_NV vectors of C stay in registers for
 * the whole k loop, so per k step the kernel loads FA_NV vectors of B and broadcasts mr values
 * of A for mr * FA_NV FMAs. AVX-512: 6 x 4 zmm = 24 accumulators of its 32 registers (2 FMA
 * pipes of latency 4 need 8 chains in flight; 6 rows load 10 values per 24 FMAs where 4 rows
 * load 8 per 16), 4 x 4 for the row counts 6 does not divide; AVX2: 6 x 2 of its 16
 * registers; the scalar level (SSE2 on x86, no FMA: products need registers of their own)
 * stays at 4 x 2 (each choice measured against the others: cpu.md).
 */
#define FA_MR 4 /* rows of the blocks every m (a multiple of 4) can be cut into */
#if FA_VW == 16
#define FA_NV 4
#define FA_MR_MAX 6
#elif FA_VW == 8
#define FA_NV 2
#define FA_MR_MAX 6
#else
#define FA_NV 2
#define FA_MR_MAX 4
#endif
#define FA_NB (FA_NV * FA_VW) /* columns of C per block */

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(FP_FAST_FMAF)
#define FA_TM_FMA 1 /* acc += x * b contracts to one rounding a term */
#else
#define FA_TM_FMA 0
#endif
/* C[r][0:nv*VW] (+)= sum_k A(r, k) B[k][0:nv*VW] for r < mr, with A(r, k) = a[r*ars + k*aks]
   (any layout: A values are broadcast) and B rows contiguous; add 0 overwrites C (no zeroing
   pass over it first). mr, nv and add are constants at each call site, so the accumulators
   become registers. */
FA_TM_INLINE void fa_tm_mk(int mr, int nv, int add, int kdim, const float *restrict a,
                           ptrdiff_t ars, ptrdiff_t aks, const float *restrict b, ptrdiff_t ldb,
                           float *restrict c, ptrdiff_t ldc, float *restrict cmax) {
#if !FA_TM_FMA
    /* Without FMA (the scalar level on x86-64: SSE2) a float multiply-add rounds twice a
       term, up to twice the error of the FMA matmul the 2x rule measures against (a 5-key
       fp32 decode failed it: cpu.md); the products of floats are exact in
       double, so the sums run in double (two SSE2 halves a vector) and round once at the end. */
    typedef double fa_vd2 __attribute__((vector_size(16)));
    fa_vd2 accd[FA_MR_MAX][FA_NV][2];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            for (int h = 0; h < 2; h++)
                accd[r][v][h] = add ? (fa_vd2){c[r * ldc + v * FA_VW + 2 * h],
                                               c[r * ldc + v * FA_VW + 2 * h + 1]}
                                    : (fa_vd2){0, 0};
    for (int k = 0; k < kdim; k++) {
        const float *restrict bk = b + k * ldb;
        const float *restrict ak = a + k * aks;
        fa_vd2 bv[FA_NV][2];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            for (int h = 0; h < 2; h++)
                bv[v][h] = (fa_vd2){bk[v * FA_VW + 2 * h], bk[v * FA_VW + 2 * h + 1]};
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const double xs = ak[r * ars];
            const fa_vd2 x = {xs, xs};
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                for (int h = 0; h < 2; h++) accd[r][v][h] += x * bv[v][h];
        }
    }
    fa_vf acc[FA_MR_MAX][FA_NV];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            for (int e = 0; e < FA_VW; e++) acc[r][v][e] = (float)accd[r][v][e / 2][e % 2];
#else
    /* The sum over k starts from 0 and C is added once at the end: a running accumulator
       (the forward's O over the key tiles, up to l |V| in size) then takes one rounding at
       its own size per call instead of one per k step, which kept long rows' O error near
       the 2x rule's edge (cpu.md). Same instructions, C's loads later. */
    fa_vf acc[FA_MR_MAX][FA_NV];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[r][v] = (fa_vf){0};
    /* two k steps per loop trip: the loop's own add/cmp/branch and the pointer updates are
       otherwise a noticeable share of a step's 34 instructions */
#pragma GCC unroll 2
    for (int k = 0; k < kdim; k++) {
        const float *restrict bk = b + k * ldb;
        const float *restrict ak = a + k * aks;
        fa_vf bv[FA_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) bv[v] = fa_vload(bk + v * FA_VW);
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const fa_vf x = fa_vset1(ak[r * ars]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[r][v] += x * bv[v];
        }
    }
    if (add)
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[r][v] += fa_vload(c + r * ldc + v * FA_VW);
#endif
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) fa_vstore(c + r * ldc + v * FA_VW, acc[r][v]);
    if (cmax) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            fa_vf mx = fa_vload(cmax + v * FA_VW);
#pragma GCC unroll 8
            for (int r = 0; r < mr; r++) mx = fa_vmax(mx, acc[r][v]);
            fa_vstore(cmax + v * FA_VW, mx);
        }
    }
}

/* One block row of C: mr rows, the column blocks of n. */
FA_TM_INLINE void fa_tm_gemm_rows(int mr, int add, int n, int kdim, const float *a, ptrdiff_t ars,
                                  ptrdiff_t aks, const float *b, ptrdiff_t ldb, float *c,
                                  ptrdiff_t ldc, float *cmax) {
    for (int x = 0; x < n; x += FA_NB) {
        const int nv = (n - x >= FA_NB ? FA_NB : n - x) / FA_VW;
        float *cx = cmax ? cmax + x : NULL;
        switch (nv) {
#if FA_NV == 4
        case 4: fa_tm_mk(mr, 4, add, kdim, a, ars, aks, b + x, ldb, c + x, ldc, cx); break;
        case 3: fa_tm_mk(mr, 3, add, kdim, a, ars, aks, b + x, ldb, c + x, ldc, cx); break;
#endif
        case 2: fa_tm_mk(mr, 2, add, kdim, a, ars, aks, b + x, ldb, c + x, ldc, cx); break;
        default: fa_tm_mk(mr, 1, add, kdim, a, ars, aks, b + x, ldb, c + x, ldc, cx); break;
        }
    }
}

/* C[m][n] (+)= A B over kdim, C row-major with stride ldc. m must be a multiple of 4 and n of
   16 (callers pad their tiles with zeros); A's padding rows are read, B's never past kdim.
   Rows go in blocks of FA_MR_MAX while the rest stays a multiple of FA_MR, then of FA_MR. */
FA_TM_INLINE void fa_tm_gemm_x(int add, int m, int n, int kdim, const float *a, ptrdiff_t ars,
                               ptrdiff_t aks, const float *b, ptrdiff_t ldb, float *c,
                               ptrdiff_t ldc, float *cmax) {
    int big = m / FA_MR_MAX;
    while (big > 0 && (m - big * FA_MR_MAX) % FA_MR) big--;
    int r = 0;
    for (; r < big * FA_MR_MAX; r += FA_MR_MAX)
        fa_tm_gemm_rows(FA_MR_MAX, add, n, kdim, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc,
                        cmax);
    for (; r < m; r += FA_MR)
        fa_tm_gemm_rows(FA_MR, add, n, kdim, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc,
                        cmax);
}

/* C += A B */
FA_TM_INLINE void fa_tm_gemm(int m, int n, int kdim, const float *a, ptrdiff_t ars, ptrdiff_t aks,
                             const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc) {
    fa_tm_gemm_x(1, m, n, kdim, a, ars, aks, b, ldb, c, ldc, NULL);
}

/* C += A B for any m: no padding rows (fa_tm_gemm's m is a multiple of 4), the last 1 to 3
   rows a block of their own; for the decode kernel, whose rows are a GQA group of any size. */
FA_TM_INLINE void fa_tm_gemm_exact(int m, int n, int kdim, const float *a, ptrdiff_t ars,
                                   ptrdiff_t aks, const float *b, ptrdiff_t ldb, float *c,
                                   ptrdiff_t ldc) {
    const int m4 = m & ~3;
    if (m4) fa_tm_gemm_x(1, m4, n, kdim, a, ars, aks, b, ldb, c, ldc, NULL);
    a += m4 * ars;
    c += m4 * ldc;
    switch (m - m4) {
    case 3: fa_tm_gemm_rows(3, 1, n, kdim, a, ars, aks, b, ldb, c, ldc, NULL); break;
    case 2: fa_tm_gemm_rows(2, 1, n, kdim, a, ars, aks, b, ldb, c, ldc, NULL); break;
    case 1: fa_tm_gemm_rows(1, 1, n, kdim, a, ars, aks, b, ldb, c, ldc, NULL); break;
    default: break;
    }
}

/* C = A B */
FA_TM_INLINE void fa_tm_gemm_set(int m, int n, int kdim, const float *a, ptrdiff_t ars,
                                 ptrdiff_t aks, const float *b, ptrdiff_t ldb, float *c,
                                 ptrdiff_t ldc) {
    fa_tm_gemm_x(0, m, n, kdim, a, ars, aks, b, ldb, c, ldc, NULL);
}

/* C = A B, and cmax[x] = max(cmax[x], max over the m rows of C[.][x]) for x < n: the
   column maxima of the product come from the registers, without a pass over C. */
FA_TM_INLINE void fa_tm_gemm_set_max(int m, int n, int kdim, const float *a, ptrdiff_t ars,
                                     ptrdiff_t aks, const float *b, ptrdiff_t ldb, float *c,
                                     ptrdiff_t ldc, float *cmax) {
    fa_tm_gemm_x(0, m, n, kdim, a, ars, aks, b, ldb, c, ldc, cmax);
}

/* Whether rows 0 .. n - 1 of dp floats (a multiple of FA_VW; row stride ld) are all finite:
   x * 0 is 0 for a finite x and NaN for an infinite or NaN one. */
FA_TM_INLINE int fa_tm_rows_finite(const float *a, int n, int dp, ptrdiff_t ld) {
    fa_vf z = {0};
    for (int r = 0; r < n; r++)
        for (int c = 0; c < dp; c += FA_VW) z += fa_vload(a + (ptrdiff_t)r * ld + c) * 0.0f;
    int ok = 1;
    for (int l = 0; l < FA_VW; l++) ok &= z[l] == 0.0f;
    return ok;
}

/*
 * C[r][0:n] += sum over the k that r sees of A(r, k) B[k][0:n], r < m: the product of a tile
 * with a mask edge when B holds an Inf or NaN. Row r sees k in [lo[r], hi[r]) (by_col 0) or,
 * with by_col 1, the k whose range holds r (lo[k] <= r < hi[k]: the transposed product, a row
 * per key). A masked entry of A is 0, but 0 * Inf is NaN: a masked key must not contribute,
 * so the masked terms are skipped, not multiplied. Each row sums from 0 and adds C once, as
 * fa_tm_mk does with FMA. Rare (special values in a tile with a mask edge): kept simple.
 */
FA_TM_INLINE void fa_tm_gemm_vis(int m, int n, int kdim, const int *lo, const int *hi,
                                 int by_col, const float *a, ptrdiff_t ars, ptrdiff_t aks,
                                 const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc) {
    for (int r = 0; r < m; r++) {
        float *restrict cr = c + (ptrdiff_t)r * ldc;
        for (int x = 0; x < n; x += FA_VW) {
            fa_vf acc = {0};
            for (int k = 0; k < kdim; k++) {
                const int sees = by_col ? lo[k] <= r && r < hi[k] : lo[r] <= k && k < hi[r];
                if (sees) acc += fa_vset1(a[r * ars + k * aks]) * fa_vload(b + k * ldb + x);
            }
            fa_vstore(cr + x, fa_vload(cr + x) + acc);
        }
    }
}

/* Tiles per work item for kernels whose items take a run of consecutive tiles sharing each
   tile of the other operand: up to max, but halved while that would leave fewer than four
   items per thread (streams = independent (batch, head) sequences of `tiles` tiles). */
FA_TM_INLINE int fa_tm_group(int64_t tiles, int64_t streams, int threads, int max) {
    int g = max;
    while (g > 1 && streams * ((tiles + g - 1) / g) < 4 * (int64_t)threads) g /= 2;
    return g;
}

/* ---- masks ---- */

/* The query rows of one tile and the keys each sees (absolute positions in the sequence). */
typedef struct fa_tm_qrows {
    int n;                              /* rows in the tile */
    int64_t lo[FA_TM_BQ], hi[FA_TM_BQ]; /* row i sees keys [lo, hi); empty when lo >= hi */
    int64_t ulo, uhi;                   /* union over the non-empty rows; ulo >= uhi: none */
    int64_t ilo, ihi;                   /* keys every row sees: [max lo, min hi) */
    int64_t diag0;                      /* diagonal column c(i0) of the first row */
} fa_tm_qrows;

/* ulo, uhi, ilo, ihi from the rows' ranges. */
FA_TM_INLINE void fa_tm_qrows_bounds(fa_tm_qrows *r) {
    r->ulo = r->ihi = INT64_MAX;
    r->uhi = r->ilo = INT64_MIN;
    for (int i = 0; i < r->n; i++) {
        if (r->lo[i] > r->ilo) r->ilo = r->lo[i];
        if (r->hi[i] < r->ihi) r->ihi = r->hi[i];
        if (r->lo[i] >= r->hi[i]) continue;
        if (r->lo[i] < r->ulo) r->ulo = r->lo[i];
        if (r->hi[i] > r->uhi) r->uhi = r->hi[i];
    }
}

FA_TM_INLINE void fa_tm_qrows_init(fa_tm_qrows *r, const fa_problem *p, int64_t i0, int n,
                                   int64_t sq, int64_t sk) {
    r->n = n;
    r->diag0 = i0 + sk - sq;
    for (int i = 0; i < n; i++) fa_row_keys(p, i0 + i, sq, sk, &r->lo[i], &r->hi[i]);
    fa_tm_qrows_bounds(r);
}

enum { FA_TM_NONE = 0, FA_TM_FULL = 1, FA_TM_PARTIAL = 2 };

/* How key tile [j0, j1) meets the query tile: nothing visible (skip it), every element
   visible (no per-element mask), or in part. The first two are found from the bounds when
   they hold for the whole tile (they do for all but the edge tiles of a mask); the loop over
   the rows is for the rest. */
FA_TM_INLINE int fa_tm_classify(const fa_tm_qrows *r, int64_t j0, int64_t j1) {
    if (j0 >= r->ilo && j1 <= r->ihi) return FA_TM_FULL;
    if (j0 >= r->uhi || j1 <= r->ulo) return FA_TM_NONE;
    int any = 0, all = 1;
    for (int i = 0; i < r->n; i++) {
        int64_t lo = r->lo[i] > j0 ? r->lo[i] : j0;
        int64_t hi = r->hi[i] < j1 ? r->hi[i] : j1;
        if (lo < hi) any = 1;
        if (r->lo[i] > j0 || r->hi[i] < j1) all = 0;
    }
    return !any ? FA_TM_NONE : all ? FA_TM_FULL : FA_TM_PARTIAL;
}

/* The query tiles g0 .. g0 + gsize - 1 of a sequence of sq rows, those that exist: their rows
   in rows[], row counts in nq[], the union of their key ranges in [*ulo, *uhi); returns how
   many exist. */
FA_TM_INLINE int fa_tm_qrun_init(fa_tm_qrows *rows, int *nq, const fa_problem *p, int64_t g0,
                                 int gsize, int64_t sq, int64_t sk, int64_t *ulo, int64_t *uhi) {
    int n = 0;
    *ulo = INT64_MAX;
    *uhi = INT64_MIN;
    for (; n < gsize; n++) {
        const int64_t i0 = (g0 + n) * FA_TM_BQ;
        if (i0 >= sq) break;
        nq[n] = sq - i0 < FA_TM_BQ ? (int)(sq - i0) : FA_TM_BQ;
        fa_tm_qrows_init(&rows[n], p, i0, nq[n], sq, sk);
        if (rows[n].ulo < *ulo) *ulo = rows[n].ulo;
        if (rows[n].uhi > *uhi) *uhi = rows[n].uhi;
    }
    return n;
}

/* kind[s] of each of n query tiles against key tile [j0, j1); returns whether any sees it. */
FA_TM_INLINE int fa_tm_classify_run(const fa_tm_qrows *rows, int n, int64_t j0, int64_t j1,
                                    int *kind) {
    int any = 0;
    for (int s = 0; s < n; s++) {
        kind[s] = fa_tm_classify(&rows[s], j0, j1);
        any |= kind[s] != FA_TM_NONE;
    }
    return any;
}

/* First row in [a, z) whose key range ends after `key` (by_lo 0) or starts at or after it
   (by_lo 1). Both ends of a row's range never decrease with the row, so the test fails up
   to some row and holds from there on: bisect. */
FA_TM_INLINE int64_t fa_tm_first_row(const fa_problem *p, int64_t sq, int64_t sk, int64_t a,
                                     int64_t z, int64_t key, int by_lo) {
    while (a < z) {
        const int64_t i = a + (z - a) / 2;
        int64_t lo, hi;
        fa_row_keys(p, i, sq, sk, &lo, &hi);
        if (by_lo ? lo >= key : hi > key)
            z = i;
        else
            a = i + 1;
    }
    return a;
}

/* Rows t0 .. t0 + n - 1 of head h of operands oa and ob (K and V, or Q and dO) as fp32 rows of
   dp floats at a and b, zero rows up to pad4(n): the packed tiles the matmuls read. */
FA_TM_INLINE void fa_tm_pack_rows2(float *a, float *b, const fa_operand *oa, const fa_operand *ob,
                                   fa_dtype dt, int64_t bi, int64_t t0, int n, int64_t h, int d,
                                   int dp) {
    const size_t es = fa_dtype_size(dt);
    for (int j = 0; j < n; j++) {
        fa_tm_load_row(a + (ptrdiff_t)j * dp, fa_tm_row(oa, es, bi, t0 + j, h), dt, d, dp, 1.0f);
        fa_tm_load_row(b + (ptrdiff_t)j * dp, fa_tm_row(ob, es, bi, t0 + j, h), dt, d, dp, 1.0f);
    }
    const size_t pad = (size_t)(fa_tm_pad4(n) - n) * dp * sizeof(float);
    memset(a + (ptrdiff_t)n * dp, 0, pad);
    memset(b + (ptrdiff_t)n * dp, 0, pad);
}

/* The masks of a query tile seen from key tile j0: visible local keys [lo, hi) in 0..BK, and
   the ALiBi distance origin c(i) - j0 (as a float, so distances are exact below 2^24).
   Padding rows past r->n see nothing. */
typedef struct fa_tm_rel {
    int lo[FA_TM_BQ], hi[FA_TM_BQ];
    float diag[FA_TM_BQ];
} fa_tm_rel;

FA_TM_INLINE int fa_tm_clampk(int64_t v) { return v < 0 ? 0 : v > FA_TM_BK ? FA_TM_BK : (int)v; }

FA_TM_INLINE void fa_tm_rel_init(fa_tm_rel *rel, const fa_tm_qrows *r, int64_t j0) {
    for (int i = 0; i < FA_TM_BQ; i++) {
        int real = i < r->n;
        rel->lo[i] = real ? fa_tm_clampk(r->lo[i] - j0) : 0;
        rel->hi[i] = real ? fa_tm_clampk(r->hi[i] - j0) : 0;
        rel->diag[i] = (float)(r->diag0 + i - j0);
    }
}

/*
 * The backward's scale, split as scale = pre * post with one of them 1 (so both exact): dS is
 * multiplied by pre before its products dQ = sum dS K and dK = sum dS Q, the sums by post when
 * stored. pre = min(scale, 1), so that no partial sum exceeds the bound of the result it makes:
 * with the whole scale applied at the store, a tiny scale (1e-43) let sum dS K overflow fp32
 * although scale * sum dS K is finite (fuzz finding bwd-dq-nonfinite-1d39219f).
 */
FA_TM_INLINE float fa_tm_ds_pre(float scale) { return scale < 1.0f ? scale : 1.0f; }
FA_TM_INLINE float fa_tm_ds_post(float scale) { return scale < 1.0f ? 1.0f : scale; }

/*
 * Where the scale goes. Every kernel computes raw dot products q.k (the operands never carry
 * the scale: rounding scale * q would perturb each score by a rounding of its own, and the
 * forward and the backward must see the same scores). A tile that needs no transform gets the
 * scale inside its exponentials, exp(fma(s, scale, -m)), at no cost; a tile with a mask edge,
 * softcap or ALiBi is scaled by the transform below, and its exponentials take mul = 1.
 */
FA_TM_INLINE int fa_tm_needs_transform(int kind, float softcap, float slope) {
    return kind == FA_TM_PARTIAL || softcap > 0 || slope != 0.0f;
}

/*
 * Softcap and ALiBi are evaluated in double and rounded once, as a plain implementation
 * rounds each elementwise step once: in float, tanhf, the division and the product (or the
 * ALiBi product and difference) round three times, which alone took the d 8 fp32 sweep case
 * (where the dot products are nearly exact) past 2x the plain error on the scalar level at
 * times. Tiles with a softcap are few and ALiBi is one multiply-add per score.
 */
/*
 * Dot products -> final scores, on a key-major tile st[j][i] (row per key j < nk, column per
 * query i < nc, row stride FA_TM_BQ): times mul (the softmax scale, where the operands do not
 * carry it already; 1 where they do), softcap (and, when g is not NULL, its derivative
 * 1 - tanh^2 into g), then ALiBi, then -inf where masked (only if masked).
 */
FA_TM_INLINE void fa_tm_scores_kmajor(float *restrict st, float *restrict g, int nk, int nc,
                                      const fa_tm_rel *rel, float mul, float softcap,
                                      float slope, int masked) {
    for (int j = 0; j < nk; j++) {
        float *restrict s = st + (ptrdiff_t)j * FA_TM_BQ;
        if (mul != 1.0f) {
            FA_TM_SIMD
            for (int i = 0; i < nc; i++) s[i] *= mul;
        }
        if (softcap > 0) {
            float *restrict gj = g ? g + (ptrdiff_t)j * FA_TM_BQ : NULL;
            for (int i = 0; i < nc; i++) {
                const double t = tanh((double)s[i] / softcap); /* in double: see above */
                s[i] = (float)(softcap * t);
                if (gj) gj[i] = (float)(1.0 - t * t);
            }
        }
        if (slope != 0.0f) {
            float fj = (float)j;
            FA_TM_SIMD
            for (int i = 0; i < nc; i++)
                s[i] = (float)((double)s[i] - (double)slope * fabsf(rel->diag[i] - fj));
        }
        if (masked) {
            FA_TM_SIMD
            for (int i = 0; i < nc; i++)
                if (j < rel->lo[i] || j >= rel->hi[i]) s[i] = -INFINITY;
        }
    }
}

/* The same on a query-major tile s[i][j] (row per query i < nq, column per key j < nk, row
   stride FA_TM_BK). */
FA_TM_INLINE void fa_tm_scores_qmajor(float *restrict sm, float *restrict g, int nq, int nk,
                                      const fa_tm_rel *rel, float mul, float softcap,
                                      float slope, int masked) {
    for (int i = 0; i < nq; i++) {
        float *restrict s = sm + (ptrdiff_t)i * FA_TM_BK;
        if (mul != 1.0f) {
            FA_TM_SIMD
            for (int j = 0; j < nk; j++) s[j] *= mul;
        }
        if (softcap > 0) {
            float *restrict gi = g ? g + (ptrdiff_t)i * FA_TM_BK : NULL;
            for (int j = 0; j < nk; j++) {
                const double t = tanh((double)s[j] / softcap);
                s[j] = (float)(softcap * t);
                if (gi) gi[j] = (float)(1.0 - t * t);
            }
        }
        if (slope != 0.0f) {
            float di = rel->diag[i];
            FA_TM_SIMD
            for (int j = 0; j < nk; j++)
                s[j] = (float)((double)s[j] - (double)slope * fabsf(di - (float)j));
        }
        if (masked) {
            int lo = rel->lo[i], hi = rel->hi[i];
            FA_TM_SIMD
            for (int j = 0; j < nk; j++)
                if (j < lo || j >= hi) s[j] = -INFINITY;
        }
    }
}

#endif /* FA_CPU_TILE_MATH_H */
