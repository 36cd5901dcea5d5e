/*
 * cpu/amx_split.h — fp32 products on the bf16 AMX unit (the amx level's fp32 forward and
 * backward; put_row also feeds the bf16 kernels' operand rows): each
 * fp32 operand x is split into three bf16 parts, x = hi + mid + lo exactly, and a product
 * x y is formed from the six partial products whose size reaches fp32's precision,
 *
 *   hi*hi (2^0),  hi*mid, mid*hi (2^-8),  hi*lo, mid*mid, lo*hi (2^-16),
 *
 * each exact in tdpbf16ps's fp32 accumulation (8 x 8 significant bits); the three dropped,
 * mid*lo, lo*mid, lo*lo, are below 2^-23 |x y| (cuBLAS calls this BF16x9 emulation; six of the
 * nine products suffice under the 2x rule: cpu.md).
 *
 * The parts come from integer masks and adds, no conversions (the VNNI pair of two values is
 * then a shift and a word blend, no permute): hi = the top 16 bits of x (sign, exponent, 7
 * stored mantissa bits: truncated, so x near FLT_MAX never rounds up to inf); r = x - hi is
 * exact (same sign, |hi| >= |x| / 2); mid = r rounded to its top 16 bits (to nearest, ties
 * away from zero: add half an ulp to the bits, then mask); lo = r - mid is exact and has at
 * most 8 significant bits, so it is a bf16 value too, and x = hi + mid + lo exactly.
 * mid must round: then lo has a random sign, and every dropped product (mid*lo, lo*mid,
 * lo*lo) has a lo factor, so their errors cancel along a dot product. Truncated, lo would
 * have the sign of x, the dropped products the sign of the product, a bias that adds up
 * (cpu.md). Parts below 2^-126 are subnormal in bf16, which AMX reads as zero: values under
 * ~2^-110 lose their lo part (cpu.md says when that shows), hence split_scale_of for V and dO
 * and split_qk_scales for Q and K.
 */
#ifndef FA_CPU_AMX_SPLIT_H
#define FA_CPU_AMX_SPLIT_H

#include <immintrin.h>
#include <stdint.h>

#include "amx_common.h"

#define SPLIT_PARTS 3

/* hi, mid, lo of 16 values, as fp32 vectors whose low 16 bits are zero. */
/* x's top 16 bits, rounded (ties away from zero) or truncated. Integer ops: vandps would
   need AVX512DQ. */
FA_TM_INLINE __m512 split_top(__m512 x, int round) {
    __m512i b = _mm512_castps_si512(x);
    if (round) b = _mm512_add_epi32(b, _mm512_set1_epi32(0x8000));
    return _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32((int)0xffff0000u)));
}

/* hi (truncated), mid (rounded), lo of 16 values. */
FA_TM_INLINE void split3(__m512 x, __m512 *hi, __m512 *mid, __m512 *lo) {
    *hi = split_top(x, 0);
    const __m512 r = _mm512_sub_ps(x, *hi);
    *mid = split_top(r, 1);
    *lo = _mm512_sub_ps(r, *mid);
}

/* The bf16 values of 16 split parts (their top halves). */
FA_TM_INLINE __m256i split_bf16(__m512 v) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}

/* The VNNI pair dwords (a[i], b[i]) of two vectors of split parts: a's top half moved down,
   b's top half kept. */
FA_TM_INLINE __m512i split_pair(__m512 a, __m512 b) {
    return _mm512_mask_blend_epi16((__mmask32)0xaaaaaaaau,
                                   _mm512_srli_epi32(_mm512_castps_si512(a), 16),
                                   _mm512_castps_si512(b));
}

/* fp32 row src[0..d) times mul (a power of two: exact) -> three bf16 rows dst + k * pstride
   (k = hi, mid, lo), zero from d to dp (the padding feeds the products: keep it 0). */
