/*
 * kvtest.c — see kvtest.h.
 */
#include "kvtest.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define addf tk_report_addf

/* The options in testkit's words (sk: the longest total), then the cache and the variants. */
void kv_case_format(const kv_case *c, char *buf, size_t len) {
    tk_case t;
    memset(&t, 0, sizeof t);
    t.name = c->name;
    t.batch = c->batch;
    t.sq = c->sq;
    for (int b = 0; b < c->batch; b++)
        if (c->lens[b] + c->snew > t.sk) t.sk = c->lens[b] + c->snew;
    t.hq = c->hq, t.hkv = c->hkv, t.d = c->d, t.dtype = c->dtype, t.scale = c->scale;
    t.causal = c->causal, t.window = c->window, t.wl = c->wl, t.wr = c->wr;
    t.softcap = c->softcap, t.alibi = c->alibi, t.strided = c->strided;
    tk_case_format(&t, buf, len);
    size_t n = strlen(buf);
#define PUT(...) n += (size_t)snprintf(buf + n, n < len ? len - n : 0, __VA_ARGS__)
    PUT(" | cache[");
    for (int b = 0; b < c->batch; b++) PUT("%s%d", b ? "," : "", c->lens[b]);
    PUT("]+%d room%d", c->snew, c->room);
    if (c->rot_dim)
        PUT(" rotary%d%s%s", c->rot_dim, c->rot_interleaved ? "-interleaved" : "-halves",
            c->rot_f32 ? "-f32tables" : "");
    if (c->leftpad) {
        PUT(" leftpad[");
        for (int b = 0; b < c->batch; b++) PUT("%s%d", b ? "," : "", c->lpad[b]);
        PUT("]");
    }
    PUT(" |");
    for (int i = 0; i < c->nvar; i++) {
        const kv_variant *v = &c->var[i];
        if (v->page) PUT(" page%d", v->page);
        else PUT(" contig");
        PUT("/s%d", v->splits);
        if (v->threads) PUT("/t%d", v->threads);
    }
#undef PUT
}

/* ---- the logical data of a case ---- */

typedef struct kv_data {
    const kv_case *c;
    fa_dtype dt; /* the precision P actually run */
    int64_t tot[TK_MAX_BATCH], sum_tot, max_tot;
    int64_t row; /* hkv * d: values of one key row */
    double *q;   /* [batch][sq][hq][d] */
    double *k[TK_MAX_BATCH], *v[TK_MAX_BATCH]; /* [tot_b][hkv][d]: cached rows, then new */
    float *slopes;
    size_t slopes_len;
    fa_params p;
    /* fused rotary: the tables [ro_len][rot_dim / 2] (rounded to their dtype), and q and the
       keys as the reference sees them, rotated in float64 (the new rows only) */
    int64_t ro_len;
    fa_dtype ro_dt;
    double *cos, *sin, *qr, *kr[TK_MAX_BATCH];
} kv_data;

static void data_free(kv_data *D) {
    free(D->q);
    for (int b = 0; b < TK_MAX_BATCH; b++) {
        free(D->k[b]);
        free(D->v[b]);
        free(D->kr[b]);
    }
    free(D->cos);
    free(D->sin);
    free(D->qr);
    free(D->slopes);
}

static double *normals(int64_t n, fa_dtype dt, tk_rng *r) {
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    for (int64_t i = 0; x && i < n; i++) x[i] = tk_round_to(dt, tk_rng_normal(r));
    return x;
}

/* x[0 .. rot_dim) rotated in float64 as position pos of the tables (the rule of
   fa_params.rotary_cos, written out independently of src/rotary.h). */
static void rotate_f64(const kv_data *D, double *x, int64_t pos) {
    const kv_case *c = D->c;
    const int half = c->rot_dim / 2;
    for (int i = 0; i < half; i++) {
        const int i1 = c->rot_interleaved ? 2 * i : i, i2 = c->rot_interleaved ? 2 * i + 1 : i + half;
        const double co = D->cos[pos * half + i], si = D->sin[pos * half + i];
        const double x1 = x[i1], x2 = x[i2];
        x[i1] = x1 * co - x2 * si;
        x[i2] = x1 * si + x2 * co;
    }
}

/* The tables (random angles, long enough for any variant's capacity plus the queries past
   the new keys) and the rotated copies of q and of the new keys. */
