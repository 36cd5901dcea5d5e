/*
 * cpu/bwd_tiled.c — FlashAttention backward on the CPU, by recomputation from LSE.
 *
 * No probability matrix is stored and no atomics are used: every sum has a fixed order, so
 * results are bit-identical run to run (the schedule below depends on the thread count, so
 * across thread counts they may differ in the last bits).
 *   pass 0  D_i = rowsum(dO * O) for every query row (one float per row and query head, in
 *           the workspace);
 *   pass 1  a work item per (batch, kv head, run of key tiles) rebuilds P and dS for every
 *           query tile of every query head of its group that sees the key tiles, and owns
 *           their dK and dV (so the group's sum needs no reduction across threads);
 *   pass 2  a work item per (batch, query head, run of query tiles) rebuilds them again for
 *           its rows and owns their dQ.
 * With enough kv heads for the threads, the one-pass schedule (bwd_schedule.c) replaces the
 * two: a pass-1 item per whole kv head also sums dQ += dS K into a per-thread buffer, and pass
 * 2 is not needed. Pass 1 keeps scores query-major (K and V transposed once per item), pass 2
 * key-major (Q and dO transposed once per item), so nothing is transposed per tile pair.
 *
 * Scores are rebuilt exactly as the forward built them (the scale placed as
 * fa_tm_needs_transform in tile_math.h describes), so P = exp(s - LSE) matches the forward's
 * rounding. With softcap the chain rule multiplies dS by 1 - tanh^2 (g), so
 * dK = scale sum_i dS g Q and dQ = scale sum_j dS g K, the scale applied when they are stored.
 *
 * Dropout (factors Z of dropout.h's mask, drop_tile.h, regenerated here: O = (P o Z) V): the
 * gradient of P is Z o dO V^T, so dS = P o (Z o dP - D) with D = rowsum(dO o O) as without
 * (sum_j P Z dP = dO . O), and dV = (P o Z)^T dO.
 */
#include <math.h>
#include <string.h>

#include "drop_tile.h"
#include "kernels.h"
#include "team.h"
#include "tile_math.h"

#define BQ FA_TM_BQ
#define BK FA_TM_BK

/* Pass 1: up to BWD_KSUB key tiles against query tiles; each query tile is loaded once for
   all of them (see pass 2). */
#define BWD_KSUB 4
typedef struct kv_sub {
    float *kt, *vt; /* d x BK: K and V tiles transposed (columns past the keys zero) */
    float *kf;      /* BK x dp: K tile packed by rows (one-pass schedule: dQ += dS K) */
    float *dk, *dv; /* BK x dp: gradient accumulators of the key tile */
} kv_sub;

typedef struct kv_bufs {
    float *qf, *dof;    /* BQ x dp: Q and dO tiles, packed */
    float *s, *dps, *g; /* BQ x BK: scores -> P; dP -> dS; softcap derivative */
    float *lse, *dd;    /* BQ: LSE (+inf for rows with none) and D of the query rows */
    kv_sub sub[BWD_KSUB];
} kv_bufs;

/* Pass 2: up to BWD_QSUB query tiles against key tiles; each key tile is loaded once for all
   of them (the reason is fwd_tiled.c's: a head's rows lie heads * d apart in BSHD memory). */
#define BWD_QSUB 4
typedef struct q_sub {
    float *qt, *dot; /* d x BQ: Q and dO tiles, transposed */
    float *dq;       /* BQ x dp: gradient accumulator of the query tile */
    float *lse, *dd;  /* BQ: LSE (+inf for rows with none) and D */
} q_sub;

typedef struct q_bufs {
    float *kf, *vf;      /* BK x dp: K and V tiles, packed */
    float *st, *dpt, *g; /* BK x BQ: scores -> P; dP -> dS; softcap derivative */
    q_sub sub[BWD_QSUB];
} q_bufs;

