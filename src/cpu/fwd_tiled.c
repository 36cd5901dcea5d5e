/*
 * cpu/fwd_tiled.c — FlashAttention forward on the CPU.
 *
 * A work item is one query tile of one (batch, head). It streams the key tiles its rows can
 * see through an online softmax (running max and sum, accumulator rescaled when the max
 * grows, one division at the end), so a thread needs O(tile) memory whatever the sequence
 * length.
 *
 * Scores are kept key-major, st[j][i] (a row per key, a column per query): Q is transposed
 * once per work item and K never, and the per-query reductions of the softmax (max, sum) run
 * down the columns, i.e. across contiguous vectors.
 *
 * The scale is applied as fa_tm_needs_transform (tile_math.h) describes; the running max m is
 * in scaled units either way.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "tile_math.h"

#define BQ FA_TM_BQ
#define BK FA_TM_BK

typedef struct fwd_bufs {
    float *qt;    /* d x BQ: the Q tile transposed */
    float *kf;    /* BK x dp: K tile (rows past the tile's keys zero) */
    float *vf;    /* BK x dp: V tile */
    float *st;    /* BK x BQ: scores, then unnormalised probabilities */
    float *o;     /* BQ x dp: output accumulator, scaled by exp(-m) */
    float *m;     /* BQ: running max of each query row */
    float *l;     /* BQ: running sum of exp(s - m) */
    float *alpha; /* BQ: rescale factor of the accumulator for this key tile */
    float *cm;    /* BQ: max of each query's scores in this key tile, from the matmul */
} fwd_bufs;

/* Places the buffers at base (or only counts, base NULL); returns floats per thread. */
static size_t fwd_layout(int64_t d, float *base, fwd_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->qt = fa_tm_take(base, &off, (size_t)d * BQ);
    b->kf = fa_tm_take(base, &off, BK * dp);
    b->vf = fa_tm_take(base, &off, BK * dp);
    b->st = fa_tm_take(base, &off, (size_t)BK * BQ);
    b->o = fa_tm_take(base, &off, BQ * dp);
    b->m = fa_tm_take(base, &off, BQ);
    b->l = fa_tm_take(base, &off, BQ);
    b->alpha = fa_tm_take(base, &off, BQ);
    b->cm = fa_tm_take(base, &off, BQ);
    return off;
}

fa_cpu_tiles FA_ISA_FN(fa_cpu_fwd_tiled_tiles)(const fa_problem *p) {
    (void)p;
    fa_cpu_tiles t = {BQ, BK};
    return t;
}

size_t FA_ISA_FN(fa_cpu_fwd_tiled_ws)(const fa_problem *p, int threads) {
    fwd_bufs b;
    if (threads < 1) threads = 1;
    return FA_TM_WS_SLACK + (size_t)threads * fwd_layout(p->d, NULL, &b) * sizeof(float);
}

/*
 * One online-softmax step over a key tile whose scores, times mul, are in st (nk keys, a
 * column per query): leaves the probabilities relative to the new max in st and rescales l
 * and the accumulator rows. It runs on whole vectors of columns, padding columns included (their
 * scores are finite: Q's padding is zero), so the probabilities of padding columns are
 * finite values that only reach accumulator rows never stored.
 */
FA_TM_INLINE void softmax_step(const fwd_bufs *B, int nk, int nq4, int dp,
                               const fa_tm_ahead *ahead, int have_max, float mul) {
    /* mul > 0, and rounding is monotonic: the max of the scaled scores is the scaled max */
    const fa_vf vmul = fa_vset1(mul);
    for (int i = 0; i < BQ; i += FA_VW) {
        const fa_vf mo = fa_vload(B->m + i);
        fa_vf mx = fa_vset1(-INFINITY);
        if (have_max)
            mx = fa_vload(B->cm + i);
        else
            for (int j = 0; j < nk; j++)
                mx = fa_vmax(mx, fa_vload(B->st + (ptrdiff_t)j * BQ + i));
        mx = fa_vmax(mo, mx * vmul);
        /* A row that has seen only masked keys keeps max -inf; taking exponentials against 0
           then gives exp(-inf) = 0 instead of exp(-inf - -inf) = NaN. */
        const fa_vf ref = fa_vsel(mx == -INFINITY, fa_vset1(0.0f), mx);
        const fa_vf alpha = fa_vexp(mo - ref);
        fa_vf sum = {0};
        for (int j = 0; j < nk; j++) {
            float *s = B->st + (ptrdiff_t)j * BQ + i;
            const fa_vf e = fa_vexp(fa_vload(s) * vmul - ref);
            fa_vstore(s, e);
            sum += e;
            if (i == 0) fa_tm_ahead_row(ahead, j); /* spread: see fa_tm_ahead */
        }
        fa_vstore(B->l + i, fa_vload(B->l + i) * alpha + sum);
        fa_vstore(B->m + i, mx);
        fa_vstore(B->alpha + i, alpha);
    }
    for (int i = 0; i < nq4; i++) {
        const float a = B->alpha[i];
        if (a == 1.0f) continue;
        float *restrict o = B->o + (ptrdiff_t)i * dp;
        const fa_vf va = fa_vset1(a);
        for (int x = 0; x < dp; x += FA_VW) fa_vstore(o + x, fa_vload(o + x) * va);
    }
}

