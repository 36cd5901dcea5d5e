/*
 * cpu/fwd_amx_tile.h — the tile-level machinery of the AMX forward, shared by its two drivers:
 * fwd_amx.c (bf16 inputs, K and V packed once per call) and fwd_amx_f32.c (fp32 inputs, key
 * tiles split per thread into bf16 parts, amx_split.h).
 *
 * Same algorithm as fwd_tiled.c (online softmax over the keys of a query tile, one division at
 * the end), with both tile products on the AMX unit:
 *
 *   S^T = K Q^T    tdpbf16ps: A = K rows (16 keys x 32 head-dim elements), B = Q^T in VNNI
 *                  pairs; the fp32 scores of a strip of 32 keys are stored key-major, st[j][i],
 *                  as in fwd_tiled.c, so the softmax reductions run down columns (whole
 *                  vectors, no horizontal reductions) and fa_tm_scores_kmajor applies masks,
 *                  softcap and ALiBi;
 *   O^T += V^T P^T tdpbf16ps: A = V^T (16 head-dim rows x 32 keys), B = P^T in VNNI pairs,
 *                  written by the softmax itself (vcvtne2ps2bf16 + one vpermw per 2 keys x 16
 *                  queries) for BK keys at a time; the accumulator is fp32, transposed (a row
 *                  per head-dim element), so rescaling it is a vector multiply per row.
 *
 * Tiles: all eight tile registers are 16 rows x 64 bytes (one configuration for the whole
 * kernel); each product is blocked 2 x 2: C in tmm0-3, A in tmm4-5, B in tmm6-7. The head dim
 * is padded with zeros to a multiple of 32 (the bf16 K step), queries to 32 (zero Q rows give
 * finite scores that only reach output columns never stored), keys to 32 (zero P rows).
 * Where V holds Inf or NaN in a block of keys that some row does not see, that block's masked
 * terms are skipped, not multiplied by a zero P (accumulate_vis; issue 42).
 *
 * Scale placement is fwd_tiled.c's (fa_tm_needs_transform): raw dot products, the scale inside
 * the exponential on tiles without a transform, the transform scaling the others.
 *
 * fp32 inputs (`parts` 3): K, V and Q are split into hi, mid and lo bf16 parts where they are
 * converted, P in the softmax's write-out, and each product runs the six partial products of
 * split_step into the same fp32 accumulator. Every buffer of bf16 operands then holds three
 * parts; the softmax is fp32 throughout, with fwd_tiled.c's accurate exponentials in place of
 * the bf16 path's short polynomials.
 *
 * Functions are `static inline` (AMX_FN) only so that a driver which does not call one gets no
 * warning; the compiler still decides what to inline.
 */
#ifndef FA_CPU_FWD_AMX_TILE_H
#define FA_CPU_FWD_AMX_TILE_H

#include <math.h>
#include <string.h>

#include "isa.h"
#include "amx_common.h"
#include "amx_split.h"

#define AMX_FN static inline

#define BQ FA_TM_BQ /* query rows per work item (64: fa_tm_qrows, fa_tm_scores_kmajor) */
#define BK 256      /* keys per O += P V step (one load and store of the accumulator) */

/* ---- per-thread buffers ---- */

typedef struct amx_bufs {
    uint32_t *qt;  /* per part dp/2 x BQ: Q^T in VNNI pairs, qt[r][i] = (q[i][2r], q[i][2r+1]) */
    uint16_t *stg; /* per part BQ x dp: rows of Q (or V, when packing) converted, zero-padded */
    float *st;     /* KS x BQ: scores of one strip of 32 keys, key-major */
    uint32_t *pt;  /* per part BK/2 x BQ: P^T in VNNI pairs, pt[r][i] = (p[2r][i], p[2r+1][i]) */
    float *ot;     /* dp x BQ: output accumulator, transposed, scaled by exp(-m) */
    float *m;      /* BQ: running max of each query row (scaled units) */
    float *l;      /* BQ: running sum of exp(s - m) */
    float *mn;     /* BQ: the running max after the current strip */
} amx_bufs;

/* Places a query tile's own buffers (Q^T, the accumulator and the row statistics) at
   base + *off (or only counts, base NULL). */
AMX_FN void amx_layout_own(int dp, int parts, float *base, size_t *off, amx_bufs *b) {
    b->qt = (uint32_t *)fa_tm_take(base, off, (size_t)parts * dp / 2 * BQ);
    b->ot = fa_tm_take(base, off, (size_t)dp * BQ);
    b->m = fa_tm_take(base, off, BQ);
    b->l = fa_tm_take(base, off, BQ);
    b->mn = fa_tm_take(base, off, BQ);
}

