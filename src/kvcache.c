/*
 * kvcache.c — the dispatcher's door for inference: fa_fwd_kvcache (decoding against a
 * contiguous or paged KV cache, with an optional append), its workspace query, and
 * fa_merge_attn. Same contract as dispatch.c: everything is checked before anything is
 * written (the cache included), then flattened into an fa_problem / fa_merge_problem for the
 * backend, whose table may lack these entries (FA_ERR_UNSUPPORTED).
 */
#include <stdio.h>
#include <stdlib.h>

#include "validate.h"

/* Write groups of fa_arg.out: the outputs, and the cache when it is appended to. Outputs and
   the cache may not overlap each other: attention reads the cache while writing out. */
enum { GROUP_OUT = 1, GROUP_CACHE = 2 };

static int params_varlen(const fa_params *p) {
    return p->cu_seqlens_q || p->cu_seqlens_k || p->batch || p->max_seqlen_q || p->max_seqlen_k;
}

/* Byte span of n int32 values (an index array) as an input of the overlap check. */
static fa_status int_span(fa_call *c, const char *name, const int32_t *a, int64_t n,
                          fa_arg *arg) {
    uint64_t bytes;
    uintptr_t end;
    if (__builtin_mul_overflow((uint64_t)n, (uint64_t)sizeof(int32_t), &bytes) ||
        __builtin_add_overflow((uintptr_t)a, bytes, &end))
        return fa_fail(c->ctx, FA_ERR_OVERFLOW, "%s: %s (%lld entries) runs past the address space",
                       c->fn, name, (long long)n);
    arg->name = name;
    arg->t = NULL;
    arg->out = 0;
    arg->is_lse = 0;
    arg->sp.lo = (uintptr_t)a;
    arg->sp.hi = end;
    return FA_OK;
}

/* One row of pool pages written by one sequence's append: [lo, hi) of page `page`. */
typedef struct wspan {
    int64_t page, lo, hi, seq;
} wspan;

static int wspan_cmp(const void *a, const void *b) {
    const wspan *x = a, *y = b;
    if (x->page != y->page) return x->page < y->page ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Host seqlens and block_table: every total within the capacity, every page a sequence uses
   inside the pool, and no pool row appended to by two sequences (the result would depend on
   the order of the writes). */
static fa_status check_cache_contents(fa_call *c, const fa_kvcache *cache, const fa_problem *pr) {
    fa_context *ctx = c->ctx;
    for (int64_t b = 0; b < pr->batch; b++) {
        int64_t len = cache->seqlens[b], total = len + pr->seqlen_new;
        if (len < 0)
            return fa_fail(ctx, FA_ERR_SHAPE, "%s: cache->seqlens[%lld] = %lld, must be >= 0",
                           c->fn, (long long)b, (long long)len);
        if (total > pr->seqlen_k && pr->block_table)
            return fa_fail(ctx, FA_ERR_SHAPE,
                           "%s: sequence %lld holds %lld tokens + %lld new, more than the %lld "
                           "that a row of block_table maps (max_pages * page_size): the block "
                           "table is too small",
                           c->fn, (long long)b, (long long)len, (long long)pr->seqlen_new,
                           (long long)pr->seqlen_k);
        if (total > pr->seqlen_k)
            return fa_fail(ctx, FA_ERR_SHAPE,
                           "%s: sequence %lld holds %lld tokens + %lld new, the cache has room "
                           "for %lld (max_len)",
                           c->fn, (long long)b, (long long)len, (long long)pr->seqlen_new,
                           (long long)pr->seqlen_k);
        if (!pr->block_table) continue;
        const int32_t *row = pr->block_table + b * pr->bt_stride;
        for (int64_t i = 0; i < (total + pr->page_size - 1) / pr->page_size; i++)
            if (row[i] < 0 || row[i] >= pr->num_pages)
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                               "%s: block_table[%lld][%lld] = %d, outside the pool of %lld pages",
                               c->fn, (long long)b, (long long)i, row[i],
                               (long long)pr->num_pages);
    }
    if (!pr->block_table || pr->seqlen_new == 0) return FA_OK;
    /* appends: at most seqlen_new / page_size + 2 page pieces per sequence */
    int64_t per = pr->seqlen_new / pr->page_size + 2, n = 0;
    /* a decode step's few pieces on the stack: no allocation on a small call's path */
    wspan local[64];
    wspan *w = pr->batch * per <= 64 ? local : malloc((size_t)(pr->batch * per) * sizeof *w);
    if (!w) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "%s: out of memory checking appends", c->fn);
    for (int64_t b = 0; b < pr->batch; b++) {
        int64_t t = cache->seqlens[b], end = t + pr->seqlen_new;
        while (t < end) {
            int64_t page_end = (t / pr->page_size + 1) * pr->page_size;
            int64_t stop = page_end < end ? page_end : end;
            wspan s = {pr->block_table[b * pr->bt_stride + t / pr->page_size],
                       t % pr->page_size, t % pr->page_size + (stop - t), b};
            w[n++] = s;
            t = stop;
        }
    }
    qsort(w, (size_t)n, sizeof *w, wspan_cmp);
    fa_status st = FA_OK;
    for (int64_t i = 1; i < n && st == FA_OK; i++)
        if (w[i].page == w[i - 1].page && w[i].lo < w[i - 1].hi)
            st = fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                         "%s: sequences %lld and %lld both append to row %lld of pool page %lld",
                         c->fn, (long long)w[i - 1].seq, (long long)w[i].seq, (long long)w[i].lo,
                         (long long)w[i].page);
    if (w != local) free(w);
    return st;
}

