/*
 * bench_decode.c — `flashattn bench --decode`: inference decoding, fa_fwd_kvcache with one
 * query token per sequence against a full KV cache, over batch sizes and cache lengths, with a
 * contiguous cache and a paged one whose pages lie in shuffled order, and with the device
 * checks of seqlens/block_table "on" (FA_DEVICE_CHECKS_SYNC: a check kernel and a wait before
 * each call) and "off" (FA_DEVICE_CHECKS_ASYNC, the default: the kernels check as they read,
 * with no wait). A decode step reads the whole cache once and does
 * little arithmetic, so its figure of merit is the K/V bytes read per second, set against
 * what the memory can do: a device-to-device copy, measured in the same run before and after
 * the sweep (the GPU's speed drifts; the higher of the two is the reference).
 *
 * The cache pools are allocated once, for the largest configuration (or enough copies of a
 * smaller one to rotate through), and filled with normal random values; every configuration
 * views them with its own shape. Consecutive calls rotate over disjoint sets of the pool, so
 * that none finds its cache in L2: a 1 x 8k cache is 32 MiB and would stay in a 50 MiB L2,
 * which a real decode step (other layers in between) never sees.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_SETS 256

typedef struct dec_pools {
    bench_buf k, v, q, o, seqlens, table;
    size_t tokens;     /* cache rows in each of k and v (a multiple of the page size) */
    size_t row_bytes;  /* bytes of one cache row: heads_kv * d elements */
} dec_pools;

static int64_t pages_per_seq(const bench_cfg *cfg, int64_t len) {
    return (len + cfg->dec.page_size - 1) / cfg->dec.page_size;
}

/* Cache rows one set of a configuration occupies. */
static size_t set_tokens(const bench_cfg *cfg, int64_t b, int64_t len, int paged) {
    return (size_t)(paged ? b * pages_per_seq(cfg, len) * cfg->dec.page_size : b * len);
}

/* Sets a configuration would like: together at least cfg->rotate_bytes of K and V. */
static int sets_wanted(const bench_cfg *cfg, size_t set_bytes) {
    if (cfg->rotate_bytes == 0 || set_bytes >= cfg->rotate_bytes) return 1;
    size_t n = (cfg->rotate_bytes + set_bytes - 1) / set_bytes;
    return n > MAX_SETS ? MAX_SETS : (int)n;
}

static void pools_free(dec_pools *pl) {
    bench_buf *all[] = {&pl->k, &pl->v, &pl->q, &pl->o, &pl->seqlens, &pl->table};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) bench_buf_free(all[i]);
}

