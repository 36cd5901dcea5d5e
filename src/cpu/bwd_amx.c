/*
 * cpu/bwd_amx.c — FlashAttention backward on AMX (the `amx` level, isa.h), for bf16 inputs
 * and, by products of split bf16 parts (amx_split.h), for fp32 ones.
 *
 * bwd_tiled.c's one-pass schedule with the five tile products on the AMX unit: a work item
 * per (batch, kv head) owns dK and dV of its key tiles and sums dQ of every query row of its
 * group into a per-thread fp32 buffer. Problems for which bwd_schedule.c picks the two-pass
 * schedule (too few kv heads for the threads, or a dQ buffer too large) are refused
 * (bwd_takes), so the avx512 backward runs them and the record names it.
 *
 * For a query tile (64 rows i) and a key tile (64 keys j), all query-major:
 *   S   = Q K^T        A = Q rows,   B = K^T in VNNI pairs of head-dim elements (kvn)
 *   dP  = dO V^T       A = dO rows,  B = V^T in VNNI pairs (vvn)
 *   P   = exp(s - LSE) as bwd_tiled.c builds it (scale placement: fa_tm_needs_transform);
 *   dS  = P (dP - D)   (times 1 - tanh^2 with softcap)
 *   dV^T += dO^T P     A = dO^T rows, B = P in VNNI pairs of query rows (pp)
 *   dK^T += Q^T dS     A = Q^T rows,  B = dS in VNNI pairs of query rows (dsp)
 *   dQ  += dS K        A = dS rows in bf16 (dsr), B = K in VNNI pairs of keys (kp)
 * P and dS are rounded to bf16 for the products (as the plain bf16 baseline rounds its matmul
 * inputs); every accumulator is fp32. dS takes the scale's part fa_tm_ds_pre, dK and dQ the
 * rest when they are stored.
 *
 * The query side (Q and dO rows, their transposes, LSE, D = rowsum(dO * O), computed here
 * instead of in a pass of its own) is packed once per work item for all query heads of the
 * group, the key side once per key tile; the per-thread buffers are then about three times
 * the one-pass dQ buffer that bwd_schedule.c bounds. Runs of QG query tiles meet KG key tiles
 * at a time (see QG, KG). The head dim is padded with zeros to a multiple of 32, queries and
 * keys to 32 (zero rows), and P and dS are zeroed past the tile's keys, so the padding never
 * reaches a stored value. On a mask edge P and dS of masked keys are 0 by selection, and where
 * the other operand of a product holds Inf or NaN its masked terms are skipped, not multiplied
 * by 0 (trans_times_pairs_vis, dq_vis; issue 42).
 *
 * fp32 (`parts` 3, cpu_bwd_amx_bf16x6_f32): every bf16 operand buffer holds three parts (hi,
 * mid, lo), P and dS are split where they are written, and each product runs the six partial
 * products of split_step. S runs them in the forward's order (fwd_amx.c), so that the scores
 * are the forward's bit for bit: P = exp(s - LSE) is only as good as the agreement of s with
 * the scores LSE was summed from, and the avx512 backward, whose FMA scores differ from the
 * forward's in the last bits, failed the 2x rule on dV where a row has one dominant key. For
 * the same reason this backward takes every fp32 problem whatever the schedule bwd_schedule.c
 * would pick (up to its dQ buffer bound), and FLASHATTN_CPU_F32_AMX=0 moves both the forward
 * and the backward to the avx512 level. dO and V are multiplied by powers of two before they
 * are split (amx_split.h's split_muls_fp32: their parts under 2^-126 would read as zero, and
 * dO or V * 2^-120 lose their lo and mid parts); dP, D and dS then carry both factors, dV
 * dO's, and the stores divide them out (exactly: powers of two), without FTZ.
 * Its speed against PyTorch's CPU backward: cpu.md.
 */
#include <math.h>
#include <string.h>

#include "amx_common.h"
#include "amx_split.h"
#include "isa.h"

#define BQ FA_TM_BQ /* query rows of a tile (64: fa_tm_qrows, fa_tm_scores_qmajor) */
#define BK FA_TM_BK /* keys of a tile (64: the row stride fa_tm_scores_qmajor assumes) */
/* Query tiles whose P and dS join one dV, dK product: the accumulators (a load and a store
   of dp x BK floats each per product) are then read once per QG tiles. */
#define QG 4
/* The same for fp32 (parts 3): single tiles. The run's P and dS pairs (three parts each) and
   its share of the query side then stay closest to L1, which pays since each pair's dQ runs
   during the next pair's P and dS (tile_pair; runs of 1, 2, 4 and 8 compared: cpu.md). */
#define QG_SPLIT 1
/* Key tiles that each run of query tiles meets while it is in cache: the query side of a
   work item (its packed operands and dQ, megabytes at long sequences) then streams through
   the cache once per KG key tiles. */
#define KG 4

FA_TM_INLINE int64_t pad64l(int64_t n) { return (n + 63) & ~(int64_t)63; }

/* bf16 parts per operand value: 1 for bf16 inputs, SPLIT_PARTS for fp32 ones. */
static int parts_of(const fa_problem *p) { return p->dtype == FA_DTYPE_F32 ? SPLIT_PARTS : 1; }

/* ---- per-thread buffers ---- */

/* One key tile: its operands (each per part) and gradient accumulators. */
typedef struct kt_bufs {
    uint32_t *kvn, *vvn; /* dp/2 x BK: kvn[r][j] = (K[j][2r], K[j][2r+1]) */
    uint32_t *kp;        /* BK/2 x dp: kp[r][x] = (K[2r][x], K[2r+1][x]) */
    float *dkt, *dvt;    /* dp x BK: dK^T and dV^T accumulators */
    int k_finite;        /* whether K (every part) is all finite: see dq_vis */
} kt_bufs;

/* Elements from one part of an operand buffer to the next. */
typedef struct part_strides {
    size_t q;   /* qr, dor, qt, dot (bf16) */
    size_t kv;  /* kvn, vvn, kp (dwords) */
    size_t pd;  /* pp, dsp (dwords) */
    size_t dsr; /* dsr (bf16) */
    size_t stg; /* stg (bf16) */
} part_strides;

typedef struct bwd_bufs {
    /* the work item's query side: nrows rows per query head of the group */
    uint16_t *qr, *dor; /* group x nrows x dp: Q and dO rows, zero padded */
    uint16_t *qt, *dot; /* group x nrows/64 x dp x 64: Q^T and dO^T by blocks of 64 rows
                           (a tile's 16 rows 128 bytes apart: whole rows of the transposed
                           matrix, nrows * 2 bytes apart, would share one L1 set when that
                           is a multiple of 4 KiB) */
    float *lse, *dd;    /* group x nrows: LSE (+inf where a row sees no key) and D */
    float *dq;          /* group x nrows x dp: dQ, unscaled */
    int *q_finite;      /* group x nrows/64: whether a query tile's Q and dO are all finite */
    /* the key tiles */
    uint16_t *stg;       /* BK x dp: K or V rows, zero padded */
    kt_bufs kt[KG];
    float *tmp;          /* BK x dp: a gradient tile transposed back, for the store */
    /* a tile pair */
    float *s, *dps, *g;  /* BQ x BK: scores; dP; softcap derivative */
    uint32_t *pp, *dsp;  /* QG*BQ/2 x BK: pp[r][j] = (P[2r][j], P[2r+1][j]), same for dS,
                            rows of a run of QG query tiles */
    uint16_t *dsr;       /* 2 x BQ x BK: dS rows, two tile pairs' (see key_group) */
    int parts;
    split_muls mul;      /* the operands' split scales and the scores' scale */
    part_strides ps;
} bwd_bufs;