static int rotary_init(kv_data *D, tk_rng *r) {
    const kv_case *c = D->c;
    const int half = c->rot_dim / 2;
    D->ro_dt = c->rot_f32 ? FA_DTYPE_F32 : D->dt;
    D->ro_len = D->max_tot + c->room + 256 + c->sq;
    D->cos = malloc(sizeof(double) * (size_t)(D->ro_len * half));
    D->sin = malloc(sizeof(double) * (size_t)(D->ro_len * half));
    const int64_t nq = (int64_t)c->batch * c->sq * c->hq * c->d;
    D->qr = malloc(sizeof(double) * (size_t)nq);
    if (!D->cos || !D->sin || !D->qr) return 1;
    for (int64_t i = 0; i < D->ro_len * half; i++) {
        const double a = 6.283185307179586 * tk_rng_uniform(r);
        D->cos[i] = tk_round_to(D->ro_dt, cos(a));
        D->sin[i] = tk_round_to(D->ro_dt, sin(a));
    }
    memcpy(D->qr, D->q, sizeof(double) * (size_t)nq);
    /* FlashAttention-2: per-token query positions when causal or windowed */
    const int per_token = c->causal || (c->window && (c->wl >= 0 || c->wr >= 0));
    for (int b = 0; b < c->batch; b++)
        for (int i = 0; i < c->sq; i++)
            for (int h = 0; h < c->hq; h++)
                rotate_f64(D, D->qr + (((int64_t)b * c->sq + i) * c->hq + h) * c->d,
                           c->lens[b] + (per_token ? i : 0));
    for (int b = 0; b < c->batch; b++) {
        D->kr[b] = malloc(sizeof(double) * (size_t)(D->tot[b] * D->row > 0 ? D->tot[b] * D->row : 1));
        if (!D->kr[b]) return 1;
        memcpy(D->kr[b], D->k[b], sizeof(double) * (size_t)(D->tot[b] * D->row));
        for (int64_t t = c->lens[b]; t < D->tot[b]; t++)
            for (int h = 0; h < c->hkv; h++) rotate_f64(D, D->kr[b] + t * D->row + h * c->d, t);
    }
    return 0;
}

static int data_init(kv_data *D, const kv_case *c, fa_dtype dt, tk_rng *r) {
    memset(D, 0, sizeof *D);
    D->c = c;
    D->dt = dt;
    D->row = (int64_t)c->hkv * c->d;
    for (int b = 0; b < c->batch; b++) {
        D->tot[b] = c->lens[b] + c->snew;
        D->sum_tot += D->tot[b];
        if (D->tot[b] > D->max_tot) D->max_tot = D->tot[b];
        D->k[b] = normals(D->tot[b] * D->row, dt, r);
        D->v[b] = normals(D->tot[b] * D->row, dt, r);
        if (!D->k[b] || !D->v[b]) return 1;
    }
    D->q = normals((int64_t)c->batch * c->sq * c->hq * c->d, dt, r);
    if (!D->q) return 1;
    /* rows before the left padding hold loud values: a call that attended to them would move
       O far (finite, so that a masked read cannot turn into NaN, which the CUDA kernels do
       not promise for keys sharing a tile with visible ones: issue 42) */
    for (int b = 0; c->leftpad && b < c->batch; b++)
        for (int64_t i = 0; i < (int64_t)c->lpad[b] * D->row; i++) {
            D->k[b][i] = tk_round_to(dt, 4.0);
            D->v[b][i] = tk_round_to(dt, 100.0);
        }
    if (c->rot_dim && rotary_init(D, r)) return 1;
    fa_params *p = &D->p;
    *p = fa_params_default();
    p->softmax_scale = c->scale;
    p->causal = c->causal;
    if (c->window) {
        p->window_left = c->wl;
        p->window_right = c->wr;
    }
    p->softcap = c->softcap;
    if (c->alibi) {
        int64_t stride;
        D->slopes = tk_alibi_slopes(c->alibi, c->batch, c->hq, r, &D->slopes_len, &stride);
        if (!D->slopes) return 1;
        p->alibi_slopes = D->slopes;
        p->alibi_batch_stride = stride;
    }
    return 0;
}

/* ---- reference and baseline: fa_fwd on the gathered keys (varlen) ---- */

typedef struct kv_ref {
    tk_buf o, lse;     /* THD [B*sq, hq, d] and [hq, B*sq] */
    fa_tensor lse_bhs; /* lse seen as [batch, hq, sq], the kernel's layout */
} kv_ref;