/* The cache geometry: contiguous [batch, max_len, heads_kv, d], or a page pool addressed
   through block_table. Fills the cache fields of *pr (capacity in seqlen_k). */
static fa_status check_cache_layout(fa_call *c, const fa_kvcache *cache, fa_problem *pr) {
    fa_context *ctx = c->ctx;
    const fa_tensor *k = &cache->k;
    if (!cache->block_table) {
        if (k->shape[0] != pr->batch)
            return fa_fail(ctx, FA_ERR_SHAPE,
                           "%s: cache->k has batch %lld but q has %lld (a contiguous cache is "
                           "[batch, max_len, heads_kv, d])",
                           c->fn, (long long)k->shape[0], (long long)pr->batch);
        pr->seqlen_k = k->shape[1];
        return FA_OK;
    }
    if (cache->max_pages < 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: cache->max_pages = %lld, must be >= 1",
                       c->fn, (long long)cache->max_pages);
    if (cache->block_table_stride < cache->max_pages)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: cache->block_table_stride = %lld is shorter than max_pages = %lld",
                       c->fn, (long long)cache->block_table_stride, (long long)cache->max_pages);
    int64_t cap, entries;
    if (__builtin_mul_overflow(cache->max_pages, k->shape[1], &cap) || cap > INT32_MAX ||
        __builtin_mul_overflow(pr->batch - 1, cache->block_table_stride, &entries) ||
        __builtin_add_overflow(entries, cache->max_pages, &entries))
        return fa_fail(ctx, FA_ERR_OVERFLOW,
                       "%s: max_pages = %lld pages of %lld tokens (or the block_table of %lld rows "
                       "%lld apart) overflow: at most 2^31 - 1 tokens per sequence",
                       c->fn, (long long)cache->max_pages, (long long)k->shape[1],
                       (long long)pr->batch, (long long)cache->block_table_stride);
    pr->block_table = cache->block_table;
    pr->bt_stride = cache->block_table_stride;
    pr->max_pages = cache->max_pages;
    pr->page_size = k->shape[1];
    pr->num_pages = k->shape[0];
    pr->seqlen_k = cap;
    return FA_OK;
}