/* The same for the buffers a thread's query tiles take turns with (staging, S, P^T). */
AMX_FN void amx_layout_shared(int dp, int parts, float *base, size_t *off, amx_bufs *b) {
    b->stg = (uint16_t *)fa_tm_take(base, off, (size_t)parts * BQ * dp / 2);
    b->st = fa_tm_take(base, off, (size_t)KS * BQ);
    b->pt = (uint32_t *)fa_tm_take(base, off, (size_t)parts * BK / 2 * BQ);
}

/* Places all the buffers of one query tile at base (or only counts, base NULL); returns
   floats per thread. */
AMX_FN size_t amx_layout(int dp, int parts, float *base, amx_bufs *b) {
    size_t off = 0;
    amx_layout_own(dp, parts, base, &off, b);
    amx_layout_shared(dp, parts, base, &off, b);
    return off;
}

/* Block of 32 keys of V (rows of stg, dp columns) -> dst[x][0..32): the A operand of
   O^T += V^T P^T, each 16-row tile of it 1 KiB contiguous. */
AMX_FN void transpose_v(uint16_t *restrict dst, const uint16_t *restrict stg, int dp) {
    transpose_rows32(dst, KS, stg, (size_t)dp, dp);
}


/* Keys [j, j + 32) of kv head hk of sequence b (rows past its end zero) -> kd: per part, 32
   rows of dp, K times kmul; vtd: per part, V^T (dp rows of 32 keys), V times vmul (fp32: see
   fwd_amx_f32.c's split scales; 1 for bf16). Parts are 32 * dp elements apart. */
AMX_FN void pack_block_to(const fa_problem *p, uint16_t *stg, int64_t b, int64_t hk, int64_t j,
                          uint16_t *kd, uint16_t *vtd, int dp, int parts, float kmul,
                          float vmul) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const int64_t bk = p->cu_k ? 0 : b;
    const int d = (int)p->d;
    const size_t es = parts == 1 ? 2 : 4, pstride = (size_t)KS * dp;
    for (int r = 0; r < KS; r++) {
        const int in = j + r < sk;
        /* the row a block ahead into L1 (see fetch_rows: the key tile's rows are in L2 by now,
           but each lies on its own page and nothing else fetches it ahead of the loads) */
        if (j + KS + r < sk)
            for (size_t x = 0; x < (size_t)d * es; x += 64) {
                _mm_prefetch((const char *)fa_tm_row(&p->k, es, bk, k0 + j + KS + r, hk) + x,
                             _MM_HINT_T0);
                _mm_prefetch((const char *)fa_tm_row(&p->v, es, bk, k0 + j + KS + r, hk) + x,
                             _MM_HINT_T0);
            }
        put_row_mul(kd + (size_t)r * dp, pstride,
                    in ? fa_tm_row(&p->k, es, bk, k0 + j + r, hk) : NULL, parts, d, dp, kmul);
        put_row_mul(stg + (size_t)r * dp, pstride,
                    in ? fa_tm_row(&p->v, es, bk, k0 + j + r, hk) : NULL, parts, d, dp, vmul);
    }
    for (int k = 0; k < parts; k++) transpose_v(vtd + k * pstride, stg + k * pstride, dp);
}

/* Q rows of the tile (nq32 of them, zero past nq), times qmul (fp32's split scale; 1 for
   bf16) -> Q^T in VNNI pairs. */
AMX_FN void load_q(const fa_problem *p, const amx_bufs *B, int64_t bq, int64_t row0, int64_t h,
                   int nq, int nq32, int dp, int parts, float qmul) {
    const int d = (int)p->d;
    const size_t es = parts == 1 ? 2 : 4, pstride = (size_t)BQ * dp;
    for (int i = 0; i < nq32; i++)
        put_row_mul(B->stg + (size_t)i * dp, pstride,
                    i < nq ? fa_tm_row(&p->q, es, bq, row0 + i, h) : NULL, parts, d, dp, qmul);
    const int dw = dp / 2; /* dwords (pairs) per row */
    for (int k = 0; k < parts; k++) {
        const uint32_t *s32 = (const uint32_t *)(B->stg + k * pstride);
        uint32_t *qt = B->qt + (size_t)k * dw * BQ;
        for (int r0 = 0; r0 < dw; r0 += 16)
            for (int i0 = 0; i0 < nq32; i0 += 16) {
                __m512i w[16];
                for (int i = 0; i < 16; i++)
                    w[i] = _mm512_loadu_si512(s32 + (size_t)(i0 + i) * dw + r0);
                fa_transpose16(w);
                for (int t = 0; t < 16; t++)
                    _mm512_storeu_si512(qt + (size_t)(r0 + t) * BQ + i0, w[t]);
            }
    }
}

/* ---- the tile products ---- */

