/*
 * cpu/ref_naive.c — textbook attention, the reference every kernel is checked against.
 *
 * It materialises the whole score matrix, batch * heads_q * sq * sk values, like the
 * three-line framework implementation does; that is its purpose (tests, and the memory wall in
 * `flashattn demo`). Two precisions share the code:
 *   exact (plain = 0): inputs widened to double, every sum in double.  FA_ALGO_NAIVE
 *   plain (plain = 1): each matmul sums in fp32 and rounds its result to the input dtype; the
 *                      softmax runs in fp32.  FA_ALGO_PLAIN, the yardstick of the 2x rule.
 * Emulating fp32 with doubles rounded after every step keeps one code path for both.
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../dropout.h"
#include "kernels.h"

typedef struct ref_mode {
    int plain;
    fa_dtype dt;
} ref_mode;

/* Accumulate: exact in double, or an fp32 fused multiply-add as a BLAS kernel would do. */
static inline double acc(ref_mode m, double sum, double a, double b) {
    double r = sum + a * b; /* a*b of two floats is exact in double */
    return m.plain ? (double)(float)r : r;
}

/* Round a finished matmul result to what the plain implementation would store. */
static inline double out_round(ref_mode m, double x) {
    if (!m.plain) return x;
    float f = (float)x;
    switch (m.dt) {
    case FA_DTYPE_F16: return fa_f16_to_f32(fa_f32_to_f16(f));
    case FA_DTYPE_BF16: return fa_bf16_to_f32(fa_f32_to_bf16(f));
    default: return f;
    }
}

/* Elementwise fp32 step of the plain path (softmax, scaling): exact path keeps double. */
static inline double fp32(ref_mode m, double x) { return m.plain ? (double)(float)x : x; }

static inline double load(const fa_problem *p, const fa_operand *a, int64_t b, int64_t t,
                          int64_t h, int64_t x) {
    const void *row = fa_at(a, p->dtype, b, t, h);
    if (p->dtype == FA_DTYPE_F64) return ((const double *)row)[x];
    return fa_load(row, p->dtype, x);
}

static inline void store(const fa_problem *p, const fa_operand *a, int64_t b, int64_t t,
                         int64_t h, int64_t x, double v) {
    void *row = fa_at(a, p->dtype, b, t, h);
    if (p->dtype == FA_DTYPE_F64)
        ((double *)row)[x] = v;
    else
        fa_store(row, p->dtype, x, (float)v);
}

static inline void store_lse(const fa_problem *p, int64_t b, int64_t h, int64_t t, double v) {
    if (!p->lse) return;
    int64_t off = b * p->lse_sb + h * p->lse_sh + t * p->lse_st;
    if (p->dtype == FA_DTYPE_F64)
        ((double *)p->lse)[off] = v;
    else
        ((float *)p->lse)[off] = (float)v;
}

/* Offsets of each (b, h) score block inside one allocation; returns total element count or
   -1 on overflow. Varlen sequences have their own sizes. */
static int64_t score_layout(const fa_problem *p, int64_t *block_off) {
    int64_t total = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t q0, sq, k0, sk;
        fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
        if (sk != 0 && sq > INT64_MAX / sk) return -1;
        int64_t per_head = sq * sk;
        if (per_head != 0 && p->heads_q > INT64_MAX / per_head) return -1;
        int64_t blk = per_head * p->heads_q;
        if (total > INT64_MAX - blk) return -1;
        block_off[b] = total;
        total += blk;
    }
    return total;
}

/*
 * Scores of head h of sequence b, then softmax in place: on return S[i*sk + j] holds P_ij
 * (0 where masked), lse[i] the row's log-sum-exp (-inf for an empty row), and pre[] (if not
 * NULL) the pre-softcap scaled dot products needed by the backward chain rule.
 */
