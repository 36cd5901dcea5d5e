/*
 * tk_case.c — runs one attention case under the correctness rule (docs/architecture.md).
 *
 * Three runs share the same random inputs, rounded to the case's precision P:
 *   reference  FA_ALGO_NAIVE on f64 copies (exact inputs, fp64 arithmetic: the truth);
 *   baseline   FA_ALGO_PLAIN on the P inputs (what a plain framework implementation gets);
 *   kernel     the algorithm under test (FA_ALGO_AUTO) on the P inputs, possibly on a device.
 * The kernel's max and mean error against the reference must be within 2x the baseline's plus
 * a small slack, for O, LSE and, when asked, dQ, dK, dV. Every output is poisoned first and
 * checked to be fully written (and not written outside its view).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

/* ---- slack of the rule ---- */

/*
 * Slack = 4 * u_P * max(1, max|ref|), u_P the unit roundoff of the case's precision.
 * Why this size: every value a kernel stores in P carries up to u_P * |x| of rounding it
 * cannot avoid. The 2x baseline term normally covers it, but the baseline can be exact by
 * luck (seqlen_k = 1 makes O = V and the gradients exactly 0 for the plain implementation)
 * while a correct kernel takes another, equally valid rounding path (D_i = rowsum(dO * O) from
 * the rounded O). Such noise is of the order of u_P times the data, and the data are unit
 * normals, hence the floor of 1. Four roundings of headroom is still orders of magnitude below
 * what any real bug produces (a wrong mask, scale or rescaling errs by 1e-2 .. 1).
 * For fp32 outputs of magnitude ~3 this is ~7e-7 absolute.
 */
static double rule_slack(fa_dtype precision, double ref_max) {
    return 4.0 * tk_unit_roundoff(precision) * (ref_max > 1.0 ? ref_max : 1.0);
}

int tk_rule(const tk_err *kernel, const tk_err *base, fa_dtype precision, double extra,
            double *slack) {
    double s = rule_slack(precision, kernel->ref_max) + extra;
    if (slack) *slack = s;
    return kernel->nonfinite == 0 && base->nonfinite == 0 &&
           kernel->max_abs <= 2.0 * base->max_abs + s &&
           kernel->mean_abs <= 2.0 * base->mean_abs + s;
}

/*
 * The extra slack of the gradients, two terms.
 *
 * D term (dQ, dK). A FlashAttention backward computes dS = P * (dP - D) with
 * D_i = rowsum(dO_i * O_i) taken from the stored O (the header prescribes it), while a plain
 * implementation uses D_i = sum_j P_ij dP_ij. Exactly, the two agree; in fp32 each is a
 * length-d sum whose rounding error is a few u_f32 * sum_x |dO_ix O_ix| (the worst case is d
 * times that), and the two roundings are independent. Where the exact dS vanishes (a row that
 * sees one key: seqlen_k = 1, the first causal row, a diagonal-only window) the plain baseline
 * is exact and the kernel is left with that noise alone:
 *   dQ_i = scale * sum_j dS_ij K_j   errs by about scale * dD_i * max|K|  (sum_j P_ij = 1),
 *   dK_j = scale * sum_i dS_ij Q_i   sums up to n_rows such errors of random sign,
 * so extra_dq = 8 u_f32 Dmag scale max|K| and extra_dk = the same with max|Q| * sqrt(n_rows),
 * Dmag = max_i sum_x |dO_ix O_ix|. dV does not involve D.
 *
 * P term (dQ, dK, dV). The backward rebuilds P = exp(scale * s - LSE) from the fp32 LSE, the
 * baseline takes exp(scale * s - max) / sum: the argument of each exp carries about
 * u_f32 * (|scale * s| + |LSE|) of rounding, which is P's relative error, and the kernel's and
 * the baseline's are independent. Summed over many rows the errors of random sign average out
 * in both; where one product makes a gradient element (a single query row, as seqlen_q = 1,
 * with dV_j = P_j dO scaled by dropout's 1 / (1 - p)) the baseline may round that element
 * almost exactly and the kernel may not (seen: dV 12 u against the baseline's 3.4 u of
 * max|dV|, at seqlen_q 1, f32, dropout 0.9). Hence extra_g += u_f32 * (Smag + Lmag) * max|g|,
 * Smag = scale * max_i |Q_i| * max_j |K_j| (2-norms over d, Cauchy-Schwarz bounds every
 * score), Lmag = max |LSE| over rows that see a key.
 * Accumulation is fp32 in every precision, hence u_f32; in f16/bf16 both terms are small next
 * to the storage slack.
 */