/* Rows per query head in the item buffers: the longest query sequence, padded to a tile. */
static int64_t item_rows(const fa_problem *p) {
    int64_t mx = p->seqlen_q;
    if (p->cu_q)
        for (int64_t b = 0; b < p->batch; b++)
            if (p->cu_q[b + 1] - p->cu_q[b] > mx) mx = p->cu_q[b + 1] - p->cu_q[b];
    return pad64l(mx);
}

/* Places the buffers at base (or only counts, base NULL); returns floats per thread. */
static size_t bwd_layout(const fa_problem *p, float *base, bwd_bufs *b) {
    const size_t dp = (size_t)pad32((int)p->d), nr = (size_t)item_rows(p);
    const size_t qside = (size_t)p->group * nr * dp; /* elements of one query-side operand */
    const size_t np = (size_t)parts_of(p);
    size_t off = 0;
    b->parts = (int)np;
    b->ps.q = qside;
    b->ps.kv = dp / 2 * BK; /* = BK / 2 * dp */
    b->ps.pd = (size_t)QG * BQ / 2 * BK;
    b->ps.dsr = (size_t)BQ * BK;
    b->ps.stg = (size_t)BK * dp;
    b->qr = (uint16_t *)fa_tm_take(base, &off, np * qside / 2);
    b->dor = (uint16_t *)fa_tm_take(base, &off, np * qside / 2);
    b->qt = (uint16_t *)fa_tm_take(base, &off, np * qside / 2);
    b->dot = (uint16_t *)fa_tm_take(base, &off, np * qside / 2);
    b->lse = fa_tm_take(base, &off, (size_t)p->group * nr);
    b->dd = fa_tm_take(base, &off, (size_t)p->group * nr);
    b->dq = fa_tm_take(base, &off, qside);
    b->q_finite = (int *)fa_tm_take(base, &off, (size_t)p->group * nr / BQ);
    b->stg = (uint16_t *)fa_tm_take(base, &off, np * BK * dp / 2);
    for (int t = 0; t < KG; t++) {
        kt_bufs *k = &b->kt[t];
        k->kvn = (uint32_t *)fa_tm_take(base, &off, np * dp / 2 * BK);
        k->vvn = (uint32_t *)fa_tm_take(base, &off, np * dp / 2 * BK);
        k->kp = (uint32_t *)fa_tm_take(base, &off, np * BK / 2 * dp);
        k->dkt = fa_tm_take(base, &off, dp * BK);
        k->dvt = fa_tm_take(base, &off, dp * BK);
    }
    b->tmp = fa_tm_take(base, &off, BK * dp);
    b->s = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->dps = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->g = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->pp = (uint32_t *)fa_tm_take(base, &off, np * QG * BQ / 2 * BK);
    b->dsp = (uint32_t *)fa_tm_take(base, &off, np * QG * BQ / 2 * BK);
    b->dsr = (uint16_t *)fa_tm_take(base, &off, 2 * np * BQ * BK / 2);
    return off;
}

/* ---- packing ---- */

/* bf16 -> fp32 of 16 elements (masked: nothing past n is read). */
FA_TM_INLINE __m512 load16_bf(const uint16_t *s, int n) {
    const __mmask32 m = n >= 16 ? (__mmask32)0xffff : (__mmask32)((1u << (n > 0 ? n : 0)) - 1);
    const __m256i h = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, s));
    const __m512i w = _mm512_cvtepu16_epi32(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* fp32 of 16 elements of a bf16 or an fp32 row (masked: nothing past n is read). */
FA_TM_INLINE __m512 load16(const void *s, int n, int f32) {
    if (!f32) return load16_bf((const uint16_t *)s, n);
    const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1);
    return _mm512_maskz_loadu_ps(m, s);
}

/* D = rowsum(dO * O) of one row, in fp32, times gmul vmul (the split scales of dO and V) as dP
   is: O times vmul and dO times gmul before the products (exact, and no product of two tiny
   values flushed). */
static float row_dot(const void *o, const void *g, int d, int f32, float vmul, float gmul) {
    const size_t es = f32 ? 4 : 2;
    const __m512 vm = _mm512_set1_ps(vmul), gm = _mm512_set1_ps(gmul);
    __m512 acc = _mm512_setzero_ps();
    for (int x = 0; x < d; x += 16)
        acc = _mm512_fmadd_ps(_mm512_mul_ps(load16((const char *)o + x * es, d - x, f32), vm),
                              _mm512_mul_ps(load16((const char *)g + x * es, d - x, f32), gm),
                              acc);
    return _mm512_reduce_add_ps(acc);
}


/* A row of es-byte elements into L1 ahead of its use. Rows of one head lie a whole token
   apart (4 KiB at H 8, d 128 fp32: each on its own page), so the hardware prefetcher does not
   fetch them ahead and each put_row / row_dot waited on its loads (cpu.md). */
FA_TM_INLINE void prefetch_row(const void *row, int d, size_t es) {
    for (size_t x = 0; x < (size_t)d * es; x += 64)
        _mm_prefetch((const char *)row + x, _MM_HINT_T0);
}

/* Rows ahead that the packing loops prefetch. */
#define PF_ROWS 4

/* LSE as the exponentials want it: a row that saw no key (-inf) must give P = 0, and
   exp(s - (+inf)) is 0 where exp(s - (-inf)) would be inf or NaN. */
FA_TM_INLINE float lse_ref(const fa_problem *p, int64_t b, int64_t h, int64_t t) {
    const float v = ((const float *)p->lse)[b * p->lse_sb + h * p->lse_sh + t * p->lse_st];
    return v == -INFINITY ? INFINITY : v;
}

