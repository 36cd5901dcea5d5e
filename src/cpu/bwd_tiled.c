/*
 * cpu/bwd_tiled.c — FlashAttention backward on the CPU, by recomputation from LSE.
 *
 * No probability matrix is stored and no atomics are used, so results are bit-identical run
 * to run whatever the thread count:
 *   pass 0  D_i = rowsum(dO * O) for every query row (the only O(seqlen) buffer: one float
 *           per row and query head, in the workspace);
 *   pass 1  a work item per (batch, kv head, key tile) rebuilds P and dS for every query tile
 *           of every query head of its group that sees the key tile, and owns that tile's dK
 *           and dV (so the group's sum needs no reduction across threads);
 *   pass 2  a work item per (batch, query head, query tile) rebuilds them again for its rows
 *           and owns their dQ.
 * Pass 1 keeps scores query-major (K and V transposed once per item), pass 2 key-major (Q and
 * dO transposed once per item), so nothing is transposed per tile pair.
 *
 * Scores are rebuilt exactly as the forward built them (the scale placed as
 * fa_tm_needs_transform in tile_math.h describes), so P = exp(s - LSE) matches the forward's
 * rounding. With softcap the chain rule multiplies dS by 1 - tanh^2 (g), so
 * dK = scale sum_i dS g Q and dQ = scale sum_j dS g K, the scale applied when they are stored.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "tile_math.h"

#define BQ FA_TM_BQ
#define BK FA_TM_BK

/* Pass 1: one key tile against query tiles. */
typedef struct kv_bufs {
    float *kt, *vt;     /* d x BK: K and V tiles transposed (columns past the
                           keys zero) */
    float *dk, *dv;     /* BK x dp: gradient accumulators of the key tile */
    float *qf, *dof;    /* BQ x dp: Q and dO tiles, where they are not read in place */
    float *s, *dps, *g; /* BQ x BK: scores -> P; dP -> dS; softcap derivative */
    float *lse, *dd;    /* BQ: LSE (+inf for rows with none) and D of the query rows */
} kv_bufs;

/* Pass 2: one query tile against key tiles. */
typedef struct q_bufs {
    float *qt, *dot;     /* d x BQ: Q and dO tiles, transposed */
    float *dq;           /* BQ x dp: gradient accumulator of the query tile */
    float *kf, *vf;      /* BK x dp: K and V tiles, where they are not read in place */
    float *st, *dpt, *g; /* BK x BQ: scores -> P; dP -> dS; softcap derivative */
    float *lse, *dd;     /* BQ */
} q_bufs;

static size_t kv_layout(int64_t d, float *base, kv_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->kt = fa_tm_take(base, &off, (size_t)d * BK);
    b->vt = fa_tm_take(base, &off, (size_t)d * BK);
    b->dk = fa_tm_take(base, &off, BK * dp);
    b->dv = fa_tm_take(base, &off, BK * dp);
    b->qf = fa_tm_take(base, &off, BQ * dp);
    b->dof = fa_tm_take(base, &off, BQ * dp);
    b->s = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->dps = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->g = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->lse = fa_tm_take(base, &off, BQ);
    b->dd = fa_tm_take(base, &off, BQ);
    return off;
}

static size_t q_layout(int64_t d, float *base, q_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->qt = fa_tm_take(base, &off, (size_t)d * BQ);
    b->dot = fa_tm_take(base, &off, (size_t)d * BQ);
    b->dq = fa_tm_take(base, &off, BQ * dp);
    b->kf = fa_tm_take(base, &off, BK * dp);
    b->vf = fa_tm_take(base, &off, BK * dp);
    b->st = fa_tm_take(base, &off, (size_t)BK * BQ);
    b->dpt = fa_tm_take(base, &off, (size_t)BK * BQ);
    b->g = fa_tm_take(base, &off, (size_t)BK * BQ);
    b->lse = fa_tm_take(base, &off, BQ);
    b->dd = fa_tm_take(base, &off, BQ);
    return off;
}

static size_t per_thread_floats(int64_t d) {
    kv_bufs a;
    q_bufs b;
    size_t x = kv_layout(d, NULL, &a), y = q_layout(d, NULL, &b);
    return x > y ? x : y;
}

/* D holds one float per query row and query head: head h, row r at D[h * rows + r], where
   r counts rows across the batch (BSHD: b * seqlen_q + i; varlen: the global token). */