static double max_abs(const fa_tensor *t) {
    double m = 0;
    int64_t n = tk_numel(t);
    for (int64_t i = 0; i < n; i++)
        if (fabs(tk_get(t, i)) > m) m = fabs(tk_get(t, i));
    return m;
}

/* the largest 2-norm of a row of d elements */
static double max_row_norm(const fa_tensor *t, int d) {
    double m = 0;
    int64_t rows = tk_numel(t) / d;
    for (int64_t row = 0; row < rows; row++) {
        double s = 0;
        for (int x = 0; x < d; x++) s += tk_get(t, row * d + x) * tk_get(t, row * d + x);
        if (s > m) m = s;
    }
    return sqrt(m);
}

tk_grad_slack tk_grad_extra(const tk_grad_ref *ref, int d, double scale, int64_t n_rows) {
    const double u = tk_unit_roundoff(FA_DTYPE_F32);
    double dmag = 0;
    int64_t rows = tk_numel(ref->o) / d;
    for (int64_t row = 0; row < rows; row++) {
        double s = 0;
        for (int x = 0; x < d; x++)
            s += fabs(tk_get(ref->dout, row * d + x) * tk_get(ref->o, row * d + x));
        if (s > dmag) dmag = s;
    }
    double lmag = 0;
    for (int64_t i = 0, n = tk_numel(ref->lse); i < n; i++) {
        double l = fabs(tk_get(ref->lse, i));
        if (isfinite(l) && l > lmag) lmag = l; /* -inf: a row that sees no key */
    }
    const double base = 8.0 * u * dmag * scale;
    const double rel = u * (scale * max_row_norm(ref->q, d) * max_row_norm(ref->k, d) + lmag);
    return (tk_grad_slack){
        .dq = base * max_abs(ref->k) + rel * max_abs(ref->dq),
        .dk = base * max_abs(ref->q) * sqrt((double)n_rows) + rel * max_abs(ref->dk),
        .dv = rel * max_abs(ref->dv),
    };
}

/* ---- ALiBi slopes ---- */

float *tk_alibi_slopes(int kind, int64_t batch, int hq, tk_rng *r, size_t *len, int64_t *stride) {
    /* The usual geometric slopes 2^(-8(h+1)/H); per batch, each row scaled by a random factor,
       with a gap after each row so the batch stride is not just heads_q. */
    int64_t rows = kind == TK_ALIBI_BATCH ? batch : 1;
    *stride = kind == TK_ALIBI_BATCH ? hq + 3 : 0;
    *len = (size_t)(rows == 1 ? hq : rows * *stride);
    float *s = malloc(*len * sizeof(float));
    if (!s) return NULL;
    for (size_t i = 0; i < *len; i++) s[i] = NAN; /* gaps: never read */
    for (int64_t b = 0; b < rows; b++)
        for (int h = 0; h < hq; h++) {
            double f = rows > 1 ? 0.5 + tk_rng_uniform(r) : 1.0;
            s[b * *stride + h] = (float)(f * exp2(-8.0 * (h + 1) / hq));
        }
    return s;
}

/* ---- messages ---- */

#define addf tk_report_addf

void tk_report_addf(tk_report *r, const char *fmt, ...) {
    size_t n = strlen(r->msg);
    if (n + 1 >= sizeof r->msg) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg + n, sizeof r->msg - n, fmt, ap);
    va_end(ap);
}