static int reference(const kv_data *D, fa_dtype dt, fa_algo algo, kv_ref *R, char *err,
                     size_t errlen) {
    const kv_case *c = D->c;
    int64_t tq = (int64_t)c->batch * c->sq, tk = 0;
    for (int b = 0; b < c->batch; b++) tk += D->tot[b] - (c->leftpad ? c->lpad[b] : 0);
    if (tk < 1) tk = 1;
    int64_t sq3[3] = {tq, c->hq, c->d}, sk3[3] = {tk, c->hkv, c->d}, sl[2] = {c->hq, tq};
    tk_buf q, k, v;
    memset(R, 0, sizeof *R);
    fa_dtype lse_dt = dt == FA_DTYPE_F64 ? FA_DTYPE_F64 : FA_DTYPE_F32;
    int e = tk_buf_alloc(&q, dt, 3, sq3, 0, NULL) | tk_buf_alloc(&k, dt, 3, sk3, 0, NULL) |
            tk_buf_alloc(&v, dt, 3, sk3, 0, NULL) | tk_buf_alloc(&R->o, dt, 3, sq3, 0, NULL) |
            tk_buf_alloc(&R->lse, lse_dt, 2, sl, 0, NULL);
    int rc = 1;
    if (e) {
        snprintf(err, errlen, "out of memory for the reference");
        goto out;
    }
    /* the reference sees q and the new keys rotated (float64; tk_set rounds them to the
       baseline's precision), and each sequence's keys from its left padding on */
    const double *qs = D->qr ? D->qr : D->q;
    for (int64_t i = 0; i < tk_numel(&q.t); i++) tk_set(&q.t, i, qs[i]);
    int32_t cu_q[TK_MAX_BATCH + 1] = {0}, cu_k[TK_MAX_BATCH + 1] = {0};
    int64_t keys = 0;
    for (int b = 0; b < c->batch; b++) {
        const double *ks = D->kr[b] ? D->kr[b] : D->k[b];
        const int64_t first = c->leftpad ? c->lpad[b] : 0, n = D->tot[b] - first;
        for (int64_t i = 0; i < n * D->row; i++) {
            tk_set(&k.t, cu_k[b] * D->row + i, ks[first * D->row + i]);
            tk_set(&v.t, cu_k[b] * D->row + i, D->v[b][first * D->row + i]);
        }
        cu_q[b + 1] = cu_q[b] + c->sq;
        cu_k[b + 1] = cu_k[b] + (int32_t)n;
        keys += n;
    }
    R->lse_bhs = R->lse.t;
    R->lse_bhs.ndim = 3;
    int64_t shape[3] = {c->batch, c->hq, c->sq}, stride[3] = {c->sq, tq, 1};
    memcpy(R->lse_bhs.shape, shape, sizeof shape);
    memcpy(R->lse_bhs.stride, stride, sizeof stride);
    if (keys == 0) { /* no key anywhere: nothing for fa_fwd to run on */
        for (int64_t i = 0; i < tk_numel(&R->o.t); i++) tk_set(&R->o.t, i, 0.0);
        for (int64_t i = 0; i < tk_numel(&R->lse.t); i++) tk_set(&R->lse.t, i, -INFINITY);
        rc = 0;
        goto out;
    }
    fa_params p = D->p;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    p.batch = c->batch;
    p.max_seqlen_q = c->sq;
    p.max_seqlen_k = D->max_tot;
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
    if (st == FA_OK) st = fa_context_set_algo(ctx, algo);
    if (st == FA_OK) st = fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &R->o.t, &R->lse.t);
    if (st != FA_OK)
        snprintf(err, errlen, "reference fa_fwd (%s): %s: %s",
                 algo == FA_ALGO_NAIVE ? "naive" : "plain", fa_status_string(st),
                 fa_last_error(ctx));
    fa_context_destroy(ctx);
    rc = st != FA_OK;
out:
    tk_buf_free(&q);
    tk_buf_free(&k);
    tk_buf_free(&v);
    return rc;
}

static void ref_free(kv_ref *R) {
    tk_buf_free(&R->o);
    tk_buf_free(&R->lse);
}

/* ---- one variant: the cache laid out, the call, the checks ---- */

