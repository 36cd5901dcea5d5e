/*
 * test_special.c — special values through the CPU forward, backward and KV-cache forward, at
 * the instruction-set level FLASHATTN_CPU_ISA selects (CTest runs it once per level), and
 * through the float64 reference (FA_ALGO_NAIVE) that the other tests compare against.
 *
 * The rules (include/flashattn.h, "Special values"):
 *  - a finite input whose exact results are finite gives finite results: huge magnitudes
 *    (scores near 1e10 and beyond, up to each dtype's range), +-0 and subnormals included;
 *  - a key a row cannot see (masked by causal / window) does not contribute to that row, even
 *    when its K or V holds NaN or Inf and it shares a tile with keys the row sees, in O, LSE
 *    and dQ; a row does not contribute to the dK, dV of keys it cannot see;
 *  - a NaN in V of a key a row sees makes that column of the row's O NaN; a NaN in its K makes
 *    the row's O and LSE NaN.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn.h"
#include "testkit.h"

/* One problem in doubles (BSHD, batch 1, one head), converted to dt for each call. */
typedef struct prob {
    fa_dtype dt;
    int64_t sq, sk, d;
    double *q, *k, *v, *dout;      /* inputs */
    double *o, *lse, *dq, *dk, *dv; /* outputs of the last call */
} prob;

static void prob_init(prob *p, fa_dtype dt, int64_t sq, int64_t sk, int64_t d) {
    p->dt = dt;
    p->sq = sq, p->sk = sk, p->d = d;
    p->q = calloc((size_t)(sq * d), sizeof(double));
    p->dout = calloc((size_t)(sq * d), sizeof(double));
    p->o = calloc((size_t)(sq * d), sizeof(double));
    p->dq = calloc((size_t)(sq * d), sizeof(double));
    p->lse = calloc((size_t)sq, sizeof(double));
    p->k = calloc((size_t)(sk * d), sizeof(double));
    p->v = calloc((size_t)(sk * d), sizeof(double));
    p->dk = calloc((size_t)(sk * d), sizeof(double));
    p->dv = calloc((size_t)(sk * d), sizeof(double));
    assert_non_null(p->dv);
}

static void prob_free(prob *p) {
    double *all[] = {p->q, p->k, p->v, p->dout, p->o, p->lse, p->dq, p->dk, p->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* Values representable in dt (the tests then know exactly what the kernels read). */
static double rep(fa_dtype dt, double x) {
    if (isnan(x) || isinf(x)) return x;
    switch (dt) {
    case FA_DTYPE_F16: return tk_f16_value(tk_f16_bits(x));
    case FA_DTYPE_BF16: return tk_bf16_value(tk_bf16_bits(x));
    case FA_DTYPE_F32: return (float)x;
    default: return x;
    }
}

static void fill(double *x, int64_t n, fa_dtype dt, tk_rng *r, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) x[i] = rep(dt, lo + (hi - lo) * tk_rng_uniform(r));
}

static void *to_dt(fa_dtype dt, const double *x, int64_t n) {
    void *b = malloc((size_t)n * fa_dtype_size(dt) + 1);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case FA_DTYPE_F16: ((uint16_t *)b)[i] = tk_f16_bits(x[i]); break;
        case FA_DTYPE_BF16: ((uint16_t *)b)[i] = tk_bf16_bits(x[i]); break;
        case FA_DTYPE_F64: ((double *)b)[i] = x[i]; break;
        default: ((float *)b)[i] = (float)x[i]; break;
        }
    }
    return b;
}

static void from_dt(fa_dtype dt, const void *b, double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case FA_DTYPE_F16: x[i] = tk_f16_value(((const uint16_t *)b)[i]); break;
        case FA_DTYPE_BF16: x[i] = tk_bf16_value(((const uint16_t *)b)[i]); break;
        case FA_DTYPE_F64: x[i] = ((const double *)b)[i]; break;
        default: x[i] = ((const float *)b)[i]; break;
        }
    }
}

/* `test_special cuda`: the huge-magnitude cases on the CUDA kernels (f16 and bf16, head dims
   they take), the float64 reference still on the CPU. */
static int g_cuda;
static const char *g_bwd_kernel; /* a prefix the backward's record must have (NULL: any) */

