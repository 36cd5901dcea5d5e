/*
 * test_threads.c — the CPU backend is deterministic whatever its thread count: the same
 * forward, backward and KV-cache call with 1, 2, 3, 7 and 16 threads (fa_context_set_threads)
 * gives bit-identical outputs, at odd sizes (sequences of 37 and 53 rows across 64-row tiles,
 * GQA 6/2, head dim 40).
 * Two choices depend on the thread count by design, and change the order of the sums:
 *  - the backward's schedule (one-pass or two-pass, src/cpu/bwd_schedule.c: one-pass needs two
 *    kv heads per thread). Under each forced schedule (FLASHATTN_CPU_BWD_SCHEDULE, read when
 *    a context is created) the gradients are bit-identical across counts, and the default
 *    schedule's gradients equal, bit for bit, those of the schedule it chose;
 *  - the KV cache's split count when num_splits is 0 (more splits when the sequences alone
 *    leave threads idle, src/cpu/kvcache.c). With a forced count the result is bit-identical
 *    across thread counts; with 0 it equals, bit for bit, the forced call with the count the
 *    selection record reports.
 * Every call also runs twice per thread count and must repeat itself bit for bit.
 * ThreadSanitizer: `make test-tsan` runs this test (and the other threaded ones) built by
 * clang with -fsanitize=thread. The OpenMP runtime is not instrumented: libomp's Archer tool
 * (OMP_TOOL_LIBRARIES) tells TSan about its barriers and tasks, and scripts/tsan.supp leaves
 * out what the runtime does inside itself (its mutex set-up looked racy). So configured, a
 * small OpenMP program with a real race in a parallel region is reported and a clean one is
 * not (clang 14, Debian 12). gcc's libgomp has no such tool.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

enum { B = 2, SQ = 37, SK = 53, HQ = 6, HKV = 2, D = 40, NQ = B * SQ * HQ * D, NK = B * SK * HKV * D };
enum { NLSE = B * HQ * SQ, KV_SQ = 3, KV_LEN = 601, KV_NEW = 2 };
static const int counts[] = {1, 2, 3, 7, 16};
#define NCOUNTS ((int)(sizeof counts / sizeof *counts))

static float q[NQ], k[NK], v[NK], dout[NQ];

static void fill(float *x, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) * 0x1p-24f - 0.5f;
    }
}

static fa_context *context(const char *schedule) {
    if (schedule)
        setenv("FLASHATTN_CPU_BWD_SCHEDULE", schedule, 1);
    else
        unsetenv("FLASHATTN_CPU_BWD_SCHEDULE");
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    unsetenv("FLASHATTN_CPU_BWD_SCHEDULE");
    return ctx;
}

static fa_params causal_window(void) {
    fa_params p = fa_params_default();
    p.causal = 1;
    p.window_left = 29; /* a diagonal band: edge tiles on both sides */
    return p;
}

/* The forward's out and lse with n threads. */
static void fwd(fa_context *ctx, int n, float *o, float *lse) {
    assert_int_equal(fa_context_set_threads(ctx, n), FA_OK);
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, FA_DEVICE_CPU, B, SQ, HQ, D);
    fa_tensor tk = fa_tensor_bshd(k, FA_DTYPE_F32, FA_DEVICE_CPU, B, SK, HKV, D);
    fa_tensor tv = fa_tensor_bshd(v, FA_DTYPE_F32, FA_DEVICE_CPU, B, SK, HKV, D);
    fa_tensor to = fa_tensor_bshd(o, FA_DTYPE_F32, FA_DEVICE_CPU, B, SQ, HQ, D);
    fa_tensor tl = fa_tensor_3d(lse, FA_DTYPE_F32, FA_DEVICE_CPU, B, HQ, SQ);
    const fa_params p = causal_window();
    assert_int_equal(fa_fwd(ctx, &tq, &tk, &tv, &p, &to, &tl), FA_OK);
}