/* A key tile of a work item: keys [j0, j0 + nk) of the sequence, nk32 with the padding. */
typedef struct ktile {
    int64_t j0;
    int nk, nk32, kind;
    const uint16_t *k, *vt; /* its packed K rows and V^T blocks */
} ktile;

/* st = K Q^T for keys [kb, kb + 32) of the tile and queries [qb, qb + 32): raw dot products. */
FA_TM_INLINE void scores_block(const ktile *t, const amx_bufs *B, int kb, int qb, int dp,
                               int parts) {
    const size_t kstride = (size_t)dp * 2, qstride = BQ * 4, sstride = BQ * 4;
    const uint16_t *k0 = t->k + (size_t)kb * parts * dp;
    AMX_FENCE();
    _tile_zero(TC00);
    _tile_zero(TC01);
    _tile_zero(TC10);
    _tile_zero(TC11);
    for (int x = 0; x < dp; x += KS) {
        const uint32_t *q = B->qt + (size_t)(x / 2) * BQ + qb;
        if (parts == 1) {
            _tile_loadd(TA0, k0 + x, kstride);
            _tile_loadd(TA1, k0 + (size_t)TR * dp + x, kstride);
            _tile_loadd(TB0, q, qstride);
            _tile_loadd(TB1, q + TR, qstride);
            AMX_DP_2X2();
        } else {
            split_step((const char *)(k0 + x), (size_t)KS * dp * 2, (size_t)TR * dp * 2, kstride,
                       (const char *)q, (size_t)(dp / 2) * BQ * 4, qstride, 0);
        }
    }
    float *s = B->st + qb;
    _tile_stored(TC00, s, sstride);
    _tile_stored(TC01, s + TR, sstride);
    _tile_stored(TC10, s + TR * BQ, sstride);
    _tile_stored(TC11, s + TR * BQ + TR, sstride);
}

/* One 32-row x 32-query block of ot += V^T P^T over keys [k0, k1) of the tile, whose V^T
   blocks start at v0 (the tile's own from key k0 on, or accumulate_vis's copy). */
FA_TM_INLINE void pv_block(const uint16_t *v0, const amx_bufs *B, int xb, int qb, int k0,
                           int k1, int dp, int parts) {
    const size_t ostride = BQ * 4, pstride = BQ * 4;
    float *o = B->ot + (size_t)xb * BQ + qb;
    AMX_FENCE();
    _tile_loadd(TC00, o, ostride);
    _tile_loadd(TC01, o + TR, ostride);
    _tile_loadd(TC10, o + TR * BQ, ostride);
    _tile_loadd(TC11, o + TR * BQ + TR, ostride);
    for (int kb = k0; kb < k1; kb += KS) {
        const uint16_t *v = v0 + (size_t)(kb - k0) * parts * dp + (size_t)xb * KS;
        const uint32_t *pp = B->pt + (size_t)(kb / 2) * BQ + qb;
        if (parts == 1) {
            _tile_loadd(TA0, v, KS * 2);
            _tile_loadd(TA1, v + TR * KS, KS * 2);
            _tile_loadd(TB0, pp, pstride);
            _tile_loadd(TB1, pp + TR, pstride);
            AMX_DP_2X2();
        } else {
            split_step((const char *)v, (size_t)KS * dp * 2, (size_t)TR * KS * 2, KS * 2,
                       (const char *)pp, (size_t)(BK / 2) * BQ * 4, pstride, 0);
        }
    }
    _tile_stored(TC00, o, ostride);
    _tile_stored(TC01, o + TR, ostride);
    _tile_stored(TC10, o + TR * BQ, ostride);
    _tile_stored(TC11, o + TR * BQ + TR, ostride);
}

/* ot += V^T P^T over keys [k0, k1) of the tile (multiples of 32). */
AMX_FN void accumulate(const ktile *t, const amx_bufs *B, int k0, int k1, int nq32, int dp,
                       int parts) {
    const uint16_t *v0 = t->vt + (size_t)k0 * parts * dp;
    for (int xb = 0; xb < dp; xb += 32)
        for (int qb = 0; qb < nq32; qb += 32) pv_block(v0, B, xb, qb, k0, k1, dp, parts);
}

/*
 * Keys a row cannot see, where V holds Inf or NaN (amx_common.h): the 32-key blocks of tile t
 * that some real row of q does not see in full and whose V^T (every part) holds such a value,
 * a bit per block (kb / 32). Keys past t->nk in the last block are real keys that no row of
 * q sees. Checked only for blocks that are not FULL: one or two per tile on a mask edge.
 */