static size_t kv_layout(int64_t d, float *base, kv_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->qf = fa_tm_take(base, &off, BQ * dp);
    b->dof = fa_tm_take(base, &off, BQ * dp);
    b->s = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->dps = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->g = fa_tm_take(base, &off, (size_t)BQ * BK);
    b->lse = fa_tm_take(base, &off, BQ);
    b->dd = fa_tm_take(base, &off, BQ);
    for (int s = 0; s < BWD_KSUB; s++) {
        kv_sub *u = &b->sub[s];
        u->kt = fa_tm_take(base, &off, (size_t)d * BK);
        u->vt = fa_tm_take(base, &off, (size_t)d * BK);
        u->kf = fa_tm_take(base, &off, BK * dp);
        u->dk = fa_tm_take(base, &off, BK * dp);
        u->dv = fa_tm_take(base, &off, BK * dp);
    }
    return off;
}

static size_t q_layout(int64_t d, float *base, q_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->kf = fa_tm_take(base, &off, BK * dp);
    b->vf = fa_tm_take(base, &off, BK * dp);
    b->st = fa_tm_take(base, &off, (size_t)BK * BQ);
    b->dpt = fa_tm_take(base, &off, (size_t)BK * BQ);
    b->g = fa_tm_take(base, &off, (size_t)BK * BQ);
    for (int s = 0; s < BWD_QSUB; s++) {
        q_sub *u = &b->sub[s];
        u->qt = fa_tm_take(base, &off, (size_t)d * BQ);
        u->dot = fa_tm_take(base, &off, (size_t)d * BQ);
        u->dq = fa_tm_take(base, &off, BQ * dp);
        u->lse = fa_tm_take(base, &off, BQ);
        u->dd = fa_tm_take(base, &off, BQ);
    }
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

/* Floats per thread: the one-pass schedule (bwd_schedule.c) adds its dQ buffer. */
static size_t thread_floats(const fa_problem *p, int threads) {
    kv_bufs a;
    return fa_cpu_bwd_one_pass(p, threads, NULL, 0)
               ? kv_layout(p->d, NULL, &a) + fa_cpu_bwd_dq_floats(p)
               : per_thread_floats(p->d);
}

fa_cpu_tiles FA_ISA_FN(fa_cpu_bwd_tiled_tiles)(const fa_problem *p) {
    (void)p;
    fa_cpu_tiles t = {BQ, BK};
    return t;
}

size_t FA_ISA_FN(fa_cpu_bwd_tiled_ws)(const fa_problem *p, int threads) {
    if (threads < 1) threads = 1;
    size_t dfloats = ((size_t)(p->heads_q * d_rows(p)) + 15) & ~(size_t)15;
    return FA_TM_WS_SLACK + (dfloats + (size_t)threads * thread_floats(p, threads)) * sizeof(float);
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

/* Loads key tile [t0, t0 + nk) of kv head hk (K and V transposed; K by rows too when rows)
   into U, zeroes its gradient accumulators. */
FA_TM_INLINE void kv_sub_init(const kv_sub *U, const fa_problem *p, int64_t bk, int64_t t0,
                              int nk, int64_t hk, int dp, int rows) {
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d;
    fa_tm_ahead ka; /* all rows requested at once: their misses overlap */
    fa_tm_ahead_init(&ka, &p->k, &p->v, es, bk, t0, nk, hk, d);
    for (int j = 0; j < nk; j++) fa_tm_ahead_row(&ka, j);
    fa_tm_load_tile_t(U->kt, &p->k, dt, bk, t0, nk, hk, d);
    fa_tm_load_tile_t(U->vt, &p->v, dt, bk, t0, nk, hk, d);
    memset(U->dk, 0, (size_t)fa_tm_pad4(nk) * dp * sizeof(float));
    memset(U->dv, 0, (size_t)fa_tm_pad4(nk) * dp * sizeof(float));
    if (rows)
        for (int j = 0; j < nk; j++)
            fa_tm_load_row(U->kf + (ptrdiff_t)j * dp, fa_tm_row(&p->k, es, bk, t0 + j, hk), dt, d,
                           dp, 1.0f);
}

/* Key tiles g0 .. g0 + gsize - 1 (those that exist; gsize <= BWD_KSUB) of (b, kv head hk):
   their dK and dV, and, when dq is not NULL, dQ += dS K into dq (the one-pass schedule: rows
   of query head hk * group + r at dq + (r * dq_rows + i) * dp, unscaled). */
FA_TM_HOT
static void kv_item(const fa_problem *p, int64_t b, int64_t hk, int64_t g0, int gsize,
                    float *ws, const float *D, float *dq, int64_t dq_rows) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b;
    const float cap = p->softcap, pre = fa_tm_ds_pre(p->scale);
    float z[BK]; /* a row's dropout factors */
    kv_bufs B;
    kv_layout(d, ws, &B);

    int nk[BWD_KSUB], nsub = 0;
    for (int s = 0; s < gsize; s++) {
        const int64_t j0 = (g0 + s) * BK;
        if (j0 >= sk) break;
        nk[s] = sk - j0 < BK ? (int)(sk - j0) : BK;
        kv_sub_init(&B.sub[s], p, bk, k0 + j0, nk[s], hk, dp, dq != NULL);
        nsub++;
    }
    if (nsub == 0) return;
    /* The rows that can see [ja, jb) are one run: from the first whose range ends after ja
       to the first whose range starts at or after jb. */
    const int64_t ja = g0 * BK, jb = (g0 + nsub - 1) * BK + nk[nsub - 1];
    const int64_t ia = fa_tm_first_row(p, sq, sk, 0, sq, ja, 0);
    const int64_t ib = fa_tm_first_row(p, sq, sk, ia, sq, jb, 1);

    fa_tm_qrows rows;
    fa_tm_rel rel;
    for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
        const float slope = fa_alibi_slope(p, b, h);
        const float *dh = D + d_off(p, b, h, q0);
        fa_dt drop;
        const int dropout = fa_dt_init(&drop, p, b, h);
        for (int64_t i0 = ia; i0 < ib; i0 += BQ) {
            const int nq = ib - i0 < BQ ? (int)(ib - i0) : BQ, nq4 = fa_tm_pad4(nq);
            fa_tm_qrows_init(&rows, p, i0, nq, sq, sk);
            int kind[BWD_KSUB], any = 0;
            for (int s = 0; s < nsub; s++) {
                const int64_t j0 = (g0 + s) * BK;
                kind[s] = fa_tm_classify(&rows, j0, j0 + nk[s]);
                any |= kind[s] != FA_TM_NONE;
            }
            if (!any) continue;
            for (int i = 0; i < nq; i++) {
                const int64_t t = q0 + i0 + i;
                B.lse[i] = lse_ref(p, b, h, t);
                B.dd[i] = dh[i0 + i];
            }
            /* packed even where fp32 rows could be read in place, as in the forward */
            fa_tm_pack_rows2(B.qf, B.dof, &p->q, &p->dout, dt, bq, q0 + i0, nq, h, d, dp);
            fa_tm_ahead ahead; /* next query tile, fetched during the first key tile's work */
            fa_tm_ahead_init(&ahead, &p->q, &p->dout, es, bq, q0 + i0 + BQ, ib - i0 - BQ, h, d);
            const fa_tm_ahead *next = &ahead;
            int q_finite = -1; /* whether the Q and dO tiles are all finite: on demand */

            for (int s = 0; s < nsub; s++) {
                if (kind[s] == FA_TM_NONE) continue;
                const kv_sub *U = &B.sub[s];
                const int n = nk[s], n4 = fa_tm_pad4(n);
                fa_tm_gemm_set(nq4, BK, d, B.qf, dp, 1, U->kt, BK, B.s, BK);
                fa_tm_gemm_set(nq4, BK, d, B.dof, dp, 1, U->vt, BK, B.dps, BK);
                const int transform = fa_tm_needs_transform(kind[s], cap, slope);
                const int partial = kind[s] == FA_TM_PARTIAL;
                if (transform) {
                    fa_tm_rel_init(&rel, &rows, (g0 + s) * BK);
                    fa_tm_scores_qmajor(B.s, cap > 0 ? B.g : NULL, nq, n, &rel, p->scale, cap,
                                        slope, kind[s] == FA_TM_PARTIAL);
                }
                const float mul = transform ? 1.0f : p->scale;
                for (int i = 0; i < nq; i++) {
                    float *restrict sr = B.s + (ptrdiff_t)i * BK;
                    float *restrict ds = B.dps + (ptrdiff_t)i * BK;
                    const float *restrict g = B.g + (ptrdiff_t)i * BK;
                    const float di = B.dd[i];
                    if (next) fa_tm_ahead_row(next, i);
                    fa_vexp_p_row(sr, sr, n, mul, B.lse[i]); /* P, as the forward's */
                    if (dropout) { /* dP = Z o dO V^T */
                        fa_drop_row(&drop.d, drop.bh, (uint32_t)(i0 + i), (g0 + s) * BK, n,
                                    drop.scale, z);
                        for (int j = 0; j < n; j++) ds[j] *= z[j];
                    }
                    { /* dS = P (dP - D) pre (fa_tm_ds_pre) */
                        const fa_vf vdi = fa_vset1(di), vpre = fa_vset1(pre);
                        int j = 0;
                        for (; j + FA_VW <= n; j += FA_VW)
                            fa_vstore(ds + j,
                                      fa_vload(sr + j) * (fa_vload(ds + j) - vdi) * vpre);
                        for (; j < n; j++) ds[j] = sr[j] * (ds[j] - di) * pre;
                    }
                    if (cap > 0) {
                        FA_TM_SIMD
                        for (int j = 0; j < n; j++) ds[j] *= g[j];
                    }
                    if (dropout) /* dV's operand: P o Z (dS above took P itself) */
                        for (int j = 0; j < n; j++) sr[j] *= z[j];
                    if (partial) { /* masked: P and dS are 0 by selection (LSE, dP may be NaN) */
                        const int lo = rel.lo[i], hi = rel.hi[i];
                        for (int j = 0; j < n; j++)
                            if (j < lo || j >= hi) sr[j] = ds[j] = 0.0f;
                    }
                    for (int j = n; j < n4; j++) sr[j] = ds[j] = 0.0f;
                }
                next = NULL;
                /* dV[j] += sum_i P[i][j] dO[i],  dK[j] += sum_i dS[i][j] Q[i] (times scale at
                   the end); on a mask edge with an Inf or NaN in the other operand, the masked
                   terms are skipped (0 * Inf is NaN) */
                if (partial && q_finite < 0)
                    q_finite = fa_tm_rows_finite(B.qf, nq, dp, dp) &&
                               fa_tm_rows_finite(B.dof, nq, dp, dp);
                if (partial && !q_finite) {
                    fa_tm_gemm_vis(n4, dp, nq, rel.lo, rel.hi, 1, B.s, 1, BK, B.dof, dp, U->dv,
                                   dp);
                    fa_tm_gemm_vis(n4, dp, nq, rel.lo, rel.hi, 1, B.dps, 1, BK, B.qf, dp, U->dk,
                                   dp);
                } else {
                    fa_tm_gemm(n4, dp, nq, B.s, 1, BK, B.dof, dp, U->dv, dp);
                    fa_tm_gemm(n4, dp, nq, B.dps, 1, BK, B.qf, dp, U->dk, dp);
                }
                /* dQ[i] += sum_j dS[i][j] K[j] (rows past the tile: dS is 0 there) */
                float *dqt = dq ? dq + ((h - hk * p->group) * dq_rows + i0) * dp : NULL;
                if (dq && partial && !fa_tm_rows_finite(U->kf, n, dp, dp))
                    fa_tm_gemm_vis(nq4, dp, n, rel.lo, rel.hi, 0, B.dps, BK, 1, U->kf, dp, dqt,
                                   dp);
                else if (dq)
                    fa_tm_gemm(nq4, dp, n, B.dps, BK, 1, U->kf, dp, dqt, dp);
            }
        }
    }

    for (int s = 0; s < nsub; s++) {
        const kv_sub *U = &B.sub[s];
        for (int j = 0; j < nk[s]; j++) {
            const int64_t t = k0 + (g0 + s) * BK + j;
            fa_tm_store_row(fa_tm_row(&p->dk, es, bk, t, hk), dt, U->dk + (ptrdiff_t)j * dp, d,
                            fa_tm_ds_post(p->scale));
            fa_tm_store_row(fa_tm_row(&p->dv, es, bk, t, hk), dt, U->dv + (ptrdiff_t)j * dp, d,
                            1.0f);
        }
    }
}