static void test_fwd_threads(void **state) {
    fa_context *ctx = context(NULL);
    static float o0[NQ], l0[NLSE], o[NQ], l[NLSE];
    fwd(ctx, 1, o0, l0);
    for (int c = 0; c < NCOUNTS; c++)
        for (int rep = 0; rep < 2; rep++) {
            fwd(ctx, counts[c], o, l);
            if (memcmp(o, o0, sizeof o) || memcmp(l, l0, sizeof l))
                fail_msg("fa_fwd with %d threads (run %d) differs from 1 thread", counts[c], rep);
        }
    fa_context_destroy(ctx);
}

typedef struct grads {
    float dq[NQ], dk[NK], dv[NK];
} grads;

/* The backward with n threads from the 1-thread forward's out and lse. */
static void bwd(fa_context *ctx, int n, const float *o, const float *lse, grads *g) {
    assert_int_equal(fa_context_set_threads(ctx, n), FA_OK);
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, FA_DEVICE_CPU, B, SQ, HQ, D);
    fa_tensor tk = fa_tensor_bshd(k, FA_DTYPE_F32, FA_DEVICE_CPU, B, SK, HKV, D);
    fa_tensor tv = fa_tensor_bshd(v, FA_DTYPE_F32, FA_DEVICE_CPU, B, SK, HKV, D);
    fa_tensor to = fa_tensor_bshd((void *)o, FA_DTYPE_F32, FA_DEVICE_CPU, B, SQ, HQ, D);
    fa_tensor tdo = fa_tensor_bshd(dout, FA_DTYPE_F32, FA_DEVICE_CPU, B, SQ, HQ, D);
    fa_tensor tl = fa_tensor_3d((void *)lse, FA_DTYPE_F32, FA_DEVICE_CPU, B, HQ, SQ);
    fa_tensor tdq = fa_tensor_bshd(g->dq, FA_DTYPE_F32, FA_DEVICE_CPU, B, SQ, HQ, D);
    fa_tensor tdk = fa_tensor_bshd(g->dk, FA_DTYPE_F32, FA_DEVICE_CPU, B, SK, HKV, D);
    fa_tensor tdv = fa_tensor_bshd(g->dv, FA_DTYPE_F32, FA_DEVICE_CPU, B, SK, HKV, D);
    const fa_params p = causal_window();
    assert_int_equal(fa_bwd(ctx, &tq, &tk, &tv, &to, &tdo, &tl, &p, &tdq, &tdk, &tdv), FA_OK);
}

static void test_bwd_threads(void **state) {
    static float o[NQ], lse[NLSE];
    static grads ref[2], g;
    const char *sched[2] = {"one-pass", "two-pass"};
    fa_context *ctx = context(NULL);
    fwd(ctx, 1, o, lse);
    for (int s = 0; s < 2; s++) { /* each schedule: bit-identical across counts */
        fa_context *cs = context(sched[s]);
        bwd(cs, 1, o, lse, &ref[s]);
        for (int c = 0; c < NCOUNTS; c++)
            for (int rep = 0; rep < 2; rep++) {
                bwd(cs, counts[c], o, lse, &g);
                if (memcmp(&g, &ref[s], sizeof g))
                    fail_msg("fa_bwd (%s) with %d threads (run %d) differs from 1 thread",
                             sched[s], counts[c], rep);
            }
        fa_context_destroy(cs);
    }
    for (int c = 0; c < NCOUNTS; c++) { /* the default: the chosen schedule's result */
        bwd(ctx, counts[c], o, lse, &g);
        const fa_selection *sel = fa_last_selection(ctx);
        assert_non_null(sel);
        if (memcmp(&g, &ref[0], sizeof g) && memcmp(&g, &ref[1], sizeof g))
            fail_msg("fa_bwd with %d threads (%s) matches neither forced schedule",
                     counts[c], sel->kernel);
    }
    fa_context_destroy(ctx);
}

static float cache_k[B * (KV_LEN + KV_NEW) * HKV * D], cache_v[B * (KV_LEN + KV_NEW) * HKV * D];
static float knew[B * KV_NEW * HKV * D], vnew[B * KV_NEW * HKV * D];

/* The KV-cache forward with n threads and `splits` (0: the library's), appending k_new /
   v_new to a fresh copy of the cache; returns the split count the record reports. */