/* fa_params.rotary_cos/sin: two 2-d tables [seqlen_ro, rotary_dim / 2] of q's dtype or f32,
   on q's device, long enough for every position a call can use (the capacity: seqlens live
   in device memory on the GPU, so the bound cannot depend on them). Appends the tables to
   the overlap check's inputs. */
static fa_status check_rotary(fa_call *c, int append, fa_problem *pr, fa_arg *a, int *n) {
    fa_context *ctx = c->ctx;
    const fa_params *p = c->p;
    if (!p->rotary_cos && !p->rotary_sin) return FA_OK;
    if (!p->rotary_cos || !p->rotary_sin)
        return fa_fail(ctx, FA_ERR_NULL_POINTER,
                       "%s: fa_params.%s is NULL but %s is not; the rotary embedding needs both",
                       c->fn, p->rotary_cos ? "rotary_sin" : "rotary_cos",
                       p->rotary_cos ? "rotary_cos" : "rotary_sin");
    if (!append)
        return fa_fail(ctx, FA_ERR_NULL_POINTER,
                       "%s: rotary_cos/rotary_sin are given but k_new/v_new are NULL: the rotary "
                       "embedding is applied to q and to the keys being appended (as "
                       "FlashAttention-2 requires)", c->fn);
    fa_arg r[2] = {{"rotary_cos", p->rotary_cos, 0, 0, {0, 0}},
                   {"rotary_sin", p->rotary_sin, 0, 0, {0, 0}}};
    FA_TRY(fa_check_tensors(c, r, 2, 2));
    const fa_tensor *co = p->rotary_cos, *si = p->rotary_sin;
    if (fa_dtype_is_fp8(pr->dtype))
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "%s: rotary_cos/rotary_sin with %s inputs: the rotary embedding takes f32, "
                       "f16 or bf16 caches (rotate before quantising)", c->fn,
                       fa_dtype_name(pr->dtype));
    if (co->dtype != si->dtype || (co->dtype != pr->dtype && co->dtype != FA_DTYPE_F32))
        return fa_fail(ctx, FA_ERR_DTYPE,
                       "%s: rotary_cos is %s and rotary_sin %s; both must be q's dtype (%s) or "
                       "f32", c->fn, fa_dtype_name(co->dtype), fa_dtype_name(si->dtype),
                       fa_dtype_name(pr->dtype));
    const fa_arg dev[3] = {{"q", c->q, 0, 0, {0, 0}}, r[0], r[1]};
    FA_TRY(fa_check_devices(c, dev, 3));
    FA_TRY(fa_check_same_shape(c, "rotary_cos", co, "rotary_sin", si));
    const int64_t rd = 2 * co->shape[1];
    if (rd > pr->d)
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "%s: rotary_cos has %lld columns, so rotary_dim = %lld, more than "
                       "head_dim = %lld (rotary_cos/sin are [seqlen_ro, rotary_dim / 2])",
                       c->fn, (long long)co->shape[1], (long long)rd, (long long)pr->d);
    /* FlashAttention-2: a causal or windowed call rotates query i at seqlens + i, any other
       at seqlens (the raw options: normalisation may turn a wide window into -1) */
    pr->rot_q_per_token = p->causal || p->window_left >= 0 || p->window_right >= 0;
    /* every position used is below capacity + (queries past the new keys, when per token):
       seqlens + seqlen_new <= capacity */
    int64_t past = pr->rot_q_per_token && pr->seqlen_q > pr->seqlen_new
                       ? pr->seqlen_q - pr->seqlen_new : 0, need = pr->seqlen_k + past;
    if (co->shape[0] < need)
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "%s: rotary_cos has %lld rows (seqlen_ro), fewer than the %lld positions "
                       "a call can use: the cache's capacity (%s = %lld)%s",
                       c->fn, (long long)co->shape[0], (long long)need,
                       pr->block_table ? "max_pages * page_size" : "max_len",
                       (long long)pr->seqlen_k,
                       past ? " plus the causal/windowed queries past the new keys" : "");
    pr->rot_cos = co->data;
    pr->rot_sin = si->data;
    pr->rot_cos_st = fa_stride_of(co, 0);
    pr->rot_sin_st = fa_stride_of(si, 0);
    pr->rot_dtype = co->dtype;
    pr->rot_dim = rd;
    pr->rot_interleaved = p->rotary_interleaved != 0;
    a[(*n)++] = r[0];
    a[(*n)++] = r[1];
    return FA_OK;
}