/* ---- pass 2: dQ ---- */

/* Loads query tile [t0, t0 + nq) of head h (Q and dO transposed, LSE, D) into U. */
FA_TM_INLINE void q_sub_init(const q_sub *U, const fa_problem *p, int64_t b, int64_t bq,
                             int64_t t0, int nq, int64_t h, const float *dh, int dp) {
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d;
    fa_tm_ahead qa; /* all rows requested at once: their misses overlap (as in the forward) */
    fa_tm_ahead_init(&qa, &p->q, &p->dout, es, bq, t0, nq, h, d);
    for (int i = 0; i < nq; i++) fa_tm_ahead_row(&qa, i);
    fa_tm_load_tile_t(U->qt, &p->q, dt, bq, t0, nq, h, d);
    fa_tm_load_tile_t(U->dot, &p->dout, dt, bq, t0, nq, h, d);
    for (int i = 0; i < nq; i++) {
        U->lse[i] = lse_ref(p, b, h, t0 + i);
        U->dd[i] = dh[i];
    }
    for (int i = nq; i < BQ; i++) { /* padding columns: P = 0 */
        U->lse[i] = INFINITY;
        U->dd[i] = 0.0f;
    }
    memset(U->dq, 0, (size_t)fa_tm_pad4(nq) * dp * sizeof(float));
}

