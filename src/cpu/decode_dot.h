/*
 * cpu/decode_dot.h — the decode kernel's scores, S = scale Q K^T for the few query rows that
 * share a kv head (the GQA group times seqlen_q), without padding them to a vector's width.
 *
 * The lanes run along the head dim, which every K and Q row has in full (zero-filled to
 * dp, a multiple of 16), so no lane computes a padding product whatever the group: 1, 2,
 * 3 or 16 rows cost 1, 2, 3 or 16 rows' products. Each K row is read once from the L1 tile
 * for up to four query rows; each (key, row) sum then folds its lanes into one score.
 * With the rows on the lanes instead, a group of 4 filled 4 of 16 columns.
 */
#ifndef FA_CPU_DECODE_DOT_H
#define FA_CPU_DECODE_DOT_H

#include "tile_math.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* The sum of v's lanes. */
FA_TM_INLINE float fa_dd_hsum(fa_vf v) {
#if FA_VW == 16
    return _mm512_reduce_add_ps((__m512)v);
#elif FA_VW == 8 && defined(__AVX__)
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128((__m256)v),
                                _mm256_extractf128_ps((__m256)v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
#else
    float s = v[0];
    for (int e = 1; e < FA_VW; e++) s += v[e];
    return s;
#endif
}

/* Keys kb (<= 2) against rows rb (<= 4); kb and rb are constants at the call sites, so the
   accumulators stay in registers. */
FA_TM_INLINE void fa_dd_block(int kb, int rb, const float *restrict k, ptrdiff_t ldk,
                              const float *restrict q, ptrdiff_t ldq, int dp, float *restrict s,
                              ptrdiff_t lds, float scale) {
#if FA_TM_FMA
    fa_vf acc[2][4];
#pragma GCC unroll 2
    for (int c = 0; c < kb; c++)
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++) acc[c][r] = (fa_vf){0};
    for (int x = 0; x < dp; x += FA_VW) {
        fa_vf kv[2];
#pragma GCC unroll 2
        for (int c = 0; c < kb; c++) kv[c] = fa_vload(k + c * ldk + x);
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++) {
            const fa_vf qv = fa_vload(q + r * ldq + x);
#pragma GCC unroll 2
            for (int c = 0; c < kb; c++) acc[c][r] += kv[c] * qv;
        }
    }
    /* the scale multiplies the finished dot product (one rounding of its own), as in every
       other kernel */
#pragma GCC unroll 2
    for (int c = 0; c < kb; c++)
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++) s[r * lds + c] = scale * fa_dd_hsum(acc[c][r]);
#else
    /* Without FMA a float multiply-add rounds twice a term (see fa_tm_mk): the products of
       floats are exact in double, so the sum runs in double and rounds once. */
    for (int c = 0; c < kb; c++)
        for (int r = 0; r < rb; r++) {
            double acc = 0;
            for (int x = 0; x < dp; x++) acc += (double)k[c * ldk + x] * (double)q[r * ldq + x];
            s[r * lds + c] = scale * (float)acc;
        }
#endif
}

FA_TM_INLINE void fa_dd_rows(int kb, int nr, const float *k, ptrdiff_t ldk, const float *q,
                             ptrdiff_t ldq, int dp, float *s, ptrdiff_t lds, float scale) {
    int r = 0;
    for (; r + 4 <= nr; r += 4)
        fa_dd_block(kb, 4, k, ldk, q + r * ldq, ldq, dp, s + r * lds, lds, scale);
    switch (nr - r) {
    case 3: fa_dd_block(kb, 3, k, ldk, q + r * ldq, ldq, dp, s + r * lds, lds, scale); break;
    case 2: fa_dd_block(kb, 2, k, ldk, q + r * ldq, ldq, dp, s + r * lds, lds, scale); break;
    case 1: fa_dd_block(kb, 1, k, ldk, q + r * ldq, ldq, dp, s + r * lds, lds, scale); break;
    default: break;
    }
}

/* s[r][j] = scale (K_j . Q_r) for r < nr, j < nk: K rows at k (stride ldk), Q rows at q
   (stride ldq), both zero beyond d up to dp; s query-major with stride lds. */
FA_TM_INLINE void fa_dd_scores(int nr, int nk, const float *k, ptrdiff_t ldk, const float *q,
                               ptrdiff_t ldq, int dp, float *s, ptrdiff_t lds, float scale) {
    int j = 0;
    for (; j + 2 <= nk; j += 2) fa_dd_rows(2, nr, k + j * ldk, ldk, q, ldq, dp, s + j, lds, scale);
    if (j < nk) fa_dd_rows(1, nr, k + j * ldk, ldk, q, ldq, dp, s + j, lds, scale);
}

#endif /* FA_CPU_DECODE_DOT_H */