FA_TM_INLINE void split_row(uint16_t *restrict dst, size_t pstride, const float *restrict src,
                            int d, int dp, float mul) {
    for (int x = 0; x < dp; x += 16) {
        const int n = d - x;
        const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1);
        __m512 h, md, lo;
        split3(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + x), _mm512_set1_ps(mul)), &h, &md, &lo);
        _mm256_storeu_si256((__m256i *)(dst + x), split_bf16(h));
        _mm256_storeu_si256((__m256i *)(dst + pstride + x), split_bf16(md));
        _mm256_storeu_si256((__m256i *)(dst + 2 * pstride + x), split_bf16(lo));
    }
}

/* A row of an operand as the products read it, parts pstride elements apart: bf16 (parts 1)
   copied, fp32 (parts 3) times mul (a power of two, split_muls_fp32's; else 1) and split;
   zeros for a padding row, past the sequence (row NULL). */
FA_TM_INLINE void put_row_mul(uint16_t *dst, size_t pstride, const void *row, int parts, int d,
                              int dp, float mul) {
    if (!row)
        for (int k = 0; k < parts; k++) memset(dst + k * pstride, 0, (size_t)dp * 2);
    else if (parts == 1)
        copy_row(dst, row, d, dp);
    else
        split_row(dst, pstride, (const float *)row, d, dp, mul);
}
FA_TM_INLINE void put_row(uint16_t *dst, size_t pstride, const void *row, int parts, int d, int dp) {
    put_row_mul(dst, pstride, row, parts, d, dp, 1.0f);
}

/*
 * The power of two an fp32 operand is multiplied by before it is split (what it feeds is
 * divided by it as it is stored): 1 where max |x| >= 1, else what brings that max into [1, 2),
 * at most 2^63. A part below 2^-126 is subnormal in bf16 and AMX reads it as zero, so V under
 * ~2^-110 would lose its lo part, and under 2^-118 its mid part too: V * 2^-120 erred 0.023 (at
 * O's scale) against plain fp32's 4.8e-7 in the forward (tests/test_fwd.c f32_scaled_inputs),
 * and dO or V * 2^-120 lose the same parts in the backward (tests/test_bwd.c f32_scaled_grads).
 * Scaling by a power of two is exact, so an operand of ordinary size gets the same bits, and
 * subnormal values are scaled exactly too (the split runs without DAZ: split_mxcsr_enter).
 * The cap: the backward's dS carries the scales of dO and V both, and 2^-126 undoes two of
 * them as a normal float; 2^63 still brings the smallest subnormal, 2^-149, to 2^-86, whose
 * parts are normal. One pass over rows (b, t, h), b < nb, t < nt, h < nh (NaN skipped; an inf
 * max leaves 1; split_max_abs is that pass, split_scale_of the power of two from its result).
 */
static inline float split_max_abs(const fa_operand *a, int64_t nb, int64_t nt, int64_t nh, int d,
                                  int threads) {
    const int64_t rows = nb * nt * nh;
    float mx = 0.0f;
#pragma omp parallel for num_threads(threads) reduction(max : mx) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = r % nh, t = r / nh % nt, b = r / nh / nt;
        const float *v = (const float *)fa_tm_row(a, 4, b, t, h);
        __m512 m = _mm512_setzero_ps();
        for (int x = 0; x < d; x += 16) {
            const __mmask16 k = d - x >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - x)) - 1);
            m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(k, v + x)), m); /* NaN: m */
        }
        const float rm = _mm512_reduce_max_ps(m);
        if (rm > mx) mx = rm;
    }
    return mx;
}

static inline float split_scale_of(float mx) {
    if (!(mx > 0.0f) || mx >= 1.0f) return 1.0f; /* also inf */
    int e;
    frexpf(mx, &e); /* mx = f 2^e, f in [0.5, 1) */
    return ldexpf(1.0f, 1 - e > 63 ? 63 : 1 - e);
}

/* The scores' scale for Q and K multiplied by qmul and kmul (exact while it stays normal). */
static inline float split_sscale(float scale, float qmul, float kmul) {
    return (float)((double)scale / ((double)qmul * (double)kmul));
}