/* Query tiles g0 .. g0 + gsize - 1 (those that exist; gsize <= BWD_QSUB) of (b, h). */
FA_TM_HOT
static void q_item(const fa_problem *p, int64_t b, int64_t h, int64_t g0, int gsize, float *ws,
                   const float *D) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b, hk = h / p->group;
    const float slope = fa_alibi_slope(p, b, h), cap = p->softcap;
    const fa_vf vpre = fa_vset1(fa_tm_ds_pre(p->scale)); /* dS's part of the scale */
    const float *dh = D + d_off(p, b, h, q0);
    fa_dt drop;
    const int dropout = fa_dt_init(&drop, p, b, h);
    q_bufs B;
    q_layout(d, ws, &B);

    fa_tm_qrows rows[BWD_QSUB];
    int nq[BWD_QSUB];
    int64_t ulo, uhi;
    const int nsub = fa_tm_qrun_init(rows, nq, p, g0, gsize, sq, sk, &ulo, &uhi);
    for (int s = 0; s < nsub; s++) {
        const int64_t i0 = (g0 + s) * BQ;
        q_sub_init(&B.sub[s], p, b, bq, q0 + i0, nq[s], h, dh + i0, dp);
    }

    fa_tm_rel rel;
    for (int64_t j0 = ulo; j0 < uhi; j0 += BK) {
        const int nk = uhi - j0 < BK ? (int)(uhi - j0) : BK, nk4 = fa_tm_pad4(nk);
        int kind[BWD_QSUB];
        if (!fa_tm_classify_run(rows, nsub, j0, j0 + nk, kind)) continue;
        /* packed even where fp32 rows could be read in place, as in the forward */
        fa_tm_pack_rows2(B.kf, B.vf, &p->k, &p->v, dt, bk, k0 + j0, nk, hk, d, dp);
        fa_tm_ahead ahead; /* next key tile, fetched during the first query tile's exponentials */
        fa_tm_ahead_init(&ahead, &p->k, &p->v, es, bk, k0 + j0 + BK, uhi - j0 - BK, hk, d);
        int k_finite = -1; /* whether the K tile is all finite: found on a mask edge's demand */
        const fa_tm_ahead *next = &ahead;

        for (int s = 0; s < nsub; s++) {
            if (kind[s] == FA_TM_NONE) continue;
            const q_sub *U = &B.sub[s];
            const int nq4 = fa_tm_pad4(nq[s]);
            fa_tm_gemm_set(nk4, BQ, d, B.kf, dp, 1, U->qt, BQ, B.st, BQ);
            fa_tm_gemm_set(nk4, BQ, d, B.vf, dp, 1, U->dot, BQ, B.dpt, BQ);
            const int transform = fa_tm_needs_transform(kind[s], cap, slope);
            if (transform) {
                fa_tm_rel_init(&rel, &rows[s], j0);
                fa_tm_scores_kmajor(B.st, cap > 0 ? B.g : NULL, nk, nq4, &rel, p->scale, cap,
                                    slope, kind[s] == FA_TM_PARTIAL);
            }
            /* P = exp(mul s - LSE), as the forward's exponentials; the argument clamped at 0
               (fa_vclamp0: this s may exceed the forward's by a rounding, and LSE is rounded) */
            const fa_vf vmul = fa_vset1(transform ? 1.0f : p->scale);
            const int partial = kind[s] == FA_TM_PARTIAL;
            if (dropout) fa_dt_kmajor(&drop, B.dpt, BQ, nk, nq[s], (g0 + s) * BQ, j0); /* Z o dP */
            for (int j = 0; j < nk; j++) {
                const float *restrict st = B.st + (ptrdiff_t)j * BQ;
                float *restrict ds = B.dpt + (ptrdiff_t)j * BQ;
                if (next) fa_tm_ahead_row(next, j);
                /* all BQ columns: padding ones have LSE +inf, so P = 0 there */
                for (int i = 0; i < BQ; i += FA_VW) {
                    const fa_vf e = fa_vexp_softmax_ftz(
                        fa_vclamp0(fa_vload(st + i) * vmul - fa_vload(U->lse + i)));
                    fa_vf v = e * (fa_vload(ds + i) - fa_vload(U->dd + i)) * vpre;
                    if (partial) { /* masked: dS is 0 by selection (dP may be NaN there) */
                        const fa_vi vj = (fa_vi){0} + j;
                        const fa_vi lo = fa_viload(rel.lo + i);
                        const fa_vi hi = fa_viload(rel.hi + i);
                        v = fa_vsel((vj < lo) | (vj >= hi), fa_vset1(0.0f), v);
                    }
                    fa_vstore(ds + i, v);
                }
                if (cap > 0) {
                    const float *restrict g = B.g + (ptrdiff_t)j * BQ;
                    FA_TM_SIMD
                    for (int i = 0; i < nq4; i++) ds[i] *= g[i];
                }
            }
            next = NULL;
            /* dQ[i] += sum_j dS[j][i] K[j]: A is dS read down its columns; masked keys skipped
               where K holds an Inf or NaN (0 * Inf is NaN) */
            if (partial && k_finite < 0) k_finite = fa_tm_rows_finite(B.kf, nk, dp, dp);
            if (partial && !k_finite)
                fa_tm_gemm_vis(nq4, dp, nk, rel.lo, rel.hi, 0, B.dpt, 1, BQ, B.kf, dp, U->dq, dp);
            else
                fa_tm_gemm(nq4, dp, nk, B.dpt, 1, BQ, B.kf, dp, U->dq, dp);
        }
    }

    for (int s = 0; s < nsub; s++)
        for (int i = 0; i < nq[s]; i++)
            fa_tm_store_row(fa_tm_row(&p->dq, es, bq, q0 + (g0 + s) * BQ + i, h), dt,
                            B.sub[s].dq + (ptrdiff_t)i * dp, d, fa_tm_ds_post(p->scale));
}