static int pools_make(dec_pools *pl, const bench_cfg *cfg, fa_device dev, fa_dtype dt,
                      tool_rng *rng) {
    memset(pl, 0, sizeof *pl);
    size_t es = fa_dtype_size(dt);
    pl->row_bytes = (size_t)(cfg->heads_kv * cfg->head_dims[0]) * es;
    int64_t max_b = 1;
    for (int bi = 0; bi < cfg->dec.nbatches; bi++)
        if (cfg->dec.batches[bi] > max_b) max_b = cfg->dec.batches[bi];
    for (int bi = 0; bi < cfg->dec.nbatches; bi++)
        for (int li = 0; li < cfg->dec.nlens; li++)
            for (int paged = 0; paged < 2; paged++) {
                if (paged ? !cfg->dec.paged : !cfg->dec.contiguous) continue;
                size_t t = set_tokens(cfg, cfg->dec.batches[bi], cfg->dec.cache_lens[li], paged);
                t *= (size_t)sets_wanted(cfg, 2 * t * pl->row_bytes);
                if (t > pl->tokens) pl->tokens = t;
            }
    size_t ps = (size_t)cfg->dec.page_size;
    pl->tokens = (pl->tokens + ps - 1) / ps * ps;
    size_t qn = (size_t)(max_b * cfg->heads * cfg->head_dims[0]);
    double t0 = tool_now();
    if (bench_buf_alloc(&pl->k, dev, pl->tokens * pl->row_bytes) != 0 ||
        bench_buf_alloc(&pl->v, dev, pl->tokens * pl->row_bytes) != 0 ||
        bench_buf_alloc(&pl->q, dev, qn * es) != 0 || bench_buf_alloc(&pl->o, dev, qn * es) != 0 ||
        bench_buf_alloc(&pl->seqlens, dev, (size_t)max_b * sizeof(int32_t)) != 0 ||
        bench_buf_alloc(&pl->table, dev, (pl->tokens / ps) * sizeof(int32_t)) != 0)
        goto fail;
    size_t n = pl->tokens * pl->row_bytes / es;
    if (bench_buf_fill_large(&pl->k, dt, n, rng) != 0 ||
        bench_buf_fill_large(&pl->v, dt, n, rng) != 0 || bench_buf_fill(&pl->q, dt, qn, rng) != 0)
        goto fail;
    char b[32];
    printf("# cache pools: K and V of %s each (%zu rows), normal random values, ready in %.1f s\n",
           tool_fmt_bytes(b, sizeof b, (double)(pl->tokens * pl->row_bytes)), pl->tokens,
           tool_now() - t0);
    return 0;
fail:
    pools_free(pl);
    return -1;
}

/* Median seconds of a copy of `bytes` between the two buffers (2 warm-up copies, 10 timed). */
static int time_copy(bench_buf *dst, bench_buf *src, size_t bytes, bench_timer *tm, double *med,
                     int *reps, char *err, size_t len) {
    enum { WARM = 2, REPS = 10 };
    double t[WARM + REPS], span;
    for (int i = 0; i < WARM + REPS; i++) {
        bench_timer_start(tm, i);
        if (bench_buf_copy(dst, 0, src, 0, bytes) != 0) {
            snprintf(err, len, "the device copy failed");
            return -1;
        }
        bench_timer_stop(tm, i);
    }
    if (bench_timer_read(tm, WARM + REPS, t, &span, err, len) != 0) return -1;
    *med = tool_median(t + WARM, REPS);
    *reps = REPS;
    return 0;
}

static void set_error(fa_context *ctx, bench_decode_row *row, fa_status st, const char *what) {
    row->status = st;
    snprintf(row->error, sizeof row->error, "%s%s%s%s", what, fa_status_string(st),
             *fa_last_error(ctx) ? ": " : "", fa_last_error(ctx));
}

/* The caches of every set of one configuration; paged sets get their pages of the pool in a
   random order (a permutation, so no page is read twice). 0, or -1 with why in err. */