typedef struct kv_run {
    const kv_data *D;
    const kv_variant *var;
    fa_backend backend;
    int on_dev;
    int64_t cap;                /* contiguous: max_len; paged: max_pages * page */
    int64_t max_pages, num_pages, bt_stride;
    int32_t *bt, *seqlens;
    tk_buf q, k, v, kn, vn, o, lse;
    tk_buf cos, sin;                /* the rotary tables (rot_dim > 0) */
    unsigned char *snap_k, *snap_v; /* the cache before the call */
    double *res_o, *res_lse;        /* the outputs, for comparisons across variants */
} kv_run;

static void run_free(kv_run *R) {
    tk_buf *all[] = {&R->q, &R->k, &R->v, &R->kn, &R->vn, &R->o, &R->lse, &R->cos, &R->sin};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tk_buf_free(all[i]);
    free(R->bt);
    free(R->seqlens);
    free(R->snap_k);
    free(R->snap_v);
    free(R->res_o);
    free(R->res_lse);
}

/* Logical index in the cache view of sequence b's token t, head h, element 0. */
static int64_t cache_index(const kv_run *R, int64_t b, int64_t t, int64_t h) {
    const kv_case *c = R->D->c;
    int64_t page = b, row = t, rows = R->cap;
    if (R->var->page) {
        page = R->bt[b * R->bt_stride + t / R->var->page];
        row = t % R->var->page;
        rows = R->var->page;
    }
    return ((page * rows + row) * c->hkv + h) * c->d;
}

/* Writes tokens [t0, t1) of every sequence into a cache view (the cache itself, or the
   snapshot that becomes the expected cache after an append). */
static void put_rows(const kv_run *R, fa_tensor *kt, fa_tensor *vt, int append_part) {
    const kv_data *D = R->D;
    const kv_case *c = D->c;
    for (int b = 0; b < c->batch; b++) {
        int64_t t0 = append_part ? c->lens[b] : 0, t1 = append_part ? D->tot[b] : c->lens[b];
        for (int64_t t = t0; t < t1; t++)
            for (int h = 0; h < c->hkv; h++)
                for (int x = 0; x < c->d; x++) {
                    int64_t li = cache_index(R, b, t, h) + x, si = t * D->row + h * c->d + x;
                    tk_set(kt, li, D->k[b][si]);
                    tk_set(vt, li, D->v[b][si]);
                }
    }
}