/*
 * The split scales of Q and K (fp32, forward and backward). A Q or K under ~2^-110 loses split
 * parts as V does, and S = Q K^T then keeps 8 to 16 bits of each product: Q of 2^-126 against
 * K near FLT_MAX (scores of size 1) erred 1e-3 of dQ's size at the backward's amx level
 * (test_special's split_scale_range). So Q and K are multiplied by *qmul and *kmul (powers of
 * two from their maxima mq, mk, as split_scale_of) and the scores' scale becomes
 * *sscale = scale / (qmul kmul): sscale (Q qmul)(K kmul)^T is scale Q K^T wherever no part
 * was lost. Capped (the larger halved, both >= 1) so that d (mq qmul)(mk kmul) <= 2^124 (the
 * dot products stay finite) and sscale is a normal float (then exact).
 */
static inline void split_qk_scales(double mq, double mk, int d, float scale, float *qmul,
                                   float *kmul, float *sscale) {
    *qmul = split_scale_of((float)mq);
    *kmul = split_scale_of((float)mk);
    for (;;) {
        const double qk = (double)*qmul * (double)*kmul;
        if (qk == 1.0 ||
            ((double)d * mq * mk * qk <= 0x1p124 && (double)fabsf(scale) / qk >= 0x1p-126))
            break;
        if (*qmul >= *kmul) *qmul *= 0.5f;
        else *kmul *= 0.5f;
    }
    *sscale = split_sscale(scale, *qmul, *kmul);
}

/* An fp32 call's split scales: the powers of two Q, K, V and dO (the backward's) are
   multiplied by before the split, the scores' scale for the scaled Q and K, and the maxima
   they came from (the backward caps its scales by them). */
typedef struct split_muls {
    float q, k, v, g, sscale;
    double mq, mk, mv, mg;
} split_muls;

/* Q's, K's and V's scales, and dO's where grads (else g 1): one pass over each. */
static inline split_muls split_muls_fp32(const fa_problem *p, int threads, int grads) {
    const int64_t nbq = p->cu_q ? 1 : p->batch, ntq = p->cu_q ? p->total_q : p->seqlen_q;
    const int64_t nbk = p->cu_k ? 1 : p->batch, ntk = p->cu_k ? p->total_k : p->seqlen_k;
    const int d = (int)p->d;
    split_muls m;
    m.mq = split_max_abs(&p->q, nbq, ntq, p->heads_q, d, threads);
    m.mk = split_max_abs(&p->k, nbk, ntk, p->heads_kv, d, threads);
    m.mv = split_max_abs(&p->v, nbk, ntk, p->heads_kv, d, threads);
    m.mg = grads ? split_max_abs(&p->dout, nbq, ntq, p->heads_q, d, threads) : 0.0;
    m.v = split_scale_of((float)m.mv);
    m.g = split_scale_of((float)m.mg);
    split_qk_scales(m.mq, m.mk, d, p->scale, &m.q, &m.k, &m.sscale);
    return m;
}

/* Values e0 (row 2r) and e1 (row 2r + 1) of 16 columns (P or dS) -> row r of their VNNI
   pairs, one row per part, the parts pstride dwords apart. */
FA_TM_INLINE void split_store_pairs(uint32_t *dst, size_t pstride, __m512 e0, __m512 e1) {
    __m512 h0, m0, l0, h1, m1, l1;
    split3(e0, &h0, &m0, &l0);
    split3(e1, &h1, &m1, &l1);
    _mm512_storeu_si512(dst, split_pair(h0, h1));
    _mm512_storeu_si512(dst + pstride, split_pair(m0, m1));
    _mm512_storeu_si512(dst + 2 * pstride, split_pair(l0, l1));
}

/* C += A B over one K step of 32 for the 2 x 2 block of amx_common.h's tile roles, from the
   tiles loaded last. */
#define AMX_DP_2X2()                                                                           \
    do {                                                                                       \
        _tile_dpbf16ps(TC00, TA0, TB0);                                                        \
        _tile_dpbf16ps(TC01, TA0, TB1);                                                        \
        _tile_dpbf16ps(TC10, TA1, TB0);                                                        \
        _tile_dpbf16ps(TC11, TA1, TB1);                                                        \
    } while (0)

