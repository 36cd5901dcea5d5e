/*
 * cpu/fwd_tiled.c — FlashAttention forward on the CPU.
 *
 * A work item is a run of up to FWD_QSUB consecutive query tiles of one (batch, head). It
 * streams the key tiles its rows can see through an online softmax (running max and sum,
 * accumulator rescaled when the max grows, one division at the end), so a thread needs
 * O(tile) memory whatever the sequence length. The tiles of a group share each key tile while
 * it is in L1/L2: in BSHD memory the rows of one head lie heads * d apart, a stride that maps
 * a head's K and V onto a fraction of the L2's sets, so a key tile fetched for one query tile
 * would not survive until the next work item (cpu.md).
 *
 * Scores are kept key-major, st[j][i] (a row per key, a column per query): Q is transposed
 * once per work item and K never, and the per-query reductions of the softmax (max, sum) run
 * down the columns, i.e. across contiguous vectors.
 *
 * The scale is applied as fa_tm_needs_transform (tile_math.h) describes; the running max m is
 * in scaled units either way.
 *
 * Dropout multiplies a key tile's probabilities by their factors (drop_tile.h) after the
 * softmax step has summed them, so l, and with it LSE, is the un-dropped softmax's.
 */
#include <math.h>
#include <string.h>

#include "drop_tile.h"
#include "kernels.h"
#include "team.h"
#include "tile_math.h"

#define BQ FA_TM_BQ
#define BK FA_TM_BK
#define FWD_QSUB 8 /* query tiles per work item */

/* One query tile's state. */
typedef struct fwd_sub {
    float *qt;    /* d x BQ: the Q tile transposed */
    float *o;     /* BQ x dp: output accumulator, scaled by exp(-m) */
    float *m;     /* BQ: running max of each query row */
    float *l;     /* BQ: running sum of exp(s - m) */
    float *alpha; /* BQ: rescale factor of the accumulator for this key tile */
    float *cm;    /* BQ: max of each query's scores in this key tile, from the matmul */
} fwd_sub;

typedef struct fwd_bufs {
    float *kf;    /* BK x dp: K tile (rows past the tile's keys zero) */
    float *vf;    /* BK x dp: V tile */
    float *st;    /* BK x BQ: scores, then unnormalised probabilities */
    fwd_sub sub[FWD_QSUB];
} fwd_bufs;

/* Places the buffers at base (or only counts, base NULL); returns floats per thread. */
static size_t fwd_layout(int64_t d, float *base, fwd_bufs *b) {
    size_t off = 0, dp = (size_t)fa_tm_pad16((int)d);
    b->kf = fa_tm_take(base, &off, BK * dp);
    b->vf = fa_tm_take(base, &off, BK * dp);
    b->st = fa_tm_take(base, &off, (size_t)BK * BQ);
    for (int s = 0; s < FWD_QSUB; s++) {
        fwd_sub *u = &b->sub[s];
        u->qt = fa_tm_take(base, &off, (size_t)d * BQ);
        u->o = fa_tm_take(base, &off, BQ * dp);
        u->m = fa_tm_take(base, &off, BQ);
        u->l = fa_tm_take(base, &off, BQ);
        u->alpha = fa_tm_take(base, &off, BQ);
        u->cm = fa_tm_take(base, &off, BQ);
    }
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
FA_TM_INLINE void softmax_step(const fwd_sub *U, float *st, int nk, int nq4, int dp,
                               const fa_tm_ahead *ahead, int a0, int a1, int have_max,
                               float mul) {
    enum { NV = BQ / FA_VW }; /* vectors of query columns */
    /* mul > 0, and rounding is monotonic: the max of the scaled scores is the scaled max */
    const fa_vf vmul = fa_vset1(mul);
    fa_vf ref[NV], sum[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        const int i = v * FA_VW;
        const fa_vf mo = fa_vload(U->m + i);
        fa_vf mx = fa_vset1(-INFINITY);
        if (have_max)
            mx = fa_vload(U->cm + i);
        else
            for (int j = 0; j < nk; j++) mx = fa_vmax(mx, fa_vload(st + (ptrdiff_t)j * BQ + i));
        mx = fa_vmax(mo, mx * vmul);
        /* A row that has seen only masked keys keeps max -inf; taking exponentials against 0
           then gives exp(-inf) = 0 instead of exp(-inf - -inf) = NaN. */
        ref[v] = fa_vsel(mx == -INFINITY, fa_vset1(0.0f), mx);
        fa_vstore(U->alpha + i, fa_vexp(mo - ref[v]));
        fa_vstore(U->m + i, mx);
        sum[v] = (fa_vf){0};
    }
    /* a key row at a time, all its column vectors: NV independent exponentials and sums in
       flight (a column at a time, each sum was one chain of dependent adds) */
    for (int j = 0; j < nk; j++) {
        float *s = st + (ptrdiff_t)j * BQ;
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++) {
            /* the scaled score rounded on its own, as the max was formed from it: then the
               argument is <= 0 exactly and the max's key gets exp(0) = 1, whatever the
               magnitude (fused, it was off by half an ulp of the max: exp overflowed, or the
               row sum underflowed to 0, at scores near 1e10) */
            const fa_vf e =
                fa_vexp_softmax_ftz(fa_vrounded(fa_vload(s + v * FA_VW) * vmul) - ref[v]);
            fa_vstore(s + v * FA_VW, e);
            sum[v] += e;
        }
        if (j < a1 - a0) fa_tm_ahead_row(ahead, a0 + j); /* spread: see fa_tm_ahead */
    }
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        const int i = v * FA_VW;
        fa_vstore(U->l + i, fa_vload(U->l + i) * fa_vload(U->alpha + i) + sum[v]);
    }
    for (int i = 0; i < nq4; i++) {
        const float a = U->alpha[i];
        if (a == 1.0f) continue;
        float *restrict o = U->o + (ptrdiff_t)i * dp;
        const fa_vf va = fa_vset1(a);
        for (int x = 0; x < dp; x += FA_VW) fa_vstore(o + x, fa_vload(o + x) * va);
    }
}