static int64_t d_rows(const fa_problem *p) {
    return p->cu_q ? p->cu_q[p->batch] : p->batch * p->seqlen_q;
}

static int64_t d_off(const fa_problem *p, int64_t b, int64_t h, int64_t q0) {
    return h * d_rows(p) + (p->cu_q ? q0 : b * p->seqlen_q);
}

fa_cpu_tiles FA_ISA_FN(fa_cpu_bwd_tiled_tiles)(const fa_problem *p) {
    (void)p;
    fa_cpu_tiles t = {BQ, BK};
    return t;
}

size_t FA_ISA_FN(fa_cpu_bwd_tiled_ws)(const fa_problem *p, int threads) {
    if (threads < 1) threads = 1;
    size_t dfloats = ((size_t)(p->heads_q * d_rows(p)) + 15) & ~(size_t)15;
    return FA_TM_WS_SLACK + (dfloats + (size_t)threads * per_thread_floats(p->d)) * sizeof(float);
}

/* LSE of a row as the exponentials want it: a row that saw no key (-inf) must give P = 0,
   and exp(s - (+inf)) is 0 where exp(s - (-inf)) would be inf or NaN. */
static inline float lse_ref(const fa_problem *p, int64_t b, int64_t h, int64_t t) {
    float v = ((const float *)p->lse)[b * p->lse_sb + h * p->lse_sh + t * p->lse_st];
    return v == -INFINITY ? INFINITY : v;
}

/* ---- pass 0 ---- */

FA_TM_HOT
static void rowdot_item(const fa_problem *p, int64_t b, int64_t h, int64_t i0, float *D) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    if (i0 >= sq) return;
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, nq = sq - i0 < BQ ? (int)(sq - i0) : BQ;
    const int64_t bq = p->cu_q ? 0 : b;
    float *dr = D + d_off(p, b, h, q0) + i0;
    float o[FA_MAX_HEAD_DIM], g[FA_MAX_HEAD_DIM];
    for (int i = 0; i < nq; i++) {
        fa_tm_load_row(o, fa_tm_row(&p->o, es, bq, q0 + i0 + i, h), dt, d, d, 1.0f);
        fa_tm_load_row(g, fa_tm_row(&p->dout, es, bq, q0 + i0 + i, h), dt, d, d, 1.0f);
        float acc = 0.0f;
        for (int x = 0; x < d; x++) acc += o[x] * g[x];
        dr[i] = acc;
    }
}

/* ---- pass 1: dK, dV ---- */

/* First row in [a, z) whose key range ends after `key` (by_lo 0) or starts at or after it
   (by_lo 1). Both ends of a row's range never decrease with the row, so the test fails up
   to some row and holds from there on: bisect. */
static int64_t first_row(const fa_problem *p, int64_t sq, int64_t sk, int64_t a, int64_t z,
                         int64_t key, int by_lo) {
    while (a < z) {
        int64_t i = a + (z - a) / 2, lo, hi;
        fa_row_keys(p, i, sq, sk, &lo, &hi);
        if (by_lo ? lo >= key : hi > key)
            z = i;
        else
            a = i + 1;
    }
    return a;
}