void tk_case_format(const tk_case *c, char *buf, size_t len) {
    char tmp[512];
    size_t n = 0;
#define PUT(...) n += (size_t)snprintf(tmp + n, n < sizeof tmp ? sizeof tmp - n : 0, __VA_ARGS__)
    if (c->name) PUT("%s: ", c->name);
    if (c->varlen) {
        PUT("varlen b%d q[", c->batch);
        for (int b = 0; b < c->batch; b++) PUT("%s%d", b ? "," : "", c->lens_q[b]);
        PUT("] k[");
        for (int b = 0; b < c->batch; b++) PUT("%s%d", b ? "," : "", c->lens_k[b]);
        PUT("]");
    } else {
        PUT("b%d sq%lld sk%lld", c->batch, (long long)c->sq, (long long)c->sk);
    }
    PUT(" h%d/%d d%d %s", c->hq, c->hkv, c->d, fa_dtype_name(c->dtype));
    if (c->scale) PUT(" scale%g", (double)c->scale);
    if (c->causal) PUT(" causal");
    if (c->window) PUT(" window(%lld,%lld)", (long long)c->wl, (long long)c->wr);
    if (c->softcap) PUT(" softcap%g", (double)c->softcap);
    if (c->alibi) PUT(" alibi-%s", c->alibi == TK_ALIBI_BATCH ? "batch" : "head");
    if (c->strided) PUT(" strided");
    if (c->bwd) PUT(" +bwd");
    if (c->deterministic) PUT(" det");
    if (c->dropout_p > 0)
        PUT(" dropout%g(seed %llu, offset %llu)", (double)c->dropout_p,
            (unsigned long long)c->dropout_seed, (unsigned long long)c->dropout_offset);
#undef PUT
    snprintf(buf, len, "%s", tmp);
}

/* Logical multi-index of element i of t, as "(a,b,c,d)". */
static void fmt_index(const fa_tensor *t, int64_t i, char *buf, size_t len) {
    int64_t idx[4] = {0};
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = i % t->shape[d];
        i /= t->shape[d];
    }
    size_t n = 0;
    for (int d = 0; d < t->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? "," : "(", (long long)idx[d]);
    if (n < len) snprintf(buf + n, len - n, ")");
}

/* ---- the problem of a case ---- */

typedef struct problem {
    const tk_case *c;
    int varlen;
    int64_t tq, tk;          /* token counts (BSHD: seqlen) */
    int32_t cu_q[TK_MAX_BATCH + 1], cu_k[TK_MAX_BATCH + 1];
    float *slopes;
    size_t slopes_len;
    fa_params p;
    int64_t shape_q[4], shape_k[4], shape_lse[3];
    int nd;
} problem;

/* One precision's tensors. */
typedef struct set {
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
} set;