/* The query side of item (b, kv head hk): rows [0, pad64(sq)) of every head of the group. */
static void pack_queries(const fa_problem *p, const bwd_bufs *B, int64_t b, int64_t hk,
                         int64_t q0, int64_t sq) {
    const int d = (int)p->d, dp = pad32(d), parts = B->parts, f32 = parts > 1;
    const size_t es = f32 ? 4 : 2, ps = B->ps.q;
    const int64_t nr = item_rows(p), n64 = pad64l(sq), bq = p->cu_q ? 0 : b;
    for (int64_t r = 0; r < p->group; r++) {
        const int64_t h = hk * p->group + r;
        uint16_t *qr = B->qr + (size_t)(r * nr) * dp, *dor = B->dor + (size_t)(r * nr) * dp;
        float *lse = B->lse + r * nr, *dd = B->dd + r * nr;
        for (int64_t i = 0; i < n64; i++) {
            if (i + PF_ROWS < sq) {
                prefetch_row(fa_tm_row(&p->q, es, bq, q0 + i + PF_ROWS, h), d, es);
                prefetch_row(fa_tm_row(&p->dout, es, bq, q0 + i + PF_ROWS, h), d, es);
                prefetch_row(fa_tm_row(&p->o, es, bq, q0 + i + PF_ROWS, h), d, es);
            }
            if (i < sq) {
                const void *g = fa_tm_row(&p->dout, es, bq, q0 + i, h);
                put_row_mul(qr + (size_t)i * dp, ps, fa_tm_row(&p->q, es, bq, q0 + i, h), parts, d,
                            dp, B->mul.q);
                put_row_mul(dor + (size_t)i * dp, ps, g, parts, d, dp, B->mul.g);
                lse[i] = lse_ref(p, b, h, q0 + i);
                dd[i] = row_dot(fa_tm_row(&p->o, es, bq, q0 + i, h), g, d, f32, B->mul.v,
                                B->mul.g);
            } else { /* padding rows: zero operands, P = 0 */
                put_row(qr + (size_t)i * dp, ps, NULL, parts, d, dp);
                put_row(dor + (size_t)i * dp, ps, NULL, parts, d, dp);
                lse[i] = INFINITY;
                dd[i] = 0.0f;
            }
        }
        uint16_t *qt = B->qt + (size_t)(r * nr) * dp, *dot = B->dot + (size_t)(r * nr) * dp;
        for (int k = 0; k < parts; k++)
            for (int64_t i = 0; i < n64; i += 32) {
                const size_t at = k * ps + (size_t)(i & ~(int64_t)63) * dp + (size_t)(i & 63);
                const size_t from = k * ps + (size_t)i * dp;
                transpose_rows32(qt + at, BQ, qr + from, (size_t)dp, dp);
                transpose_rows32(dot + at, BQ, dor + from, (size_t)dp, dp);
            }
        for (int64_t i = 0; i < n64; i += BQ) {
            int fin = 1;
            for (int k = 0; k < parts; k++)
                fin &= bf16_all_finite(qr + k * ps + (size_t)i * dp, (size_t)BQ * dp) &&
                       bf16_all_finite(dor + k * ps + (size_t)i * dp, (size_t)BQ * dp);
            B->q_finite[r * (nr / BQ) + i / BQ] = fin;
        }
    }
}

/* dst[r][j] = dword r of row j of stg (BK rows): the transpose of the rows as dwords. */
static void dword_transpose(uint32_t *dst, const uint16_t *stg, int dp) {
    const uint32_t *s = (const uint32_t *)stg;
    const int dw = dp / 2;
    for (int j0 = 0; j0 < BK; j0 += 16)
        for (int r0 = 0; r0 < dw; r0 += 16) {
            __m512i w[16];
            for (int j = 0; j < 16; j++) w[j] = _mm512_loadu_si512(s + (size_t)(j0 + j) * dw + r0);
            fa_transpose16(w);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_si512(dst + (size_t)(r0 + t) * BK + j0, w[t]);
        }
}

/* stg = rows [t0, t0 + nk) of kv head hk of operand a times mul (each part B->ps.stg elements
   on), zero past nk. */
static void stage_keys(const fa_problem *p, const bwd_bufs *B, const fa_operand *a, int64_t bk,
                       int64_t t0, int nk, int64_t hk, int dp, float mul) {
    const size_t es = B->parts > 1 ? 4 : 2;
    for (int j = 0; j < BK; j++) {
        if (j + PF_ROWS < nk) prefetch_row(fa_tm_row(a, es, bk, t0 + j + PF_ROWS, hk), (int)p->d, es);
        put_row_mul(B->stg + (size_t)j * dp, B->ps.stg,
                    j < nk ? fa_tm_row(a, es, bk, t0 + j, hk) : NULL, B->parts, (int)p->d, dp,
                    mul);
    }
}

/* The key side of a key tile: kvn and kp from K, vvn from V, each part. */
static void pack_keys(const fa_problem *p, const bwd_bufs *B, const kt_bufs *K, int64_t bk,
                      int64_t t0, int nk, int64_t hk, int dp) {
    const size_t ps = B->ps.stg, pk = B->ps.kv;
    stage_keys(p, B, &p->k, bk, t0, nk, hk, dp, B->mul.k);
    const __m512i idx = interleave_idx(32);
    for (int k = 0; k < B->parts; k++) {
        const uint16_t *stg = B->stg + k * ps;
        uint32_t *kp = K->kp + k * pk;
        dword_transpose(K->kvn + k * pk, stg, dp);
        for (int r = 0; r < BK / 2; r++)
            for (int x = 0; x < dp; x += 16) {
                const __m512i a = _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(stg + (size_t)(2 * r) * dp + x)));
                const __m512i c = _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(stg + (size_t)(2 * r + 1) * dp + x)));
                _mm512_storeu_si512(kp + (size_t)r * dp + x, _mm512_permutex2var_epi16(a, idx, c));
            }
    }
    stage_keys(p, B, &p->v, bk, t0, nk, hk, dp, B->mul.v);
    for (int k = 0; k < B->parts; k++) dword_transpose(K->vvn + k * pk, B->stg + k * ps, dp);
}

/* ---- the tile products ---- */

/* A 32 x 32 block of C (fp32, row stride cs bytes) += steps products of a 32-row A slab (row
   stride as bytes; K step k at a + (k / 2) a_pair + (k % 2) a_step bytes) and a 32-column B
   slab (row stride bs bytes, the next K step b_step bytes on); C starts at zero when zero is
   set. With split operands (parts 3) each K step runs split_step on parts apart and bpart
   bytes apart, swapped as it says. between (NULL: none) runs after every K step, while its
   products are still in flight (ds_times_keys builds the next pair's P and dS there). */
typedef struct split_at {
    int parts;
    size_t apart, bpart;
    int swapped;
} split_at;