static void scores_softmax(const fa_problem *p, ref_mode m, int64_t b, int64_t h, double *S,
                           double *lse, int64_t sq, int64_t sk, int64_t q0, int64_t k0) {
    int64_t hk = h / p->group;
    int64_t bq = p->cu_q ? 0 : b, tq = q0;
    int64_t bk = p->cu_k ? 0 : b, tk = k0;
    double slope = fa_alibi_slope(p, b, h);
    for (int64_t i = 0; i < sq; i++) {
        int64_t lo, hi;
        fa_row_keys(p, i, sq, sk, &lo, &hi);
        double *s = S + i * sk;
        double mx = -INFINITY;
        for (int64_t j = 0; j < sk; j++) {
            if (j < lo || j >= hi) {
                s[j] = -INFINITY;
                continue;
            }
            double dot = 0;
            for (int64_t x = 0; x < p->d; x++)
                dot = acc(m, dot, load(p, &p->q, bq, tq + i, h, x),
                          load(p, &p->k, bk, tk + j, hk, x));
            double v = fp32(m, out_round(m, dot) * p->scale);
            if (p->softcap > 0) v = fp32(m, p->softcap * tanh(v / p->softcap));
            if (p->alibi) {
                int64_t dist = i + sk - sq - j;
                v = fp32(m, v - slope * (double)(dist < 0 ? -dist : dist));
            }
            s[j] = v;
            if (v > mx) mx = v;
        }
        if (lo >= hi) { /* nobody to attend to */
            for (int64_t j = 0; j < sk; j++) s[j] = 0;
            lse[i] = -INFINITY;
            continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < sk; j++) {
            s[j] = (j < lo || j >= hi) ? 0 : fp32(m, exp(s[j] - mx));
            sum = fp32(m, sum + s[j]);
        }
        for (int64_t j = 0; j < sk; j++) s[j] = fp32(m, s[j] / sum);
        lse[i] = fp32(m, mx + log(sum));
    }
}

/* Derivative of the final score with respect to the raw dot product q·k. */
static double dscore_ddot(const fa_problem *p, ref_mode m, double dot) {
    if (p->softcap <= 0) return p->scale;
    double t = tanh(fp32(m, out_round(m, dot) * p->scale) / p->softcap);
    return p->scale * (1 - t * t);
}

/* Dropout's factor of element (b, h, i, j): 0 where dropout.h's rule drops it, else
   1 / (1 - p) (exact: in double; plain: the fp32 factor a framework multiplies by); 1 when
   dropout is off. The mask is the kernels' own, so both compute the same function. */
static double drop_z(const fa_problem *p, ref_mode m, const fa_drop *dr, int64_t b, int64_t h,
                     int64_t i, int64_t j) {
    if (!(p->drop_p > 0)) return 1;
    if (!fa_drop_keep(dr, (uint32_t)(b * p->heads_q + h), (uint32_t)i, (uint64_t)j)) return 0;
    return m.plain ? (double)fa_drop_scale(p->drop_p) : 1.0 / (1.0 - (double)p->drop_p);
}

static int resolve_threads(int threads) { return threads > 0 ? threads : 1; }