AMX_FN unsigned special_blocks(const fa_tm_qrows *q, const ktile *t, int dp, int parts) {
    unsigned bad = 0;
    for (int kb = 0; kb < t->nk32; kb += KS)
        if (fa_tm_classify(q, t->j0 + kb, t->j0 + kb + KS) != FA_TM_FULL &&
            !bf16_all_finite(t->vt + (size_t)kb * parts * dp, (size_t)parts * KS * dp))
            bad |= 1u << (kb / KS);
    return bad;
}

/* The terms that bf16_zero_specials dropped from block kb of tile t, for the rows of q that
   see their key: ot[x][i] += P[j][i] V[j][x] (P's parts summed), Inf or NaN. */
AMX_FN void pv_specials(const fa_tm_qrows *q, const ktile *t, const amx_bufs *B, int kb,
                        int dp, int parts) {
    const uint16_t *vb = t->vt + (size_t)kb * parts * dp;
    const size_t ppart = (size_t)(BK / 2) * BQ; /* dwords from one part of P^T to the next */
    AMX_FENCE();
    for (int k = 0; k < parts; k++)
        for (int x = 0; x < dp; x++)
            for (int c = 0; c < KS; c++) {
                const uint16_t w = vb[(size_t)k * KS * dp + (size_t)x * KS + c];
                if (!bf16_special(w)) continue;
                const int j = kb + c;
                const int64_t key = t->j0 + j;
                for (int i = 0; i < q->n; i++) {
                    if (key < q->lo[i] || key >= q->hi[i]) continue;
                    float pj = 0.0f;
                    for (int kp = 0; kp < parts; kp++) {
                        const uint32_t two = B->pt[kp * ppart + (size_t)(j / 2) * BQ + i];
                        pj += fa_tm_bf2f((uint16_t)(j & 1 ? two >> 16 : two & 0xffffu));
                    }
                    B->ot[(size_t)x * BQ + i] += pj * fa_tm_bf2f(w);
                }
            }
    AMX_FENCE();
}

/* accumulate where some blocks are in bad (special_blocks): a block at a time in key order,
   a bad block's V^T copied into stg (free while key tiles run) with its Inf and NaN set to 0,
   then pv_specials. Each element of ot takes its products in accumulate's order (the
   accumulator's trips through memory are exact), so a row that sees no special value gets
   accumulate's bits. */
AMX_FN void accumulate_vis(const fa_tm_qrows *q, const ktile *t, const amx_bufs *B, int k0,
                           int k1, int nq32, int dp, int parts, unsigned bad) {
    const size_t blk = (size_t)parts * KS * dp; /* elements of a block of V^T, all parts */
    for (int kb = k0; kb < k1; kb += KS) {
        const int special = (bad >> (kb / KS)) & 1;
        const uint16_t *v = t->vt + (size_t)kb * parts * dp;
        if (special) {
            AMX_FENCE();
            for (size_t e = 0; e < blk; e += 32)
                _mm512_storeu_si512(B->stg + e, bf16_zero_specials(_mm512_loadu_si512(v + e)));
            v = B->stg;
        }
        for (int xb = 0; xb < dp; xb += 32)
            for (int qb = 0; qb < nq32; qb += 32) pv_block(v, B, xb, qb, kb, kb + KS, dp, parts);
        if (special) pv_specials(q, t, B, kb, dp, parts);
    }
}

/* ---- softmax ---- */

/*
 * 2^t = 2^n 2^f with n = round(t) and 2^f on [-1/2, 1/2] by a polynomial (coefficients c,
 * highest power first), 2^n applied by vscalefps. Results that would be subnormal
 * (t <= -125) are 0: masked keys (t = -inf) give exactly 0, and no instruction produces a
 * subnormal, which costs a microcode assist of ~100 cycles per vector (the masked half of every
 * diagonal tile would pay it). NaN stays NaN (the compare is unordered-true).
 */
FA_TM_INLINE __m512 exp2_by(__m512 t, const float *c, int deg) {
    const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLE_UQ);
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(c[0]);
    for (int i = 1; i <= deg; i++) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
    return _mm512_maskz_scalef_ps(normal, p, n);
}

/* Degree 5 (relative error 2e-7, fitted for [-1/2, 1/2]): 10 instructions where fa_vexp takes
   15, for the rescale factors of the running max. */
static const float EXP2_DEG5[6] = {1.3276472e-3f, 9.6755419e-3f, 5.5507131e-2f,
                                   2.4022120e-1f, 6.9314694e-1f, 1.0000001f};
FA_TM_INLINE __m512 exp2_poly(__m512 t) { return exp2_by(t, EXP2_DEG5, 5); }

/* Degree 3 (relative error 7.5e-5) for the probabilities themselves, which are rounded to bf16
   (8 significant bits) before the P V product: two FMAs fewer on the kernel's critical path.
   Their row sums use the same values, so O = sum(P V) / sum(P) stays consistent; the LSE
   moves by at most 7.5e-5. */