static int run_alloc(kv_run *R, tk_rng *rng) {
    const kv_data *D = R->D;
    const kv_case *c = D->c;
    /* CUDA takes rows 16-byte aligned, except for a head dim that is not a multiple of 8:
       its padded copies (src/cuda/pad_kv.h) read rows 2 bytes apart, so they get none */
    const int page = R->var->page, align = R->on_dev && c->d % 8 == 0 ? 8 : 1,
              st = c->strided;
    int64_t cap = D->max_tot + c->room;
    if (cap < 1) cap = 1;
    int64_t cache_shape[4] = {c->batch, cap, c->hkv, c->d};
    R->bt_stride = 1;
    if (page) {
        R->max_pages = (cap + page - 1) / page;
        R->num_pages = c->batch * R->max_pages + 3; /* a few pages nobody uses */
        R->bt_stride = R->max_pages + 1;            /* and a gap after every row */
        cap = R->max_pages * page;
        cache_shape[0] = R->num_pages;
        cache_shape[1] = page;
    }
    R->cap = cap;
    int64_t qs[4] = {c->batch, c->sq, c->hq, c->d}, ls[3] = {c->batch, c->hq, c->sq};
    int64_t ns[4] = {c->batch, c->snew, c->hkv, c->d};
    int e = tk_buf_alloc_aligned(&R->q, D->dt, 4, qs, st, align, rng) |
            tk_buf_alloc_aligned(&R->o, D->dt, 4, qs, st, align, rng) |
            tk_buf_alloc_aligned(&R->lse, FA_DTYPE_F32, 3, ls, st, 1, rng) |
            tk_buf_alloc_aligned(&R->k, D->dt, 4, cache_shape, st, align, rng) |
            tk_buf_alloc_aligned(&R->v, D->dt, 4, cache_shape, st, align, rng);
    if (c->snew)
        e |= tk_buf_alloc_aligned(&R->kn, D->dt, 4, ns, st, align, rng) |
             tk_buf_alloc_aligned(&R->vn, D->dt, 4, ns, st, align, rng);
    if (c->rot_dim) {
        const int64_t ts[2] = {D->ro_len, c->rot_dim / 2};
        e |= tk_buf_alloc_aligned(&R->cos, D->ro_dt, 2, ts, st, 1, rng) |
             tk_buf_alloc_aligned(&R->sin, D->ro_dt, 2, ts, st, 1, rng);
        for (int64_t i = 0; !e && i < ts[0] * ts[1]; i++) {
            tk_set(&R->cos.t, i, D->cos[i]);
            tk_set(&R->sin.t, i, D->sin[i]);
        }
    }
    R->seqlens = malloc(sizeof(int32_t) * (size_t)c->batch);
    R->bt = malloc(sizeof(int32_t) * (size_t)(c->batch * R->bt_stride));
    if (e || !R->seqlens || !R->bt) return 1;
    for (int b = 0; b < c->batch; b++) R->seqlens[b] = c->lens[b];
    if (page) { /* pages in shuffled pool order; entries past a sequence's need are -1 */
        int64_t np = R->num_pages;
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)np);
        if (!perm) return 1;
        for (int64_t i = 0; i < np; i++) perm[i] = (int32_t)i;
        for (int64_t i = np - 1; i > 0; i--) {
            int64_t j = tk_rng_range(rng, 0, i);
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int b = 0; b < c->batch; b++) {
            int64_t used = (D->tot[b] + page - 1) / page;
            for (int64_t i = 0; i < R->bt_stride; i++)
                R->bt[b * R->bt_stride + i] = i == R->max_pages ? -7
                                              : i < used       ? perm[b * R->max_pages + i]
                                                               : -1;
        }
        free(perm);
    }
    /* the cache: poison (NaN) everywhere but the cached tokens, so reading past a sequence's
       keys shows up in O */
    put_rows(R, &R->k.t, &R->v.t, 0);
    for (int b = 0; b < c->batch && c->snew; b++)
        for (int64_t i = 0; i < c->snew * D->row; i++) {
            tk_set(&R->kn.t, (int64_t)b * c->snew * D->row + i, D->k[b][c->lens[b] * D->row + i]);
            tk_set(&R->vn.t, (int64_t)b * c->snew * D->row + i, D->v[b][c->lens[b] * D->row + i]);
        }
    for (int64_t i = 0; i < tk_numel(&R->q.t); i++) tk_set(&R->q.t, i, D->q[i]);
    R->snap_k = malloc(R->k.bytes);
    R->snap_v = malloc(R->v.bytes);
    if (!R->snap_k || !R->snap_v) return 1;
    memcpy(R->snap_k, R->k.base, R->k.bytes);
    memcpy(R->snap_v, R->v.base, R->v.bytes);
    return 0;
}

/* Device copies of the host arrays of a call. */
typedef struct dev_arrays {
    void *seqlens, *bt, *slopes, *lpad;
} dev_arrays;

static fa_status call_kernel(kv_run *R, fa_context *ctx, dev_arrays *dv) {
    const kv_data *D = R->D;
    const kv_case *c = D->c;
    int on = R->on_dev;
    tk_buf *io[] = {&R->q, &R->k, &R->v, &R->o, &R->lse, &R->kn, &R->vn, &R->cos, &R->sin};
    int nio = c->rot_dim ? 9 : c->snew ? 7 : 5;
    fa_params p = D->p;
    const int32_t *lpad = c->leftpad ? c->lpad : NULL;
    const int32_t *seqlens = R->seqlens, *bt = R->var->page ? R->bt : NULL;
    if (on) {
        for (int i = 0; i < nio; i++)
            if (tk_device_upload(io[i])) return FA_ERR_CUDA;
        dv->seqlens = tk_device_copy_array(R->seqlens, sizeof(int32_t) * (size_t)c->batch);
        dv->bt = bt ? tk_device_copy_array(bt, sizeof(int32_t) * (size_t)(c->batch * R->bt_stride))
                    : NULL;
        dv->slopes = D->slopes ? tk_device_copy_array(D->slopes, D->slopes_len * sizeof(float))
                               : NULL;
        dv->lpad = lpad ? tk_device_copy_array(lpad, sizeof(int32_t) * (size_t)c->batch) : NULL;
        if (!dv->seqlens || (bt && !dv->bt) || (D->slopes && !dv->slopes) || (lpad && !dv->lpad))
            return FA_ERR_CUDA;
        lpad = dv->lpad;
        seqlens = dv->seqlens;
        bt = dv->bt;
        if (D->slopes) p.alibi_slopes = dv->slopes;
    }
#define VIEW(b) (on ? tk_device_view(&(b)) : (b).t)
    fa_tensor q = VIEW(R->q), o = VIEW(R->o), lse = VIEW(R->lse);
    fa_kvcache cache = {VIEW(R->k), VIEW(R->v), seqlens, bt, R->bt_stride, R->max_pages};
    fa_tensor kn, vn, co, si;
    if (c->snew) {
        kn = VIEW(R->kn);
        vn = VIEW(R->vn);
    }
    if (c->rot_dim) {
        co = VIEW(R->cos);
        si = VIEW(R->sin);
        p.rotary_cos = &co;
        p.rotary_sin = &si;
        p.rotary_interleaved = c->rot_interleaved;
    }
    p.cache_leftpad = lpad;
#undef VIEW
    fa_status st = fa_fwd_kvcache(ctx, &q, &cache, c->snew ? &kn : NULL, c->snew ? &vn : NULL,
                                  &p, R->var->splits, &o, &lse);
    tk_buf *back[] = {&R->o, &R->lse, &R->k, &R->v}; /* what the call may write */
    for (int i = 0; on && st == FA_OK && i < 4; i++)
        if (tk_device_download(back[i])) return FA_ERR_CUDA;
    return st;
}