FA_TM_INLINE void block2x2(float *c, size_t cs, int zero, const char *a, size_t as,
                           size_t a_step, size_t a_pair, const char *b, size_t bs,
                           size_t b_step, int steps, split_at sp, void (*between)(void *),
                           void *arg) {
    char *cb = (char *)c;
    AMX_FENCE();
    if (zero) {
        _tile_zero(TC00);
        _tile_zero(TC01);
        _tile_zero(TC10);
        _tile_zero(TC11);
    } else {
        _tile_loadd(TC00, cb, cs);
        _tile_loadd(TC01, cb + 64, cs);
        _tile_loadd(TC10, cb + TR * cs, cs);
        _tile_loadd(TC11, cb + TR * cs + 64, cs);
    }
    for (int k = 0; k < steps; k++, b += b_step) {
        const char *ak = a + (size_t)(k >> 1) * a_pair + (size_t)(k & 1) * a_step;
        if (sp.parts > 1) {
            split_step(ak, sp.apart, TR * as, as, b, sp.bpart, bs, sp.swapped);
        } else {
            _tile_loadd(TA0, ak, as);
            _tile_loadd(TA1, ak + TR * as, as);
            _tile_loadd(TB0, b, bs);
            _tile_loadd(TB1, b + 64, bs);
            AMX_DP_2X2();
        }
        if (between) {
            AMX_FENCE();
            between(arg);
            AMX_FENCE();
        }
    }
    _tile_stored(TC00, cb, cs);
    _tile_stored(TC01, cb + 64, cs);
    _tile_stored(TC10, cb + TR * cs, cs);
    _tile_stored(TC11, cb + TR * cs + 64, cs);
    AMX_FENCE();
}

/* out[i][j] = sum_x rows[i][x] vnn[x/2][j] for i < nq32, j < nk32: S (Q, kvn) or dP (dO, vvn).
   Split products run swapped: S must be fwd_amx.c's S^T = K Q^T bit for bit. */
static void rows_times_keys(const bwd_bufs *B, float *out, const uint16_t *rows,
                            const uint32_t *vnn, int nq32, int nk32, int dp) {
    const split_at sp = {B->parts, B->ps.q * 2, B->ps.kv * 4, 1};
    for (int qb = 0; qb < nq32; qb += 32)
        for (int kb = 0; kb < nk32; kb += 32)
            block2x2(out + (size_t)qb * BK + kb, BK * 4, 1,
                     (const char *)(rows + (size_t)qb * dp), (size_t)dp * 2, KS * 2, KS * 4,
                     (const char *)(vnn + kb), BK * 4, (size_t)TR * BK * 4, dp / KS, sp, NULL,
                     NULL);
}

/* acc[x][j] += sum_i tr[x][i] pairs[i/2][j] over nq32 queries: dV^T (dO^T, P) or dK^T (Q^T,
   dS). tr is the head's transposed operand at the block of the run's first row. */
static void trans_times_pairs(const bwd_bufs *B, float *acc, const uint16_t *tr,
                              const uint32_t *pairs, int nq32, int nk32, int dp) {
    const split_at sp = {B->parts, B->ps.q * 2, B->ps.pd * 4, 0};
    for (int xb = 0; xb < dp; xb += 32)
        for (int kb = 0; kb < nk32; kb += 32)
            block2x2(acc + (size_t)xb * BK + kb, BK * 4, 0,
                     (const char *)(tr + (size_t)xb * BQ), BQ * 2, KS * 2, (size_t)BQ * dp * 2,
                     (const char *)(pairs + kb), BK * 4, (size_t)TR * BK * 4, nq32 / KS, sp,
                     NULL, NULL);
}

/* trans_times_pairs for a run whose Q or dO rows hold Inf or NaN while some of its rows do
   not see every key of the tile (a masked term is a zero P or dS times that value: NaN): a K
   step (32 query rows) at a time, the slab of tr copied into stg (free while key tiles run)
   with Inf and NaN set to 0 (amx_common.h), then the dropped terms added for the keys their
   row sees: acc[x][j] += tr[x][i] pairs[i][j] (the pair value's parts summed). Each element of
   acc takes its products in trans_times_pairs' order (the accumulator's trips through memory
   are exact), so a key no special value reaches gets trans_times_pairs' bits. rows: the run's
   query tiles; the tile's keys are [j0, j0 + nk). */
static void trans_times_pairs_vis(const bwd_bufs *B, float *acc, const uint16_t *tr,
                                  const uint32_t *pairs, int nq32, int nk32, int dp,
                                  const fa_tm_qrows *rows, int64_t j0, int nk) {
    const int parts = B->parts;
    const size_t slab = (size_t)KS * dp; /* bf16 of a copied slab, per part */
    const split_at sp = {parts, slab * 2, B->ps.pd * 4, 0};
    for (int qs = 0; qs < nq32; qs += KS) {
        /* element (x, query qs + c) of tr at at + x * BQ + c: blocks of 64 queries */
        const size_t at = (size_t)(qs / BQ) * BQ * dp + (size_t)(qs % BQ);
        AMX_FENCE();
        for (int k = 0; k < parts; k++)
            for (int x = 0; x < dp; x++)
                _mm512_storeu_si512(B->stg + k * slab + (size_t)x * KS,
                                    bf16_zero_specials(_mm512_loadu_si512(
                                        tr + k * B->ps.q + at + (size_t)x * BQ)));
        for (int xb = 0; xb < dp; xb += 32)
            for (int kb = 0; kb < nk32; kb += 32)
                block2x2(acc + (size_t)xb * BK + kb, BK * 4, 0,
                         (const char *)(B->stg + (size_t)xb * KS), KS * 2, KS * 2, KS * 4,
                         (const char *)(pairs + (size_t)(qs / 2) * BK + kb), BK * 4,
                         (size_t)TR * BK * 4, 1, sp, NULL, NULL);
        for (int k = 0; k < parts; k++)
            for (int x = 0; x < dp; x++)
                for (int c = 0; c < KS; c++) {
                    const uint16_t w = tr[k * B->ps.q + at + (size_t)x * BQ + c];
                    if (!bf16_special(w)) continue;
                    const int qi = qs + c; /* row of the run */
                    const fa_tm_qrows *r = &rows[qi / BQ];
                    const int i = qi % BQ;
                    if (i >= r->n) continue;
                    for (int j = 0; j < nk; j++) {
                        if (j0 + j < r->lo[i] || j0 + j >= r->hi[i]) continue;
                        float pv = 0.0f;
                        for (int kd = 0; kd < parts; kd++) {
                            const uint32_t two = pairs[kd * B->ps.pd + (size_t)(qi / 2) * BK + j];
                            pv += fa_tm_bf2f((uint16_t)(qi & 1 ? two >> 16 : two & 0xffffu));
                        }
                        acc[(size_t)x * BK + j] += fa_tm_bf2f(w) * pv;
                    }
                }
        AMX_FENCE();
    }
}

/* ---- P and dS ---- */

/* Rows i and i + 1 of a 16-column chunk into a VNNI pair row: (a[j], b[j]) per dword. */
FA_TM_INLINE void store_pair(uint32_t *dst, __m512 a, __m512 b, __m512i ilv) {
    const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* a low half, b high */
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(ilv, w));
}

/* Columns j .. j + 15 that lie in [lo, hi), as a mask. */
FA_TM_INLINE __mmask16 span16(int j, int lo, int hi) {
    const int a = lo - j < 0 ? 0 : lo - j > 16 ? 16 : lo - j;
    const int z = hi - j < 0 ? 0 : hi - j > 16 ? 16 : hi - j;
    return (__mmask16)(((1u << z) - 1) & ~((1u << a) - 1));
}