static const float EXP2_DEG3[4] = {5.517259134e-2f, 2.426137087e-1f, 6.932610297e-1f,
                                   9.999278607e-1f};
FA_TM_INLINE __m512 exp2_p(__m512 t) { return exp2_by(t, EXP2_DEG3, 3); }

/*
 * The running max moves only when a strip's max exceeds it by more than LAZY (natural-log
 * units): the probabilities are then relative to a max at most LAZY below the true one, so
 * they stay below e^8 (no overflow in fp32 or bf16; their rounding is relative, so it does
 * not grow) while the accumulator's rescale, a pass over all of it, is skipped on nearly
 * every strip. The result is the same: O = sum(P V) / l and LSE = m + log(l) do not depend on
 * which m was used.
 */
#define LAZY 8.0f
#define LOG2E 1.44269504088896341f

/*
 * The online softmax runs strip by strip (32 keys: st stays in L1, where the tile stores are
 * cheap), in three steps: strip_max finds the new running maxima, move_max rescales the sum
 * and the accumulator where they moved (rarely, see LAZY), strip_exp writes the strip's
 * probabilities. The scores of a strip, times mul, are in st (a row per key, a column per
 * query); columns up to nq32 run (padding included: their scores are finite, Q's padding is
 * zero).
 */

/* mn = the running max after the strip's ns keys, per the LAZY rule; returns whether any
   column's max moves. */
AMX_FN int strip_max(const amx_bufs *B, int ns, int nq32, float mul) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    int moved = 0;
    for (int i = 0; i < nq32; i += 16) {
        /* four chains: one would wait on vmaxps's latency at every key */
        __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
        const float *sj = B->st + i;
        int j = 0;
        for (; j + 4 <= ns; j += 4, sj += 4 * BQ) {
            m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sj));
            m1 = _mm512_max_ps(m1, _mm512_loadu_ps(sj + BQ));
            m2 = _mm512_max_ps(m2, _mm512_loadu_ps(sj + 2 * BQ));
            m3 = _mm512_max_ps(m3, _mm512_loadu_ps(sj + 3 * BQ));
        }
        for (; j < ns; j++, sj += BQ) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sj));
        __m512 mx = _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3));
        /* mul > 0 and rounding is monotonic: the max of the scaled scores is the scaled max */
        mx = _mm512_mul_ps(mx, _mm512_set1_ps(mul));
        const __m512 mo = _mm512_loadu_ps(B->m + i);
        const __mmask16 grow = _mm512_cmp_ps_mask(mx, _mm512_add_ps(mo, _mm512_set1_ps(LAZY)),
                                                  _CMP_GT_OQ);
        moved |= grow != 0;
        _mm512_storeu_ps(B->mn + i, _mm512_mask_mov_ps(mo, grow, mx));
    }
    return moved;
}

/* A row that has seen only masked keys keeps max -inf: exponentials against 0 then give
   exp(-inf) = 0 instead of exp(-inf - -inf) = NaN. */
FA_TM_INLINE __m512 exp_ref(__m512 m) {
    return _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                              _mm512_setzero_ps());
}

/* m = mn, and l and the accumulator rows (those that carry data: d) times exp(m - mn) where
   the max moved. fp32 (parts 3) takes fa_vexp, as fwd_tiled.c does: the factor weighs the
   keys before the move against those after, and the degree-5 polynomial's 2e-7 would be
   several fp32 roundings (the max moves rarely: the cost does not show). */
AMX_FN void move_max(const amx_bufs *B, int d, int nq32, int parts) {
    for (int i = 0; i < nq32; i += 16) {
        const __m512 mo = _mm512_loadu_ps(B->m + i), mn = _mm512_loadu_ps(B->mn + i);
        const __mmask16 moved = _mm512_cmp_ps_mask(mo, mn, _CMP_NEQ_UQ);
        if (!moved) continue;
        const __m512 dm = _mm512_sub_ps(mo, exp_ref(mn));
        const __m512 a = _mm512_mask_mov_ps(
            _mm512_set1_ps(1.0f), moved,
            parts == 1 ? exp2_poly(_mm512_mul_ps(dm, _mm512_set1_ps(LOG2E)))
                       : (__m512)fa_vexp((fa_vf)dm));
        _mm512_storeu_ps(B->l + i, _mm512_mul_ps(_mm512_loadu_ps(B->l + i), a));
        _mm512_storeu_ps(B->m + i, mn);
        for (int x = 0; x < d; x++) {
            float *o = B->ot + (size_t)x * BQ + i;
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), a));
        }
    }
}