/* fa_params.cache_leftpad: contiguous caches only (FlashAttention-2 refuses paged ones too);
   host values 0 <= leftpad[b] <= seqlens[b]. */
static fa_status check_leftpad(fa_call *c, const fa_kvcache *cache, fa_problem *pr) {
    fa_context *ctx = c->ctx;
    const int32_t *lp = c->p->cache_leftpad;
    if (!lp) return FA_OK;
    if (pr->block_table)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "%s: cache_leftpad with a paged cache (block_table): left padding is "
                       "taken for contiguous caches only, as in FlashAttention-2", c->fn);
    if (c->q->device == FA_DEVICE_CPU)
        for (int64_t b = 0; b < pr->batch; b++)
            if (lp[b] < 0 || lp[b] > cache->seqlens[b])
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                               "%s: cache_leftpad[%lld] = %d, must be in [0, cache->seqlens[%lld] "
                               "= %d]", c->fn, (long long)b, lp[b], (long long)b,
                               cache->seqlens[b]);
    pr->kv_leftpad = lp;
    return FA_OK;
}

static fa_status validate_kv(fa_call *c, const fa_kvcache *cache, const fa_tensor *k_new,
                             const fa_tensor *v_new, int num_splits, fa_problem *pr) {
    fa_context *ctx = c->ctx;
    const fa_params *p = c->p;
    memset(pr, 0, sizeof *pr);
    if (!cache) return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: cache is NULL", c->fn);
    if (!cache->seqlens)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: cache->seqlens is NULL", c->fn);
    if (!k_new != !v_new)
        return fa_fail(ctx, FA_ERR_NULL_POINTER,
                       "%s: %s is NULL but %s is not; an append needs both", c->fn,
                       k_new ? "v_new" : "k_new", k_new ? "k_new" : "v_new");
    if (params_varlen(p))
        return fa_fail(ctx, FA_ERR_VARLEN,
                       "%s: varlen fields of fa_params are set (cu_seqlens_q/k, batch, "
                       "max_seqlen_q/k); the cache's seqlens give the lengths, leave them 0/NULL",
                       c->fn);
    if (num_splits < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "%s: num_splits = %d, must be >= 0 (0: the library chooses)", c->fn,
                       num_splits);

    int append = k_new != NULL, cache_group = append && !c->query_only ? GROUP_CACHE : 0;
    fa_arg a[12] = {
        {"q", c->q, 0, 0, {0, 0}},
        {"cache->k", &cache->k, cache_group, 0, {0, 0}},
        {"cache->v", &cache->v, cache_group, 0, {0, 0}},
        {"out", c->out, GROUP_OUT, 0, {0, 0}},
    };
    int n = 4;
    if (append) {
        a[n++] = (fa_arg){"k_new", k_new, 0, 0, {0, 0}};
        a[n++] = (fa_arg){"v_new", v_new, 0, 0, {0, 0}};
    }
    if (c->lse) a[n++] = (fa_arg){"lse", c->lse, GROUP_OUT, 1, {0, 0}};
    FA_TRY(fa_check_tensors(c, a, n, 4));
    FA_TRY(fa_check_dtypes(c, a, n));
    FA_TRY(fa_check_devices(c, a, n));

    const fa_tensor *q = c->q, *k = &cache->k;
    FA_TRY(fa_check_same_shape(c, "q", q, "out", c->out));
    FA_TRY(fa_check_same_shape(c, "cache->k", k, "cache->v", &cache->v));
    if (q->shape[3] != k->shape[3])
        return fa_fail(ctx, FA_ERR_SHAPE, "%s: head_dim of q (%lld) and cache->k (%lld) differ",
                       c->fn, (long long)q->shape[3], (long long)k->shape[3]);
    int64_t d = q->shape[3], hq = q->shape[2], hk = k->shape[2];
    if (d > FA_MAX_HEAD_DIM)
        return fa_fail(ctx, FA_ERR_HEAD_DIM, "%s: head_dim = %lld, the %s backend takes 1..%d",
                       c->fn, (long long)d, ctx->ops->name, FA_MAX_HEAD_DIM);
    if (hq % hk != 0)
        return fa_fail(ctx, FA_ERR_GQA, "%s: heads_q = %lld is not a multiple of heads_kv = %lld",
                       c->fn, (long long)hq, (long long)hk);
    pr->dtype = q->dtype;
    pr->odtype = c->out->dtype;
    pr->batch = q->shape[0];
    pr->seqlen_q = q->shape[1];
    pr->heads_q = hq;
    pr->heads_kv = hk;
    pr->group = hq / hk;
    pr->d = d;
    FA_TRY(check_cache_layout(c, cache, pr));
    if (append) {
        FA_TRY(fa_check_same_shape(c, "k_new", k_new, "v_new", v_new));
        const int64_t want[4] = {pr->batch, k_new->shape[1], hk, d};
        for (int i = 0; i < 4; i++)
            if (k_new->shape[i] != want[i])
                return fa_fail(ctx, FA_ERR_SHAPE,
                               "%s: k_new->shape[%d] = %lld, must be %lld ([batch, seqlen_new, "
                               "heads_kv, head_dim])",
                               c->fn, i, (long long)k_new->shape[i], (long long)want[i]);
        pr->seqlen_new = k_new->shape[1];
    }
    if (c->lse) {
        const fa_tensor *l = c->lse;
        if (l->shape[0] != pr->batch || l->shape[1] != hq || l->shape[2] != pr->seqlen_q)
            return fa_fail(ctx, FA_ERR_SHAPE, "%s: lse must be [batch, heads_q, seqlen_q] = "
                           "[%lld, %lld, %lld]", c->fn, (long long)pr->batch, (long long)hq,
                           (long long)pr->seqlen_q);
        pr->lse = l->data;
        pr->lse_sb = fa_stride_of(l, 0);
        pr->lse_sh = fa_stride_of(l, 1);
        pr->lse_st = fa_stride_of(l, 2);
    }
    FA_TRY(fa_check_options(c, pr));
    /* decoding is inference: no kernel of this entry regenerates a mask for a backward */
    if (pr->drop_p > 0)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "%s: dropout_p = %g: fa_fwd_kvcache has no dropout (inference only); "
                       "set dropout_p = 0", c->fn, (double)pr->drop_p);
    if (q->device == FA_DEVICE_CPU) FA_TRY(check_cache_contents(c, cache, pr));
    FA_TRY(check_rotary(c, append, pr, a, &n));
    FA_TRY(check_leftpad(c, cache, pr));

    if (!c->query_only) {
        FA_TRY(int_span(c, "cache->seqlens", cache->seqlens, pr->batch, &a[n++]));
        if (pr->block_table)
            FA_TRY(int_span(c, "cache->block_table", pr->block_table,
                            (pr->batch - 1) * pr->bt_stride + pr->max_pages, &a[n++]));
        if (pr->kv_leftpad)
            FA_TRY(int_span(c, "cache_leftpad", pr->kv_leftpad, pr->batch, &a[n++]));
        FA_TRY(fa_check_overlaps(c, a, n));
    }

    pr->q = fa_operand_of(q, 0);
    pr->k = fa_operand_of(k, 0);
    pr->v = fa_operand_of(&cache->v, 0);
    pr->o = fa_operand_of(c->out, 0);
    if (append) {
        pr->k_new = fa_operand_of(k_new, 0);
        pr->v_new = fa_operand_of(v_new, 0);
    }
    pr->kv_seqlens = cache->seqlens;
    pr->num_splits = num_splits;
    return FA_OK;
}