/* Loads query tile [i0, i0 + nq) of head h into U and resets its softmax state. */
FA_TM_INLINE void sub_init(const fwd_sub *U, const fa_problem *p, int64_t bq, int64_t t0,
                           int nq, int64_t h, int dp) {
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d;
    /* all the tile's Q rows requested at once, so that their misses overlap instead of
       stalling the transposing loop one row at a time */
    fa_tm_ahead qa;
    fa_tm_ahead_init(&qa, &p->q, &p->q, es, bq, t0, nq, h, d);
    for (int i = 0; i < nq; i++) fa_tm_ahead_row(&qa, i);
    fa_tm_load_tile_t(U->qt, &p->q, dt, bq, t0, nq, h, d);
    memset(U->o, 0, (size_t)fa_tm_pad4(nq) * dp * sizeof(float));
    for (int i = 0; i < BQ; i++) {
        U->m[i] = -INFINITY;
        U->l[i] = 0.0f;
    }
}

/* O = acc / l and LSE = m + log l of query tile [i0, i0 + nq) (zero and -inf for rows that
   saw no key). */
FA_TM_INLINE void sub_store(const fwd_sub *U, const fa_tm_qrows *rows, const fa_problem *p,
                            int64_t b, int64_t bq, int64_t t0, int nq, int64_t h, int dp,
                            float vd) {
    const fa_dtype dt = p->odtype; /* FP8 inputs write a wider output */
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d;
    float *lse = (float *)p->lse;
    for (int i = 0; i < nq; i++) {
        const int64_t t = t0 + i;
        void *orow = fa_tm_row(&p->o, es, bq, t, h);
        float li = U->l[i], row_lse;
        if (rows->lo[i] >= rows->hi[i]) {
            fa_tm_store_zero(orow, dt, d);
            row_lse = -INFINITY;
        } else {
            float *restrict o = U->o + (ptrdiff_t)i * dp;
            FA_TM_SIMD
            for (int x = 0; x < d; x++) o[x] /= li;
            /* V's descale (FP8; else 1) scales the finished row: O is linear in V */
            fa_tm_store_row(orow, dt, o, d, vd);
            row_lse = (float)((double)U->m[i] + log((double)li)); /* one rounding */
        }
        if (lse) lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_st] = row_lse;
    }
}

/*
 * A tile with a mask edge (a causal diagonal, a window's side) in 16 x 16 blocks: the keys
 * [lo[c], hi[c]) that some real row of query block c (columns 16c .. 16c + 15) sees bound
 * both products. S is formed only in the blocks of key rows and query columns that meet
 * (fa_tm_scores_kmajor sets the others' visible columns to -inf: they are all masked), and
 * O += P V of each query block sums only its keys (the others' P is exactly 0). On the
 * diagonal that is 10 of 16 blocks of each product.
 */
enum { PB = 16, NPB = BQ / PB };