static int kv(fa_context *ctx, int n, int splits, float *o, float *lse) {
    static float ck[sizeof cache_k / sizeof *cache_k], cv[sizeof cache_v / sizeof *cache_v];
    memcpy(ck, cache_k, sizeof ck);
    memcpy(cv, cache_v, sizeof cv);
    assert_int_equal(fa_context_set_threads(ctx, n), FA_OK);
    const int32_t seqlens[B] = {KV_LEN, 117};
    fa_kvcache cache = {fa_tensor_bshd(ck, FA_DTYPE_F32, FA_DEVICE_CPU, B, KV_LEN + KV_NEW, HKV, D),
                        fa_tensor_bshd(cv, FA_DTYPE_F32, FA_DEVICE_CPU, B, KV_LEN + KV_NEW, HKV, D),
                        seqlens, NULL, 0, 0};
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, FA_DEVICE_CPU, B, KV_SQ, HQ, D);
    fa_tensor tkn = fa_tensor_bshd(knew, FA_DTYPE_F32, FA_DEVICE_CPU, B, KV_NEW, HKV, D);
    fa_tensor tvn = fa_tensor_bshd(vnew, FA_DTYPE_F32, FA_DEVICE_CPU, B, KV_NEW, HKV, D);
    fa_tensor to = fa_tensor_bshd(o, FA_DTYPE_F32, FA_DEVICE_CPU, B, KV_SQ, HQ, D);
    fa_tensor tl = fa_tensor_3d(lse, FA_DTYPE_F32, FA_DEVICE_CPU, B, HQ, KV_SQ);
    fa_params p = fa_params_default(); /* causal over the whole cache: room for splits */
    p.causal = 1;
    assert_int_equal(fa_fwd_kvcache(ctx, &tq, &cache, &tkn, &tvn, &p, splits, &to, &tl), FA_OK);
    return fa_last_selection(ctx)->num_splits;
}

enum { KV_NO = B * KV_SQ * HQ * D, KV_NL = B * HQ * KV_SQ, MAX_SPLITS = 16 };

static void test_kvcache_threads(void **state) {
    fa_context *ctx = context(NULL);
    static float o0[KV_NO], l0[KV_NL], o[KV_NO], l[KV_NL];
    for (int splits = 1; splits <= 4; splits += 3) { /* forced: bit-identical across counts */
        kv(ctx, 1, splits, o0, l0);
        for (int c = 0; c < NCOUNTS; c++)
            for (int rep = 0; rep < 2; rep++) {
                kv(ctx, counts[c], splits, o, l);
                if (memcmp(o, o0, sizeof o) || memcmp(l, l0, sizeof l))
                    fail_msg("fa_fwd_kvcache (%d splits) with %d threads (run %d) differs from 1 "
                             "thread", splits, counts[c], rep);
            }
    }
    for (int c = 0; c < NCOUNTS; c++) { /* the library's count: that forced count's result */
        const int chosen = kv(ctx, counts[c], 0, o, l);
        assert_true(chosen >= 1 && chosen <= MAX_SPLITS);
        kv(ctx, 1, chosen, o0, l0);
        if (memcmp(o, o0, sizeof o) || memcmp(l, l0, sizeof l))
            fail_msg("fa_fwd_kvcache with %d threads (%d splits chosen) differs from 1 thread "
                     "with %d splits", counts[c], chosen, chosen);
    }
    fa_context_destroy(ctx);
}

int main(void) {
    fill(q, NQ, 1), fill(k, NK, 2), fill(v, NK, 3), fill(dout, NQ, 4);
    fill(cache_k, (int)(sizeof cache_k / sizeof *cache_k), 5);
    fill(cache_v, (int)(sizeof cache_v / sizeof *cache_v), 6);
    fill(knew, (int)(sizeof knew / sizeof *knew), 7), fill(vnew, (int)(sizeof vnew / sizeof *vnew), 8);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fwd_threads),
        cmocka_unit_test(test_bwd_threads),
        cmocka_unit_test(test_kvcache_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