fa_status fa_cpu_fwd_naive(const fa_problem *p, int plain, int threads, size_t *bytes_used) {
    ref_mode m = {plain, p->dtype};
    int64_t *off = malloc((size_t)p->batch * sizeof *off);
    if (!off) return FA_ERR_OUT_OF_MEMORY;
    int64_t total = score_layout(p, off);
    int64_t lse_total = p->seqlen_q * p->heads_q * p->batch;
    if (total < 0 || (uint64_t)total > SIZE_MAX / sizeof(double) - (uint64_t)lse_total) {
        free(off);
        return FA_ERR_OUT_OF_MEMORY;
    }
    size_t bytes = ((size_t)total + (size_t)lse_total) * sizeof(double);
    double *S = malloc(bytes ? bytes : 1);
    if (!S) {
        free(off);
        return FA_ERR_OUT_OF_MEMORY;
    }
    double *L = S + total;
    *bytes_used = bytes;

    const fa_drop dr = fa_drop_init(p->drop_seed, p->drop_offset, p->drop_p);
    int64_t work = p->batch * p->heads_q;
#pragma omp parallel for num_threads(resolve_threads(threads)) schedule(dynamic)
    for (int64_t w = 0; w < work; w++) {
        int64_t b = w / p->heads_q, h = w % p->heads_q;
        int64_t q0, sq, k0, sk;
        fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
        double *Sb = S + off[b] + h * sq * sk;
        double *lse = L + (b * p->heads_q + h) * p->seqlen_q;
        scores_softmax(p, m, b, h, Sb, lse, sq, sk, q0, k0);
        int64_t hk = h / p->group;
        int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b;
        for (int64_t i = 0; i < sq; i++) {
            const double *prow = Sb + i * sk;
            /* only the keys the row sees: a masked key's P is 0, but 0 * Inf or NaN in its V
               would be NaN (the kernels' rule: masked keys do not contribute) */
            int64_t lo, hi;
            fa_row_keys(p, i, sq, sk, &lo, &hi);
            for (int64_t x = 0; x < p->d; x++) {
                double o = 0;
                for (int64_t j = lo; j < hi; j++) /* O = (P with dropout) V; LSE is P's */
                    o = acc(m, o, out_round(m, fp32(m, prow[j] * drop_z(p, m, &dr, b, h, i, j))),
                            load(p, &p->v, bk, k0 + j, hk, x));
                store(p, &p->o, bq, q0 + i, h, x, out_round(m, o));
            }
            store_lse(p, b, h, q0 + i, lse[i]);
        }
    }
    free(S);
    free(off);
    return FA_OK;
}