static fa_context *ctx_new(fa_algo algo) {
    fa_context *c = NULL;
    const int cuda = g_cuda && algo != FA_ALGO_NAIVE;
    assert_int_equal(fa_context_create(&c, cuda ? FA_BACKEND_CUDA : FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_algo(c, algo), FA_OK);
    return c;
}

/* Where a call of algo reads its buffers: a device copy of host's `bytes` under CUDA, else
   host itself; unmirror copies a device buffer back into host and frees it. */
static void *mirror(fa_algo algo, void *host, size_t bytes) {
    if (!g_cuda || algo == FA_ALGO_NAIVE) return host;
    void *d = tk_device_copy_array(host, bytes);
    assert_non_null(d);
    return d;
}

static void unmirror(void *host, void *p, size_t bytes) {
    if (p == host) return;
    assert_int_equal(tk_device_read_array(host, p, bytes), 0);
    tk_device_free_array(p);
}

static fa_device where(fa_algo algo) {
    return g_cuda && algo != FA_ALGO_NAIVE ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
}

/* Forward (bwd 1: then the backward from its O and LSE) of p under params; the reference
   (algo NAIVE) runs in float64. */
static void run(prob *p, fa_algo algo, const fa_params *prm, int bwd) {
    fa_context *c = ctx_new(algo);
    const fa_dtype dt = algo == FA_ALGO_NAIVE ? FA_DTYPE_F64 : p->dt;
    const fa_dtype lt = algo == FA_ALGO_NAIVE ? FA_DTYPE_F64 : FA_DTYPE_F32;
    const fa_device dev = where(algo);
    const int64_t sq = p->sq, sk = p->sk, d = p->d;
    const size_t es = fa_dtype_size(dt), nq = (size_t)(sq * d) * es, nk = (size_t)(sk * d) * es;
    void *q = to_dt(dt, p->q, sq * d), *k = to_dt(dt, p->k, sk * d), *v = to_dt(dt, p->v, sk * d);
    void *o = to_dt(dt, p->o, sq * d), *lse = malloc((size_t)sq * 8);
    void *mq = mirror(algo, q, nq), *mk = mirror(algo, k, nk), *mv = mirror(algo, v, nk);
    void *mo = mirror(algo, o, nq), *ml = mirror(algo, lse, (size_t)sq * 8);
    fa_tensor tq = fa_tensor_bshd(mq, dt, dev, 1, sq, 1, d);
    fa_tensor tk = fa_tensor_bshd(mk, dt, dev, 1, sk, 1, d);
    fa_tensor tv = fa_tensor_bshd(mv, dt, dev, 1, sk, 1, d);
    fa_tensor to = fa_tensor_bshd(mo, dt, dev, 1, sq, 1, d);
    fa_tensor tl = fa_tensor_3d(ml, lt, dev, 1, 1, sq);
    assert_int_equal(fa_fwd(c, &tq, &tk, &tv, prm, &to, &tl), FA_OK);
    if (bwd) {
        void *dout = to_dt(dt, p->dout, sq * d), *dq = malloc(nq + 1);
        void *dk = malloc(nk + 1), *dv = malloc(nk + 1);
        void *mdo = mirror(algo, dout, nq), *mdq = mirror(algo, dq, nq);
        void *mdk = mirror(algo, dk, nk), *mdv = mirror(algo, dv, nk);
        fa_tensor tdo = fa_tensor_bshd(mdo, dt, dev, 1, sq, 1, d);
        fa_tensor tdq = fa_tensor_bshd(mdq, dt, dev, 1, sq, 1, d);
        fa_tensor tdk = fa_tensor_bshd(mdk, dt, dev, 1, sk, 1, d);
        fa_tensor tdv = fa_tensor_bshd(mdv, dt, dev, 1, sk, 1, d);
        assert_int_equal(fa_bwd(c, &tq, &tk, &tv, &to, &tdo, &tl, prm, &tdq, &tdk, &tdv), FA_OK);
        const fa_selection *sel = fa_last_selection(c);
        if (g_bwd_kernel && algo != FA_ALGO_NAIVE &&
            (!sel || strncmp(sel->kernel, g_bwd_kernel, strlen(g_bwd_kernel)) != 0))
            fail_msg("the backward ran %s, not a %s kernel (%s)", sel ? sel->kernel : "nothing",
                     g_bwd_kernel, sel ? sel->reason : "");
        unmirror(dout, mdo, nq), unmirror(dq, mdq, nq), unmirror(dk, mdk, nk);
        unmirror(dv, mdv, nk);
        from_dt(dt, dq, p->dq, sq * d);
        from_dt(dt, dk, p->dk, sk * d);
        from_dt(dt, dv, p->dv, sk * d);
        free(dout), free(dq), free(dk), free(dv);
    }
    unmirror(q, mq, nq), unmirror(k, mk, nk), unmirror(v, mv, nk), unmirror(o, mo, nq);
    unmirror(lse, ml, (size_t)sq * 8);
    from_dt(dt, o, p->o, sq * d);
    from_dt(lt, lse, p->lse, sq);
    free(q), free(k), free(v), free(o), free(lse);
    fa_context_destroy(c);
}

static int all_finite(const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static const char *dtn(fa_dtype dt) { return fa_dtype_name(dt); }

/* Every output of the last run finite (bwd: the gradients too). */
static void expect_finite(const prob *p, int bwd, const char *what) {
    const int64_t sq = p->sq, sk = p->sk, d = p->d;
    for (int64_t i = 0; i < sq; i++) {
        if (!all_finite(p->o + i * d, d) || !isfinite(p->lse[i]))
            fail_msg("%s %s d %lld: row %lld: O or LSE not finite (LSE %g)", what, dtn(p->dt),
                     (long long)d, (long long)i, p->lse[i]);
        if (bwd && !all_finite(p->dq + i * d, d))
            fail_msg("%s %s d %lld: dQ row %lld not finite", what, dtn(p->dt), (long long)d,
                     (long long)i);
    }
    for (int64_t j = 0; bwd && j < sk; j++)
        if (!all_finite(p->dk + j * d, d) || !all_finite(p->dv + j * d, d))
            fail_msg("%s %s d %lld: dK or dV row %lld not finite", what, dtn(p->dt),
                     (long long)d, (long long)j);
}

/* ---- huge finite magnitudes ---- */

/* Q and K uniform in +-mag (scores up to mag^2 d scale), V and dO of order 1: the exact O is
   a convex combination of V's rows, so |O| <= max |V|, and the gradients are moderate. */
static void huge_case(fa_dtype dt, double mag, int64_t d, int causal, int bwd, uint64_t seed) {
    prob p;
    prob_init(&p, dt, 80, 80, d);
    tk_rng r;
    tk_rng_init(&r, seed);
    fill(p.q, 80 * d, dt, &r, -mag, mag);
    fill(p.k, 80 * d, dt, &r, -mag, mag);
    fill(p.v, 80 * d, dt, &r, -1, 1);
    fill(p.dout, 80 * d, dt, &r, -1, 1);
    fa_params prm = fa_params_default();
    prm.causal = causal;
    char what[64];
    snprintf(what, sizeof what, "|Q|,|K| <= %g%s", mag, causal ? " causal" : "");
    run(&p, FA_ALGO_AUTO, &prm, bwd);
    expect_finite(&p, bwd, what);
    for (int64_t i = 0; i < 80 * d; i++)
        if (fabs(p.o[i]) > 1.0 + 1e-2)
            fail_msg("%s %s d %lld: |O| = %g > max |V| = 1", what, dtn(dt), (long long)d,
                     fabs(p.o[i]));
    prob_free(&p);
}

static void huge_forward(void **state) {
    (void)state;
    static const int64_t ds[] = {8, 12, 20, 40};
    for (size_t i = 0; i < 4; i++)
        for (int causal = 0; causal < 2; causal++) {
            const uint64_t s = 100 + i * 2 + (uint64_t)causal;
            huge_case(FA_DTYPE_F32, 1e5, ds[i], causal, 0, s);
            huge_case(FA_DTYPE_F32, 1e9, ds[i], causal, 0, s);
            huge_case(FA_DTYPE_F32, 1e18, ds[i], causal, 0, s); /* q.k < 1e38 d: finite */
            huge_case(FA_DTYPE_F16, 6e4, ds[i], causal, 0, s);
            huge_case(FA_DTYPE_BF16, 1e5, ds[i], causal, 0, s);
            huge_case(FA_DTYPE_BF16, 1e18, ds[i], causal, 0, s);
        }
}

static void huge_backward(void **state) {
    (void)state;
    static const char *sched[] = {"one-pass", "two-pass"};
    static const int64_t ds[] = {8, 20, 40};
    for (int s = 0; s < 2; s++) {
        setenv("FLASHATTN_CPU_BWD_SCHEDULE", sched[s], 1);
        for (size_t i = 0; i < 3; i++)
            for (int causal = 0; causal < 2; causal++) {
                const uint64_t sd = 200 + i * 2 + (uint64_t)causal;
                huge_case(FA_DTYPE_F32, 1e5, ds[i], causal, 1, sd);
                huge_case(FA_DTYPE_F16, 6e4, ds[i], causal, 1, sd);
                huge_case(FA_DTYPE_BF16, 1e5, ds[i], causal, 1, sd);
            }
    }
    unsetenv("FLASHATTN_CPU_BWD_SCHEDULE");
}

/* ---- +-0 and subnormals ---- */

/* Scores are (nearly) 0, so O is the mean of the visible V rows: against the float64
   reference, within a few roundings of max |V|. */
static void tiny_case(fa_dtype dt, double tiny, int64_t d, int causal) {
    prob p, ref;
    const int64_t n = 70;
    prob_init(&p, dt, n, n, d);
    prob_init(&ref, dt, n, n, d);
    tk_rng r;
    tk_rng_init(&r, 7 + (uint64_t)d);
    for (int64_t i = 0; i < n * d; i++) {
        const double sgn = (i % 3) ? 1.0 : -1.0;
        p.q[i] = rep(dt, (i % 5 == 0) ? -0.0 : sgn * tiny * (1 + (double)(i % 4)));
        p.k[i] = rep(dt, (i % 7 == 0) ? 0.0 : -sgn * tiny * (1 + (double)(i % 3)));
        p.v[i] = rep(dt, (i % 2) ? -0.0 : sgn * tiny * (double)(1 + i % 6));
        p.dout[i] = rep(dt, tk_rng_uniform(&r) - 0.5);
    }
    memcpy(ref.q, p.q, (size_t)(n * d) * 8), memcpy(ref.k, p.k, (size_t)(n * d) * 8);
    memcpy(ref.v, p.v, (size_t)(n * d) * 8), memcpy(ref.dout, p.dout, (size_t)(n * d) * 8);
    fa_params prm = fa_params_default();
    prm.causal = causal;
    run(&p, FA_ALGO_AUTO, &prm, 1);
    run(&ref, FA_ALGO_NAIVE, &prm, 1);
    expect_finite(&p, 1, "+-0 / subnormal");
    for (int64_t i = 0; i < n * d; i++)
        if (fabs(p.o[i] - ref.o[i]) > 6 * tiny + 1e-300 || fabs(p.dv[i] - ref.dv[i]) > 1e-2)
            fail_msg("+-0 / subnormal %s d %lld: O %g (ref %g), dV %g (ref %g) at %lld",
                     dtn(dt), (long long)d, p.o[i], ref.o[i], p.dv[i], ref.dv[i], (long long)i);
    for (int64_t i = 0; i < n; i++)
        if (fabs(p.lse[i] - ref.lse[i]) > 1e-3 * (1 + fabs(ref.lse[i])))
            fail_msg("+-0 / subnormal %s: LSE %g, ref %g", dtn(dt), p.lse[i], ref.lse[i]);
    prob_free(&p), prob_free(&ref);
}

static void zeros_subnormals(void **state) {
    (void)state;
    for (int causal = 0; causal < 2; causal++)
        for (int64_t d = 8; d <= 40; d += 32) {
            tiny_case(FA_DTYPE_F32, 1e-40, d, causal);    /* fp32 subnormals */
            tiny_case(FA_DTYPE_F32, 0.0, d, causal);      /* all +-0 */
            tiny_case(FA_DTYPE_F16, 0x1p-20, d, causal);  /* fp16 subnormals */
            tiny_case(FA_DTYPE_BF16, 1e-39, d, causal);   /* bf16 subnormals */
        }
}

/* ---- NaN and Inf behind the mask ---- */

enum { IN_Q, IN_K, IN_V, IN_DO };

/* Sets element x of row t of operand `in` to val. */
static void poke(prob *p, int in, int64_t t, int64_t x, double val) {
    double *a = in == IN_Q ? p->q : in == IN_K ? p->k : in == IN_V ? p->v : p->dout;
    a[t * p->d + x] = val;
}

/* Whether row i sees key j under prm (square, bottom-right aligned: c(i) = i). */
static int sees(const fa_params *prm, int64_t i, int64_t j) {
    int64_t wl = prm->window_left, wr = prm->causal ? 0 : prm->window_right;
    return (wl < 0 || j >= i - wl) && (wr < 0 || j <= i + wr);
}

/*
 * A special value at row t of operand `in`, against the same problem without it: every output
 * the rule says it cannot reach is finite and equal (to a few roundings) to the clean run's.
 * Reached: a key's K/V reaches the rows that see it (O, LSE, dQ), its own dK, dV and through
 * those rows the dK, dV of the keys they see; a query's Q/dO reaches its own O, LSE, dQ and the
 * dK, dV of the keys it sees. algo NAIVE: the reference.
 */
static void masked_case(fa_dtype dt, fa_algo algo, int64_t n, int64_t d, const fa_params *prm,
                        int in, int64_t t, double val, int bwd) {
    prob a, b;
    prob_init(&a, dt, n, n, d);
    prob_init(&b, dt, n, n, d);
    tk_rng r;
    tk_rng_init(&r, 31 + (uint64_t)(n * d));
    fill(a.q, n * d, dt, &r, -1, 1), fill(a.k, n * d, dt, &r, -1, 1);
    fill(a.v, n * d, dt, &r, -1, 1), fill(a.dout, n * d, dt, &r, -1, 1);
    memcpy(b.q, a.q, (size_t)(n * d) * 8), memcpy(b.k, a.k, (size_t)(n * d) * 8);
    memcpy(b.v, a.v, (size_t)(n * d) * 8), memcpy(b.dout, a.dout, (size_t)(n * d) * 8);
    poke(&b, in, t, d / 2, val);
    run(&a, algo, prm, bwd);
    run(&b, algo, prm, bwd);
    static const char *names[] = {"Q", "K", "V", "dO"};
    const int key = in == IN_K || in == IN_V;
    const double tol = algo == FA_ALGO_NAIVE ? 1e-12 : 1e-5;
#define SAME(x, y) (isfinite(y) && fabs((x) - (y)) <= tol * (1 + fabs(x)))
    for (int64_t i = 0; i < n; i++) { /* query rows */
        const int reached = key ? sees(prm, i, t) : i == t;
        if (reached) continue;
        int ok = SAME(a.lse[i], b.lse[i]);
        for (int64_t x = 0; x < d; x++) {
            ok &= SAME(a.o[i * d + x], b.o[i * d + x]);
            if (bwd) ok &= SAME(a.dq[i * d + x], b.dq[i * d + x]);
        }
        if (!ok)
            fail_msg("%s %s n %lld d %lld: %g in %s row %lld reached query row %lld it cannot "
                     "reach (O %g, LSE %g, dQ %g; clean %g, %g, %g)",
                     algo == FA_ALGO_NAIVE ? "naive" : "tiled", dtn(dt), (long long)n,
                     (long long)d, val, names[in], (long long)t, (long long)i, b.o[i * d + d / 2],
                     b.lse[i], b.dq[i * d + d / 2], a.o[i * d + d / 2], a.lse[i],
                     a.dq[i * d + d / 2]);
    }
    for (int64_t j = 0; bwd && j < n; j++) { /* keys */
        /* a key's special poisons the rows that see it (their P, D, dS), and through them
           the dK, dV of every key those rows see */
        int reached = key ? j == t : sees(prm, t, j);
        for (int64_t i = 0; key && !reached && i < n; i++)
            reached = sees(prm, i, t) && sees(prm, i, j);
        if (reached) continue;
        int ok = 1;
        for (int64_t x = 0; x < d; x++)
            ok &= SAME(a.dk[j * d + x], b.dk[j * d + x]) && SAME(a.dv[j * d + x], b.dv[j * d + x]);
        if (!ok)
            fail_msg("%s %s n %lld d %lld: %g in %s row %lld reached dK/dV of key %lld "
                     "(dK %g dV %g; clean %g %g)",
                     algo == FA_ALGO_NAIVE ? "naive" : "tiled", dtn(dt), (long long)n,
                     (long long)d, val, names[in], (long long)t, (long long)j, b.dk[j * d + d / 2],
                     b.dv[j * d + d / 2], a.dk[j * d + d / 2], a.dv[j * d + d / 2]);
    }
#undef SAME
    prob_free(&a), prob_free(&b);
}

/* The masked cases in dtypes dts, with `base`'s other parameters (e.g. deterministic): head
   dim ds[1] for the causal key at 100, ds[2] for the windowed query row, ds[0] for the rest
   (16, 40 and 24 on the CPU). */
static void masked_cases(fa_algo algo, int bwd, const fa_dtype *dts, size_t ndt,
                         const int64_t ds[3], const fa_params *base) {
    static const double vals[] = {NAN, INFINITY, -INFINITY};
    fa_params causal = *base, window = *base;
    causal.causal = 1;
    window.window_left = 5;
    window.window_right = 3;
    for (size_t di = 0; di < ndt; di++)
        for (size_t vi = 0; vi < 3; vi++) {
            const fa_dtype dt = dts[di];
            const double v = vals[vi];
            /* the case: causal, 130 tokens, key 129 shares a tile with row 128 */
            for (int in = IN_K; in <= IN_V; in++) {
                masked_case(dt, algo, 130, ds[0], &causal, in, 129, v, bwd);
                masked_case(dt, algo, 130, ds[1], &causal, in, 100, v, bwd);
                masked_case(dt, algo, 130, ds[0], &window, in, 70, v, bwd);
            }
            /* a query row's specials must not reach the keys it cannot see */
            for (int in = IN_Q; bwd && in <= IN_DO; in += IN_DO - IN_Q) {
                masked_case(dt, algo, 130, ds[0], &causal, in, 1, v, bwd);
                masked_case(dt, algo, 130, ds[2], &window, in, 66, v, bwd);
            }
        }
}

static void masked_specials_algo(fa_algo algo, int bwd) {
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    static const int64_t ds[3] = {16, 40, 24};
    const fa_params base = fa_params_default();
    masked_cases(algo, bwd, dts, algo == FA_ALGO_NAIVE ? 1u : 3u, ds, &base);
}

static void masked_forward(void **state) {
    (void)state;
    masked_specials_algo(FA_ALGO_AUTO, 0);
}

static void masked_backward(void **state) {
    (void)state;
    static const char *sched[] = {"one-pass", "two-pass"};
    for (int s = 0; s < 2; s++) {
        setenv("FLASHATTN_CPU_BWD_SCHEDULE", sched[s], 1);
        masked_specials_algo(FA_ALGO_AUTO, 1);
    }
    unsetenv("FLASHATTN_CPU_BWD_SCHEDULE");
}

static void masked_reference(void **state) {
    (void)state;
    masked_specials_algo(FA_ALGO_NAIVE, 1);
}

/* ---- NaN in a visible key ---- */

/* NaN in V[t][x] makes column x of the O rows that see t NaN and leaves the other columns;
   NaN in K[t] makes the O and LSE of those rows NaN. */
static void visible_nan(void **state) {
    (void)state;
    fa_params prm = fa_params_default();
    prm.causal = 1;
    const int64_t n = 130, d = 16, t = 100, x0 = d / 2;
    for (fa_algo algo = FA_ALGO_AUTO; algo <= FA_ALGO_NAIVE; algo++)
        for (int in = IN_K; in <= IN_V; in++) {
            prob p;
            prob_init(&p, FA_DTYPE_F32, n, n, d);
            tk_rng r;
            tk_rng_init(&r, 5);
            fill(p.q, n * d, p.dt, &r, -1, 1), fill(p.k, n * d, p.dt, &r, -1, 1);
            fill(p.v, n * d, p.dt, &r, -1, 1);
            poke(&p, in, t, x0, NAN);
            run(&p, algo, &prm, 0);
            for (int64_t i = t; i < n; i++)
                for (int64_t x = 0; x < d; x++) {
                    const int want_nan = in == IN_K || x == x0;
                    if (want_nan != !!isnan(p.o[i * d + x]) ||
                        (in == IN_K) != !!isnan(p.lse[i]))
                        fail_msg("algo %d: NaN in %s of key %lld: row %lld col %lld: O %g LSE %g",
                                 (int)algo, in == IN_K ? "K" : "V", (long long)t, (long long)i,
                                 (long long)x, p.o[i * d + x], p.lse[i]);
                }
            prob_free(&p);
        }
}

/* ---- KV cache ---- */

/* The decode path: huge magnitudes give finite O and LSE; a special value in a cache row the
   rows cannot see (past a query's causal diagonal, or past the sequence's length) does not
   reach them. */
static void kv_run(fa_dtype dt, int64_t len, int64_t sq, int64_t d, const double *q,
                   const double *k, const double *v, int splits, double *o, double *lse) {
    fa_context *c = ctx_new(FA_ALGO_AUTO);
    const fa_device dev = where(FA_ALGO_AUTO);
    const int64_t cap = len + 16;
    const size_t es = fa_dtype_size(dt), nq = (size_t)(sq * d) * es, nc = (size_t)(cap * d) * es;
    void *bq = to_dt(dt, q, sq * d), *bk = to_dt(dt, k, cap * d), *bv = to_dt(dt, v, cap * d);
    void *bo = malloc((size_t)(sq * d) * 4 + 1);
    float *bl = malloc((size_t)sq * 4);
    int32_t seqlens[1] = {(int32_t)len};
    void *mq = mirror(FA_ALGO_AUTO, bq, nq), *mk = mirror(FA_ALGO_AUTO, bk, nc);
    void *mv = mirror(FA_ALGO_AUTO, bv, nc), *mo = mirror(FA_ALGO_AUTO, bo, nq);
    void *ml = mirror(FA_ALGO_AUTO, bl, (size_t)sq * 4);
    void *ms = mirror(FA_ALGO_AUTO, seqlens, sizeof seqlens);
    fa_kvcache kc;
    memset(&kc, 0, sizeof kc);
    kc.k = fa_tensor_bshd(mk, dt, dev, 1, cap, 1, d);
    kc.v = fa_tensor_bshd(mv, dt, dev, 1, cap, 1, d);
    kc.seqlens = ms;
    fa_tensor tq = fa_tensor_bshd(mq, dt, dev, 1, sq, 1, d);
    fa_tensor to = fa_tensor_bshd(mo, dt, dev, 1, sq, 1, d);
    fa_tensor tl = fa_tensor_3d(ml, FA_DTYPE_F32, dev, 1, 1, sq);
    fa_params prm = fa_params_default();
    prm.causal = 1;
    assert_int_equal(fa_fwd_kvcache(c, &tq, &kc, NULL, NULL, &prm, splits, &to, &tl), FA_OK);
    unmirror(bq, mq, nq), unmirror(bk, mk, nc), unmirror(bv, mv, nc), unmirror(bo, mo, nq);
    unmirror(bl, ml, (size_t)sq * 4), unmirror(seqlens, ms, sizeof seqlens);
    assert_int_equal(fa_context_check(c), FA_OK);
    from_dt(dt, bo, o, sq * d);
    for (int64_t i = 0; i < sq; i++) lse[i] = bl[i];
    free(bq), free(bk), free(bv), free(bo), free(bl);
    fa_context_destroy(c);
}

/* Q and K uniform in +-mag (V in +-1), the cache call of `splits`: every row of O and LSE
   finite. The draws come from r, which the caller may go on using. */
static void kv_huge(const char *who, fa_dtype dt, double mag, int64_t len, int64_t sq, int64_t d,
                    int splits, tk_rng *r, double *q, double *k, double *v, double *o,
                    double *lse) {
    const int64_t cap = len + 16;
    fill(q, sq * d, dt, r, -mag, mag);
    fill(k, cap * d, dt, r, -mag, mag);
    fill(v, cap * d, dt, r, -1, 1);
    kv_run(dt, len, sq, d, q, k, v, splits, o, lse);
    for (int64_t i = 0; i < sq; i++)
        if (!all_finite(o + i * d, d) || !isfinite(lse[i]))
            fail_msg("%skvcache %s d %lld splits %d |Q|,|K| <= %g: row %lld not finite", who,
                     dtn(dt), (long long)d, splits, mag, (long long)i);
}

/* A special value in a cache row the rows cannot see: rows 0..2 of 4 queries see keys up to
   126..128 of len 130 (key 129 only row 3), and row 135 lies past the length: a NaN in K or V
   of key 129 and an Inf in row 135 leave rows 0..2 as they were (sq <= 4). */
static void kv_masked(const char *who, fa_dtype dt, int64_t len, int64_t sq, int64_t d,
                      int splits, tk_rng *r) {
    const int64_t cap = len + 16;
    double *q = calloc((size_t)(sq * d), 8), *k = calloc((size_t)(cap * d), 8);
    double *v = calloc((size_t)(cap * d), 8), *o = calloc((size_t)(sq * d), 8);
    double *o2 = calloc((size_t)(sq * d), 8), lse[4], lse2[4];
    fill(q, sq * d, dt, r, -1, 1);
    fill(k, cap * d, dt, r, -1, 1);
    fill(v, cap * d, dt, r, -1, 1);
    kv_run(dt, len, sq, d, q, k, v, splits, o, lse);
    for (int in = IN_K; in <= IN_V; in++) {
        double *a = in == IN_K ? k : v;
        const double keep = a[129 * d + 1], keep2 = a[135 * d];
        a[129 * d + 1] = NAN;
        a[135 * d] = INFINITY;
        kv_run(dt, len, sq, d, q, k, v, splits, o2, lse2);
        a[129 * d + 1] = keep, a[135 * d] = keep2;
        for (int64_t i = 0; i < 3; i++) {
            int ok = lse2[i] == lse2[i] && fabs(lse2[i] - lse[i]) <= 1e-5;
            for (int64_t x = 0; x < d; x++)
                ok &= isfinite(o2[i * d + x]) && fabs(o2[i * d + x] - o[i * d + x]) <= 1e-5;
            if (!ok)
                fail_msg("%skvcache %s d %lld splits %d: NaN in %s of key 129 reached row %lld "
                         "(O %g, LSE %g)",
                         who, dtn(dt), (long long)d, splits, in == IN_K ? "K" : "V",
                         (long long)i, o2[i * d + 1], lse2[i]);
        }
    }
    free(q), free(k), free(v), free(o), free(o2);
}

static void kvcache_special(void **state) {
    (void)state;
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    static const double mags[] = {1e5, 6e4, 1e5};
    const int64_t len = 130, sq = 4, cap = len + 16;
    for (size_t di = 0; di < 3; di++)
        for (int64_t d = 8; d <= 40; d += 32)
            for (int splits = 1; splits <= 3; splits += 2) {
                const fa_dtype dt = dts[di];
                double *q = calloc((size_t)(sq * d), 8), *k = calloc((size_t)(cap * d), 8);
                double *v = calloc((size_t)(cap * d), 8), *o = calloc((size_t)(sq * d), 8);
                double lse[4];
                tk_rng r;
                tk_rng_init(&r, 77 + (uint64_t)d);
                kv_huge("", dt, mags[di], len, sq, d, splits, &r, q, k, v, o, lse);
                kv_masked("", dt, len, sq, d, splits, &r);
                free(q), free(k), free(v), free(o);
            }
}

/* ---- extreme softmax scales ---- */

/* The backward at a softmax scale far from 1, against the float64 reference: each gradient
   within tol of the largest of its kind. A tiny scale with huge K, V and dO: the unscaled
   sums dS K and dS Q reach 1e52, past fp32, while scale times them is finite (dQ near 1e9):
   dS must take the scale before its products (fuzz finding bwd-dq-nonfinite-1d39219f). A huge
   scale with tiny Q and K: there the sums take it after; with a tiny V and huge dO too, dQ
   near 1e30 (fuzz finding crash-29b28e08, the amx level). */
static void scale_case(fa_dtype dt, float scale, double mq, double mk, double mv, double mdo,
                       int64_t d, int causal, uint64_t seed, int q_off_zero) {
    const int64_t n = 70; /* two tiles of keys */
    prob p, ref;
    prob_init(&p, dt, n, n, d);
    prob_init(&ref, dt, n, n, d);
    tk_rng r;
    tk_rng_init(&r, seed);
    fill(p.q, n * d, dt, &r, -mq, mq);
    for (int64_t i = 0; q_off_zero && i < n * d; i++) /* |q| in [mq, 2 mq) */
        p.q[i] = rep(dt, copysign(mq + fabs(p.q[i]), p.q[i]));
    fill(p.k, n * d, dt, &r, -mk, mk);
    fill(p.v, n * d, dt, &r, -mv, mv);
    fill(p.dout, n * d, dt, &r, -mdo, mdo);
    memcpy(ref.q, p.q, (size_t)(n * d) * 8), memcpy(ref.k, p.k, (size_t)(n * d) * 8);
    memcpy(ref.v, p.v, (size_t)(n * d) * 8), memcpy(ref.dout, p.dout, (size_t)(n * d) * 8);
    fa_params prm = fa_params_default();
    prm.softmax_scale = scale;
    prm.causal = causal;
    run(&p, FA_ALGO_AUTO, &prm, 1);
    run(&ref, FA_ALGO_NAIVE, &prm, 1);
    char what[64];
    snprintf(what, sizeof what, "scale %g%s", (double)scale, causal ? " causal" : "");
    expect_finite(&p, 1, what);
    const double tol = dt == FA_DTYPE_F32 ? 1e-3 : 3e-2;
    /* a gradient under the dtype's smallest subnormal stores as 0 or it: off by up to that */
    const double tiny = dt == FA_DTYPE_F32 ? 0x1p-149 : 0x1p-133;
    const double *got[] = {p.o, p.dq, p.dk, p.dv}, *want[] = {ref.o, ref.dq, ref.dk, ref.dv};
    static const char *name[] = {"O", "dQ", "dK", "dV"};
    for (int g = 0; g < 4; g++) {
        double big = 0;
        for (int64_t i = 0; i < n * d; i++) big = fmax(big, fabs(want[g][i]));
        for (int64_t i = 0; i < n * d; i++)
            if (!(fabs(got[g][i] - want[g][i]) <= tol * big + tiny))
                fail_msg("%s %s d %lld: %s[%lld] = %g, reference %g (largest %g)", what,
                         dtn(dt), (long long)d, name[g], (long long)i, got[g][i], want[g][i],
                         big);
    }
    prob_free(&p), prob_free(&ref);
}

static void scale_extremes(void **state) {
    (void)state;
    static const char *sched[] = {"one-pass", "two-pass"};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int s = 0; s < 2; s++) {
        setenv("FLASHATTN_CPU_BWD_SCHEDULE", sched[s], 1);
        for (int t = 0; t < 2; t++)
            for (int64_t d = 8; d <= 40; d += 32)
                for (int causal = 0; causal < 2; causal++) {
                    const uint64_t sd = 600 + (uint64_t)(s * 8 + t * 4 + causal) + (uint64_t)d;
                    scale_case(dts[t], 0x1p-140f, 1, 1e15, 1e12, 1e22, d, causal, sd, 0);
                    scale_case(dts[t], 0x1p100f, 1e-20, 1e-20, 1, 1, d, causal, sd, 0);
                    /* and a tiny V (the amx level's fp32 split scales it by 2^63) */
                    scale_case(dts[t], 0x1p100f, 1e-25, 1e-5, 1e-30, 1e36, d, causal, sd, 0);
                }
    }
    unsetenv("FLASHATTN_CPU_BWD_SCHEDULE");
}

/* A huge K with tiny dO and V: the exact dQ is ~1e8, but the amx level's fp32 backward scales
   dO and V by 2^50 each before its split, and dS carries both into sum dS K (K ~3e38), which
   would overflow without split_muls_of's cap (bwd_amx.c). Q of 2^-126 to 2^-125 (no zeros)
   keeps the scores near 1, so the softmax is not one-hot and dS is not only rounding noise;
   Q's split parts under 2^-126 read as zero at the amx level unless Q is scaled too
   (split_qk_scales; without, dQ erred 1e-3 of its size). Every level runs it. */
static void split_scale_range(void **state) {
    (void)state;
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int t = 0; t < 2; t++)
        for (int64_t d = 8; d <= 72; d += 32)
            for (int causal = 0; causal < 2; causal++)
                scale_case(dts[t], 0.125f, 0x1p-126, 3e38, 0x1.ep-50, 0x1.ep-50, d, causal,
                           700 + (uint64_t)(t * 2 + causal) + (uint64_t)d, 1);
}