FA_TM_HOT
static void kv_item(const fa_problem *p, int64_t b, int64_t hk, int64_t j0, float *ws,
                    const float *D) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    if (j0 >= sk) return;
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int nk = sk - j0 < BK ? (int)(sk - j0) : BK, nk4 = fa_tm_pad4(nk);
    const int64_t j1 = j0 + nk, bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b;
    const float cap = p->softcap;
    kv_bufs B;
    kv_layout(d, ws, &B);

    fa_tm_ahead ka; /* all rows requested at once: their misses overlap */
    fa_tm_ahead_init(&ka, &p->k, &p->v, es, bk, k0 + j0, nk, hk, d);
    for (int j = 0; j < nk; j++) fa_tm_ahead_row(&ka, j);
    for (int j = 0; j < nk; j++) {
        fa_tm_load_col(B.kt + j, BK, fa_tm_row(&p->k, es, bk, k0 + j0 + j, hk), dt, d, 1.0f);
        fa_tm_load_col(B.vt + j, BK, fa_tm_row(&p->v, es, bk, k0 + j0 + j, hk), dt, d, 1.0f);
    }
    for (int x = 0; x < d; x++)
        for (int j = nk; j < BK; j++) B.kt[(ptrdiff_t)x * BK + j] = B.vt[(ptrdiff_t)x * BK + j] = 0;
    memset(B.dk, 0, (size_t)nk4 * dp * sizeof(float));
    memset(B.dv, 0, (size_t)nk4 * dp * sizeof(float));

    /* The rows that can see [j0, j1) are one run: from the first whose range ends after j0
       to the first whose range starts at or after j1. */
    const int64_t ia = first_row(p, sq, sk, 0, sq, j0, 0);
    const int64_t ib = first_row(p, sq, sk, ia, sq, j1, 1);

    fa_tm_qrows rows;
    fa_tm_rel rel;
    for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
        const float slope = fa_alibi_slope(p, b, h);
        const float *dh = D + d_off(p, b, h, q0);
        for (int64_t i0 = ia; i0 < ib; i0 += BQ) {
            const int nq = ib - i0 < BQ ? (int)(ib - i0) : BQ, nq4 = fa_tm_pad4(nq);
            fa_tm_qrows_init(&rows, p, i0, nq, sq, sk);
            const int kind = fa_tm_classify(&rows, j0, j1);
            if (kind == FA_TM_NONE) continue;
            for (int i = 0; i < nq; i++) {
                const int64_t t = q0 + i0 + i;
                B.lse[i] = lse_ref(p, b, h, t);
                B.dd[i] = dh[i0 + i];
            }
            /* fp32 rows that fill whole vectors, in whole 4-row blocks, are read where they lie
               (the matmuls take any row stride); the rest is converted and padded */
            const float *qp = B.qf, *dop = B.dof;
            ptrdiff_t qld = dp, dold = dp;
            if (dt == FA_DTYPE_F32 && d == dp && nq == nq4) {
                qp = (const float *)fa_tm_row(&p->q, es, bq, q0 + i0, h);
                dop = (const float *)fa_tm_row(&p->dout, es, bq, q0 + i0, h);
                qld = (ptrdiff_t)p->q.st;
                dold = (ptrdiff_t)p->dout.st;
            } else {
                for (int i = 0; i < nq; i++) {
                    const int64_t t = q0 + i0 + i;
                    fa_tm_load_row(B.qf + (ptrdiff_t)i * dp, fa_tm_row(&p->q, es, bq, t, h), dt, d,
                                   dp, 1.0f);
                    fa_tm_load_row(B.dof + (ptrdiff_t)i * dp, fa_tm_row(&p->dout, es, bq, t, h), dt,
                                   d, dp, 1.0f);
                }
                memset(B.qf + (ptrdiff_t)nq * dp, 0, (size_t)(nq4 - nq) * dp * sizeof(float));
                memset(B.dof + (ptrdiff_t)nq * dp, 0, (size_t)(nq4 - nq) * dp * sizeof(float));
            }
            fa_tm_ahead ahead; /* next query tile, fetched during this one's exponentials */
            fa_tm_ahead_init(&ahead, &p->q, &p->dout, es, bq, q0 + i0 + BQ, ib - i0 - BQ, h, d);

            fa_tm_gemm_set(nq4, BK, d, qp, qld, 1, B.kt, BK, B.s, BK);
            fa_tm_gemm_set(nq4, BK, d, dop, dold, 1, B.vt, BK, B.dps, BK);
            const int transform = fa_tm_needs_transform(kind, cap, slope);
            if (transform) {
                fa_tm_rel_init(&rel, &rows, j0);
                fa_tm_scores_qmajor(B.s, cap > 0 ? B.g : NULL, nq, nk, &rel, p->scale, cap,
                                    slope, kind == FA_TM_PARTIAL);
            }
            const float mul = transform ? 1.0f : p->scale;
            for (int i = 0; i < nq; i++) {
                float *restrict s = B.s + (ptrdiff_t)i * BK;
                float *restrict ds = B.dps + (ptrdiff_t)i * BK;
                const float *restrict g = B.g + (ptrdiff_t)i * BK;
                const float lse = B.lse[i], di = B.dd[i];
                fa_tm_ahead_row(&ahead, i);
                fa_vexp_row(s, s, nk, mul, lse);
                {
                    const fa_vf vdi = fa_vset1(di);
                    int j = 0;
                    for (; j + FA_VW <= nk; j += FA_VW)
                        fa_vstore(ds + j, fa_vload(s + j) * (fa_vload(ds + j) - vdi));
                    for (; j < nk; j++) ds[j] = s[j] * (ds[j] - di);
                }
                if (cap > 0) {
                    FA_TM_SIMD
                    for (int j = 0; j < nk; j++) ds[j] *= g[j];
                }
                for (int j = nk; j < nk4; j++) s[j] = ds[j] = 0.0f;
            }
            /* dV[j] += sum_i P[i][j] dO[i],  dK[j] += sum_i dS[i][j] Q[i] (times scale at the
               end) */
            fa_tm_gemm(nk4, dp, nq, B.s, 1, BK, dop, dold, B.dv, dp);
            fa_tm_gemm(nk4, dp, nq, B.dps, 1, BK, qp, qld, B.dk, dp);
        }
    }

    for (int j = 0; j < nk; j++) {
        fa_tm_store_row(fa_tm_row(&p->dk, es, bk, k0 + j0 + j, hk), dt, B.dk + (ptrdiff_t)j * dp, d,
                        p->scale);
        fa_tm_store_row(fa_tm_row(&p->dv, es, bk, k0 + j0 + j, hk), dt, B.dv + (ptrdiff_t)j * dp, d,
                        1.0f);
    }
}