/* P = exp(mul s - LSE) and dS = P (dP - D) (times g with softcap) of one row, 16 columns at
   j, zero at and past column nk and outside vis (the keys the row sees, on a mask edge): P
   and dS of a masked key are 0 by selection, since its dP is NaN where its V holds NaN or Inf
   and D is where the row's dO does (0 * NaN). */
FA_TM_INLINE void row_chunk(const bwd_bufs *B, int i, int j, int nk, __mmask16 vis, float mul,
                            float pre, float lse, float di, int cap, __m512 *pv, __m512 *dsv) {
    const float *s = B->s + (size_t)i * BK + j, *dp = B->dps + (size_t)i * BK + j;
    const int n = nk - j;
    const __mmask16 keep =
        vis & (n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1));
    /* as fa_vexp_softmax_row: clamped at 0, the score may exceed LSE by a rounding */
    fa_vf x = fa_vclamp0(fa_vload(s) * fa_vset1(mul) - fa_vset1(lse));
    const __m512 pr = _mm512_maskz_mov_ps(keep, (__m512)fa_vexp_softmax(x));
    __m512 ds = /* P (dP - D) pre (fa_tm_ds_pre) */
        _mm512_maskz_mul_ps(keep, pr, _mm512_sub_ps(_mm512_loadu_ps(dp), _mm512_set1_ps(di)));
    ds = _mm512_mul_ps(ds, _mm512_set1_ps(pre));
    if (cap) ds = _mm512_maskz_mul_ps(keep, ds, _mm512_loadu_ps(B->g + (size_t)i * BK + j));
    *pv = pr;
    *dsv = ds;
}

/* The pair's P and dS in the three layouts the products read, for rows < nq32 (a row past
   nq has LSE +inf: P = 0; its softcap derivative was never written, so it is not read) and
   columns < nk32; a job, done a few rows at a time (build_rows) between the products of the
   previous pair's dQ (see key_group). */
typedef struct build_job {
    uint32_t *pp, *dsp;
    uint16_t *dsr;
    const float *lse, *dd;
    const int *vlo, *vhi; /* keys [vlo[i], vhi[i]) of the tile are row i's; NULL: all */
    int nq, nq32, nk, nk32, cap;
    float mul, pre; /* the exponentials' scale (1 where transformed); dS's (fa_tm_ds_pre) */
    int next; /* the first row not built yet */
} build_job;

/* Rows [job->next, job->next + 2 n) of the job (n row pairs), at most to nq32. */
static void build_rows(const bwd_bufs *B, build_job *job, int n) {
    uint32_t *pp = job->pp, *dsp = job->dsp;
    const float *lse = job->lse, *dd = job->dd;
    const int nq = job->nq, nk = job->nk, nk32 = job->nk32, cap = job->cap;
    const float mul = job->mul, pre = job->pre;
    const int i0 = job->next, i1 = i0 + 2 * n < job->nq32 ? i0 + 2 * n : job->nq32;
    job->next = i1;
    const __m512i ilv = interleave_idx(16);
    const size_t pd = B->ps.pd, pr = B->ps.dsr;
    for (int i = i0; i < i1; i += 2)
        for (int j = 0; j < nk32; j += 16) {
            __m512 p0, p1, d0, d1;
            const __mmask16 v0 = job->vlo ? span16(j, job->vlo[i], job->vhi[i]) : 0xffff;
            const __mmask16 v1 = job->vlo ? span16(j, job->vlo[i + 1], job->vhi[i + 1]) : 0xffff;
            row_chunk(B, i, j, nk, v0, mul, pre, lse[i], dd[i], cap && i < nq, &p0, &d0);
            row_chunk(B, i + 1, j, nk, v1, mul, pre, lse[i + 1], dd[i + 1], cap && i + 1 < nq,
                      &p1, &d1);
            if (B->parts > 1) { /* fp32: each value split, a row of pairs or dS per part */
                split_store_pairs(pp + (size_t)(i / 2) * BK + j, pd, p0, p1);
                split_store_pairs(dsp + (size_t)(i / 2) * BK + j, pd, d0, d1);
                __m512 h, m, l;
                uint16_t *r0 = job->dsr + (size_t)i * BK + j, *r1 = r0 + BK;
                split3(d0, &h, &m, &l);
                _mm256_storeu_si256((__m256i *)r0, split_bf16(h));
                _mm256_storeu_si256((__m256i *)(r0 + pr), split_bf16(m));
                _mm256_storeu_si256((__m256i *)(r0 + 2 * pr), split_bf16(l));
                split3(d1, &h, &m, &l);
                _mm256_storeu_si256((__m256i *)r1, split_bf16(h));
                _mm256_storeu_si256((__m256i *)(r1 + pr), split_bf16(m));
                _mm256_storeu_si256((__m256i *)(r1 + 2 * pr), split_bf16(l));
                continue;
            }
            store_pair(pp + (size_t)(i / 2) * BK + j, p0, p1, ilv);
            store_pair(dsp + (size_t)(i / 2) * BK + j, d0, d1, ilv);
            _mm256_storeu_si256((__m256i *)(job->dsr + (size_t)i * BK + j),
                                (__m256i)_mm512_cvtneps_pbh(d0));
            _mm256_storeu_si256((__m256i *)(job->dsr + (size_t)(i + 1) * BK + j),
                                (__m256i)_mm512_cvtneps_pbh(d1));
        }
}

/* A pair whose dQ product is still to run: dq[i][x] += sum_j dS[i][j] K[j][x] over nk32
   keys, dS rows in dsr. vis: the pair is on a mask edge and K holds Inf or NaN (dq_vis);
   then row i < nq sees keys [lo[i], hi[i]) of the tile. */
typedef struct dq_job {
    float *dq;
    const uint16_t *dsr;
    const uint32_t *kp;
    int nq32, nk32;
    int vis, nq;
    int lo[BQ], hi[BQ];
} dq_job;

/* The dQ product of a job with vis set: a K step (32 keys) at a time, its rows of kp copied
   into stg (free while key tiles run) with Inf and NaN set to 0 (amx_common.h), then the
   dropped terms added for the rows that see their key: dq[i][x] += dS[i][j] K[j][x] (dS's
   parts summed). Each element of dq takes its products in ds_times_keys' order (the
   accumulator's trips through memory are exact), so a row that sees no special value gets
   ds_times_keys' bits. */
