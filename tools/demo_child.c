/*
 * demo_child.c — one forward run of the demo inside an isolated child process.
 *
 * The child builds its own inputs from the seed (so the naive and the flash child see the
 * same numbers), starts the thread pool on a tiny problem in a throw-away context, records
 * its current RSS as the baseline, then times the one call that matters on a fresh context.
 * Peak RSS minus baseline is the memory the attention itself added: the fresh context still
 * has to allocate its workspace, and the tiny warm-up peaks far below the real call.
 */
#define _GNU_SOURCE
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "demo.h"

double demo_flops(int64_t batch, int64_t heads, int64_t n, int64_t d, int causal) {
    double f = 4.0 * (double)batch * (double)heads * (double)n * (double)n * (double)d;
    return causal ? 0.5 * f : f;
}

typedef struct bufs {
    void *q, *k, *v, *o;
    float *lse;
} bufs;

static void free_bufs(bufs *b) {
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->o);
    free(b->lse);
}

static int alloc_bufs(bufs *b, int64_t batch, int64_t n, int64_t h, int64_t d, fa_dtype dt,
                      uint64_t seed) {
    size_t elems = (size_t)(batch * n * h * d), es = fa_dtype_size(dt);
    memset(b, 0, sizeof *b);
    b->q = tool_alloc(elems * es);
    b->k = tool_alloc(elems * es);
    b->v = tool_alloc(elems * es);
    b->o = tool_alloc(elems * es);
    b->lse = tool_alloc((size_t)(batch * h * n) * sizeof(float));
    if (!b->q || !b->k || !b->v || !b->o || !b->lse) {
        free_bufs(b);
        return -1;
    }
    tool_rng r = tool_rng_seed(seed);
    tool_fill_random(b->q, dt, elems, &r);
    tool_fill_random(b->k, dt, elems, &r);
    tool_fill_random(b->v, dt, elems, &r);
    /* 0xff bytes are NaN in every float format: an element the call forgets shows up */
    memset(b->o, 0xff, elems * es);
    memset(b->lse, 0xff, (size_t)(batch * h * n) * sizeof(float));
    return 0;
}

static fa_status forward(fa_context *ctx, const bufs *b, int64_t batch, int64_t n, int64_t h,
                         int64_t d, fa_dtype dt, int causal) {
    fa_tensor q = fa_tensor_bshd(b->q, dt, FA_DEVICE_CPU, batch, n, h, d);
    fa_tensor k = fa_tensor_bshd(b->k, dt, FA_DEVICE_CPU, batch, n, h, d);
    fa_tensor v = fa_tensor_bshd(b->v, dt, FA_DEVICE_CPU, batch, n, h, d);
    fa_tensor o = fa_tensor_bshd(b->o, dt, FA_DEVICE_CPU, batch, n, h, d);
    fa_tensor lse = fa_tensor_3d(b->lse, FA_DTYPE_F32, FA_DEVICE_CPU, batch, h, n);
    fa_params p = fa_params_default();
    p.causal = causal;
    return fa_fwd(ctx, &q, &k, &v, &p, &o, &lse);
}

static size_t workspace_query(fa_context *ctx, const bufs *b, int64_t batch, int64_t n,
                              int64_t h, int64_t d, fa_dtype dt, int causal) {
    fa_tensor q = fa_tensor_bshd(b->q, dt, FA_DEVICE_CPU, batch, n, h, d);
    fa_tensor k = fa_tensor_bshd(b->k, dt, FA_DEVICE_CPU, batch, n, h, d);
    fa_params p = fa_params_default();
    p.causal = causal;
    size_t bytes = 0;
    if (fa_fwd_workspace_size(ctx, &q, &k, &k, &p, &bytes) != FA_OK) return 0;
    return bytes;
}

static int pwrite_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    off_t off = 0;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w <= 0) return -1;
        p += w;
        off += w;
        n -= (size_t)w;
    }
    return 0;
}

static void copy_error(demo_report *rep, const fa_context *ctx, fa_status st) {
    snprintf(rep->error, sizeof rep->error, "%s%s%s", fa_status_string(st),
             *fa_last_error(ctx) ? ": " : "", fa_last_error(ctx));
}