static int judge(tk_report *r, int verbose, const char *what, const fa_tensor *kern,
                 const fa_tensor *base, const fa_tensor *ref, fa_dtype dt) {
    tk_err e[2] = {tk_compare(kern, ref), tk_compare(base, ref)};
    double slack;
    int ok = tk_rule(&e[0], &e[1], dt, 0, &slack);
    if (!ok || verbose)
        addf(r, "    %-3s %s kernel max %.3g mean %.3g | baseline max %.3g mean %.3g | allowed "
                "max %.3g (slack %.2g)%s\n",
             what, ok ? "ok  " : "FAIL", e[0].max_abs, e[0].mean_abs, e[1].max_abs,
             e[1].mean_abs, 2 * e[1].max_abs + slack, slack,
             e[0].nonfinite ? " [kernel has non-finite mismatches]" : "");
    return ok;
}

/* Fused rotary: each appended key element must be the float64 rotation of its new key to
   within one rounding to the cache's dtype plus the fp32 arithmetic's; it is then copied
   into the expected cache ek, so that the byte comparison covers everything else. */
static int check_rotated_keys(tk_report *r, const kv_run *R, fa_tensor *ek) {
    const kv_data *D = R->D;
    const kv_case *c = D->c;
    const double u = tk_unit_roundoff(D->dt) + ldexp(1.0, -22);
    for (int b = 0; b < c->batch; b++)
        for (int64_t t = c->lens[b]; t < D->tot[b]; t++)
            for (int h = 0; h < c->hkv; h++)
                for (int x = 0; x < c->d; x++) {
                    const int64_t li = cache_index(R, b, t, h) + x;
                    const double want = D->kr[b][t * D->row + h * c->d + x],
                                 got = tk_get(&R->k.t, li);
                    /* |x1 cos| + |x2 sin| <= 2 max |x| bounds the terms' sizes */
                    double mag = 0;
                    for (int i = 0; i < c->d; i++)
                        mag = fmax(mag, fabs(D->k[b][t * D->row + h * c->d + i]));
                    if (!(fabs(got - want) <= u * (fabs(want) + 4 * mag))) {
                        addf(r, "    rotated key (batch %d, token %lld, kv head %d, column %d) "
                                "in the cache is %.9g, expected %.9g\n",
                             b, (long long)t, h, x, got, want);
                        return 0;
                    }
                    tk_set(ek, li, got);
                }
    return 1;
}

/* The cache afterwards must equal the cache before with exactly the appended rows written. */
static int check_cache(tk_report *r, kv_run *R) {
    fa_tensor ek = R->k.t, ev = R->v.t;
    ek.data = R->snap_k + ((char *)R->k.t.data - (char *)R->k.base);
    ev.data = R->snap_v + ((char *)R->v.t.data - (char *)R->v.base);
    put_rows(R, &ek, &ev, 1);
    if (R->D->c->rot_dim && !check_rotated_keys(r, R, &ek)) return 0;
    const unsigned char *got[2] = {R->k.base, R->v.base}, *want[2] = {R->snap_k, R->snap_v};
    size_t bytes[2] = {R->k.bytes, R->v.bytes};
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < bytes[i]; j++)
            if (got[i][j] != want[i][j]) {
                addf(r, "    cache %s: byte %zu of the allocation is 0x%02x, expected 0x%02x "
                        "(the append wrote a wrong place, or something else wrote the cache)\n",
                     i ? "v" : "k", j, got[i][j], want[i][j]);
                return 0;
            }
    return 1;
}