static void set_free(set *s) {
    tk_buf *all[] = {&s->q, &s->k, &s->v, &s->o, &s->lse, &s->dout, &s->dq, &s->dk, &s->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tk_buf_free(all[i]);
}

static int problem_init(problem *pb, const tk_case *c, tk_rng *r, char *err, size_t errlen) {
    memset(pb, 0, sizeof *pb);
    pb->c = c;
    pb->varlen = c->varlen;
    if (c->batch < 1 || c->batch > TK_MAX_BATCH || c->hq < 1 || c->hkv < 1 || c->d < 1) {
        snprintf(err, errlen, "bad case: batch 1..%d, heads and d >= 1", TK_MAX_BATCH);
        return 1;
    }
    fa_params *p = &pb->p;
    *p = fa_params_default();
    p->softmax_scale = c->scale;
    p->causal = c->causal;
    if (c->window) {
        p->window_left = c->wl;
        p->window_right = c->wr;
    }
    p->softcap = c->softcap;
    p->deterministic = c->deterministic;
    p->dropout_p = c->dropout_p;
    p->dropout_seed = c->dropout_seed;
    p->dropout_offset = c->dropout_offset;
    if (c->varlen) {
        int64_t mq = 0, mk = 0;
        for (int b = 0; b < c->batch; b++) {
            pb->cu_q[b + 1] = pb->cu_q[b] + c->lens_q[b];
            pb->cu_k[b + 1] = pb->cu_k[b] + c->lens_k[b];
            if (c->lens_q[b] > mq) mq = c->lens_q[b];
            if (c->lens_k[b] > mk) mk = c->lens_k[b];
        }
        pb->tq = pb->cu_q[c->batch];
        pb->tk = pb->cu_k[c->batch];
        if (pb->tq < 1 || pb->tk < 1) {
            snprintf(err, errlen, "bad case: varlen needs >= 1 token in q and in k");
            return 1;
        }
        p->cu_seqlens_q = pb->cu_q;
        p->cu_seqlens_k = pb->cu_k;
        p->batch = c->batch;
        p->max_seqlen_q = mq;
        p->max_seqlen_k = mk;
        pb->nd = 3;
        int64_t sq[3] = {pb->tq, c->hq, c->d}, sk[3] = {pb->tk, c->hkv, c->d};
        int64_t sl[2] = {c->hq, pb->tq};
        memcpy(pb->shape_q, sq, sizeof sq);
        memcpy(pb->shape_k, sk, sizeof sk);
        memcpy(pb->shape_lse, sl, sizeof sl);
    } else {
        pb->tq = c->sq;
        pb->tk = c->sk;
        pb->nd = 4;
        int64_t sq[4] = {c->batch, c->sq, c->hq, c->d}, sk[4] = {c->batch, c->sk, c->hkv, c->d};
        int64_t sl[3] = {c->batch, c->hq, c->sq};
        memcpy(pb->shape_q, sq, sizeof sq);
        memcpy(pb->shape_k, sk, sizeof sk);
        memcpy(pb->shape_lse, sl, sizeof sl);
    }
    if (c->alibi) {
        int64_t stride;
        pb->slopes = tk_alibi_slopes(c->alibi, c->batch, c->hq, r, &pb->slopes_len, &stride);
        if (!pb->slopes) return 1;
        p->alibi_slopes = pb->slopes;
        p->alibi_batch_stride = stride;
    }
    return 0;
}

static int set_alloc(set *s, const problem *pb, fa_dtype dt, int strided, int align, int bwd,
                     tk_rng *r) {
    int nd = pb->nd;
    fa_dtype lse_dt = dt == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
#define ALLOC(buf, t, n, shape) tk_buf_alloc_aligned(&s->buf, t, n, shape, strided, align, r)
    int e = ALLOC(q, dt, nd, pb->shape_q) | ALLOC(k, dt, nd, pb->shape_k) |
            ALLOC(v, dt, nd, pb->shape_k) | ALLOC(o, dt, nd, pb->shape_q) |
            ALLOC(lse, lse_dt, nd - 1, pb->shape_lse);
    if (bwd)
        e |= ALLOC(dout, dt, nd, pb->shape_q) | ALLOC(dq, dt, nd, pb->shape_q) |
             ALLOC(dk, dt, nd, pb->shape_k) | ALLOC(dv, dt, nd, pb->shape_k);
#undef ALLOC
    return e;
}

static fa_context *make_ctx(fa_backend backend, fa_algo algo, int threads) {
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, backend) != FA_OK) return NULL;
    if (fa_context_set_algo(ctx, algo) != FA_OK ||
        (threads > 0 && fa_context_set_threads(ctx, threads) != FA_OK)) {
        fa_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* ---- running on host or device ---- */

/* Device copies of the problem's small host arrays, for the CUDA hook. */
typedef struct devarrays {
    void *cu_q, *cu_k, *slopes;
} devarrays;

static fa_params params_for(const problem *pb, const devarrays *dev) {
    fa_params p = pb->p;
    if (dev) {
        if (pb->varlen) {
            p.cu_seqlens_q = dev->cu_q;
            p.cu_seqlens_k = dev->cu_k;
        }
        if (pb->slopes) p.alibi_slopes = dev->slopes;
    }
    return p;
}

static fa_tensor view(tk_buf *b, int on_dev) { return on_dev ? tk_device_view(b) : b->t; }

static int upload(tk_buf **bufs, int n) {
    for (int i = 0; i < n; i++)
        if (tk_device_upload(bufs[i])) return 1;
    return 0;
}

static int download(tk_buf **bufs, int n) {
    for (int i = 0; i < n; i++)
        if (tk_device_download(bufs[i])) return 1;
    return 0;
}

static fa_status run_fwd(fa_context *ctx, const problem *pb, set *s, const devarrays *dev) {
    tk_poison(&s->o);
    tk_poison(&s->lse);
    int on = dev != NULL;
    tk_buf *io[] = {&s->q, &s->k, &s->v, &s->o, &s->lse};
    if (on && upload(io, 5)) return FA_ERR_CUDA;
    fa_params p = params_for(pb, dev);
    fa_tensor q = view(&s->q, on), k = view(&s->k, on), v = view(&s->v, on);
    fa_tensor o = view(&s->o, on), lse = view(&s->lse, on);
    fa_status st = fa_fwd(ctx, &q, &k, &v, &p, &o, &lse);
    tk_buf *outs[] = {&s->o, &s->lse};
    if (on && st == FA_OK && download(outs, 2)) return FA_ERR_CUDA;
    return st;
}

static fa_status run_bwd(fa_context *ctx, const problem *pb, set *s, const devarrays *dev) {
    tk_poison(&s->dq);
    tk_poison(&s->dk);
    tk_poison(&s->dv);
    int on = dev != NULL;
    tk_buf *io[] = {&s->dout, &s->dq, &s->dk, &s->dv}; /* q, k, v, o, lse are up already */
    if (on && upload(io, 4)) return FA_ERR_CUDA;
    fa_params p = params_for(pb, dev);
    fa_tensor q = view(&s->q, on), k = view(&s->k, on), v = view(&s->v, on);
    fa_tensor o = view(&s->o, on), lse = view(&s->lse, on), dout = view(&s->dout, on);
    fa_tensor dq = view(&s->dq, on), dk = view(&s->dk, on), dv = view(&s->dv, on);
    fa_status st = fa_bwd(ctx, &q, &k, &v, &o, &dout, &lse, &p, &dq, &dk, &dv);
    tk_buf *outs[] = {&s->dq, &s->dk, &s->dv};
    if (on && st == FA_OK && download(outs, 3)) return FA_ERR_CUDA;
    return st;
}

/* See the comment above tk_grad_extra. */
static tk_grad_slack grad_noise(const problem *pb, set *R) {
    const tk_case *c = pb->c;
    int64_t n_rows = c->sq;
    for (int b = 0; c->varlen && b < c->batch; b++)
        if (c->lens_q[b] > n_rows) n_rows = c->lens_q[b];
    n_rows *= c->hq / c->hkv;
    double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d);
    const tk_grad_ref ref = {&R->q.t,  &R->k.t,  &R->o.t,  &R->lse.t, &R->dout.t,
                             &R->dq.t, &R->dk.t, &R->dv.t};
    return tk_grad_extra(&ref, c->d, scale, n_rows);
}