/* One backward call's layout, shared by its four loops' items. */
typedef struct bwd_run {
    const fa_problem *p;
    float *D, *base;
    size_t per_thread, kvf;
    int64_t ntq, ntk, nqg, nkg, rows;
    int qgs, kgs;
} bwd_run;

static void rowdot_run(void *arg, int64_t w) {
    const bwd_run *r = arg;
    const fa_problem *p = r->p;
    const int64_t bh = w / r->ntq;
    rowdot_item(p, bh / p->heads_q, bh % p->heads_q, (w % r->ntq) * BQ, r->D);
}

/* One-pass: every key tile of (b, kv head) in turn, dQ summed in the thread's buffer. */
static void one_pass_run(void *arg, int64_t w) {
    const bwd_run *r = arg;
    const fa_problem *p = r->p;
    const int64_t b = w / p->heads_kv, hk = w % p->heads_kv, dp = fa_tm_pad16((int)p->d);
    float *t = r->base + r->per_thread * (size_t)fa_tm_tid(), *dq = t + r->kvf;
    memset(dq, 0, fa_cpu_bwd_dq_floats(p) * sizeof(float));
    for (int64_t g0 = 0; g0 < r->ntk; g0 += BWD_KSUB)
        kv_item(p, b, hk, g0, BWD_KSUB, t, r->D, dq, r->rows);
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t bq = p->cu_q ? 0 : b;
    for (int64_t g = 0; g < p->group; g++)
        for (int64_t i = 0; i < sq; i++)
            fa_tm_store_row(fa_tm_row(&p->dq, es, bq, q0 + i, hk * p->group + g), p->dtype,
                            dq + (g * r->rows + i) * dp, (int)p->d, fa_tm_ds_post(p->scale));
}