/*
 * The bf16 strip's exponent, exp(s * mul - ref) as 2^(s * mul log2 e - ref log2 e), in the
 * GPU kernels' rule (ptx.cuh): the reference in log2 units rounded up, off = -ru(ref log2 e),
 * and while |off| < 2^10 one fma, fma(s, mul log2 e, off): its one rounding and that of
 * mul log2 e err by under 2^-13 there (an ulp of 2^10). Past that the same fma is off by up to
 * an ulp of the max, 1024 and more at scores near 1e10, which gave the max key 2^-1024 = 0 (a
 * row sum of 0: LSE -inf, O NaN) or 2^+1024 = inf (issue 42). There the product is rounded on
 * its own first, as strip_max formed the max from it: s * mul - ref is then at most 0 exactly
 * (LAZY above it where ref lags the max), the max key's argument exactly 0, and log2 e comes
 * after the subtraction.
 */
#define EXACT_FROM 1024.0f

/* 16 columns of a strip from key row sj on, in the form `exact` says (a constant at each call
   site of strip_cols, so each form is a loop of its own) */
FA_TM_INLINE __m512 strip_p(const float *sj, int exact, __m512 vmul2, __m512 off, __m512 vmul,
                            __m512 ref) {
    if (!exact) return exp2_p(_mm512_fmadd_ps(_mm512_loadu_ps(sj), vmul2, off));
    const fa_vf x = fa_vrounded((fa_vf)_mm512_mul_ps(_mm512_loadu_ps(sj), vmul)) - (fa_vf)ref;
    return exp2_p(_mm512_mul_ps((__m512)x, _mm512_set1_ps(LOG2E)));
}

/* strip_exp's work on columns [i, i + 16) */
FA_TM_INLINE void strip_cols(const amx_bufs *B, uint32_t *pt, int ns, int i, int exact,
                             __m512i ilv, __m512 vmul2, __m512 off, __m512 vmul, __m512 ref) {
    __m512 sum = _mm512_setzero_ps();
    const float *sj = B->st + i;
    uint32_t *pj = pt + i;
    int j = 0;
    for (; j + 2 <= ns; j += 2, sj += 2 * BQ, pj += BQ) {
        const __m512 e0 = strip_p(sj, exact, vmul2, off, vmul, ref);
        const __m512 e1 = strip_p(sj + BQ, exact, vmul2, off, vmul, ref);
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
        /* e0 in the low half, e1 in the high one, then interleaved */
        const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
        _mm512_storeu_si512(pj, _mm512_permutexvar_epi16(ilv, pair));
    }
    if (j < ns) { /* odd key count: the last key pairs with a zero */
        const __m512 e0 = strip_p(sj, exact, vmul2, off, vmul, ref);
        sum = _mm512_add_ps(sum, e0);
        const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), e0);
        _mm512_storeu_si512(pj, _mm512_permutexvar_epi16(ilv, pair));
        j += 2;
        pj += BQ;
    }
    for (; j < KS; j += 2, pj += BQ) _mm512_storeu_si512(pj, _mm512_setzero_si512());
    _mm512_storeu_ps(B->l + i, _mm512_add_ps(_mm512_loadu_ps(B->l + i), sum));
}

/* The strip's probabilities exp(s * mul - m) (strip_p), rounded to bf16, into 16 rows of P^T
   in VNNI pairs at pt (zero for the padding keys past ns), and their sums into l. The form is
   chosen per 16 columns. */