fa_status fa_cpu_bwd_naive(const fa_problem *p, int plain, int threads, size_t *bytes_used) {
    ref_mode m = {plain, p->dtype};
    int64_t *off = malloc((size_t)p->batch * sizeof *off);
    if (!off) return FA_ERR_OUT_OF_MEMORY;
    int64_t total = score_layout(p, off);
    /* per (b, kv head): dK and dV accumulators; per query row: its lse and dP row */
    int64_t kv_acc = 2 * p->seqlen_k * p->d * p->batch * p->heads_kv;
    int64_t rows = p->seqlen_q * p->heads_q * p->batch;
    int64_t extra = kv_acc + rows + (int64_t)resolve_threads(threads) * p->seqlen_k;
    if (total < 0 || (uint64_t)total > SIZE_MAX / sizeof(double) - (uint64_t)extra) {
        free(off);
        return FA_ERR_OUT_OF_MEMORY;
    }
    size_t bytes = ((size_t)total + (size_t)extra) * sizeof(double);
    double *S = calloc(bytes ? bytes : 1, 1);
    if (!S) {
        free(off);
        return FA_ERR_OUT_OF_MEMORY;
    }
    double *ACC = S + total, *L = ACC + kv_acc, *DP = L + rows;
    *bytes_used = bytes;

    const fa_drop dr = fa_drop_init(p->drop_seed, p->drop_offset, p->drop_p);
    /* One task per (b, kv head) so the group's dK/dV sums need no locks. */
    int64_t work = p->batch * p->heads_kv;
#pragma omp parallel for num_threads(resolve_threads(threads)) schedule(dynamic)
    for (int64_t w = 0; w < work; w++) {
        int64_t b = w / p->heads_kv, hk = w % p->heads_kv;
        int64_t q0, sq, k0, sk;
        fa_seq_bounds(p, b, &q0, &sq, &k0, &sk);
        int64_t bq = p->cu_q ? 0 : b, bk = p->cu_k ? 0 : b;
        double *dK = ACC + w * 2 * p->seqlen_k * p->d, *dV = dK + p->seqlen_k * p->d;
        double *dp = DP;
#ifdef _OPENMP
        dp = DP + (int64_t)omp_get_thread_num() * p->seqlen_k;
#endif
        for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
            double *P = S + off[b] + h * sq * sk;
            double *lse = L + (b * p->heads_q + h) * p->seqlen_q;
            scores_softmax(p, m, b, h, P, lse, sq, sk, q0, k0);
            for (int64_t i = 0; i < sq; i++) {
                const double *prow = P + i * sk;
                /* The sums run over the keys the row sees [lo, hi) only, and masked dS is 0:
                   a masked key (or a row that cannot see it) does not contribute, Inf or NaN
                   in its operands included (0 * NaN is NaN). */
                int64_t lo, hi;
                fa_row_keys(p, i, sq, sk, &lo, &hi);
                /* With dropout factors Z (O = (P o Z) V): dP_ij = Z_ij (dO_i · V_j), the
                   gradient of P itself; D_i = sum_j P_ij dP_ij (= dO_i · O_i, the kernels'
                   form); dS = P o (dP - D); dV_j = sum_i P_ij Z_ij dO_i. Z = 1 without. */
                double D = 0;
                for (int64_t j = 0; j < sk; j++) dp[j] = 0;
                for (int64_t j = lo; j < hi; j++) {
                    double s = 0;
                    for (int64_t x = 0; x < p->d; x++)
                        s = acc(m, s, load(p, &p->dout, bq, q0 + i, h, x),
                                load(p, &p->v, bk, k0 + j, hk, x));
                    dp[j] = fp32(m, out_round(m, s) * drop_z(p, m, &dr, b, h, i, j));
                    D = fp32(m, D + prow[j] * dp[j]);
                }
                for (int64_t j = lo; j < hi; j++) {
                    if (prow[j] == 0) {
                        dp[j] = 0;
                        continue;
                    }
                    double dot = 0; /* only the softcap derivative needs it */
                    for (int64_t x = 0; p->softcap > 0 && x < p->d; x++)
                        dot = acc(m, dot, load(p, &p->q, bq, q0 + i, h, x),
                                  load(p, &p->k, bk, k0 + j, hk, x));
                    double ds = fp32(m, prow[j] * (dp[j] - D));
                    dp[j] = out_round(m, fp32(m, ds * dscore_ddot(p, m, dot)));
                }
                /* dQ_i = sum_j dS_ij K_j */
                for (int64_t x = 0; x < p->d; x++) {
                    double s = 0;
                    for (int64_t j = lo; j < hi; j++)
                        s = acc(m, s, dp[j], load(p, &p->k, bk, k0 + j, hk, x));
                    store(p, &p->dq, bq, q0 + i, h, x, out_round(m, s));
                }
                /* dK_j += dS_ij Q_i ; dV_j += P_ij dO_i  (rows of P rounded as the plain
                   matmul would see them) */
                for (int64_t j = lo; j < hi; j++) {
                    double pr = out_round(m, fp32(m, prow[j] * drop_z(p, m, &dr, b, h, i, j)));
                    for (int64_t x = 0; x < p->d; x++) {
                        dK[j * p->d + x] =
                            acc(m, dK[j * p->d + x], dp[j], load(p, &p->q, bq, q0 + i, h, x));
                        dV[j * p->d + x] =
                            acc(m, dV[j * p->d + x], pr, load(p, &p->dout, bq, q0 + i, h, x));
                    }
                }
            }
        }
        for (int64_t j = 0; j < sk; j++)
            for (int64_t x = 0; x < p->d; x++) {
                store(p, &p->dk, bk, k0 + j, hk, x, out_round(m, dK[j * p->d + x]));
                store(p, &p->dv, bk, k0 + j, hk, x, out_round(m, dV[j * p->d + x]));
            }
    }
    free(S);
    free(off);
    return FA_OK;
}