static fa_status run_kv(fa_call *c, const fa_kvcache *cache, const fa_tensor *k_new,
                        const fa_tensor *v_new, int num_splits, size_t *query_bytes) {
    fa_params params;
    FA_TRY(fa_call_begin(c, &params));
    fa_problem pr;
    fa_status st = c->query_only && !query_bytes
                       ? fa_fail(c->ctx, FA_ERR_NULL_POINTER, "%s: bytes is NULL", c->fn)
                       : validate_kv(c, cache, k_new, v_new, num_splits, &pr);
    const fa_backend_ops *ops = c->ctx->ops;
    if (st == FA_OK && (!ops->fwd_kvcache || !ops->fwd_kvcache_workspace))
        st = fa_fail(c->ctx, FA_ERR_UNSUPPORTED,
                     "%s: the %s backend has no KV-cache kernel in this build", c->fn, ops->name);
    if (st == FA_OK)
        st = fa_call_finish(c, &pr, ops->fwd_kvcache_workspace, ops->fwd_kvcache, query_bytes);
    return fa_call_end(c, st);
}

fa_status fa_fwd_kvcache(fa_context *ctx, const fa_tensor *q, const fa_kvcache *cache,
                         const fa_tensor *k_new, const fa_tensor *v_new, const fa_params *p,
                         int num_splits, fa_tensor *out, fa_tensor *lse) {
    fa_call c = {ctx, "fa_fwd_kvcache", q, NULL, NULL, out, lse, NULL, NULL, NULL, NULL, p, 0, 0};
    return run_kv(&c, cache, k_new, v_new, num_splits, NULL);
}

