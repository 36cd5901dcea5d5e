/*
 * test_gradcheck.c — the backward pass against finite differences.
 *
 * loss(q, k, v) = sum(dO * O) with a fixed random dO, so dloss/dq = dQ of fa_bwd with dout = dO.
 * The forward is FA_ALGO_NAIVE on f64 tensors; the gradient is taken by central differences
 * element by element on tiny shapes, and compared with
 *   - fa_bwd with FA_ALGO_NAIVE in f64 (must agree to finite-difference accuracy), and
 *   - fa_bwd with the tiled kernel in f32 (must agree to fp32 rounding accuracy).
 * This checks the reference itself, which the sweeps' rule trusts.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sweep.h"

typedef struct gcase {
    const char *name;
    int b, sq, sk, hq, hkv, d;
    int causal, window;
    int64_t wl, wr;
    float softcap, scale;
    int alibi; /* TK_ALIBI_* */
    int varlen;
    int32_t lq[2], lk[2];
    float dropout; /* dropout_p: the mask is fixed by the seed, so the loss stays smooth */
} gcase;

static const gcase cases[] = {
    {.name = "plain", .b = 1, .sq = 3, .sk = 4, .hq = 2, .hkv = 2, .d = 4},
    {.name = "causal-gqa-empty-rows", .b = 2, .sq = 4, .sk = 3, .hq = 4, .hkv = 2, .d = 3,
     .causal = 1},
    {.name = "softcap", .b = 1, .sq = 3, .sk = 5, .hq = 2, .hkv = 1, .d = 4, .softcap = 0.5f,
     .scale = 1.0f},
    {.name = "alibi-causal", .b = 1, .sq = 4, .sk = 4, .hq = 2, .hkv = 2, .d = 4, .causal = 1,
     .alibi = TK_ALIBI_HEAD},
    {.name = "alibi-batch-window", .b = 2, .sq = 3, .sk = 5, .hq = 2, .hkv = 1, .d = 4,
     .window = 1, .wl = 1, .wr = 1, .alibi = TK_ALIBI_BATCH},
    {.name = "varlen-empty", .b = 2, .hq = 2, .hkv = 1, .d = 4, .varlen = 1, .lq = {3, 2},
     .lk = {0, 4}, .softcap = 1.0f, .alibi = TK_ALIBI_HEAD},
    {.name = "mqa4-everything", .b = 1, .sq = 5, .sk = 6, .hq = 4, .hkv = 1, .d = 5,
     .causal = 1, .window = 1, .wl = 2, .wr = -1, .softcap = 0.8f, .alibi = TK_ALIBI_HEAD,
     .scale = 0.9f},
    {.name = "dropout-causal-gqa", .b = 2, .sq = 4, .sk = 6, .hq = 4, .hkv = 2, .d = 3,
     .causal = 1, .dropout = 0.5f},
    {.name = "dropout-varlen-softcap", .b = 2, .hq = 2, .hkv = 1, .d = 4, .varlen = 1,
     .lq = {3, 5}, .lk = {6, 4}, .softcap = 1.0f, .alibi = TK_ALIBI_HEAD, .dropout = 0.3f},
};

typedef struct gset {
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
} gset;

typedef struct gprob {
    const gcase *c;
    fa_params p;
    int32_t cu_q[3], cu_k[3];
    float slopes[16];
    int nd;
    int64_t sq[4], sk[4], sl[3];
} gprob;