static void dq_vis(const bwd_bufs *B, const dq_job *q, int dp) {
    const int parts = B->parts;
    const size_t step = (size_t)TR * dp; /* dwords of kp per K step, per part */
    const split_at sp = {parts, B->ps.dsr * 2, step * 4, 0};
    uint32_t *kc = (uint32_t *)B->stg;
    for (int kb = 0; kb < q->nk32; kb += KS) {
        AMX_FENCE();
        for (int k = 0; k < parts; k++) {
            const uint16_t *src =
                (const uint16_t *)(q->kp + k * B->ps.kv + (size_t)(kb / 2) * dp);
            uint16_t *dst = (uint16_t *)(kc + k * step);
            for (size_t e = 0; e < 2 * step; e += 32)
                _mm512_storeu_si512(dst + e, bf16_zero_specials(_mm512_loadu_si512(src + e)));
        }
        for (int qb = 0; qb < q->nq32; qb += 32)
            for (int xb = 0; xb < dp; xb += 32)
                block2x2(q->dq + (size_t)qb * dp + xb, (size_t)dp * 4, 0,
                         (const char *)(q->dsr + (size_t)qb * BK + kb), BK * 2, KS * 2, KS * 4,
                         (const char *)(kc + xb), (size_t)dp * 4, (size_t)TR * dp * 4, 1, sp,
                         NULL, NULL);
        for (int k = 0; k < parts; k++)
            for (int r = 0; r < TR; r++)
                for (int x = 0; x < dp; x++) {
                    const uint32_t two = q->kp[k * B->ps.kv + (size_t)(kb / 2 + r) * dp + x];
                    for (int h = 0; h < 2; h++) {
                        const uint16_t w = (uint16_t)(h ? two >> 16 : two & 0xffffu);
                        if (!bf16_special(w)) continue;
                        const int j = kb + 2 * r + h;
                        for (int i = 0; i < q->nq; i++) {
                            if (j < q->lo[i] || j >= q->hi[i]) continue;
                            float ds = 0.0f;
                            for (int kd = 0; kd < parts; kd++)
                                ds += fa_tm_bf2f(q->dsr[kd * B->ps.dsr + (size_t)i * BK + j]);
                            q->dq[(size_t)i * dp + x] += ds * fa_tm_bf2f(w);
                        }
                    }
                }
        AMX_FENCE();
    }
}

/* build_rows of one job, per rows at a time, as block2x2's between-steps work. */
typedef struct build_step {
    const bwd_bufs *B;
    build_job *job;
    int per;
} build_step;
static void build_step_run(void *x) {
    const build_step *s = x;
    build_rows(s->B, s->job, s->per);
}

/* The dQ product of job q (none if NULL), with the rows of build job b (none if NULL) built
   between its K steps: the vector work of P and dS then runs while the tile products of the
   step before it are still in flight, instead of after them (the products' tail and the
   elementwise work overlap). */
static void ds_times_keys(const bwd_bufs *B, const dq_job *q, build_job *b, int dp) {
    if (q && q->vis) { /* rare: the rows built after it */
        dq_vis(B, q, dp);
        q = NULL;
    }
    if (q) {
        const split_at sp = {B->parts, B->ps.dsr * 2, B->ps.kv * 4, 0};
        const int steps = q->nk32 / KS, all = q->nq32 / 32 * (dp / 32) * steps;
        /* row pairs per K step, rounded up: the build is done by the last step */
        build_step bs = {B, b, b ? (b->nq32 / 2 + all - 1) / all : 0};
        for (int qb = 0; qb < q->nq32; qb += 32)
            for (int xb = 0; xb < dp; xb += 32)
                block2x2(q->dq + (size_t)qb * dp + xb, (size_t)dp * 4, 0,
                         (const char *)(q->dsr + (size_t)qb * BK), BK * 2, KS * 2, KS * 4,
                         (const char *)(q->kp + xb), (size_t)dp * 4, (size_t)TR * dp * 4,
                         steps, sp, b ? build_step_run : NULL, &bs);
    }
    if (b) build_rows(B, b, b->nq32); /* the rest, or all without a dQ product */
}

/* ---- one work item ---- */

/* Where a tile pair runs: the query tile of head r of the group at row i0 against the key
   tile at j0; slot: its place in the run of query tiles that share a dV, dK product. */
typedef struct pair_at {
    int64_t r, i0, j0;
    int nq, nk, slot;
} pair_at;

/* One query tile against the key tile: S and dP, then P and dS (into the run's slot, dS rows
   into dsr buffer *cur) built between the products of the pending pair's dQ (*pend, if any),
   and this pair's dQ left pending in its place, *cur flipped to the other buffer. */
static void tile_pair(const fa_problem *p, const bwd_bufs *B, const kt_bufs *K,
                      const fa_tm_qrows *rows, int kind, const pair_at *at, float slope,
                      dq_job *pend, int *has_pend, int *cur) {
    const int dp = pad32((int)p->d), nq32 = pad32(at->nq), nk32 = pad32(at->nk);
    const int64_t nr = item_rows(p), row0 = at->r * nr + at->i0;
    rows_times_keys(B, B->s, B->qr + (size_t)row0 * dp, K->kvn, nq32, nk32, dp);
    rows_times_keys(B, B->dps, B->dor + (size_t)row0 * dp, K->vvn, nq32, nk32, dp);
    const float cap = p->softcap;
    const int transform = fa_tm_needs_transform(kind, cap, slope);
    const int partial = kind == FA_TM_PARTIAL; /* then also transform */
    fa_tm_rel rel;
    if (transform) {
        fa_tm_rel_init(&rel, rows, at->j0);
        fa_tm_scores_qmajor(B->s, cap > 0 ? B->g : NULL, at->nq, at->nk, &rel, B->mul.sscale,
                            cap, slope, partial);
    }
    const size_t slot = (size_t)at->slot * BQ / 2 * BK;
    uint16_t *dsr = B->dsr + (size_t)*cur * B->parts * BQ * BK;
    build_job bj = {B->pp + slot, B->dsp + slot, dsr, B->lse + row0, B->dd + row0,
                    partial ? rel.lo : NULL, partial ? rel.hi : NULL,
                    at->nq, nq32, at->nk, nk32, cap > 0, transform ? 1.0f : B->mul.sscale,
                    fa_tm_ds_pre(p->scale), 0};
    dq_job mine;
    mine.dq = B->dq + (size_t)row0 * dp;
    mine.dsr = dsr;
    mine.kp = K->kp;
    mine.nq32 = nq32;
    mine.nk32 = nk32;
    /* on a mask edge a masked key's dS is 0, and 0 times K's Inf or NaN is NaN */
    mine.vis = partial && !K->k_finite;
    mine.nq = at->nq;
    if (mine.vis) {
        memcpy(mine.lo, rel.lo, sizeof mine.lo);
        memcpy(mine.hi, rel.hi, sizeof mine.hi);
    }
    if (B->parts == 1) { /* bf16: slower interleaved (cpu.md); built, then its dQ */
        ds_times_keys(B, NULL, &bj, dp);
        ds_times_keys(B, &mine, NULL, dp);
        return;
    }
    ds_times_keys(B, *has_pend ? pend : NULL, &bj, dp);
    *pend = mine;
    *has_pend = 1;
    *cur ^= 1;
}

/* A run of query tiles with nothing to see gets P = dS = 0 in its slot. */
static void empty_slot(const bwd_bufs *B, int slot) {
    const size_t at = (size_t)slot * BQ / 2 * BK, n = (size_t)BQ / 2 * BK * 4;
    for (int k = 0; k < B->parts; k++) {
        memset(B->pp + k * B->ps.pd + at, 0, n);
        memset(B->dsp + k * B->ps.pd + at, 0, n);
    }
}