static int check_empty_rows(tk_report *r, const kv_run *R, const kv_ref *ref) {
    const kv_case *c = R->D->c;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->hq; h++)
            for (int i = 0; i < c->sq; i++) {
                if (tk_get(&ref->lse_bhs, ((int64_t)b * c->hq + h) * c->sq + i) != -INFINITY)
                    continue;
                for (int x = 0; x < c->d; x++) {
                    double v = tk_get(&R->o.t, (((int64_t)b * c->sq + i) * c->hq + h) * c->d + x);
                    if (v != 0) {
                        addf(r, "    O of a row that sees no key is %g (batch %d, row %d, head "
                                "%d), must be 0\n", v, b, i, h);
                        return 0;
                    }
                }
            }
    return 1;
}

static int check_selection(tk_report *r, const kv_run *R, fa_context *ctx) {
    const fa_selection *s = fa_last_selection(ctx);
    if (!s) {
        addf(r, "    no selection record after a successful call\n");
        return 0;
    }
    snprintf(r->kernel_fwd, sizeof r->kernel_fwd, "%s", s->kernel);
    int paged = strstr(s->kernel, "paged") != NULL;
    int forced = R->var->splits;
    int ok = strstr(s->kernel, "kvcache") && paged == (R->var->page != 0) &&
             strcmp(s->op, "fwd") == 0 && (forced ? s->num_splits == forced : s->num_splits >= 1);
    if (!ok)
        addf(r, "    selection record: kernel %s op %s splits %d; expected a %skvcache kernel, "
                "op fwd, splits %s%d\n",
             s->kernel, s->op, s->num_splits, R->var->page ? "paged " : "contiguous ",
             forced ? "" : ">= ", forced ? forced : 1);
    /* CUDA, d not a multiple of 8: the zero-padded copies (src/cuda/pad_kv.h) say so, with
       the compiled size that ran (d<dp>) and the caller's d (_pad<d>); no other call does */
    const int d = R->D->c->d;
    if (ok && R->on_dev) {
        char want[24];
        snprintf(want, sizeof want, "_pad%d", d);
        const char *at = strstr(s->kernel, want);
        const int padded = at && at[strlen(want)] == 0;
        ok = padded == (d % 8 != 0) && (!padded || s->reason[0]);
        if (!ok)
            addf(r, "    selection record: kernel %s (reason \"%s\"); d %d must %shave the "
                    "suffix %s and a reason\n",
                 s->kernel, s->reason, d, d % 8 ? "" : "not ", want);
    }
    return ok;
}

static double *values(const fa_tensor *t) {
    int64_t n = tk_numel(t);
    double *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++) x[i] = tk_get(t, i);
    return x;
}

/* shared: the case's one context (kv_case.one_context), else NULL for a fresh one */
static int run_variant(tk_report *r, kv_run *R, const kv_ref *ref, const kv_ref *base,
                       tk_rng *rng, int verbose, fa_context *shared) {
    if (run_alloc(R, rng)) {
        addf(r, "    out of host memory\n");
        return 0;
    }
    fa_context *ctx = shared;
    fa_status st = shared ? FA_OK : fa_context_create(&ctx, R->backend);
    if (st == FA_OK && R->var->threads && !R->on_dev)
        st = fa_context_set_threads(ctx, R->var->threads);
    dev_arrays dv = {NULL, NULL, NULL, NULL};
    if (st == FA_OK) st = call_kernel(R, ctx, &dv);
    int ok = st == FA_OK;
    if (!ok)
        addf(r, "    fa_fwd_kvcache: %s: %s\n", fa_status_string(st),
             ctx ? fa_last_error(ctx) : fa_last_error(NULL));
    if (ok) ok = check_selection(r, R, ctx);
    if (ok) {
        char m[256];
        if (tk_check_written(&R->o, "out", m, sizeof m) ||
            tk_check_written(&R->lse, "lse", m, sizeof m)) {
            addf(r, "    %s\n", m);
            ok = 0;
        }
    }
    if (ok) {
        ok &= judge(r, verbose, "O", &R->o.t, &base->o.t, &ref->o.t, R->D->dt);
        ok &= judge(r, verbose, "LSE", &R->lse.t, &base->lse_bhs, &ref->lse_bhs, R->D->dt);
        ok &= check_empty_rows(r, R, ref);
        ok &= check_cache(r, R);
        R->res_o = values(&R->o.t);
        R->res_lse = values(&R->lse.t);
        ok &= R->res_o && R->res_lse;
    }
    tk_device_free_array(dv.seqlens);
    tk_device_free_array(dv.bt);
    tk_device_free_array(dv.slopes);
    tk_device_free_array(dv.lpad);
    if (!shared) fa_context_destroy(ctx);
    return ok;
}

