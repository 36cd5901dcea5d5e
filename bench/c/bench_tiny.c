/*
 * bench_tiny.c — `flashattn bench --tiny`: the latency of calls too small for a thread team,
 * where the time is the library's overhead (checks, dispatch, the record, a team's start)
 * rather than arithmetic. Each row times every call on its own and prints the median, with
 * the threads the library recorded; issue 43's target is 10 us a call on the CPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define TINY_CALLS 2000 /* timed calls per row; the median of so many is stable to ~0.1 us */

typedef struct tiny_shape {
    const char *name;
    int op; /* 0 fwd, 1 bwd, 2 fwd_kvcache (one new token appended, one query token) */
    int64_t batch, seqlen, heads, heads_kv, d;
} tiny_shape;

/* A 1x1x1x8 call of each op, and a decode step of a small model (8 query heads over 2 kv
   heads, d 64, 128 cached tokens, one appended). */
static const tiny_shape shapes[] = {
    {"fwd 1x1x1x8", 0, 1, 1, 1, 1, 8},
    {"bwd 1x1x1x8", 1, 1, 1, 1, 1, 8},
    {"kvcache 1x1x1x8, 1 cached", 2, 1, 1, 1, 1, 8},
    {"kvcache decode 8/2 heads, d 64, 128 cached", 2, 1, 128, 8, 2, 64},
};

typedef struct tiny_bufs {
    float *q, *k, *v, *o, *lse, *dq, *dk, *dv, *kn, *vn;
    int32_t seqlens[1];
} tiny_bufs;

static int tiny_call(fa_context *ctx, const tiny_shape *s, tiny_bufs *b) {
    const fa_device dev = FA_DEVICE_CPU;
    const fa_dtype dt = FA_DTYPE_F32;
    fa_params p = fa_params_default();
    fa_tensor q = fa_tensor_bshd(b->q, dt, dev, s->batch, 1, s->heads, s->d);
    fa_tensor o = fa_tensor_bshd(b->o, dt, dev, s->batch, 1, s->heads, s->d);
    fa_tensor lse = fa_tensor_3d(b->lse, FA_DTYPE_F32, dev, s->batch, s->heads, 1);
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
    fa_tensor dq = fa_tensor_bshd(b->dq, dt, dev, s->batch, 1, s->heads, s->d);
    fa_tensor dk = fa_tensor_bshd(b->dk, dt, dev, s->batch, s->seqlen, s->heads_kv, s->d);
    fa_tensor dv = fa_tensor_bshd(b->dv, dt, dev, s->batch, s->seqlen, s->heads_kv, s->d);
    return fa_bwd(ctx, &q, &k, &v, &o, &o, &lse, &p, &dq, &dk, &dv);
}

/* Fills every buffer large enough for every shape with normal values. */
static int tiny_alloc(tiny_bufs *b, tool_rng *r) {
    const size_t n = 8 * 64 * 130; /* heads x d x (cache + 2) at most */
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
    tiny_free(&b);
    return failed ? 1 : 0;
}