/* dV, dK += the run of query tiles of head r from row i0 (rows32 rows, padding included);
   vis: the run's Q or dO hold Inf or NaN and some of its rows (rows[]) do not see every key
   [j0, j0 + nk) of the tile (trans_times_pairs_vis). */
static void run_products(const fa_problem *p, const bwd_bufs *B, const kt_bufs *K, int64_t r,
                         int64_t i0, int rows32, int nk32, int vis, const fa_tm_qrows *rows,
                         int64_t j0, int nk) {
    const int dp = pad32((int)p->d);
    const int64_t nr = item_rows(p);
    const size_t t0 = (size_t)(r * nr + i0) * dp; /* i0 is on the 64-row grid */
    if (vis) {
        trans_times_pairs_vis(B, K->dvt, B->dot + t0, B->pp, rows32, nk32, dp, rows, j0, nk);
        trans_times_pairs_vis(B, K->dkt, B->qt + t0, B->dsp, rows32, nk32, dp, rows, j0, nk);
        return;
    }
    trans_times_pairs(B, K->dvt, B->dot + t0, B->pp, rows32, nk32, dp);
    trans_times_pairs(B, K->dkt, B->qt + t0, B->dsp, rows32, nk32, dp);
}

/* A gradient row src (overwritten) times mul and unscale (undoing the split scales, down to
   2^-189: a double), in double and rounded once: in fp32 either order can fail, src * mul
   overflowing where unscale then brings it back (a huge scale with a tiny V: vmul 2^63; fuzz
   finding crash-29b28e08) and src * unscale going subnormal and losing bits that mul would
   have kept. */
static void store_grad_row(void *dst, fa_dtype dt, float *src, int d, float mul, double unscale) {
    if (unscale != 1.0) {
        const double m = (double)mul * unscale; /* exact: unscale is a power of two */
        for (int x = 0; x < d; x++) src[x] = (float)((double)src[x] * m);
        mul = 1.0f;
    }
    fa_tm_store_row(dst, dt, src, d, mul);
}

/* Rows [0, nk) of a gradient tile held transposed (acc[x][j]) -> operand rows, times mul
   and unscale (store_grad_row). */
static void store_keys(const fa_problem *p, const bwd_bufs *B, const float *acc,
                       const fa_operand *dst, int64_t bk, int64_t t0, int nk, int64_t hk,
                       float mul, double unscale) {
    const int d = (int)p->d, dp = pad32(d);
    for (int j0 = 0; j0 < nk; j0 += 16)
        for (int x0 = 0; x0 < dp; x0 += 16) {
            __m512i w[16];
            for (int t = 0; t < 16; t++)
                w[t] = _mm512_loadu_si512(acc + (size_t)(x0 + t) * BK + j0);
            fa_transpose16(w);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_si512(B->tmp + (size_t)(j0 + t) * dp + x0, w[t]);
        }
    for (int j = 0; j < nk; j++)
        store_grad_row(fa_tm_row(dst, fa_dtype_size(p->dtype), bk, t0 + j, hk), p->dtype,
                       B->tmp + (size_t)j * dp, d, mul, unscale);
}

/* Every query tile of every head of the group that sees key tiles j0, j0 + BK, ... (n of
   them, nk[t] keys each), in runs of QG tiles on the 64-row grid (the packed transposes start
   there): each run meets all n key tiles while it is in cache. Rows outside [ia, ib) see
   none of the keys, which the classification tells. */
static void key_group(const fa_problem *p, const bwd_bufs *B, int64_t b, int64_t hk,
                      int64_t sq, int64_t sk, int64_t j0, int n, const int *nk) {
    const int64_t ia = fa_tm_first_row(p, sq, sk, 0, sq, j0, 0);
    const int64_t ib = fa_tm_first_row(p, sq, sk, ia, sq, j0 + (n - 1) * BK + nk[n - 1], 1);
    fa_tm_qrows rows[QG];
    const int qg = B->parts > 1 ? QG_SPLIT : QG;
    const int64_t nr = item_rows(p);
    pair_at at;
    /* each pair's dQ product runs during the next pair's P and dS (tile_pair); the last one
       after the loops. dq rows sum their key tiles in the same order as before. */
    dq_job pend = {0};
    int has_pend = 0, cur = 0;
    for (at.r = 0; at.r < p->group; at.r++) {
        const float slope = fa_alibi_slope(p, b, hk * p->group + at.r);
        for (int64_t g0 = ia & ~(int64_t)63; g0 < ib; g0 += qg * BQ) {
            int nrun = 0;
            for (; nrun < qg && g0 + nrun * BQ < ib; nrun++) {
                const int64_t i0 = g0 + nrun * BQ;
                fa_tm_qrows_init(&rows[nrun], p, i0, sq - i0 < BQ ? (int)(sq - i0) : BQ, sq, sk);
            }
            /* only the last tile of the sequence can be short */
            const int rows32 = (nrun - 1) * BQ + pad32(rows[nrun - 1].n);
            int q_finite = 1; /* the run's Q and dO */
            for (int s = 0; s < nrun; s++)
                q_finite &= B->q_finite[at.r * (nr / BQ) + g0 / BQ + s];
            for (int t = 0; t < n; t++) {
                at.j0 = j0 + t * BK;
                at.nk = nk[t];
                int any = 0, full = 1;
                for (at.slot = 0; at.slot < nrun; at.slot++) {
                    at.i0 = g0 + at.slot * BQ;
                    at.nq = rows[at.slot].n;
                    const int kind = fa_tm_classify(&rows[at.slot], at.j0, at.j0 + at.nk);
                    if (kind != FA_TM_NONE)
                        tile_pair(p, B, &B->kt[t], &rows[at.slot], kind, &at, slope, &pend,
                                  &has_pend, &cur);
                    else
                        empty_slot(B, at.slot);
                    any |= kind != FA_TM_NONE;
                    full &= kind == FA_TM_FULL;
                }
                if (any)
                    run_products(p, B, &B->kt[t], at.r, g0, rows32, pad32(at.nk),
                                 !q_finite && !full, rows, at.j0, at.nk);
            }
        }
    }
    if (has_pend) ds_times_keys(B, &pend, NULL, pad32((int)p->d));
}