/* ---- the CUDA kernels (test_special cuda) ---- */

static const int64_t cuda_ds[] = {8, 40, 64, 128, 256};

static void cuda_huge_forward(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cuda_ds / sizeof *cuda_ds; i++)
        for (int causal = 0; causal < 2; causal++) {
            const uint64_t s = 300 + i * 2 + (uint64_t)causal;
            huge_case(FA_DTYPE_F16, 6e4, cuda_ds[i], causal, 0, s);
            huge_case(FA_DTYPE_BF16, 1e5, cuda_ds[i], causal, 0, s);
            huge_case(FA_DTYPE_BF16, 1e18, cuda_ds[i], causal, 0, s);
        }
}

static void cuda_huge_backward(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cuda_ds / sizeof *cuda_ds; i++)
        for (int causal = 0; causal < 2; causal++) {
            const uint64_t s = 400 + i * 2 + (uint64_t)causal;
            huge_case(FA_DTYPE_F16, 6e4, cuda_ds[i], causal, 1, s);
            huge_case(FA_DTYPE_BF16, 1e5, cuda_ds[i], causal, 1, s);
        }
}

/* The decode kernel, split or not, on huge scores: every row finite. */
static void cuda_huge_kvcache(void **state) {
    (void)state;
    static const fa_dtype dts[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    static const double mags[] = {6e4, 1e5};
    const int64_t len = 130, sq = 4, cap = len + 16;
    for (size_t di = 0; di < 2; di++)
        for (size_t i = 0; i < sizeof cuda_ds / sizeof *cuda_ds; i++)
            for (int splits = 1; splits <= 3; splits += 2) {
                const fa_dtype dt = dts[di];
                const int64_t d = cuda_ds[i];
                double *q = calloc((size_t)(sq * d), 8), *k = calloc((size_t)(cap * d), 8);
                double *v = calloc((size_t)(cap * d), 8), *o = calloc((size_t)(sq * d), 8);
                double lse[4];
                tk_rng r;
                tk_rng_init(&r, 500 + (uint64_t)d);
                kv_huge("cuda ", dt, mags[di], len, sq, d, splits, &r, q, k, v, o, lse);
                free(q), free(k), free(v), free(o);
            }
}

/* NaN and Inf behind the mask on the CUDA kernels, atomic and deterministic dQ, by mode:
   - "cuda": at head dims of every sm80 kernel (d 16 and 24 pad to 32, 40 to 64, 120 to 128,
     200 to 256), which the sm80 kernels serve on every GPU. The Hopper forward (sm90, exactly
     d 64, 128 and 256) and the Hopper backward at d 64 and 128 do not keep the rule yet
     (issue 42, finding 4; docs/masked_specials_cuda.md), so these leave those head dims out;
   - "cuda-sm80": the Hopper kernels off, and d 64, 128 and 256 added;
   - "cuda-sm90-bwd": the Hopper forward off and the Hopper backward on (the record says it
     ran), at d 256. */
enum { CUDA_DEFAULT, CUDA_SM80, CUDA_SM90_BWD };
static int g_cuda_mode;

static void cuda_masked(void **state) {
    (void)state;
    static const fa_dtype dts[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    static const int64_t ds[][3] = {{16, 40, 24},    {96, 96, 96},    {120, 120, 120},
                                    {192, 192, 192}, {200, 200, 200}, {64, 64, 64},
                                    {128, 128, 128}, {256, 256, 256}};
    const size_t first = g_cuda_mode == CUDA_SM90_BWD ? 7 : 0;
    const size_t end = g_cuda_mode == CUDA_DEFAULT ? 5 : 8;
    for (int det = 0; det < 2; det++) {
        fa_params base = fa_params_default();
        base.deterministic = det;
        for (size_t i = first; i < end; i++) masked_cases(FA_ALGO_AUTO, 1, dts, 2, ds[i], &base);
    }
}

/* The decode kernel (sm80 on every GPU), split or not. */
static void cuda_masked_kvcache(void **state) {
    (void)state;
    static const fa_dtype dts[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t di = 0; di < 2; di++)
        for (size_t i = 0; i < sizeof cuda_ds / sizeof *cuda_ds; i++)
            for (int splits = 1; splits <= 3; splits += 2) {
                tk_rng r;
                tk_rng_init(&r, 900 + (uint64_t)cuda_ds[i]);
                kv_masked("cuda ", dts[di], 130, 4, cuda_ds[i], splits, &r);
            }
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "cuda") == 0 || strcmp(argv[1], "cuda-sm80") == 0 ||
                     strcmp(argv[1], "cuda-sm90-bwd") == 0)) {
        g_cuda_mode = strcmp(argv[1], "cuda-sm80") == 0       ? CUDA_SM80
                      : strcmp(argv[1], "cuda-sm90-bwd") == 0 ? CUDA_SM90_BWD
                                                              : CUDA_DEFAULT;
        /* read at context creation */
        if (g_cuda_mode == CUDA_SM80) setenv("FLASHATTN_CUDA_SM90", "0", 1);
        if (g_cuda_mode == CUDA_SM90_BWD) setenv("FLASHATTN_CUDA_SM90_FWD", "0", 1);
        fa_context *c = NULL;
        if (!tk_device_available() || fa_context_create(&c, FA_BACKEND_CUDA) != FA_OK) {
            fprintf(stderr, "test_special %s: no CUDA device or no device support built in\n",
                    argv[1]);
            return 77;
        }
        fa_context_destroy(c);
        g_cuda = 1;
        if (g_cuda_mode == CUDA_SM90_BWD) {
            if (tk_device_cc_major() != 9) {
                fprintf(stderr, "test_special %s: not a Hopper GPU\n", argv[1]);
                return 77;
            }
            g_bwd_kernel = "sm90_bwd";
            const struct CMUnitTest sm90[] = {cmocka_unit_test(cuda_masked)};
            return cmocka_run_group_tests(sm90, NULL, NULL);
        }
        const struct CMUnitTest cuda[] = {
            cmocka_unit_test(cuda_huge_forward), cmocka_unit_test(cuda_huge_backward),
            cmocka_unit_test(cuda_huge_kvcache), cmocka_unit_test(cuda_masked),
            cmocka_unit_test(cuda_masked_kvcache)};
        return cmocka_run_group_tests(cuda, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(huge_forward),     cmocka_unit_test(huge_backward),
        cmocka_unit_test(zeros_subnormals), cmocka_unit_test(masked_forward),
        cmocka_unit_test(masked_backward),  cmocka_unit_test(masked_reference),
        cmocka_unit_test(visible_nan),      cmocka_unit_test(kvcache_special),
        cmocka_unit_test(scale_extremes),   cmocka_unit_test(split_scale_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