/* ---- pass 2: dQ ---- */

FA_TM_HOT
static void q_item(const fa_problem *p, int64_t b, int64_t h, int64_t i0, float *ws,
                   const float *D) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    if (i0 >= sq) return;
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int nq = sq - i0 < BQ ? (int)(sq - i0) : BQ, nq4 = fa_tm_pad4(nq);
    const int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b, hk = h / p->group;
    const float slope = fa_alibi_slope(p, b, h), cap = p->softcap;
    const float *dh = D + d_off(p, b, h, q0);
    q_bufs B;
    q_layout(d, ws, &B);

    fa_tm_qrows rows;
    fa_tm_qrows_init(&rows, p, i0, nq, sq, sk);
    fa_tm_ahead qa; /* all rows requested at once: their misses overlap (as in the forward) */
    fa_tm_ahead_init(&qa, &p->q, &p->dout, es, bq, q0 + i0, nq, h, d);
    for (int i = 0; i < nq; i++) fa_tm_ahead_row(&qa, i);
    for (int i = 0; i < nq; i++) {
        const int64_t t = q0 + i0 + i;
        fa_tm_load_col(B.qt + i, BQ, fa_tm_row(&p->q, es, bq, t, h), dt, d, 1.0f);
        fa_tm_load_col(B.dot + i, BQ, fa_tm_row(&p->dout, es, bq, t, h), dt, d, 1.0f);
        B.lse[i] = lse_ref(p, b, h, t);
        B.dd[i] = dh[i0 + i];
    }
    for (int x = 0; x < d; x++)
        for (int i = nq; i < BQ; i++)
            B.qt[(ptrdiff_t)x * BQ + i] = B.dot[(ptrdiff_t)x * BQ + i] = 0;
    for (int i = nq; i < BQ; i++) { /* padding columns: P = 0 */
        B.lse[i] = INFINITY;
        B.dd[i] = 0.0f;
    }
    memset(B.dq, 0, (size_t)nq4 * dp * sizeof(float));

    fa_tm_rel rel;
    for (int64_t j0 = rows.ulo; j0 < rows.uhi; j0 += BK) {
        const int nk = rows.uhi - j0 < BK ? (int)(rows.uhi - j0) : BK, nk4 = fa_tm_pad4(nk);
        const int kind = fa_tm_classify(&rows, j0, j0 + nk);
        if (kind == FA_TM_NONE) continue;
        /* in place where possible, as in pass 1 */
        const float *kp = B.kf, *vp = B.vf;
        ptrdiff_t kld = dp, vld = dp;
        if (dt == FA_DTYPE_F32 && d == dp && nk == nk4) {
            kp = (const float *)fa_tm_row(&p->k, es, bk, k0 + j0, hk);
            vp = (const float *)fa_tm_row(&p->v, es, bk, k0 + j0, hk);
            kld = (ptrdiff_t)p->k.st;
            vld = (ptrdiff_t)p->v.st;
        } else {
            for (int j = 0; j < nk; j++) {
                fa_tm_load_row(B.kf + (ptrdiff_t)j * dp,
                               fa_tm_row(&p->k, es, bk, k0 + j0 + j, hk), dt, d, dp, 1.0f);
                fa_tm_load_row(B.vf + (ptrdiff_t)j * dp,
                               fa_tm_row(&p->v, es, bk, k0 + j0 + j, hk), dt, d, dp, 1.0f);
            }
            memset(B.kf + (ptrdiff_t)nk * dp, 0, (size_t)(nk4 - nk) * dp * sizeof(float));
            memset(B.vf + (ptrdiff_t)nk * dp, 0, (size_t)(nk4 - nk) * dp * sizeof(float));
        }
        fa_tm_ahead ahead; /* next key tile, fetched during this one's exponentials */
        fa_tm_ahead_init(&ahead, &p->k, &p->v, es, bk, k0 + j0 + BK, rows.uhi - j0 - BK, hk, d);

        fa_tm_gemm_set(nk4, BQ, d, kp, kld, 1, B.qt, BQ, B.st, BQ);
        fa_tm_gemm_set(nk4, BQ, d, vp, vld, 1, B.dot, BQ, B.dpt, BQ);
        const int transform = fa_tm_needs_transform(kind, cap, slope);
        if (transform) {
            fa_tm_rel_init(&rel, &rows, j0);
            fa_tm_scores_kmajor(B.st, cap > 0 ? B.g : NULL, nk, nq4, &rel, p->scale, cap, slope,
                                kind == FA_TM_PARTIAL);
        }
        const fa_vf vmul = fa_vset1(transform ? 1.0f : p->scale);
        for (int j = 0; j < nk; j++) {
            const float *restrict s = B.st + (ptrdiff_t)j * BQ;
            float *restrict ds = B.dpt + (ptrdiff_t)j * BQ;
            fa_tm_ahead_row(&ahead, j);
            /* all BQ columns: padding ones have LSE +inf, so P = 0 there */
            for (int i = 0; i < BQ; i += FA_VW)
                fa_vstore(ds + i, fa_vexp(fa_vload(s + i) * vmul - fa_vload(B.lse + i)) *
                                      (fa_vload(ds + i) - fa_vload(B.dd + i)));
            if (cap > 0) {
                const float *restrict g = B.g + (ptrdiff_t)j * BQ;
                FA_TM_SIMD
                for (int i = 0; i < nq4; i++) ds[i] *= g[i];
            }
        }
        /* dQ[i] += sum_j dS[j][i] K[j]: A is dS read down its columns */
        fa_tm_gemm(nq4, dp, nk, B.dpt, 1, BQ, kp, kld, B.dq, dp);
    }

    for (int i = 0; i < nq; i++)
        fa_tm_store_row(fa_tm_row(&p->dq, es, bq, q0 + i0 + i, h), dt, B.dq + (ptrdiff_t)i * dp, d,
                        p->scale);
}