AMX_FN void strip_exp(const amx_bufs *B, uint32_t *pt, int ns, int nq32, float mul) {
    const __m512 vmul2 = _mm512_set1_ps(mul * LOG2E), vmul = _mm512_set1_ps(mul);
    const __m512i ilv = interleave_idx(16);
    for (int i = 0; i < nq32; i += 16) {
        const __m512 ref = exp_ref(_mm512_loadu_ps(B->m + i));
        /* -ru(ref log2 e), rounded down as the product with -log2 e */
        const __m512 off = _mm512_mul_round_ps(ref, _mm512_set1_ps(-LOG2E),
                                               _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        /* not below 2^10 (or NaN) in some column */
        if (_mm512_cmp_ps_mask(_mm512_abs_ps(off), _mm512_set1_ps(EXACT_FROM), _CMP_NLT_UQ))
            strip_cols(B, pt, ns, i, 1, ilv, vmul2, off, vmul, ref);
        else
            strip_cols(B, pt, ns, i, 0, ilv, vmul2, off, vmul, ref);
    }
}

/* exp(s * mul - ref) for fp32, the product rounded on its own as fwd_tiled.c forms it: ref
   is a max of such rounded products, so the argument is <= 0 exactly (fused, it was off by
   half an ulp of the max: exp overflowed, or the row sum underflowed, at scores near 1e10). */
FA_TM_INLINE __m512 exp_scaled(__m512 s, __m512 vmul, __m512 ref) {
    return (__m512)fa_vexp_softmax(fa_vrounded((fa_vf)_mm512_mul_ps(s, vmul)) - (fa_vf)ref);
}

/* strip_exp for fp32 inputs: the probabilities in fp32, exp(s * mul - m) by fwd_tiled.c's
   fa_vexp_softmax (the bf16 path's short polynomial and folded log2 e would err by far more
   than fp32's rounding), each split into its three bf16 parts, rows of P^T for each part
   BK / 2 rows apart. */
AMX_FN void strip_exp_split(const amx_bufs *B, uint32_t *pt, int ns, int nq32, float mul) {
    const __m512 vmul = _mm512_set1_ps(mul);
    const size_t pstride = (size_t)(BK / 2) * BQ;
    for (int i = 0; i < nq32; i += 16) {
        const __m512 ref = exp_ref(_mm512_loadu_ps(B->m + i));
        __m512 sum = _mm512_setzero_ps();
        const float *sj = B->st + i;
        uint32_t *pj = pt + i;
        int j = 0;
        for (; j + 2 <= ns; j += 2, sj += 2 * BQ, pj += BQ) {
            const __m512 e0 = exp_scaled(_mm512_loadu_ps(sj), vmul, ref);
            const __m512 e1 = exp_scaled(_mm512_loadu_ps(sj + BQ), vmul, ref);
            sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
            split_store_pairs(pj, pstride, e0, e1);
        }
        if (j < ns) { /* odd key count: the last key pairs with a zero */
            const __m512 e0 = exp_scaled(_mm512_loadu_ps(sj), vmul, ref);
            sum = _mm512_add_ps(sum, e0);
            split_store_pairs(pj, pstride, e0, _mm512_setzero_ps());
            j += 2;
            pj += BQ;
        }
        for (; j < KS; j += 2, pj += BQ)
            for (int k = 0; k < SPLIT_PARTS; k++)
                _mm512_storeu_si512(pj + k * pstride, _mm512_setzero_si512());
        _mm512_storeu_ps(B->l + i, _mm512_add_ps(_mm512_loadu_ps(B->l + i), sum));
    }
}

/* O rows of the tile: the accumulator transposed back 16 x 16 at a time, divided by l, times
   omul (a power of two undoing the fp32 forward's scaling of V; else 1), stored as fp32 or
   rounded to bf16 (vcvtneps2bf16: to nearest even). Rows that see no key get 0. */
AMX_FN void store_out(const fa_problem *p, const amx_bufs *B, const fa_tm_qrows *rows,
                      int64_t bq, int64_t t0, int64_t h, int nq, float omul) {
    const int d = (int)p->d, f32 = p->dtype == FA_DTYPE_F32;
    const size_t es = f32 ? 4 : 2;
    for (int i0 = 0; i0 < nq; i0 += 16)
        for (int x0 = 0; x0 < d; x0 += 16) {
            __m512i r[16];
            for (int t = 0; t < 16; t++)
                r[t] = _mm512_loadu_si512(B->ot + (size_t)(x0 + t) * BQ + i0);
            fa_transpose16(r);
            for (int i = 0; i < 16 && i0 + i < nq; i++) {
                if (rows->lo[i0 + i] >= rows->hi[i0 + i]) continue;
                const __m512 o = _mm512_mul_ps(
                    _mm512_div_ps((__m512)r[i], _mm512_set1_ps(B->l[i0 + i])), _mm512_set1_ps(omul));
                if (f32) {
                    float *dst = (float *)fa_tm_row(&p->o, 4, bq, t0 + i0 + i, h) + x0;
                    const int n = d - x0 < 16 ? d - x0 : 16;
                    _mm512_mask_storeu_ps(dst, (__mmask16)((1u << n) - 1), o);
                    continue;
                }
                const __m256i v = (__m256i)_mm512_cvtneps_pbh(o);
                uint16_t *dst = (uint16_t *)fa_tm_row(&p->o, 2, bq, t0 + i0 + i, h) + x0;
                if (x0 + 16 <= d) {
                    _mm256_storeu_si256((__m256i *)dst, v);
                } else {
                    uint16_t tmp[16];
                    _mm256_storeu_si256((__m256i *)tmp, v);
                    memcpy(dst, tmp, (size_t)(d - x0) * 2);
                }
            }
        }
    for (int i = 0; i < nq; i++)
        if (rows->lo[i] >= rows->hi[i])
            fa_tm_store_zero(fa_tm_row(&p->o, es, bq, t0 + i, h), p->dtype, d);
}

/* ---- one work item ---- */

/* One strip of a key tile: keys [s, s + 32) of tile t. Scores, then masks, softcap and
   ALiBi where they apply (which then carry the scale, see the top); returns the multiplier
   its exponentials take, or 0 when no query row sees any of its keys. */
AMX_FN float strip_scores(const fa_problem *p, const fa_tm_qrows *q, const amx_bufs *B,
                          const ktile *t, int s, float slope, int nq, int nq32, int dp,
                          int parts) {
    const int ns = t->nk - s < KS ? t->nk - s : KS;
    const int kind = fa_tm_classify(q, t->j0 + s, t->j0 + s + ns);
    if (kind == FA_TM_NONE) return 0.0f;
    for (int qb = 0; qb < nq32; qb += 32) scores_block(t, B, s, qb, dp, parts);
    AMX_FENCE();
    if (!fa_tm_needs_transform(kind, p->softcap, slope)) return p->scale;
    fa_tm_rel rel;
    fa_tm_rel_init(&rel, q, t->j0 + s);
    /* padding columns (i >= nq) stay 0 */
    fa_tm_scores_kmajor(B->st, NULL, ns, nq, &rel, p->scale, p->softcap, slope,
                        kind == FA_TM_PARTIAL);
    return 1.0f;
}

/* Rows [r0, r1) of K and V of kv head hk of sequence b, to be fetched into L2 while a key
   tile is computed: the fp32 forward splits each key tile from the tensors themselves, whose
   BSHD rows lie heads * d apart, a stride the hardware prefetchers do not follow (the split
   waited on every row's miss), and prefetches issued in one burst stall on the miss buffers:
   each strip of the tile issues its share. */
typedef struct row_fetch {
    const fa_problem *p;
    int64_t b, hk, r0, r1;
} row_fetch;

AMX_FN void fetch_rows(const row_fetch *f, int64_t r0, int64_t r1) {
    const fa_problem *p = f->p;
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, f->b, &q0, &sq, &k0, &sk);
    const int64_t bk = p->cu_k ? 0 : f->b;
    if (r1 > sk) r1 = sk;
    for (int64_t r = r0; r < r1; r++) {
        const char *kr = (const char *)fa_tm_row(&p->k, 4, bk, k0 + r, f->hk);
        const char *vr = (const char *)fa_tm_row(&p->v, 4, bk, k0 + r, f->hk);
        for (size_t x = 0; x < (size_t)p->d * 4; x += 64) {
            _mm_prefetch(kr + x, _MM_HINT_T1);
            _mm_prefetch(vr + x, _MM_HINT_T1);
        }
    }
}