static int make_caches(const bench_cfg *cfg, dec_pools *pl, fa_dtype dt, fa_device dev,
                       int64_t b, int64_t len, int paged, int nsets, tool_rng *rng,
                       fa_kvcache *caches, char *err, size_t errlen) {
    int64_t hkv = cfg->heads_kv, d = cfg->head_dims[0], ps = cfg->dec.page_size;
    int64_t pps = pages_per_seq(cfg, len);
    size_t st = set_tokens(cfg, b, len, paged);
    int32_t *lens = malloc((size_t)b * sizeof *lens);
    if (!lens) return snprintf(err, errlen, "out of host memory"), -1;
    for (int64_t i = 0; i < b; i++) lens[i] = (int32_t)len;
    int rc = bench_buf_upload(&pl->seqlens, 0, lens, (size_t)b * sizeof *lens);
    free(lens);
    if (rc != 0) return snprintf(err, errlen, "cannot upload the cache lengths"), -1;
    int64_t pool_pages = (int64_t)(pl->tokens / (size_t)ps);
    if (paged) {
        size_t n = (size_t)nsets * (size_t)(b * pps);
        int32_t *tab = malloc(n * sizeof *tab);
        if (!tab) return snprintf(err, errlen, "out of host memory"), -1;
        for (int s = 0; s < nsets; s++) {
            int32_t *t = tab + (size_t)s * (size_t)(b * pps);
            for (int64_t i = 0; i < b * pps; i++) t[i] = (int32_t)(s * b * pps + i);
            for (int64_t i = b * pps - 1; i > 0; i--) { /* Fisher-Yates */
                int64_t j = (int64_t)(tool_rng_u64(rng) % (uint64_t)(i + 1));
                int32_t x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
        }
        rc = bench_buf_upload(&pl->table, 0, tab, n * sizeof *tab);
        free(tab);
        if (rc != 0) return snprintf(err, errlen, "cannot upload the block tables"), -1;
    }
    for (int s = 0; s < nsets; s++) {
        fa_kvcache *c = &caches[s];
        memset(c, 0, sizeof *c);
        c->seqlens = pl->seqlens.ptr;
        if (paged) {
            c->k = fa_tensor_bshd(pl->k.ptr, dt, dev, pool_pages, ps, hkv, d);
            c->v = fa_tensor_bshd(pl->v.ptr, dt, dev, pool_pages, ps, hkv, d);
            c->block_table = (const int32_t *)pl->table.ptr + (size_t)s * (size_t)(b * pps);
            c->block_table_stride = pps;
            c->max_pages = pps;
        } else {
            size_t off = (size_t)s * st * pl->row_bytes;
            c->k = fa_tensor_bshd((char *)pl->k.ptr + off, dt, dev, b, len, hkv, d);
            c->v = fa_tensor_bshd((char *)pl->v.ptr + off, dt, dev, b, len, hkv, d);
        }
    }
    return 0;
}

/* Times one row: warm-up, per-call events (median), then `reps` calls back to back. */
static int time_row(fa_context *ctx, const bench_cfg *cfg, const fa_kvcache *caches, int nsets,
                    const fa_tensor *q, fa_tensor *o, const fa_params *p, bench_timer *tm,
                    bench_decode_row *row) {
    static double times[BENCH_MAX_REPS];
    double span = 0;
    int splits = cfg->dec.splits;
    fa_status st = fa_context_set_device_checks(ctx, row->checks);
    if (st != FA_OK) return set_error(ctx, row, st, "fa_context_set_device_checks: "), -1;
    int call_no = 0;
    for (int i = 0; i < cfg->warmup && st == FA_OK; i++, call_no++) {
        bench_timer_start(tm, i);
        st = fa_fwd_kvcache(ctx, q, &caches[call_no % nsets], NULL, NULL, p, splits, o, NULL);
        bench_timer_stop(tm, i);
    }
    if (st != FA_OK) return set_error(ctx, row, st, ""), -1;
    double est = 0;
    if (cfg->warmup > 0) {
        if (bench_timer_read(tm, cfg->warmup, times, &span, row->error, sizeof row->error) != 0)
            return row->status = FA_ERR_CUDA, -1;
        est = times[0];
        for (int i = 1; i < cfg->warmup; i++)
            if (times[i] < est) est = times[i];
    }
    int reps = bench_rep_count(cfg, est);
    for (int i = 0; i < reps && st == FA_OK; i++, call_no++) {
        bench_timer_start(tm, i);
        st = fa_fwd_kvcache(ctx, q, &caches[call_no % nsets], NULL, NULL, p, splits, o, NULL);
        bench_timer_stop(tm, i);
    }
    if (st != FA_OK) return set_error(ctx, row, st, ""), -1;
    const fa_selection *sel = fa_last_selection(ctx);
    if (sel) {
        snprintf(row->kernel, sizeof row->kernel, "%s", sel->kernel);
        snprintf(row->reason, sizeof row->reason, "%s", sel->reason);
        row->num_splits = sel->num_splits;
        row->workspace_bytes = sel->workspace_bytes;
    }
    if (bench_timer_read(tm, reps, times, &span, row->error, sizeof row->error) != 0)
        return row->status = FA_ERR_CUDA, -1;
    row->min_s = row->max_s = times[0];
    for (int i = 1; i < reps; i++) {
        if (times[i] < row->min_s) row->min_s = times[i];
        if (times[i] > row->max_s) row->max_s = times[i];
    }
    row->median_s = tool_median(times, reps);
    row->span_mean_s = span;
    /* Back to back: what a serving loop sees when the host queues step after step (launch
       overhead included where the host is slower than the GPU; with checks on (synchronous),
       the per-call synchronisation too). */
    bench_timer_start(tm, 0);
    double h0 = tool_now();
    for (int i = 0; i < reps && st == FA_OK; i++, call_no++)
        st = fa_fwd_kvcache(ctx, q, &caches[call_no % nsets], NULL, NULL, p, splits, o, NULL);
    double h1 = tool_now();
    bench_timer_stop(tm, 0);
    if (st != FA_OK) return set_error(ctx, row, st, "back-to-back calls: "), -1;
    double total = 0;
    if (bench_timer_read(tm, 1, &total, &span, row->error, sizeof row->error) != 0)
        return row->status = FA_ERR_CUDA, -1;
    row->loop_s = total / reps;
    row->host_loop_s = (h1 - h0) / reps;
    row->reps = reps;
    row->status = FA_OK;
    return 0;
}

/* The CPU's rows add the KV bytes per second as a share of the host read bandwidth. */
static void print_header(int gpu) {
    printf("%5s %7s %-10s %6s %4s %4s %10s %10s %10s %8s %6s %s %s\n", "B", "cache", "layout",
           "checks", "reps", "sets", "median us", "loop us", "host us", gpu ? "KV TB/s" : "KV GB/s",
           "%copy", gpu ? "" : " %read", " kernel/splits");
}

static void print_row(const bench_decode_row *r, const bench_copy *copy, int gpu) {
    const double copy_bps = copy->bps;
    char layout[24];
    if (r->paged)
        snprintf(layout, sizeof layout, "paged%lld", (long long)r->page_size);
    else
        snprintf(layout, sizeof layout, "contiguous");
    printf("%5lld %7lld %-10s %6s ", (long long)r->batch, (long long)r->cache_len, layout,
           r->checks ? "on" : "off");
    if (r->status != FA_OK) {
        printf("error: %s\n", r->error);
        return;
    }
    double bps = r->kv_bytes / r->median_s;
    printf("%4d %4d %10.1f %10.1f %10.1f %8.3f %5.1f%% ", r->reps, r->sets, r->median_s * 1e6,
           r->loop_s * 1e6, r->host_loop_s * 1e6, bps * (gpu ? 1e-12 : 1e-9),
           copy_bps > 0 ? 100 * bps / copy_bps : 0.0);
    if (!gpu) printf("%5.1f%% ", copy->read_bps > 0 ? 100 * bps / copy->read_bps : 0.0);
    printf(" %s/%d\n", r->kernel, r->num_splits);
}

/* The copy bandwidth into *bps and, on the CPU, the read bandwidth into *read_bps. */
static int measure(bench_buf c[2], const bench_cfg *cfg, bench_timer *tm, double *med, double *bps,
                   double *read_bps, const char *when) {
    char err[256];
    int reps = 0;
    if (time_copy(&c[1], &c[0], cfg->dec.copy_bytes, tm, med, &reps, err, sizeof err) != 0) {
        fprintf(stderr, "flashattn bench: copy bandwidth (%s): %s\n", when, err);
        return -1;
    }
    *bps = 2.0 * (double)cfg->dec.copy_bytes / *med;
    char b[32];
    printf("# copy bandwidth (%s): %s copied in %.1f us (median of %d), %.3f %s read + write\n",
           when, tool_fmt_bytes(b, sizeof b, (double)cfg->dec.copy_bytes), *med * 1e6, reps,
           *bps * (cfg->backend == FA_BACKEND_CUDA ? 1e-12 : 1e-9),
           cfg->backend == FA_BACKEND_CUDA ? "TB/s" : "GB/s");
    if (cfg->backend == FA_BACKEND_CUDA) return 0;
    double rmed;
    *read_bps = bench_host_read_bps(c[0].ptr, cfg->dec.copy_bytes, (int)cfg->threads[0], 10, &rmed);
    printf("# read bandwidth (%s): %s read in %.1f us (median of 10, %s threads), %.3f GB/s\n",
           when, b, rmed * 1e6, cfg->threads[0] > 0 ? "the context's" : "all", *read_bps * 1e-9);
    return 0;
}

int bench_decode_run(bench_cfg *cfg, bench_decode_row **rows_out, int *nrows_out,
                     bench_copy *copy, char *fatal, size_t fatal_len) {
    fa_device dev = cfg->backend == FA_BACKEND_CUDA ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
    int gpu = dev == FA_DEVICE_CUDA;
    fa_dtype dt = cfg->dtypes[0];
    memset(copy, 0, sizeof *copy);
    copy->bytes = cfg->dec.copy_bytes;
    *rows_out = NULL;
    *nrows_out = 0;
    if (cfg->rotate_bytes == (size_t)-1 && !gpu) cfg->rotate_bytes = 0;
    fa_context *ctx = NULL;
    if (bench_open_backend(cfg, &ctx, fatal, fatal_len) != 0) return -1;
    fa_status tst = fa_context_set_threads(ctx, (int)cfg->threads[0]);
    if (tst != FA_OK) {
        snprintf(fatal, fatal_len, "fa_context_set_threads: %s", fa_last_error(ctx));
        fa_context_destroy(ctx);
        return -1;
    }
    int cap = cfg->dec.nbatches * cfg->dec.nlens * 2 * cfg->dec.nchecks;
    bench_decode_row *rows = calloc((size_t)cap, sizeof *rows);
    fa_kvcache *caches = calloc(MAX_SETS, sizeof *caches);
    bench_timer *tm = bench_timer_create(dev, BENCH_MAX_REPS);
    bench_buf cb[2] = {{0}, {0}};
    dec_pools pl;
    memset(&pl, 0, sizeof pl);
    int failed = -1;
    tool_rng rng = tool_rng_seed(cfg->seed);
    if (!rows || !caches || !tm) {
        snprintf(fatal, fatal_len, "out of memory (or no CUDA events) for the timing records");
        goto done;
    }
    if (bench_buf_alloc(&cb[0], dev, cfg->dec.copy_bytes) != 0 ||
        bench_buf_alloc(&cb[1], dev, cfg->dec.copy_bytes) != 0 ||
        bench_buf_fill_large(&cb[0], FA_DTYPE_BF16, cfg->dec.copy_bytes / 2, &rng) != 0) {
        snprintf(fatal, fatal_len, "cannot allocate or fill the 2 x %zu bytes of the copy "
                 "measurement", cfg->dec.copy_bytes);
        goto done;
    }
    copy->reps = 10;
    if (measure(cb, cfg, tm, &copy->start_s, &copy->start_bps, &copy->read_start_bps,
                "before the sweep") != 0) {
        snprintf(fatal, fatal_len, "the copy bandwidth could not be measured");
        goto done;
    }
    copy->bps = copy->start_bps;
    copy->read_bps = copy->read_start_bps;
    if (pools_make(&pl, cfg, dev, dt, &rng) != 0) {
        char b[32];
        snprintf(fatal, fatal_len, "cannot allocate or fill the cache pools (K and V of %s each)",
                 tool_fmt_bytes(b, sizeof b, (double)(pl.tokens * pl.row_bytes)));
        goto done;
    }
    char rot[32];
    if (cfg->dec.splits)
        printf("# decode: num_splits forced to %d\n", cfg->dec.splits);
    char sets[96] = "one set of the cache";
    if (cfg->rotate_bytes)
        snprintf(sets, sizeof sets, "sets of the cache of >= %s together (as many as fit)",
                 tool_fmt_bytes(rot, sizeof rot, (double)cfg->rotate_bytes));
    printf("# decode: %s, heads %lld/%lld, d %lld, one query token, causal; calls rotate over "
           "%s; median of per-call %s, then as many calls back to back (loop) and the host's "
           "time to issue them (host)\n",
           fa_dtype_name(dt), (long long)cfg->heads, (long long)cfg->heads_kv,
           (long long)cfg->head_dims[0], sets, gpu ? "CUDA events" : "wall clocks");
    print_header(gpu);
    failed = 0;
    int n = 0;
    fa_params p = fa_params_default();
    p.causal = 1;
    int64_t h = cfg->heads, d = cfg->head_dims[0];
    for (int bi = 0; bi < cfg->dec.nbatches; bi++)
        for (int li = 0; li < cfg->dec.nlens; li++)
            for (int paged = 0; paged < 2; paged++) {
                if (paged ? !cfg->dec.paged : !cfg->dec.contiguous) continue;
                int64_t b = cfg->dec.batches[bi], len = cfg->dec.cache_lens[li];
                size_t st = set_tokens(cfg, b, len, paged);
                int nsets = sets_wanted(cfg, 2 * st * pl.row_bytes);
                if ((size_t)nsets > pl.tokens / st) nsets = (int)(pl.tokens / st);
                char err[256] = "";
                int bad = make_caches(cfg, &pl, dt, dev, b, len, paged, nsets, &rng, caches, err,
                                      sizeof err) != 0;
                fa_tensor q = fa_tensor_bshd(pl.q.ptr, dt, dev, b, 1, h, d);
                fa_tensor o = fa_tensor_bshd(pl.o.ptr, dt, dev, b, 1, h, d);
                for (int ci = 0; ci < cfg->dec.nchecks; ci++) {
                    bench_decode_row *r = &rows[n++];
                    r->dtype = dt;
                    r->batch = b;
                    r->heads = h;
                    r->heads_kv = cfg->heads_kv;
                    r->head_dim = d;
                    r->seqlen_q = 1;
                    r->cache_len = len;
                    r->causal = 1;
                    r->paged = paged;
                    r->page_size = paged ? cfg->dec.page_size : 0;
                    r->checks = cfg->dec.checks[ci];
                    r->sets = nsets;
                    r->kv_bytes = 2.0 * (double)b * (double)len * (double)pl.row_bytes;
                    if (bad) {
                        r->status = FA_ERR_INTERNAL;
                        snprintf(r->error, sizeof r->error, "%s", err);
                        failed++;
                    } else if (time_row(ctx, cfg, caches, nsets, &q, &o, &p, tm, r) != 0) {
                        failed++;
                    }
                    print_row(r, copy, gpu);
                    fflush(stdout);
                    if (cfg->json_path) {
                        double load[2] = {cfg->load_start, tool_loadavg()};
                        bench_write_decode_json(cfg->json_path, cfg, rows, n, copy, load, NULL);
                    }
                }
            }
    if (measure(cb, cfg, tm, &copy->end_s, &copy->end_bps, &copy->read_end_bps,
                "after the sweep") == 0) {
        if (copy->end_bps > copy->bps) copy->bps = copy->end_bps;
        if (copy->read_end_bps > copy->read_bps) copy->read_bps = copy->read_end_bps;
    }
    *nrows_out = n;
done:
    pools_free(&pl);
    bench_buf_free(&cb[0]);
    bench_buf_free(&cb[1]);
    bench_timer_destroy(tm);
    free(caches);
    fa_context_destroy(ctx);
    if (failed < 0) {
        free(rows);
        rows = NULL;
    }
    *rows_out = rows;
    return failed;
}