/* ---- checks ---- */

/* Compares one output of kernel and baseline against the reference under the rule. */
static int judge(tk_report *r, int verbose, const char *what, tk_buf *kern, tk_buf *base,
                 tk_buf *ref, fa_dtype precision, double extra, tk_err out[2],
                 double *slack_used) {
    out[0] = tk_compare(&kern->t, &ref->t);
    out[1] = tk_compare(&base->t, &ref->t);
    double slack;
    int ok = tk_rule(&out[0], &out[1], precision, extra, &slack);
    *slack_used = slack;
    char at[64] = "";
    if (out[0].argmax >= 0) fmt_index(&ref->t, out[0].argmax, at, sizeof at);
    if (!ok || verbose)
        addf(r, "  %-3s %s kernel max %.3g mean %.3g | baseline max %.3g mean %.3g | "
                "allowed max %.3g mean %.3g (slack %.2g) | worst at %s\n",
             what, ok ? "ok  " : "FAIL", out[0].max_abs, out[0].mean_abs, out[1].max_abs,
             out[1].mean_abs, 2 * out[1].max_abs + slack, 2 * out[1].mean_abs + slack, slack, at);
    if (out[0].nonfinite) {
        fmt_index(&ref->t, out[0].first_nonfinite, at, sizeof at);
        addf(r, "      kernel has %d non-finite mismatches, first at %s: %g vs ref %g\n",
             out[0].nonfinite, at, tk_get(&kern->t, out[0].first_nonfinite),
             tk_get(&ref->t, out[0].first_nonfinite));
    }
    if (out[1].nonfinite)
        addf(r, "      baseline (FA_ALGO_PLAIN) has %d non-finite mismatches\n", out[1].nonfinite);
    return ok;
}

/* Rows that see no key: the reference's LSE is -inf there, and the kernel must give exactly
   O = 0 (forward) or dQ = 0 (backward) for them. */
static int check_empty_rows(tk_report *r, const problem *pb, const tk_buf *lse_ref,
                            const tk_buf *x, const char *what) {
    const tk_case *c = pb->c;
    int64_t rows = pb->varlen ? pb->tq : c->batch * c->sq;
    for (int64_t row = 0; row < rows; row++)
        for (int h = 0; h < c->hq; h++) {
            int64_t li = pb->varlen ? (int64_t)h * pb->tq + row
                                    : ((row / c->sq) * c->hq + h) * c->sq + row % c->sq;
            if (tk_get(&lse_ref->t, li) != -INFINITY) continue;
            for (int e = 0; e < c->d; e++) {
                double v = tk_get(&x->t, (row * c->hq + h) * c->d + e);
                if (v != 0) {
                    addf(r, "  %s of a row that sees no key is %g, must be 0 (token %lld head %d "
                            "element %d)\n",
                         what, v, (long long)row, h, e);
                    return 0;
                }
            }
        }
    return 1;
}

