/*
 * bench_tiny.c — `flashattn bench --tiny`: the latency of calls too small for a thread team,
 * where the time is the library's overhead (checks, dispatch, the record, a team's start)
 * rather than arithmetic. Each row times every call on its own and prints the median, with
 * the threads the library recorded; issue 43's target is 10 us a call on the CPU.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define TINY_CALLS 2000 /* timed calls per row; the median of so many is stable to ~0.1 us */
#define CROSS_CALLS 300 /* per side and row of the threshold table (larger calls) */
#define CROSS_MAX_CACHE 2048

typedef struct tiny_shape {
    const char *name;
    int op; /* 0 fwd, 1 bwd, 2 fwd_kvcache (one new token appended, one query token) */
    int64_t batch, seqlen, heads, heads_kv, d;
    int64_t sq; /* query rows of fwd / bwd (0: 1) */
} tiny_shape;

/* A 1x1x1x8 call of each op, and a decode step of a small model (8 query heads over 2 kv
   heads, d 64, 128 cached tokens, one appended). */
static const tiny_shape shapes[] = {
    {"fwd 1x1x1x8", 0, 1, 1, 1, 1, 8, 0},
    {"bwd 1x1x1x8", 1, 1, 1, 1, 1, 8, 0},
    {"kvcache 1x1x1x8, 1 cached", 2, 1, 1, 1, 1, 8, 0},
    {"kvcache decode 8/2 heads, d 64, 128 cached", 2, 1, 128, 8, 2, 64, 0},
};

/* The threshold's measurement (cpu/team.h): calls from 2^16 to 2^23 FLOPs, each timed alone
   on the calling thread and through the context's team, alternately (so both see the same
   load). Square forwards (1 head, d 64: 256 s^2 FLOPs) and decode steps of the small model
   above (2048 FLOPs a cached token). */
static const tiny_shape cross[] = {
    {"fwd 1x16x1x64", 0, 1, 16, 1, 1, 64, 16},
    {"fwd 1x32x1x64", 0, 1, 32, 1, 1, 64, 32},
    {"fwd 1x48x1x64", 0, 1, 48, 1, 1, 64, 48},
    {"fwd 1x64x1x64", 0, 1, 64, 1, 1, 64, 64},
    {"fwd 1x90x1x64", 0, 1, 90, 1, 1, 64, 90},
    {"fwd 1x128x1x64", 0, 1, 128, 1, 1, 64, 128},
    {"fwd 1x181x1x64", 0, 1, 181, 1, 1, 64, 181},
    {"decode 8/2 heads, d 64, 128 cached", 2, 1, 128, 8, 2, 64, 0},
    {"decode 8/2 heads, d 64, 512 cached", 2, 1, 512, 8, 2, 64, 0},
    {"decode 8/2 heads, d 64, 1024 cached", 2, 1, 1024, 8, 2, 64, 0},
    {"decode 8/2 heads, d 64, 2048 cached", 2, 1, CROSS_MAX_CACHE, 8, 2, 64, 0},
};

typedef struct tiny_bufs {
    float *q, *k, *v, *o, *lse, *dq, *dk, *dv, *kn, *vn;
    int32_t seqlens[1];
} tiny_bufs;

static int tiny_call(fa_context *ctx, const tiny_shape *s, tiny_bufs *b) {
    const fa_device dev = FA_DEVICE_CPU;
    const fa_dtype dt = FA_DTYPE_F32;
    fa_params p = fa_params_default();
    const int64_t sq = s->op == 2 || !s->sq ? 1 : s->sq;
    fa_tensor q = fa_tensor_bshd(b->q, dt, dev, s->batch, sq, s->heads, s->d);
    fa_tensor o = fa_tensor_bshd(b->o, dt, dev, s->batch, sq, s->heads, s->d);
    fa_tensor lse = fa_tensor_3d(b->lse, FA_DTYPE_F32, dev, s->batch, s->heads, sq);
    if (s->op == 2) {
        fa_kvcache c;
        memset(&c, 0, sizeof c);
        c.k = fa_tensor_bshd(b->k, dt, dev, s->batch, s->seqlen + 1, s->heads_kv, s->d);
        c.v = fa_tensor_bshd(b->v, dt, dev, s->batch, s->seqlen + 1, s->heads_kv, s->d);
        b->seqlens[0] = (int32_t)s->seqlen;
        c.seqlens = b->seqlens;
        fa_tensor kn = fa_tensor_bshd(b->kn, dt, dev, s->batch, 1, s->heads_kv, s->d);
        fa_tensor vn = fa_tensor_bshd(b->vn, dt, dev, s->batch, 1, s->heads_kv, s->d);
        p.causal = 1;
        return fa_fwd_kvcache(ctx, &q, &c, &kn, &vn, &p, 0, &o, &lse);
    }
    fa_tensor k = fa_tensor_bshd(b->k, dt, dev, s->batch, s->seqlen, s->heads_kv, s->d);
    fa_tensor v = fa_tensor_bshd(b->v, dt, dev, s->batch, s->seqlen, s->heads_kv, s->d);
    if (s->op == 0) return fa_fwd(ctx, &q, &k, &v, &p, &o, &lse);
    fa_tensor dq = fa_tensor_bshd(b->dq, dt, dev, s->batch, sq, s->heads, s->d);
    fa_tensor dk = fa_tensor_bshd(b->dk, dt, dev, s->batch, s->seqlen, s->heads_kv, s->d);
    fa_tensor dv = fa_tensor_bshd(b->dv, dt, dev, s->batch, s->seqlen, s->heads_kv, s->d);
    return fa_bwd(ctx, &q, &k, &v, &o, &o, &lse, &p, &dq, &dk, &dv);
}