int kv_run_case(const kv_case *c, fa_backend backend, uint64_t seed, int verbose,
                tk_report *r) {
    memset(r, 0, sizeof *r);
    char line[512];
    kv_case_format(c, line, sizeof line);
    int on_dev = backend == FA_BACKEND_CUDA;
    addf(r, "%s [%s] seed %llu\n", line, on_dev ? "cuda" : "cpu", (unsigned long long)seed);
    if (on_dev && !tk_device_available()) {
        addf(r, "  skipped: no device memory support in this testkit\n");
        return r->status = TK_SKIP;
    }
    fa_dtype dt = on_dev && c->dtype == FA_DTYPE_F32 ? FA_DTYPE_BF16 : c->dtype;
    tk_rng rng;
    tk_rng_init(&rng, seed);
    kv_data D;
    kv_ref ref, base;
    memset(&ref, 0, sizeof ref);
    memset(&base, 0, sizeof base);
    kv_run runs[KV_MAX_VARIANTS];
    memset(runs, 0, sizeof runs);
    char err[256];
    int ok = 1;
    if (data_init(&D, c, dt, &rng)) {
        addf(r, "  out of host memory\n");
        ok = 0;
    }
    if (ok && (reference(&D, FA_DTYPE_F64, FA_ALGO_NAIVE, &ref, err, sizeof err) ||
               reference(&D, dt, FA_ALGO_PLAIN, &base, err, sizeof err))) {
        addf(r, "  %s\n", err);
        ok = 0;
    }
    fa_context *shared = NULL;
    if (ok && c->one_context && fa_context_create(&shared, backend) != FA_OK) {
        addf(r, "  fa_context_create: %s\n", fa_last_error(NULL));
        ok = 0;
    }
    for (int i = 0; ok && i < c->nvar; i++) {
        kv_run *R = &runs[i];
        R->D = &D;
        R->var = &c->var[i];
        R->backend = backend;
        R->on_dev = on_dev;
        addf(r, "  variant %d (%s%d, splits %d, threads %d)\n", i, R->var->page ? "page " : "contig",
             R->var->page, R->var->splits, R->var->threads);
        int vok = run_variant(r, R, &ref, &base, &rng, verbose, shared);
        /* on the CPU the layout changes where rows come from, not the arithmetic */
        for (int j = 0; vok && !on_dev && j < i; j++) {
            const kv_variant *a = &c->var[j], *b = R->var;
            if (a->splits != b->splits || a->threads != b->threads || !runs[j].res_o) continue;
            size_t no = (size_t)tk_numel(&R->o.t), nl = (size_t)tk_numel(&R->lse.t);
            if (memcmp(runs[j].res_o, R->res_o, no * sizeof(double)) ||
                memcmp(runs[j].res_lse, R->res_lse, nl * sizeof(double))) {
                addf(r, "    outputs differ from variant %d, which differs only in the cache "
                        "layout\n", j);
                vok = 0;
            }
        }
        ok &= vok;
    }
    fa_context_destroy(shared);
    if (!ok)
        addf(r, "  kernel %s; rerun with FLASHATTN_TEST_SEED=%llu\n",
             r->kernel_fwd[0] ? r->kernel_fwd : "-", (unsigned long long)seed);
    for (int i = 0; i < KV_MAX_VARIANTS; i++) run_free(&runs[i]);
    ref_free(&ref);
    ref_free(&base);
    data_free(&D);
    return r->status = ok ? TK_PASS : TK_FAIL;
}