/*
 * One K step of 32 of a 2 x 2 block with split operands: the six partial products. A part k's
 * two row tiles at a + k * apart and + a1 (bytes), row stride as; B part k's two column tiles
 * at b + k * bpart and + 64, row stride bs. Seven operand loads for six products, not twelve:
 * each part is loaded once and meets its partners while it is held (tile loads from L2, where
 * three parts of an operand live, bounded the first version: cpu.md).
 *
 * The order is fixed, element by element, because a backward must recompute the forward's
 * scores bit for bit (its P = exp(s - LSE) is consistent only with the scores LSE came from):
 * with swapped 0 the products run (A part, B part) = (hi, lo), (hi, mid), (mid, mid),
 * (mid, hi), (lo, hi), (hi, hi); swapped 1 runs the same products with the roles exchanged,
 * for the backward's S = Q K^T (A = Q) against the forward's S^T = K Q^T (A = K). The small
 * products come first, hi*hi last.
 */
FA_TM_INLINE void split_step(const char *a, size_t apart, size_t a1, size_t as, const char *b,
                             size_t bpart, size_t bs, int swapped) {
#define LOAD_A(k)                                                                              \
    do {                                                                                       \
        _tile_loadd(TA0, a + (k) * apart, as);                                                 \
        _tile_loadd(TA1, a + (k) * apart + a1, as);                                            \
    } while (0)
#define LOAD_B(k)                                                                              \
    do {                                                                                       \
        _tile_loadd(TB0, b + (k) * bpart, bs);                                                 \
        _tile_loadd(TB1, b + (k) * bpart + 64, bs);                                            \
    } while (0)
    if (!swapped) {
        LOAD_B(2);
        LOAD_A(0);
        AMX_DP_2X2(); /* hi, lo */
        LOAD_B(1);
        AMX_DP_2X2(); /* hi, mid */
        LOAD_A(1);
        AMX_DP_2X2(); /* mid, mid */
        LOAD_B(0);
        AMX_DP_2X2(); /* mid, hi */
        LOAD_A(2);
        AMX_DP_2X2(); /* lo, hi */
        LOAD_A(0);
        AMX_DP_2X2(); /* hi, hi */
    } else {
        LOAD_A(2);
        LOAD_B(0);
        AMX_DP_2X2(); /* (B, A) = hi, lo */
        LOAD_A(1);
        AMX_DP_2X2(); /* hi, mid */
        LOAD_B(1);
        AMX_DP_2X2(); /* mid, mid */
        LOAD_A(0);
        AMX_DP_2X2(); /* mid, hi */
        LOAD_B(2);
        AMX_DP_2X2(); /* lo, hi */
        LOAD_B(0);
        AMX_DP_2X2(); /* hi, hi */
    }
#undef LOAD_A
#undef LOAD_B
}

/*
 * The split kernels run with MXCSR's flush-to-zero bit set (and the caller's MXCSR restored
 * after): exponentials of masked (-inf) and far-below-max scores underflow, and each such
 * vector took a microcode assist (cpu.md). What it flushes is below 2^-126 and so already
 * lost to the split's parts
 * (AMX reads subnormal bf16 as zero); P below 2^-126 next to a row max near 1 is far below the
 * rule's absolute error. Not denormals-are-zero: with FTZ no result is subnormal, so only the
 * caller's inputs can be, and the fp32 kernels scale V (and the backward dO) up before
 * splitting them (split_muls_fp32), which DAZ would turn into zeros (V * 2^-120 has subnormal
 * values). Stores whose values are divided by such a scale run without FTZ (the
 * result is subnormal where plain fp32's is, and must round there, not flush).
 */
FA_TM_INLINE unsigned split_mxcsr_enter(void) {
    const unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8000u); /* FTZ (bit 15) */
    return old;
}

FA_TM_INLINE void split_mxcsr_leave(unsigned old) { _mm_setcsr(old); }

#endif /* FA_CPU_AMX_SPLIT_H */