static int written(tk_report *r, const char *who, tk_buf **bufs, const char **names, int n) {
    for (int i = 0; i < n; i++) {
        char m[256], label[64];
        snprintf(label, sizeof label, "%s %s", who, names[i]);
        if (tk_check_written(bufs[i], label, m, sizeof m)) {
            addf(r, "  %s\n", m);
            return 0;
        }
    }
    return 1;
}

static void sel_name(fa_context *ctx, char *dst, size_t len) {
    const fa_selection *s = fa_last_selection(ctx);
    snprintf(dst, len, "%s", s ? s->kernel : "?");
}

/* ---- the case ---- */

tk_case tk_case_on(const tk_case *c, fa_backend backend) {
    tk_case r = *c;
    if (backend == FA_BACKEND_CUDA && r.dtype == FA_DTYPE_F32) r.dtype = FA_DTYPE_BF16;
    return r;
}

int tk_run_case(const tk_case *c, const tk_opts *opts, uint64_t seed, tk_report *r) {
    tk_opts defaults = {FA_BACKEND_CPU, FA_ALGO_AUTO, 0, 0};
    if (!opts) opts = &defaults;
    memset(r, 0, sizeof *r);
    char line[512];
    tk_case_format(c, line, sizeof line);
    addf(r, "%s [%s] seed %llu\n", line, opts->backend == FA_BACKEND_CUDA ? "cuda" : "cpu",
         (unsigned long long)seed);

    problem pb;
    memset(&pb, 0, sizeof pb);
    fa_context *kctx = make_ctx(opts->backend, opts->algo, opts->threads);
    if (!kctx) {
        r->status = TK_SKIP;
        addf(r, "  skipped: no context for this backend (%s)\n", fa_last_error(NULL));
        return r->status;
    }
    int on_dev = opts->backend == FA_BACKEND_CUDA;
    if (on_dev && !tk_device_available()) {
        fa_context_destroy(kctx);
        r->status = TK_SKIP;
        addf(r, "  skipped: testkit built without device-memory support\n");
        return r->status;
    }
    fa_context *nctx = make_ctx(FA_BACKEND_CPU, FA_ALGO_NAIVE, 0);
    fa_context *pctx = make_ctx(FA_BACKEND_CPU, FA_ALGO_PLAIN, 0);

    tk_rng rng;
    tk_rng_init(&rng, seed);
    set K, B, R; /* kernel, baseline, reference */
    memset(&K, 0, sizeof K);
    memset(&B, 0, sizeof B);
    memset(&R, 0, sizeof R);
    devarrays dev = {NULL, NULL, NULL};
    int ok = 1;
    fa_status st;
    char err[256];

    if (!nctx || !pctx) {
        addf(r, "  cannot create the reference contexts: %s\n", fa_last_error(NULL));
        ok = 0;
        goto done;
    }
    if (problem_init(&pb, c, &rng, err, sizeof err)) {
        addf(r, "  %s\n", err);
        ok = 0;
        goto done;
    }
    /* The kernel's tensors carry the case's strides; the baseline's and the reference's are
       contiguous copies of the same values (exact: every P value is a double). */
    /* on the GPU, rows must start on 16-byte boundaries: gaps of whole 8-element units; a head
       dim that is not a multiple of 8 the backend copies element by element (src/cuda/pad.h),
       so there any gap is allowed and the rows of a contiguous tensor are left unaligned */
    const int align = on_dev && c->d % 8 == 0 ? 8 : 1;
    if (set_alloc(&K, &pb, c->dtype, c->strided, align, c->bwd, &rng) ||
        set_alloc(&B, &pb, c->dtype, 0, 1, c->bwd, &rng) ||
        set_alloc(&R, &pb, FA_DTYPE_F64, 0, 1, c->bwd, &rng)) {
        addf(r, "  out of host memory\n");
        ok = 0;
        goto done;
    }
    tk_fill_normal(&K.q, &rng, 1.0);
    tk_fill_normal(&K.k, &rng, 1.0);
    tk_fill_normal(&K.v, &rng, 1.0);
    tk_copy(&B.q, &K.q);
    tk_copy(&B.k, &K.k);
    tk_copy(&B.v, &K.v);
    tk_copy(&R.q, &K.q);
    tk_copy(&R.k, &K.k);
    tk_copy(&R.v, &K.v);
    if (c->bwd) {
        tk_fill_normal(&K.dout, &rng, 1.0);
        tk_copy(&B.dout, &K.dout);
        tk_copy(&R.dout, &K.dout);
    }
    if (on_dev) {
        dev.cu_q = pb.varlen ? tk_device_copy_array(pb.cu_q, sizeof pb.cu_q) : NULL;
        dev.cu_k = pb.varlen ? tk_device_copy_array(pb.cu_k, sizeof pb.cu_k) : NULL;
        dev.slopes = pb.slopes ? tk_device_copy_array(pb.slopes, pb.slopes_len * sizeof(float))
                               : NULL;
    }

    /* forward */
    const char *fnames[] = {"out", "lse"};
    struct {
        const char *who;
        fa_context *ctx;
        set *s;
        const devarrays *dev;
    } runs[3] = {{"reference", nctx, &R, NULL},
                 {"baseline", pctx, &B, NULL},
                 {"kernel", kctx, &K, on_dev ? &dev : NULL}};
    for (int i = 0; i < 3 && ok; i++) {
        st = run_fwd(runs[i].ctx, &pb, runs[i].s, runs[i].dev);
        if (st != FA_OK) {
            addf(r, "  %s fa_fwd: %s: %s\n", runs[i].who, fa_status_string(st),
                 fa_last_error(runs[i].ctx));
            ok = 0;
            break;
        }
        if (runs[i].ctx == kctx) sel_name(kctx, r->kernel_fwd, sizeof r->kernel_fwd);
        tk_buf *outs[] = {&runs[i].s->o, &runs[i].s->lse};
        ok &= written(r, runs[i].who, outs, fnames, 2);
    }
    if (!ok) goto done;
    int v = opts->verbose;
    ok &= judge(r, v, "O", &K.o, &B.o, &R.o, c->dtype, 0, r->o, &r->slack[0]);
    ok &= judge(r, v, "LSE", &K.lse, &B.lse, &R.lse, c->dtype, 0, r->lse, &r->slack[1]);
    ok &= check_empty_rows(r, &pb, &R.lse, &K.o, "O");

    /* backward: each run differentiates its own forward (its O and LSE), as a user would */
    if (c->bwd && ok) {
        const char *bnames[] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3 && ok; i++) {
            st = run_bwd(runs[i].ctx, &pb, runs[i].s, runs[i].dev);
            if (st != FA_OK) {
                addf(r, "  %s fa_bwd: %s: %s\n", runs[i].who, fa_status_string(st),
                     fa_last_error(runs[i].ctx));
                ok = 0;
                break;
            }
            if (runs[i].ctx == kctx) sel_name(kctx, r->kernel_bwd, sizeof r->kernel_bwd);
            tk_buf *outs[] = {&runs[i].s->dq, &runs[i].s->dk, &runs[i].s->dv};
            ok &= written(r, runs[i].who, outs, bnames, 3);
        }
        if (ok) {
            tk_grad_slack ge = grad_noise(&pb, &R);
            ok &= judge(r, v, "dQ", &K.dq, &B.dq, &R.dq, c->dtype, ge.dq, r->dq, &r->slack[2]);
            ok &= judge(r, v, "dK", &K.dk, &B.dk, &R.dk, c->dtype, ge.dk, r->dk, &r->slack[3]);
            ok &= judge(r, v, "dV", &K.dv, &B.dv, &R.dv, c->dtype, ge.dv, r->dv, &r->slack[4]);
            ok &= check_empty_rows(r, &pb, &R.lse, &K.dq, "dQ");
        }
    }

done:
    if (!ok || opts->verbose)
        addf(r, "  kernels: fwd %s, bwd %s; rerun with FLASHATTN_TEST_SEED=%llu\n",
             r->kernel_fwd[0] ? r->kernel_fwd : "-", r->kernel_bwd[0] ? r->kernel_bwd : "-",
             (unsigned long long)seed);
    r->status = ok ? TK_PASS : TK_FAIL;
    tk_device_free_array(dev.cu_q);
    tk_device_free_array(dev.cu_k);
    tk_device_free_array(dev.slopes);
    set_free(&K);
    set_free(&B);
    set_free(&R);
    free(pb.slopes);
    fa_context_destroy(kctx);
    fa_context_destroy(nctx);
    fa_context_destroy(pctx);
    return r->status;
}