static void partial_spans(const fa_tm_rel *rel, int nq, int *lo, int *hi) {
    for (int c = 0; c < NPB; c++) {
        lo[c] = BK;
        hi[c] = 0;
        for (int i = c * PB; i < (c + 1) * PB && i < nq; i++) {
            if (rel->lo[i] >= rel->hi[i]) continue;
            if (rel->lo[i] < lo[c]) lo[c] = rel->lo[i];
            if (rel->hi[i] > hi[c]) hi[c] = rel->hi[i];
        }
    }
}

FA_TM_INLINE void partial_scores(const fwd_bufs *B, const fwd_sub *U, const int *lo,
                                 const int *hi, int nk4, int d, int dp) {
    for (int k0 = 0; k0 < nk4; k0 += PB) {
        const int k1 = nk4 - k0 < PB ? nk4 : k0 + PB;
        int c0 = NPB, c1 = 0; /* the query blocks that see a key of [k0, k1) */
        for (int c = 0; c < NPB; c++)
            if (lo[c] < k1 && hi[c] > k0) {
                if (c < c0) c0 = c;
                c1 = c + 1;
            }
        if (c0 < c1)
            fa_tm_gemm_set(k1 - k0, (c1 - c0) * PB, d, B->kf + (ptrdiff_t)k0 * dp, dp, 1,
                           U->qt + c0 * PB, BQ, B->st + (ptrdiff_t)k0 * BQ + c0 * PB, BQ);
    }
}

FA_TM_INLINE void partial_pv(const fwd_bufs *B, const fwd_sub *U, const int *lo, const int *hi,
                             int nq4, int dp) {
    for (int c = 0; c < NPB && c * PB < nq4; c++) {
        if (lo[c] >= hi[c]) continue;
        const int m = nq4 - c * PB < PB ? nq4 - c * PB : PB;
        fa_tm_gemm(m, dp, hi[c] - lo[c], B->st + (ptrdiff_t)lo[c] * BQ + c * PB, 1, BQ,
                   B->vf + (ptrdiff_t)lo[c] * dp, dp, U->o + (ptrdiff_t)c * PB * dp, dp);
    }
}