FA_TM_HOT
static void amx_bwd_item(const fa_problem *p, int64_t b, int64_t hk, float *ws,
                         const split_muls *mul) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const int d = (int)p->d, dp = pad32(d);
    const int64_t nr = item_rows(p), bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b;
    /* dS carries dO's and V's factors, dQ also K's, dK Q's; dV dO's */
    const double un_s = 1.0 / ((double)mul->g * mul->v), un_v = 1.0 / mul->g;
    const double un_q = un_s / mul->k, un_k = un_s / mul->q;
    bwd_bufs B;
    bwd_layout(p, ws, &B);
    B.mul = *mul;
    /* the stores without FTZ (amx_split.h): a gradient divided by the scales is subnormal
       where plain fp32's is, and must round there, not flush */
    const unsigned csr = _mm_getcsr(), csr_store = csr & ~0x8000u;
    pack_queries(p, &B, b, hk, q0, sq);
    memset(B.dq, 0, (size_t)(p->group * nr) * dp * sizeof(float));
    for (int64_t j0 = 0; j0 < sk; j0 += KG * BK) {
        int nk[KG], n = 0;
        for (; n < KG && j0 + n * BK < sk; n++) {
            const int64_t jt = j0 + n * BK;
            kt_bufs *K = &B.kt[n];
            nk[n] = sk - jt < BK ? (int)(sk - jt) : BK;
            pack_keys(p, &B, K, bk, k0 + jt, nk[n], hk, dp);
            K->k_finite = bf16_all_finite((const uint16_t *)K->kp, (size_t)B.parts * BK * dp);
            memset(K->dkt, 0, (size_t)dp * BK * sizeof(float));
            memset(K->dvt, 0, (size_t)dp * BK * sizeof(float));
        }
        if (sq > 0) key_group(p, &B, b, hk, sq, sk, j0, n, nk);
        _mm_setcsr(csr_store);
        for (int t = 0; t < n; t++) {
            const int64_t jt = k0 + j0 + t * BK;
            store_keys(p, &B, B.kt[t].dkt, &p->dk, bk, jt, nk[t], hk, fa_tm_ds_post(p->scale),
                       un_k);
            store_keys(p, &B, B.kt[t].dvt, &p->dv, bk, jt, nk[t], hk, 1.0f, un_v);
        }
        _mm_setcsr(csr);
    }
    _mm_setcsr(csr_store);
    for (int64_t r = 0; r < p->group; r++)
        for (int64_t i = 0; i < sq; i++)
            store_grad_row(fa_tm_row(&p->dq, fa_dtype_size(p->dtype), bq, q0 + i,
                                     hk * p->group + r),
                           p->dtype, B.dq + (size_t)(r * nr + i) * dp, d,
                           fa_tm_ds_post(p->scale), un_q);
    _mm_setcsr(csr);
}

/* ---- entry points ---- */

int fa_cpu_amx_bwd_takes(const fa_problem *p, int threads) {
    /* no dropout here: the avx512 tiled backward regenerates dropout.h's mask */
    if (p->d > 256 || p->drop_p > 0) return 0;
    if (p->dtype == FA_DTYPE_F32) /* every schedule (see the top), up to the dQ bound */
        return fa_cpu_f32_amx_enabled() && (threads <= 0 || fa_cpu_bwd_dq_fits(p));
    if (p->dtype != FA_DTYPE_BF16) return 0;
    return threads <= 0 || fa_cpu_bwd_one_pass(p, threads, NULL, 0);
}

/* The fp32 backward's name says how its products run: six split-bf16 products each. */
const char *fa_cpu_amx_bwd_method(const fa_problem *p) {
    return p->dtype == FA_DTYPE_F32 ? "bf16x6" : NULL;
}

fa_cpu_tiles fa_cpu_amx_bwd_tiles(const fa_problem *p) {
    (void)p;
    fa_cpu_tiles t = {BQ, BK};
    return t;
}

size_t fa_cpu_amx_bwd_ws(const fa_problem *p, int threads) {
    bwd_bufs b;
    if (threads < 1) threads = 1;
    return FA_TM_WS_SLACK + (size_t)threads * bwd_layout(p, NULL, &b) * sizeof(float);
}

/*
 * The fp32 split scales: Q's and K's with the scores' scale (split_qk_scales), dO's and V's
 * split_scale_of's, capped so that the sums they inflate stay finite: dS = P (dP - D) carries
 * dO's and V's, and |dP_ij|, |D_i| <= d max|dO| max|V| (Cauchy-Schwarz; O is a mean of V's
 * rows), so |sum_j dS_ij K_j| <= 2 d max|dO| max|V| max|K| (the P of a row sum to 1), times
 * K's scale, and |sum_i dS_ij Q_i| <= the same with max|Q| and Q's scale times the rows of
 * the item. Where that bound times gmul vmul would pass 2^124 (FLT_MAX is ~2^128, and the
 * three parts' partial sums need room), the larger of dO's and V's scales is halved until it
 * does not (then K's and Q's, should those alone pass it): a huge K with tiny dO and V (both
 * scaled by 2^50) overflowed dQ otherwise, though the exact dQ is ~1e8 (test_special's
 * split_scale_range). The scales stay >= 1, so the parts of an operand of ordinary size are
 * those of no scaling.
 */
static split_muls split_muls_of(const fa_problem *p, int threads) {
    if (p->dtype != FA_DTYPE_F32) {
        const split_muls one = {1.0f, 1.0f, 1.0f, 1.0f, p->scale, 0, 0, 0, 0};
        return one;
    }
    split_muls m = split_muls_fp32(p, threads, 1);
    const int d = (int)p->d;
    const double mq = m.mq, mk = m.mk, mv = m.mv, mg = m.mg;
    const double rows = (double)(p->group * item_rows(p));
    for (;;) {
        const double sums = 2.0 * d * mg * m.g * mv * m.v * fmax(mk * m.k, mq * m.q * rows);
        if (!(sums > 0x1p124)) break;
        if (m.g > 1.0f || m.v > 1.0f) {
            if (m.g >= m.v) m.g *= 0.5f;
            else m.v *= 0.5f;
        } else if (m.q > 1.0f || m.k > 1.0f) {
            if (m.q >= m.k) m.q *= 0.5f;
            else m.k *= 0.5f;
            m.sscale = split_sscale(p->scale, m.q, m.k);
        } else {
            break;
        }
    }
    return m;
}

void fa_cpu_amx_bwd(const fa_problem *p, void *ws, int threads) {
    if (threads < 1) threads = 1;
    float *base = fa_tm_align(ws);
    bwd_bufs unused;
    const size_t per_thread = bwd_layout(p, NULL, &unused);
    amx_config cfg;
    amx_config_init(&cfg);
    const int64_t items = p->batch * p->heads_kv;
    const split_muls mul = split_muls_of(p, threads);
#pragma omp parallel num_threads(threads)
    {
        float *mine = base + per_thread * (size_t)fa_tm_tid();
        /* the tile state is per thread: configure it in each one, release it after */
        _tile_loadconfig(&cfg);
        /* no assists on underflowing exponentials (amx_split.h); bf16 too, for its causal
           backward (the bf16 forward gains nothing: left as it is; cpu.md) */
        const unsigned csr = split_mxcsr_enter();
#pragma omp for schedule(dynamic)
        for (int64_t w = 0; w < items; w++)
            amx_bwd_item(p, w / p->heads_kv, w % p->heads_kv, mine, &mul);
        split_mxcsr_leave(csr);
        _tile_release();
    }
}