FA_TM_HOT
static void fwd_item(const fa_problem *p, int64_t b, int64_t h, int64_t i0, float *ws) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    if (i0 >= sq) return;
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int nq = sq - i0 < BQ ? (int)(sq - i0) : BQ, nq4 = fa_tm_pad4(nq);
    const int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b, hk = h / p->group;
    const float slope = fa_alibi_slope(p, b, h);
    fwd_bufs B;
    fwd_layout(d, ws, &B);

    fa_tm_qrows rows;
    fa_tm_qrows_init(&rows, p, i0, nq, sq, sk);

    /* all the tile's Q rows requested at once, so that their misses overlap instead of
       stalling the transposing loop one row at a time */
    fa_tm_ahead qa;
    fa_tm_ahead_init(&qa, &p->q, &p->q, es, bq, q0 + i0, nq, h, d);
    for (int i = 0; i < nq; i++) fa_tm_ahead_row(&qa, i);
    for (int i = 0; i < nq; i++)
        fa_tm_load_col(B.qt + i, BQ, fa_tm_row(&p->q, es, bq, q0 + i0 + i, h), dt, d, 1.0f);
    for (int x = 0; x < d; x++)
        for (int i = nq; i < BQ; i++) B.qt[(ptrdiff_t)x * BQ + i] = 0.0f;
    memset(B.o, 0, (size_t)nq4 * dp * sizeof(float));
    for (int i = 0; i < BQ; i++) {
        B.m[i] = -INFINITY;
        B.l[i] = 0.0f;
    }

    fa_tm_rel rel;
    for (int64_t j0 = rows.ulo; j0 < rows.uhi; j0 += BK) {
        const int nk = rows.uhi - j0 < BK ? (int)(rows.uhi - j0) : BK, nk4 = fa_tm_pad4(nk);
        const int kind = fa_tm_classify(&rows, j0, j0 + nk);
        if (kind == FA_TM_NONE) continue;
        /* fp32 rows that fill whole vectors and a tile of whole 4-row blocks are read where
           they lie (the matmuls take any row stride); the rest is converted and padded */
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
        }
        /* the next key tile's rows, fetched while this one's exponentials run */
        fa_tm_ahead ahead;
        fa_tm_ahead_init(&ahead, &p->k, &p->v, es, bk, k0 + j0 + BK, rows.uhi - j0 - BK, hk, d);

        /* Where the matmul's scores are final (a whole tile of whole 4-key blocks, no mask,
           softcap or ALiBi) their maxima come out of its registers. */
        const int have_max = kind == FA_TM_FULL && nk == nk4 && slope == 0.0f && !(p->softcap > 0);
        if (have_max) {
            for (int i = 0; i < BQ; i++) B.cm[i] = -INFINITY;
            fa_tm_gemm_set_max(nk4, BQ, d, kp, kld, 1, B.qt, BQ, B.st, BQ, B.cm);
        } else {
            fa_tm_gemm_set(nk4, BQ, d, kp, kld, 1, B.qt, BQ, B.st, BQ);
        }
        const int transform = fa_tm_needs_transform(kind, p->softcap, slope);
        if (transform) {
            fa_tm_rel_init(&rel, &rows, j0);
            /* padding columns (i >= nq) stay unscaled: their scores are 0 */
            fa_tm_scores_kmajor(B.st, NULL, nk, nq, &rel, p->scale, p->softcap, slope,
                                kind == FA_TM_PARTIAL);
        }
        softmax_step(&B, nk, nq4, dp, &ahead, have_max, transform ? 1.0f : p->scale);
        /* O[i][x] += sum_j P[j][i] V[j][x]: A is st read down its columns */
        fa_tm_gemm(nq4, dp, nk, B.st, 1, BQ, vp, vld, B.o, dp);
    }

    float *lse = (float *)p->lse;
    for (int i = 0; i < nq; i++) {
        const int64_t t = q0 + i0 + i;
        void *orow = fa_tm_row(&p->o, es, bq, t, h);
        float li = B.l[i], row_lse;
        if (rows.lo[i] >= rows.hi[i]) {
            fa_tm_store_zero(orow, dt, d);
            row_lse = -INFINITY;
        } else {
            float *restrict o = B.o + (ptrdiff_t)i * dp;
            FA_TM_SIMD
            for (int x = 0; x < d; x++) o[x] /= li;
            fa_tm_store_row(orow, dt, o, d, 1.0f);
            row_lse = B.m[i] + logf(li);
        }
        if (lse) lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_st] = row_lse;
    }
}

/* Longest query sequence: the tile count of the work grid. */
static int64_t max_seqlen_q(const fa_problem *p) {
    if (!p->cu_q) return p->seqlen_q;
    int64_t mx = 0;
    for (int64_t b = 0; b < p->batch; b++)
        if (p->cu_q[b + 1] - p->cu_q[b] > mx) mx = p->cu_q[b + 1] - p->cu_q[b];
    return mx;
}

void FA_ISA_FN(fa_cpu_fwd_tiled)(const fa_problem *p, void *ws, int threads) {
    if (threads < 1) threads = 1;
    fwd_bufs unused;
    const size_t per_thread = fwd_layout(p->d, NULL, &unused);
    float *base = fa_tm_align(ws);
    const int64_t ntq = (max_seqlen_q(p) + BQ - 1) / BQ;
    const int64_t items = p->batch * p->heads_q * ntq;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t w = 0; w < items; w++) {
        /* last tiles first: under a causal mask they are the longest */
        const int64_t t = ntq - 1 - w % ntq, bh = w / ntq;
        fwd_item(p, bh / p->heads_q, bh % p->heads_q, t * BQ,
                 base + per_thread * (size_t)fa_tm_tid());
    }
}