/* As fa_fwd_workspace_size: q stands in for the output it lacks (only shapes are read). */
fa_status fa_fwd_kvcache_workspace_size(fa_context *ctx, const fa_tensor *q,
                                        const fa_kvcache *cache, const fa_tensor *k_new,
                                        const fa_tensor *v_new, const fa_params *p,
                                        int num_splits, size_t *bytes) {
    fa_call c = {ctx,  "fa_fwd_kvcache_workspace_size", q, NULL, NULL, q, NULL, NULL, NULL, NULL,
                 NULL, p, 0, 1};
    return run_kv(&c, cache, k_new, v_new, num_splits, bytes);
}

/* ---- fa_merge_attn ---- */

/* out BSHD [b, s, h, d] pairs with lse [b, h, s]; THD [t, h, d] with [h, t]. */
static int lse_fits(const fa_tensor *out, const fa_tensor *l) {
    if (out->ndim == 4)
        return l->shape[0] == out->shape[0] && l->shape[1] == out->shape[2] &&
               l->shape[2] == out->shape[1];
    return l->shape[0] == out->shape[1] && l->shape[1] == out->shape[0];
}

static int merge_dtype_ok(fa_dtype dt) {
    return dt == FA_DTYPE_F32 || dt == FA_DTYPE_F16 || dt == FA_DTYPE_BF16;
}

/* The argument list of a merge: out, lse, then every part's output and LSE (their names
   formatted into `names`, 24 bytes each). */
static int merge_args(int n, const fa_tensor *out_parts, const fa_tensor *lse_parts,
                      const fa_tensor *out, const fa_tensor *lse, fa_arg *a, char *names) {
    int k = 0;
    a[k++] = (fa_arg){"out", out, GROUP_OUT, 0, {0, 0}};
    if (lse) a[k++] = (fa_arg){"lse", lse, GROUP_OUT, 1, {0, 0}};
    for (int s = 0; s < n; s++) {
        char *on = names + (size_t)s * 48, *ln = on + 24;
        snprintf(on, 24, "out_parts[%d]", s);
        snprintf(ln, 24, "lse_parts[%d]", s);
        a[k++] = (fa_arg){on, &out_parts[s], 0, 0, {0, 0}};
        a[k++] = (fa_arg){ln, &lse_parts[s], 0, 1, {0, 0}};
    }
    return k;
}