/* A context for the job; on failure NULL, with the status and message in rep. */
static fa_context *make_ctx(const demo_cfg *cfg, fa_algo algo, demo_report *rep) {
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
    if (st == FA_OK) st = fa_context_set_threads(ctx, cfg->threads);
    if (st == FA_OK) st = fa_context_set_algo(ctx, algo);
    if (st != FA_OK) {
        rep->status = st;
        copy_error(rep, ctx, st);
        fa_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* The job's timed call: fa_fwd, or the naive side (which records its own outcome in rep). */
static fa_status timed_call(const demo_job *job, fa_context *ctx, const bufs *b,
                            demo_report *rep) {
    const demo_cfg *cfg = job->cfg;
    int64_t B = cfg->batch, N = job->seqlen, H = job->heads, D = cfg->head_dim;
    if (!job->naive) return forward(ctx, b, B, N, H, D, cfg->dtype, job->causal);
    fa_status st = demo_naive_fwd(b->q, b->k, b->v, b->o, cfg->dtype, B, N, H, D, job->causal);
    if (st == FA_OK) {
        snprintf(rep->kernel, sizeof rep->kernel, "%s", demo_naive_label());
    } else {
        char need[32];
        tool_fmt_bytes(need, sizeof need, (double)rep->score_bytes);
        snprintf(rep->error, sizeof rep->error, "no memory for its %lldx%lldx%lldx%lld fp32 scores%s (%s)",
                 (long long)B, (long long)H, (long long)N, (long long)N,
                 cfg->dtype == FA_DTYPE_F32 ? "" : " and fp32 copies", need);
    }
    return st;
}

/* Starts the worker threads and faults the code in on a problem too small to matter, so the
   timed call and the baseline both see a warm runtime; records the library's thread count,
   which the naive side then uses too. The naive side warms at 256 tokens, where a BLAS starts
   its own threads and buffers: their address space must exist before the memory limit. */
static void warm_up(const demo_job *job, demo_report *rep) {
    const demo_cfg *cfg = job->cfg;
    int64_t H = job->heads, D = cfg->head_dim;
    fa_context *ctx = make_ctx(cfg, FA_ALGO_AUTO, rep);
    bufs warm;
    if (ctx && alloc_bufs(&warm, 1, 64, H, D, cfg->dtype, cfg->seed) == 0) {
        if (forward(ctx, &warm, 1, 64, H, D, cfg->dtype, job->causal) == FA_OK &&
            fa_last_selection(ctx))
            rep->lib_threads = fa_last_selection(ctx)->threads;
        free_bufs(&warm);
    }
    fa_context_destroy(ctx);
    if (!job->naive) return;
    rep->sel_threads = demo_naive_set_threads(rep->lib_threads);
    if (alloc_bufs(&warm, 1, 256, 1, D, cfg->dtype, cfg->seed) == 0) {
        demo_naive_fwd(warm.q, warm.k, warm.v, warm.o, cfg->dtype, 1, 256, 1, D, job->causal);
        free_bufs(&warm);
    }
}

/* Runs in the child. Exit codes: 0 the report is complete, 2 setup failed (reported). */
static int child_main(void *arg, int fd) {
    const demo_job *job = arg;
    const demo_cfg *cfg = job->cfg;
    int64_t B = cfg->batch, N = job->seqlen, H = job->heads, D = cfg->head_dim;
    fa_dtype dt = cfg->dtype;
    demo_report rep;
    memset(&rep, 0, sizeof rep);
    if (job->naive) rep.score_bytes = demo_naive_bytes(B, H, N, D, dt);

#ifdef __GLIBC__
    /* Every block of 64 KiB or more gets fresh pages and returns them when freed; otherwise
       the warm-up's freed buffers would be reused by the timed call and its workspace would
       not show in the RSS it adds. */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
#endif
    warm_up(job, &rep);
    iso_limit_memory(cfg->mem_limit);
    fa_context *ctx = make_ctx(cfg, FA_ALGO_AUTO, &rep);
    if (!ctx) {
        rep.stage = DEMO_STAGE_DONE;
        iso_write(fd, &rep, sizeof rep);
        return 2;
    }

    size_t elems = (size_t)(B * N * H * D);
    rep.input_bytes = 4 * elems * fa_dtype_size(dt) + (uint64_t)(B * H * N) * sizeof(float);
    bufs b;
    if (alloc_bufs(&b, B, N, H, D, dt, cfg->seed ^ (uint64_t)N * 0x9e3779b97f4a7c15ull) != 0) {
        rep.stage = DEMO_STAGE_DONE;
        rep.status = FA_ERR_OUT_OF_MEMORY;
        rep.no_inputs = 1;
        snprintf(rep.error, sizeof rep.error, "the tool could not allocate the inputs");
        iso_write(fd, &rep, sizeof rep);
        fa_context_destroy(ctx);
        return 2;
    }
    if (!job->naive) rep.ws_query = workspace_query(ctx, &b, B, N, H, D, dt, job->causal);
    rep.baseline_kib = iso_self_rss_kib();
    rep.stage = DEMO_STAGE_READY;
    iso_write(fd, &rep, sizeof rep);

    /* A naive run that would fit but take too long is skipped; one that cannot fit still runs,
       because the library's own failure is the point of the demo and costs no time. */
    if (job->naive && cfg->naive_budget > 0 &&
        job->est_seconds > cfg->naive_budget &&
        (double)rep.score_bytes + (double)rep.baseline_kib * 1024.0 < (double)cfg->mem_limit) {
        rep.stage = DEMO_STAGE_DONE;
        rep.skipped = 1;
        iso_write(fd, &rep, sizeof rep);
        free_bufs(&b);
        fa_context_destroy(ctx);
        return 0;
    }

    double t0 = tool_now();
    fa_status st = timed_call(job, ctx, &b, &rep);
    rep.seconds = tool_now() - t0;
    rep.status = st;
    /* A call under DEMO_REPEAT_BELOW seconds is repeated and the median taken: one call that
       short on a busy machine is mostly noise. The outputs are those of the last call, which
       computes the same numbers. */
    double times[DEMO_MAX_CALLS] = {rep.seconds};
    int calls = 1;
    for (double spent = rep.seconds; st == FA_OK && rep.seconds < DEMO_REPEAT_BELOW &&
                                     calls < DEMO_MAX_CALLS && spent < 5 * DEMO_REPEAT_BELOW;
         calls++) {
        double t1 = tool_now();
        st = timed_call(job, ctx, &b, &rep);
        times[calls] = tool_now() - t1;
        spent += times[calls];
    }
    rep.calls = calls;
    rep.seconds = tool_median(times, calls);
    rep.status = st;
    if (st == FA_OK) {
        const fa_selection *sel = job->naive ? NULL : fa_last_selection(ctx);
        if (sel) {
            rep.ws_used = sel->workspace_bytes;
            rep.sel_threads = sel->threads;
            rep.tile_q = sel->tile_q;
            rep.tile_k = sel->tile_k;
            snprintf(rep.kernel, sizeof rep.kernel, "%s", sel->kernel);
            snprintf(rep.reason, sizeof rep.reason, "%s", sel->reason);
        }
        for (size_t i = 0; i < elems; i++)
            if (!isfinite(tool_load(b.o, dt, i))) rep.nonfinite++;
        if (job->out_fd >= 0 &&
            pwrite_all(job->out_fd, b.o, elems * fa_dtype_size(dt)) == 0)
            rep.out_bytes = elems * fa_dtype_size(dt);
    } else if (!job->naive) {
        copy_error(&rep, ctx, st);
    }
    rep.stage = DEMO_STAGE_DONE;
    iso_write(fd, &rep, sizeof rep);
    free_bufs(&b);
    fa_context_destroy(ctx);
    return 0;
}

/* The progress line of a run that takes more than a second: on a terminal one line on stderr,
   rewritten in place every second and erased when the run ends; elsewhere (a log) one line per
   such run, so the log says what ran long without a line per second. */
typedef struct progress {
    const demo_job *job;
    int tty, shown;
} progress;

static void progress_tick(void *arg, double elapsed) {
    progress *pg = arg;
    if (elapsed < 1.0 || (!pg->tty && pg->shown)) return;
    if (pg->tty && (int)elapsed == pg->shown) return;
    char est[48] = "", t[24];
    if (pg->job->est_seconds > 0)
        snprintf(est, sizeof est, ", %s expected",
                 tool_fmt_seconds(t, sizeof t, pg->job->est_seconds));
    if (pg->tty)
        fprintf(stderr, "\r\033[K  %s at seqlen %lld: running for %d s%s ", pg->job->label,
                (long long)pg->job->seqlen, (int)elapsed, est);
    else
        fprintf(stderr, "flashattn demo: %s at seqlen %lld runs longer than a second%s\n",
                pg->job->label, (long long)pg->job->seqlen, est);
    fflush(stderr);
    pg->shown = (int)elapsed;
}

int demo_run(const demo_job *job, demo_outcome *oc) {
    memset(oc, 0, sizeof *oc);
    progress pg = {job, isatty(STDERR_FILENO), 0};
    int rc = iso_run_watched(child_main, (void *)job, job->label ? progress_tick : NULL, &pg,
                             &oc->iso);
    if (pg.tty && pg.shown) fprintf(stderr, "\r\033[K");
    if (rc != 0) return -1;
    /* reports come back to back; the last complete one counts */
    const char *p = oc->iso.report;
    for (size_t left = oc->iso.report_bytes; left >= sizeof(demo_report);
         left -= sizeof(demo_report), p += sizeof(demo_report)) {
        memcpy(&oc->rep, p, sizeof oc->rep);
        oc->have_report = 1;
    }
    return 0;
}

int demo_out_file(void) { return memfd_create("flashattn-demo-out", MFD_CLOEXEC); }

double demo_max_abs_err(int fx, int fy, fa_dtype dt, size_t n) {
    enum { CHUNK = 1 << 16 };
    size_t es = fa_dtype_size(dt);
    char *x = malloc(CHUNK * es), *y = malloc(CHUNK * es);
    double m = x && y ? 0 : -1;
    for (size_t i = 0; i < n && m >= 0; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        off_t off = (off_t)(i * es);
        if (pread(fx, x, k * es, off) != (ssize_t)(k * es) ||
            pread(fy, y, k * es, off) != (ssize_t)(k * es)) {
            m = -1;
            break;
        }
        for (size_t j = 0; j < k; j++) {
            double e = fabs(tool_load(x, dt, j) - tool_load(y, dt, j));
            if (isnan(e)) {
                m = NAN;
                break;
            }
            if (e > m) m = e;
        }
        if (isnan(m)) break;
    }
    free(x);
    free(y);
    return m;
}

void demo_outcome_free(demo_outcome *oc) {
    free(oc->iso.report);
    memset(oc, 0, sizeof *oc);
}