static void gprob_init(gprob *g, const gcase *c) {
    memset(g, 0, sizeof *g);
    g->c = c;
    g->p = fa_params_default();
    g->p.causal = c->causal;
    if (c->window) {
        g->p.window_left = c->wl;
        g->p.window_right = c->wr;
    }
    g->p.softcap = c->softcap;
    g->p.softmax_scale = c->scale;
    g->p.dropout_p = c->dropout;
    g->p.dropout_seed = 0x9E3779B97F4A7C15ull; /* fixed: every forward of the loss, one mask */
    g->p.dropout_offset = 3;
    if (c->alibi) {
        for (int i = 0; i < 16; i++) g->slopes[i] = 0.3f + 0.17f * (float)i;
        g->p.alibi_slopes = g->slopes;
        g->p.alibi_batch_stride = c->alibi == TK_ALIBI_BATCH ? c->hq : 0;
    }
    if (c->varlen) {
        g->cu_q[1] = c->lq[0];
        g->cu_q[2] = c->lq[0] + c->lq[1];
        g->cu_k[1] = c->lk[0];
        g->cu_k[2] = c->lk[0] + c->lk[1];
        g->p.cu_seqlens_q = g->cu_q;
        g->p.cu_seqlens_k = g->cu_k;
        g->p.batch = c->b;
        g->nd = 3;
        int64_t sq[3] = {g->cu_q[2], c->hq, c->d}, sk[3] = {g->cu_k[2], c->hkv, c->d};
        int64_t sl[2] = {c->hq, g->cu_q[2]};
        memcpy(g->sq, sq, sizeof sq);
        memcpy(g->sk, sk, sizeof sk);
        memcpy(g->sl, sl, sizeof sl);
    } else {
        g->nd = 4;
        int64_t sq[4] = {c->b, c->sq, c->hq, c->d}, sk[4] = {c->b, c->sk, c->hkv, c->d};
        int64_t sl[3] = {c->b, c->hq, c->sq};
        memcpy(g->sq, sq, sizeof sq);
        memcpy(g->sk, sk, sizeof sk);
        memcpy(g->sl, sl, sizeof sl);
    }
}

static void gset_alloc(gset *s, const gprob *g, fa_dtype dt, tk_rng *r) {
    fa_dtype ldt = dt == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
    tk_buf *q[] = {&s->q, &s->o, &s->dout, &s->dq}, *k[] = {&s->k, &s->v, &s->dk, &s->dv};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tk_buf_alloc(q[i], dt, g->nd, g->sq, 0, r), 0);
        assert_int_equal(tk_buf_alloc(k[i], dt, g->nd, g->sk, 0, r), 0);
    }
    assert_int_equal(tk_buf_alloc(&s->lse, ldt, g->nd - 1, g->sl, 0, r), 0);
}

static void gset_free(gset *s) {
    tk_buf *all[] = {&s->q, &s->k, &s->v, &s->o, &s->lse, &s->dout, &s->dq, &s->dk, &s->dv};
    for (int i = 0; i < 9; i++) tk_buf_free(all[i]);
}

static double loss(fa_context *ctx, const gprob *g, gset *s) {
    assert_int_equal(fa_fwd(ctx, &s->q.t, &s->k.t, &s->v.t, &g->p, &s->o.t, &s->lse.t), FA_OK);
    double l = 0;
    int64_t n = tk_numel(&s->o.t);
    for (int64_t i = 0; i < n; i++) l += tk_get(&s->dout.t, i) * tk_get(&s->o.t, i);
    return l;
}

/* Worst |a - b| relative to max(1, max|b|), and the largest |b|. */
static double rel_err(const fa_tensor *a, const fa_tensor *b, double *bmax) {
    double e = 0, m = 0;
    int64_t n = tk_numel(b);
    for (int64_t i = 0; i < n; i++) {
        double x = tk_get(a, i), y = tk_get(b, i);
        if (!(fabs(x - y) <= e)) e = fabs(x - y); /* also catches NaN */
        if (fabs(y) > m) m = fabs(y);
    }
    *bmax = m;
    return e / (m > 1 ? m : 1);
}