/* Host part LSEs: each value finite or -inf (the part saw no key there). +inf or NaN is no
   log-sum-exp of attention, and would make the merged row NaN. */
static fa_status check_part_lses(fa_call *c, int n, const fa_tensor *lse_parts, int thd) {
    for (int s = 0; s < n; s++) {
        const fa_tensor *l = &lse_parts[s];
        const float *x = l->data;
        const int64_t nb = thd ? 1 : l->shape[0], nh = l->shape[thd ? 0 : 1],
                      nt = l->shape[thd ? 1 : 2], sb = thd ? 0 : fa_stride_of(l, 0),
                      sh = fa_stride_of(l, thd ? 0 : 1), st = fa_stride_of(l, thd ? 1 : 2);
        for (int64_t b = 0; b < nb; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t t = 0; t < nt; t++) {
                    const float v = x[b * sb + h * sh + t * st];
                    if (!isnan(v) && v != INFINITY) continue;
                    char at[96];
                    if (thd) snprintf(at, sizeof at, "[head %lld, token %lld]", (long long)h,
                                      (long long)t);
                    else snprintf(at, sizeof at, "[batch %lld, head %lld, row %lld]",
                                  (long long)b, (long long)h, (long long)t);
                    return fa_fail(c->ctx, FA_ERR_INVALID_ARGUMENT,
                                   "%s: lse_parts[%d]%s = %g: a part's lse must be finite, or "
                                   "-inf where the part saw no key",
                                   c->fn, s, at, (double)v);
                }
    }
    return FA_OK;
}

static fa_status validate_merge(fa_call *c, int n, const fa_tensor *out_parts,
                                const fa_tensor *lse_parts, const fa_tensor *out,
                                const fa_tensor *lse, fa_arg *a, char *names,
                                fa_merge_problem *m, fa_merge_part *parts) {
    fa_context *ctx = c->ctx;
    int nd = out->ndim == 3 ? 3 : 4, na = merge_args(n, out_parts, lse_parts, out, lse, a, names);
    FA_TRY(fa_check_tensors(c, a, na, nd));
    FA_TRY(fa_check_devices(c, a, na));
    for (int i = 0; i < na; i++) {
        fa_dtype dt = a[i].t->dtype;
        int ok = a[i].is_lse ? dt == FA_DTYPE_F32 : merge_dtype_ok(dt);
        if (ok && !a[i].is_lse && a[i].t != out) ok = dt == out_parts[0].dtype;
        if (!ok)
            return fa_fail(ctx, FA_ERR_DTYPE,
                           "%s: %s is %s; LSEs are f32, out and the parts f32, f16 or bf16, all "
                           "parts one dtype (%s)",
                           c->fn, a[i].name, fa_dtype_name(dt), fa_dtype_name(out_parts[0].dtype));
    }
    for (int i = 0; i < na; i++) {
        if (!a[i].is_lse) FA_TRY(fa_check_same_shape(c, "out", out, a[i].name, a[i].t));
        else if (!lse_fits(out, a[i].t))
            return fa_fail(ctx, FA_ERR_SHAPE, "%s: %s must be [%s] of out", c->fn, a[i].name,
                           nd == 4 ? "batch, heads, seqlen" : "heads, total_tokens");
    }
    if (out->shape[nd - 1] > FA_MAX_HEAD_DIM)
        return fa_fail(ctx, FA_ERR_HEAD_DIM, "%s: head_dim = %lld, the %s backend takes 1..%d",
                       c->fn, (long long)out->shape[nd - 1], ctx->ops->name, FA_MAX_HEAD_DIM);
    FA_TRY(fa_check_overlaps(c, a, na));
    if (ctx->ops == &fa_cpu_backend) FA_TRY(check_part_lses(c, n, lse_parts, nd == 3));

    int thd = nd == 3;
    memset(m, 0, sizeof *m);
    m->n = n;
    m->parts = parts;
    m->part_dtype = out_parts[0].dtype;
    m->dtype = out->dtype;
    m->batch = thd ? 1 : out->shape[0];
    m->seqlen = out->shape[thd ? 0 : 1];
    m->heads = out->shape[nd - 2];
    m->d = out->shape[nd - 1];
    m->o = fa_operand_of(out, thd);
    for (int s = 0; s <= n; s++) {
        const fa_tensor *l = s < n ? &lse_parts[s] : lse;
        if (!l) break;
        int64_t sb = thd ? 0 : fa_stride_of(l, 0), sh = fa_stride_of(l, thd ? 0 : 1),
                st = fa_stride_of(l, thd ? 1 : 2);
        if (s < n) {
            parts[s].o = fa_operand_of(&out_parts[s], thd);
            parts[s].lse = l->data;
            parts[s].lse_sb = sb, parts[s].lse_sh = sh, parts[s].lse_st = st;
        } else {
            m->lse = l->data;
            m->lse_sb = sb, m->lse_sh = sh, m->lse_st = st;
        }
    }
    return FA_OK;
}