/*
 * One key tile, strip by strip: each strip's probabilities join P^T, and O += P V runs once
 * for the tile (a load and a store of the accumulator per BK keys), except that where a
 * strip moves the running max the strips before it are accumulated first, so that the
 * rescale covers them.
 */
AMX_FN void key_tile(const fa_problem *p, const fa_tm_qrows *q, const amx_bufs *B,
                     const ktile *t, float slope, int nq, int nq32, int dp, int parts,
                     const row_fetch *f) {
    int done = 0; /* keys of the tile already in the accumulator */
    /* blocks where a zero P would meet an Inf or NaN of V (none: the plain products) */
    const unsigned bad = t->kind == FA_TM_FULL && t->nk == t->nk32
                             ? 0u
                             : special_blocks(q, t, dp, parts);
    const int64_t per = f ? (f->r1 - f->r0 + t->nk32 / KS - 1) / (t->nk32 / KS) : 0;
    for (int s = 0; s < t->nk; s += KS) {
        if (f) fetch_rows(f, f->r0 + s / KS * per, f->r0 + (s / KS + 1) * per);
        uint32_t *pt = B->pt + (size_t)(s / 2) * BQ;
        const int ns = t->nk - s < KS ? t->nk - s : KS;
        const float mul = strip_scores(p, q, B, t, s, slope, nq, nq32, dp, parts);
        if (mul == 0.0f) { /* nothing visible: zero probabilities */
            for (int k = 0; k < parts; k++)
                for (int r = 0; r < KS / 2; r++)
                    memset(pt + ((size_t)k * (BK / 2) + r) * BQ, 0, (size_t)nq32 * 4);
            continue;
        }
        if (strip_max(B, ns, nq32, mul)) {
            if (s > done && bad)
                accumulate_vis(q, t, B, done, s, nq32, dp, parts, bad);
            else if (s > done)
                accumulate(t, B, done, s, nq32, dp, parts);
            done = s;
            AMX_FENCE();
            move_max(B, (int)p->d, nq32, parts);
        }
        if (parts == 1)
            strip_exp(B, pt, ns, nq32, mul);
        else
            strip_exp_split(B, pt, ns, nq32, mul);
    }
    if (bad)
        accumulate_vis(q, t, B, done, t->nk32, nq32, dp, parts, bad);
    else
        accumulate(t, B, done, t->nk32, nq32, dp, parts);
}

#endif /* FA_CPU_FWD_AMX_TILE_H */