/* Query tiles g0 .. g0 + gsize - 1 (those that exist; gsize <= FWD_QSUB) of (b, h). */
FA_TM_HOT
static void fwd_item(const fa_problem *p, int64_t b, int64_t h, int64_t g0, int gsize,
                     float *ws) {
    int64_t q0, sq, k0, sk;
    fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
    const fa_dtype dt = p->dtype;
    const size_t es = fa_dtype_size(dt);
    const int d = (int)p->d, dp = fa_tm_pad16(d);
    const int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b, hk = h / p->group;
    const float slope = fa_alibi_slope(p, b, h);
    fa_dt drop;
    const int dropout = fa_dt_init(&drop, p, b, h);
    /* FP8: Q's and K's descales are factors of every score, so they join the softmax scale
       (one fp32 constant, as the header documents); 1 for other dtypes */
    const float scale = p->scale * fa_descale(p, p->q_descale, b, hk) *
                        fa_descale(p, p->k_descale, b, hk);
    const float vd = fa_descale(p, p->v_descale, b, hk);
    fwd_bufs B;
    fwd_layout(d, ws, &B);

    fa_tm_qrows rows[FWD_QSUB];
    int nq[FWD_QSUB];
    int64_t ulo, uhi;
    const int nsub = fa_tm_qrun_init(rows, nq, p, g0, gsize, sq, sk, &ulo, &uhi);
    for (int s = 0; s < nsub; s++) sub_init(&B.sub[s], p, bq, q0 + (g0 + s) * BQ, nq[s], h, dp);

    fa_tm_rel rel;
    for (int64_t j0 = ulo; j0 < uhi; j0 += BK) {
        const int nk = uhi - j0 < BK ? (int)(uhi - j0) : BK, nk4 = fa_tm_pad4(nk);
        int kind[FWD_QSUB];
        if (!fa_tm_classify_run(rows, nsub, j0, j0 + nk, kind)) continue;
        /* Packed into contiguous rows even where fp32 rows could be read in place: the
           matmuls then run from L1, and the misses are taken here. */
        fa_tm_pack_rows2(B.kf, B.vf, &p->k, &p->v, dt, bk, k0 + j0, nk, hk, d, dp);
        /* The next key tile's rows are fetched while this one's exponentials run, a share
           in each query tile's softmax: all of them in the first one stalled it on the
           core's miss buffers. */
        fa_tm_ahead ahead;
        fa_tm_ahead_init(&ahead, &p->k, &p->v, es, bk, k0 + j0 + BK, uhi - j0 - BK, hk, d);
        int active = 0, t = 0;
        int v_finite = -1; /* whether the V tile is all finite: found on a mask edge's demand */
        for (int s = 0; s < nsub; s++) active += kind[s] != FA_TM_NONE;

        for (int s = 0; s < nsub; s++) {
            if (kind[s] == FA_TM_NONE) continue;
            const fwd_sub *U = &B.sub[s];
            /* Where the matmul's scores are final (a whole tile of whole 4-key blocks, no
               mask, softcap or ALiBi) their maxima come out of its registers. */
            const int have_max =
                kind[s] == FA_TM_FULL && nk == nk4 && slope == 0.0f && !(p->softcap > 0);
            const int transform = fa_tm_needs_transform(kind[s], p->softcap, slope);
            const int partial = kind[s] == FA_TM_PARTIAL;
            int plo[NPB], phi[NPB];
            if (transform) fa_tm_rel_init(&rel, &rows[s], j0);
            if (partial) partial_spans(&rel, nq[s], plo, phi);
            if (have_max) {
                for (int i = 0; i < BQ; i++) U->cm[i] = -INFINITY;
                fa_tm_gemm_set_max(nk4, BQ, d, B.kf, dp, 1, U->qt, BQ, B.st, BQ, U->cm);
            } else if (partial) {
                partial_scores(&B, U, plo, phi, nk4, d, dp);
            } else {
                fa_tm_gemm_set(nk4, BQ, d, B.kf, dp, 1, U->qt, BQ, B.st, BQ);
            }
            if (transform) {
                /* padding columns (i >= nq) stay unscaled: their scores are 0 */
                fa_tm_scores_kmajor(B.st, NULL, nk, nq[s], &rel, scale, p->softcap, slope,
                                    kind[s] == FA_TM_PARTIAL);
            }
            const int nq4 = fa_tm_pad4(nq[s]);
            softmax_step(U, B.st, nk, nq4, dp, &ahead, t * BK / active, (t + 1) * BK / active,
                         have_max, transform ? 1.0f : scale);
            t++;
            if (dropout) fa_dt_kmajor(&drop, B.st, BQ, nk, nq[s], (g0 + s) * BQ, j0);
            /* O[i][x] += sum_j P[j][i] V[j][x]: A is st read down its columns */
            if (partial && v_finite < 0) v_finite = fa_tm_rows_finite(B.vf, nk, dp, dp);
            if (partial && !v_finite) /* masked keys' P is 0, and 0 * Inf or NaN is NaN */
                fa_tm_gemm_vis(nq4, dp, nk, rel.lo, rel.hi, 0, B.st, 1, BQ, B.vf, dp, U->o, dp);
            else if (partial)
                partial_pv(&B, U, plo, phi, nq4, dp);
            else
                fa_tm_gemm(nq4, dp, nk, B.st, 1, BQ, B.vf, dp, U->o, dp);
        }
    }

    for (int s = 0; s < nsub; s++)
        sub_store(&B.sub[s], &rows[s], p, b, bq, q0 + (g0 + s) * BQ, nq[s], h, dp, vd);
}

typedef struct fwd_run {
    const fa_problem *p;
    float *base;
    size_t per_thread;
    int64_t ngroups;
    int gsize;
} fwd_run;

static void fwd_run_item(void *arg, int64_t w) {
    const fwd_run *r = arg;
    const fa_problem *p = r->p;
    /* last tiles first: under a causal mask they are the longest */
    const int64_t g = r->ngroups - 1 - w % r->ngroups, bh = w / r->ngroups;
    fwd_item(p, bh / p->heads_q, bh % p->heads_q, g * r->gsize, r->gsize,
             r->base + r->per_thread * (size_t)fa_tm_tid());
}

void FA_ISA_FN(fa_cpu_fwd_tiled)(const fa_problem *p, void *ws, int threads) {
    if (threads < 1) threads = 1;
    fwd_bufs unused;
    fwd_run r = {p, fa_tm_align(ws), fwd_layout(p->d, NULL, &unused), 0, 0};
    const int64_t ntq = (p->seqlen_q + BQ - 1) / BQ; /* varlen: the longest sequence */
    r.gsize = fa_tm_group(ntq, p->batch * p->heads_q, threads, FWD_QSUB);
    r.ngroups = (ntq + r.gsize - 1) / r.gsize;
    fa_cpu_for(threads, p->batch * p->heads_q * r.ngroups, fwd_run_item, &r);
}