static void gradcheck(void **state) {
    const gcase *c = *state;
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    gprob g;
    gprob_init(&g, c);
    fa_context *naive, *tiled;
    assert_int_equal(fa_context_create(&naive, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_algo(naive, FA_ALGO_NAIVE), FA_OK);
    assert_int_equal(fa_context_create(&tiled, FA_BACKEND_CPU), FA_OK);

    /* f64 inputs that are exactly f32 values, so the f32 run sees the very same problem */
    gset s, fd, t;
    gset_alloc(&s, &g, FA_DTYPE_F64, &r);
    gset_alloc(&fd, &g, FA_DTYPE_F64, &r);
    gset_alloc(&t, &g, FA_DTYPE_F32, &r);
    tk_buf *in[] = {&s.q, &s.k, &s.v, &s.dout};
    for (int i = 0; i < 4; i++) {
        int64_t n = tk_numel(&in[i]->t);
        for (int64_t e = 0; e < n; e++)
            tk_set(&in[i]->t, e, tk_round_to(FA_DTYPE_F32, tk_rng_normal(&r)));
    }

    /* Central differences. With h = 1e-5 on O(1) inputs the truncation error is ~h^2 * L'''
       ~1e-10 and the cancellation error ~1e-16 * |L| / h ~1e-10: a tolerance of 1e-6 (relative
       to max(1, |g|)) leaves four orders of margin and still catches any real error, which is
       O(1e-2) or more. */
    const double h = 1e-5, tol_fd = 1e-6;
    tk_buf *wrt[3] = {&s.q, &s.k, &s.v}, *grad[3] = {&fd.dq, &fd.dk, &fd.dv};
    for (int w = 0; w < 3; w++) {
        int64_t n = tk_numel(&wrt[w]->t);
        for (int64_t e = 0; e < n; e++) {
            double x = tk_get(&wrt[w]->t, e);
            tk_set(&wrt[w]->t, e, x + h);
            double lp = loss(naive, &g, &s);
            tk_set(&wrt[w]->t, e, x - h);
            double lm = loss(naive, &g, &s);
            tk_set(&wrt[w]->t, e, x);
            tk_set(&grad[w]->t, e, (lp - lm) / (2 * h));
        }
    }

    /* reference backward in f64 */
    loss(naive, &g, &s);
    assert_int_equal(fa_bwd(naive, &s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.dout.t, &s.lse.t, &g.p,
                            &s.dq.t, &s.dk.t, &s.dv.t),
                     FA_OK);

    /* tiled kernel in f32 on the same values */
    tk_copy(&t.q, &s.q);
    tk_copy(&t.k, &s.k);
    tk_copy(&t.v, &s.v);
    tk_copy(&t.dout, &s.dout);
    assert_int_equal(fa_fwd(tiled, &t.q.t, &t.k.t, &t.v.t, &g.p, &t.o.t, &t.lse.t), FA_OK);
    assert_int_equal(fa_bwd(tiled, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.dout.t, &t.lse.t, &g.p,
                            &t.dq.t, &t.dk.t, &t.dv.t),
                     FA_OK);
    /* fp32 tolerance: a length-n fp32 sum of products errs by at most ~n*u times the sum of
       the magnitudes of its terms (u = 2^-24). The longest chain here is a score dot product
       (d terms), a softmax row and dP (sk, d terms), then dQ over sk keys or dK/dV over
       group*sq rows; with unit-normal data every term is O(1) up to the gradient's own scale.
       Four such stages, each allowed n*u with n the longest length, times 4 for the factors
       hidden in "O(1)", gives 16 * n * u relative to max(1, |g|) — about 1e-5 here, two
       orders above the typical fp32 error and far below a wrong gradient. */
    int64_t seq = c->sq > c->sk ? c->sq : c->sk;
    for (int b = 0; c->varlen && b < c->b; b++) {
        if (c->lq[b] > seq) seq = c->lq[b];
        if (c->lk[b] > seq) seq = c->lk[b];
    }
    int64_t n = c->d + seq * (c->hq / c->hkv);
    double tol32 = 16.0 * (double)n * 0x1p-24;

    const char *nm[3] = {"dq", "dk", "dv"};
    tk_buf *ref[3] = {&s.dq, &s.dk, &s.dv}, *ker[3] = {&t.dq, &t.dk, &t.dv};
    for (int w = 0; w < 3; w++) {
        double gmax, e64 = rel_err(&ref[w]->t, &grad[w]->t, &gmax);
        double e32 = rel_err(&ker[w]->t, &grad[w]->t, &gmax);
        print_message("%-22s %s: |g|max %.3g  naive-f64 err %.2e (tol %.0e)  tiled-f32 err %.2e "
                      "(tol %.1e)\n",
                      c->name, nm[w], gmax, e64, tol_fd, e32, tol32);
        if (!(e64 <= tol_fd) || !(e32 <= tol32))
            fail_msg("%s %s: finite differences disagree (seed %llu)", c->name, nm[w],
                     (unsigned long long)tk_seed());
    }
    gset_free(&s);
    gset_free(&fd);
    gset_free(&t);
    fa_context_destroy(naive);
    fa_context_destroy(tiled);
}

int main(void) {
    enum { N = sizeof cases / sizeof *cases };
    struct CMUnitTest tests[N];
    for (int i = 0; i < N; i++) {
        tests[i] = (struct CMUnitTest){cases[i].name, gradcheck, NULL, NULL, (void *)&cases[i]};
    }
    printf("[ SEED     ] %llu\n", (unsigned long long)tk_seed());
    return _cmocka_run_group_tests("gradcheck", tests, N, NULL, NULL) != 0;
}