/* Fills every buffer large enough for every shape with normal values. */
static int tiny_alloc(tiny_bufs *b, tool_rng *r) {
    const size_t n = 8 * 64 * (CROSS_MAX_CACHE + 2); /* heads x d x (cache + 2) at most */
    float **all[] = {&b->q, &b->k, &b->v, &b->o, &b->lse, &b->dq, &b->dk, &b->dv, &b->kn, &b->vn};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        *all[i] = malloc(n * sizeof(float));
        if (!*all[i]) return -1;
        tool_fill_normal(*all[i], FA_DTYPE_F32, n, r);
    }
    return 0;
}

static void tiny_free(tiny_bufs *b) {
    float *all[] = {b->q, b->k, b->v, b->o, b->lse, b->dq, b->dk, b->dv, b->kn, b->vn};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

static double shape_flops(const tiny_shape *s) {
    if (s->op == 2) return 4.0 * (double)(s->heads * (s->seqlen + 1) * s->d);
    return 4.0 * (double)(s->batch * s->heads * s->sq * s->seqlen * s->d);
}

/* A context whose threshold is `flops` (FLASHATTN_CPU_SMALL_FLOPS), or NULL. */
static fa_context *threshold_context(const char *flops, int threads) {
    fa_context *ctx = NULL;
    setenv("FLASHATTN_CPU_SMALL_FLOPS", flops, 1);
    const fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
    unsetenv("FLASHATTN_CPU_SMALL_FLOPS");
    if (st != FA_OK) return NULL;
    if (threads > 0) fa_context_set_threads(ctx, threads);
    return ctx;
}

/* The threshold table: median us alone and with the team, and which one the default picks. */
static int crossover(const bench_cfg *cfg, tiny_bufs *b) {
    fa_context *alone = threshold_context("1e30", (int)cfg->threads[0]);
    fa_context *team = threshold_context("0", (int)cfg->threads[0]);
    static double ta[CROSS_CALLS], tt[CROSS_CALLS];
    int failed = !alone || !team;
    if (!failed)
        printf("\nthreshold (cpu/team.h, %.0f FLOPs): each call alone and through the team, "
               "alternately\n%-46s %10s %10s %10s %8s %8s\n",
               1048576.0, "call (f32)", "FLOPs", "alone us", "team us", "threads", "default");
    for (size_t i = 0; i < sizeof cross / sizeof *cross && !failed; i++) {
        const tiny_shape *s = &cross[i];
        int st = FA_OK;
        for (int w = 0; w < 20 && st == FA_OK; w++)
            if ((st = tiny_call(alone, s, b)) == FA_OK) st = tiny_call(team, s, b);
        for (int c = 0; c < CROSS_CALLS && st == FA_OK; c++) {
            double t0 = tool_now();
            st = tiny_call(alone, s, b);
            ta[c] = tool_now() - t0;
            t0 = tool_now();
            if (st == FA_OK) st = tiny_call(team, s, b);
            tt[c] = tool_now() - t0;
        }
        if (st != FA_OK) {
            printf("%-46s failed: %s\n", s->name, fa_last_error(NULL));
            failed = 1;
            break;
        }
        const int threads = fa_last_selection(team)->threads;
        const double fl = shape_flops(s), ma = tool_median(ta, CROSS_CALLS) * 1e6,
                     mt = tool_median(tt, CROSS_CALLS) * 1e6;
        printf("%-46s %10.3g %10.2f %10.2f %8d %8s\n", s->name, fl, ma, mt, threads,
               fl < 1048576.0 ? "alone" : "team");
    }
    if (alone) fa_context_destroy(alone);
    if (team) fa_context_destroy(team);
    return failed;
}

int bench_tiny_run(const bench_cfg *cfg) {
    tiny_bufs b;
    memset(&b, 0, sizeof b);
    tool_rng r = tool_rng_seed(cfg->seed);
    fa_context *ctx = NULL;
    int failed = 0;
    if (tiny_alloc(&b, &r) != 0 || fa_context_create(&ctx, FA_BACKEND_CPU) != FA_OK) {
        fprintf(stderr, "flashattn bench --tiny: cannot allocate the inputs or a context\n");
        tiny_free(&b);
        return 1;
    }
    if (cfg->threads[0] > 0) fa_context_set_threads(ctx, (int)cfg->threads[0]);
    static double t[TINY_CALLS];
    printf("%-46s %10s %10s %10s %8s  %s\n", "call (f32)", "median us", "min us", "p90 us",
           "threads", "kernel");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const tiny_shape *s = &shapes[i];
        int st = FA_OK;
        for (int w = 0; w < 50 && st == FA_OK; w++) st = tiny_call(ctx, s, &b);
        for (int c = 0; c < TINY_CALLS && st == FA_OK; c++) {
            const double t0 = tool_now();
            st = tiny_call(ctx, s, &b);
            t[c] = tool_now() - t0;
        }
        if (st != FA_OK) {
            printf("%-46s failed: %s\n", s->name, fa_last_error(ctx));
            failed++;
            continue;
        }
        const fa_selection *sel = fa_last_selection(ctx);
        const double med = tool_median(t, TINY_CALLS); /* sorts t */
        printf("%-46s %10.2f %10.2f %10.2f %8d  %s\n", s->name, med * 1e6, t[0] * 1e6,
               t[TINY_CALLS * 9 / 10] * 1e6, sel ? sel->threads : 0, sel ? sel->kernel : "?");
    }
    fa_context_destroy(ctx);
    failed += crossover(cfg, &b);
    tiny_free(&b);
    return failed ? 1 : 0;
}