static int64_t max_len(const int32_t *cu, int64_t batch, int64_t fixed) {
    if (!cu) return fixed;
    int64_t mx = 0;
    for (int64_t b = 0; b < batch; b++)
        if (cu[b + 1] - cu[b] > mx) mx = cu[b + 1] - cu[b];
    return mx;
}

void FA_ISA_FN(fa_cpu_bwd_tiled)(const fa_problem *p, void *ws, int threads) {
    if (threads < 1) threads = 1;
    float *D = fa_tm_align(ws);
    const size_t dfloats = ((size_t)(p->heads_q * d_rows(p)) + 15) & ~(size_t)15;
    float *base = D + dfloats;
    const size_t per_thread = per_thread_floats(p->d);
    const int64_t ntq = (max_len(p->cu_q, p->batch, p->seqlen_q) + BQ - 1) / BQ;
    const int64_t ntk = (max_len(p->cu_k, p->batch, p->seqlen_k) + BK - 1) / BK;
    const int64_t q_items = p->batch * p->heads_q * ntq;
    const int64_t kv_items = p->batch * p->heads_kv * ntk;

#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t w = 0; w < q_items; w++) {
        const int64_t bh = w / ntq;
        rowdot_item(p, bh / p->heads_q, bh % p->heads_q, (w % ntq) * BQ, D);
    }

    /* first key tiles first: under a causal mask they are seen by the most rows */
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t w = 0; w < kv_items; w++) {
        const int64_t bh = w / ntk;
        kv_item(p, bh / p->heads_kv, bh % p->heads_kv, (w % ntk) * BK,
                base + per_thread * (size_t)fa_tm_tid(), D);
    }

#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t w = 0; w < q_items; w++) {
        const int64_t t = ntq - 1 - w % ntq, bh = w / ntq;
        q_item(p, bh / p->heads_q, bh % p->heads_q, t * BQ, base + per_thread * (size_t)fa_tm_tid(),
               D);
    }
}