/* first key tiles first: under a causal mask they are seen by the most rows */
static void kv_run(void *arg, int64_t w) {
    const bwd_run *r = arg;
    const fa_problem *p = r->p;
    const int64_t bh = w / r->nkg;
    kv_item(p, bh / p->heads_kv, bh % p->heads_kv, (w % r->nkg) * r->kgs, r->kgs,
            r->base + r->per_thread * (size_t)fa_tm_tid(), r->D, NULL, 0);
}

static void q_run(void *arg, int64_t w) {
    const bwd_run *r = arg;
    const fa_problem *p = r->p;
    const int64_t g = r->nqg - 1 - w % r->nqg, bh = w / r->nqg;
    q_item(p, bh / p->heads_q, bh % p->heads_q, g * r->qgs, r->qgs,
           r->base + r->per_thread * (size_t)fa_tm_tid(), r->D);
}

void FA_ISA_FN(fa_cpu_bwd_tiled)(const fa_problem *p, void *ws, int threads) {
    if (threads < 1) threads = 1;
    bwd_run r;
    memset(&r, 0, sizeof r);
    r.p = p;
    r.D = fa_tm_align(ws);
    const size_t dfloats = ((size_t)(p->heads_q * d_rows(p)) + 15) & ~(size_t)15;
    r.base = r.D + dfloats;
    r.per_thread = thread_floats(p, threads);
    /* varlen: seqlen_q/k are the longest sequences */
    r.ntq = (p->seqlen_q + BQ - 1) / BQ;
    r.ntk = (p->seqlen_k + BK - 1) / BK;
    r.qgs = fa_tm_group(r.ntq, p->batch * p->heads_q, threads, BWD_QSUB);
    r.nqg = (r.ntq + r.qgs - 1) / r.qgs;
    r.kgs = fa_tm_group(r.ntk, p->batch * p->heads_kv, threads, BWD_KSUB);
    r.nkg = (r.ntk + r.kgs - 1) / r.kgs;

    fa_cpu_for(threads, p->batch * p->heads_q * r.ntq, rowdot_run, &r);
    if (fa_cpu_bwd_one_pass(p, threads, NULL, 0)) {
        kv_bufs unused;
        r.kvf = kv_layout(p->d, NULL, &unused);
        r.rows = fa_cpu_bwd_dq_rows(p);
        fa_cpu_for(threads, p->batch * p->heads_kv, one_pass_run, &r);
        return;
    }
    fa_cpu_for(threads, p->batch * p->heads_kv * r.nkg, kv_run, &r);
    fa_cpu_for(threads, p->batch * p->heads_q * r.nqg, q_run, &r);
}