/* The backend's merge, with the context's device current (fa_call_finish does the same). */
static fa_status merge_on_device(fa_context *ctx, const fa_merge_problem *m) {
    int saved = -1;
    if (ctx->ops->enter) FA_TRY(ctx->ops->enter(ctx, "fa_merge_attn", &saved));
    const fa_status st = ctx->ops->merge(ctx, m);
    if (ctx->ops->leave) ctx->ops->leave(saved);
    return st;
}

/* fa_merge_attn with the context held. */
static fa_status merge(fa_call *c, int n, const fa_tensor *out_parts, const fa_tensor *lse_parts,
                       fa_tensor *out, fa_tensor *lse) {
    fa_context *ctx = c->ctx;
    if (n < 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "fa_merge_attn: n = %d, must be >= 1", n);
    if (!out_parts || !lse_parts)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "fa_merge_attn: %s is NULL",
                       out_parts ? "lse_parts" : "out_parts");
    if (!out) return fa_fail(ctx, FA_ERR_NULL_POINTER, "fa_merge_attn: out is NULL");
    if (out->ndim != 3 && out->ndim != 4)
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "fa_merge_attn: out has ndim %d, expected 4 (BSHD) or 3 (THD)", out->ndim);
    size_t na = 2 * (size_t)n + 2;
    fa_arg *a = malloc(na * sizeof *a);
    char *names = malloc((size_t)n * 48);
    fa_merge_part *parts = malloc((size_t)n * sizeof *parts);
    fa_merge_problem m;
    fa_status st;
    if (!a || !names || !parts)
        st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "fa_merge_attn: out of memory for %d parts", n);
    else
        st = validate_merge(c, n, out_parts, lse_parts, out, lse, a, names, &m, parts);
    if (st == FA_OK && !ctx->ops->merge)
        st = fa_fail(ctx, FA_ERR_UNSUPPORTED,
                     "fa_merge_attn: the %s backend has no merge kernel in this build",
                     ctx->ops->name);
    if (st == FA_OK) st = merge_on_device(ctx, &m);
    if (st == FA_OK) fa_call_done(ctx);
    free(a);
    free(names);
    free(parts);
    return st;
}

fa_status fa_merge_attn(fa_context *ctx, int n, const fa_tensor *out_parts,
                        const fa_tensor *lse_parts, fa_tensor *out, fa_tensor *lse) {
    fa_call c = {ctx, "fa_merge_attn", NULL, NULL, NULL, out, lse, NULL, NULL, NULL, NULL, NULL,
                 0, 0};
    fa_params params;
    FA_TRY(fa_call_begin(&c, &params));
    return fa_call_end(&c, merge(&c, n, out_parts, lse_parts, out, lse));
}
