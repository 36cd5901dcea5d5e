/*
 * test_small.c — a call below the small-work threshold (src/cpu/team.h: no thread team, its
 * items in a plain loop on the calling thread) gives, bit for bit, what the same call gives
 * through the team, and the threshold is crossed: the rule is that results never depend on
 * the thread count, so skipping the team must not change a bit either.
 *
 * Two contexts of 2 threads each: one with the default threshold (2^20 FLOPs) and one with
 * FLASHATTN_CPU_SMALL_FLOPS=0, where every call gets the team. Forward, backward (under each
 * forced schedule: the schedule depends on the thread count by design) and KV-cache calls
 * (forced split counts: the automatic one depends on it too) at sizes on both sides of the
 * threshold run in both; the records must say 1 thread below it and 2 above (in the default
 * context), 2 always in the other, and the outputs must match. Outputs are poisoned with a
 * different NaN before each of the two calls, so a row one path leaves unwritten differs.
 * Also: a threshold that is not a number refuses the context with a message.
 * Run per level of the CPU kernels through FLASHATTN_CPU_ISA (tests/CMakeLists.txt).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

/* Every allocation of the process is counted (glibc: its own entry points do the work), so a
   test can say that a warm small call allocates nothing; elsewhere that test skips, and under
   a sanitizer too (its runtime owns malloc: ASan aborted in its own set-up). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FA_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FA_TEST_SANITIZED 1
#endif
#endif
#if defined(__GLIBC__) && !defined(FA_TEST_SANITIZED)
#define COUNT_ALLOCS 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static volatile long g_allocs;
void *malloc(size_t n) { return g_allocs++, __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return g_allocs++, __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return g_allocs++, __libc_realloc(p, n); }
void *aligned_alloc(size_t a, size_t n) { return g_allocs++, __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n) {
    g_allocs++;
    *p = __libc_memalign(a, n);
    return *p ? 0 : 12; /* ENOMEM */
}
#else
#define COUNT_ALLOCS 0
static volatile long g_allocs; /* stays 0: the test skips */
#endif

enum { HQ = 6, HKV = 2, D = 40, MAXS = 64, MAXKV = 1500, NEWT = 1 };
enum { NQ = MAXS * HQ * D, NK = MAXS * HKV * D, NC = (MAXKV + NEWT) * HKV * D };

static float q[NQ], k[NK], v[NK], dout[NQ], cache_k[NC], cache_v[NC], knew[HKV * D],
    vnew[HKV * D];

static void fill(float *x, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) * 0x1p-24f - 0.5f;
    }
}

/* A quiet NaN whose payload names the run, so two unwritten outputs never compare equal. */
static void poison(float *x, int n, uint32_t payload) {
    const uint32_t bits = 0x7fc00000u | payload;
    for (int i = 0; i < n; i++) memcpy(&x[i], &bits, 4);
}

/* A context of 2 threads; threshold NULL: the library's, else FLASHATTN_CPU_SMALL_FLOPS. */
static fa_context *context(const char *threshold, const char *schedule) {
    if (threshold) setenv("FLASHATTN_CPU_SMALL_FLOPS", threshold, 1);
    if (schedule) setenv("FLASHATTN_CPU_BWD_SCHEDULE", schedule, 1);
    fa_context *ctx;
    const fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
    unsetenv("FLASHATTN_CPU_SMALL_FLOPS");
    unsetenv("FLASHATTN_CPU_BWD_SCHEDULE");
    if (st != FA_OK) fail_msg("fa_context_create: %s", fa_last_error(NULL));
    assert_int_equal(fa_context_set_threads(ctx, 2), FA_OK);
    return ctx;
}

/* Out and lse (and with bwd the gradients) of an s x s call, packed at out; *n: floats
   written. */
static int run_attn(fa_context *ctx, int bwd, int s, float *out, uint32_t payload, size_t *n) {
    const fa_device cpu = FA_DEVICE_CPU;
    const fa_dtype f = FA_DTYPE_F32;
    const size_t nq = (size_t)s * HQ * D, nk = (size_t)s * HKV * D;
    float *o = out, *lse = o + nq, *dq = lse + HQ * s, *dk = dq + nq, *dv = dk + nk;
    *n = nq + HQ * s + (bwd ? nq + 2 * nk : 0);
    poison(out, (int)*n, payload);
    fa_tensor tq = fa_tensor_bshd(q, f, cpu, 1, s, HQ, D);
    fa_tensor tk = fa_tensor_bshd(k, f, cpu, 1, s, HKV, D);
    fa_tensor tv = fa_tensor_bshd(v, f, cpu, 1, s, HKV, D);
    fa_tensor to = fa_tensor_bshd(o, f, cpu, 1, s, HQ, D);
    fa_tensor tl = fa_tensor_3d(lse, f, cpu, 1, HQ, s);
    fa_params p = fa_params_default();
    p.causal = 1;
    assert_int_equal(fa_fwd(ctx, &tq, &tk, &tv, &p, &to, &tl), FA_OK);
    if (!bwd) return fa_last_selection(ctx)->threads;
    fa_tensor tdo = fa_tensor_bshd(dout, f, cpu, 1, s, HQ, D);
    fa_tensor tdq = fa_tensor_bshd(dq, f, cpu, 1, s, HQ, D);
    fa_tensor tdk = fa_tensor_bshd(dk, f, cpu, 1, s, HKV, D);
    fa_tensor tdv = fa_tensor_bshd(dv, f, cpu, 1, s, HKV, D);
    assert_int_equal(fa_bwd(ctx, &tq, &tk, &tv, &to, &tdo, &tl, &p, &tdq, &tdk, &tdv), FA_OK);
    return fa_last_selection(ctx)->threads;
}

/* One decode step (one query token, one appended) against `len` cached tokens with `splits`
   splits, on a fresh copy of the cache; the copy is part of the output (the append). */
static int run_kv(fa_context *ctx, int len, int splits, float *out, uint32_t payload) {
    const fa_device cpu = FA_DEVICE_CPU;
    const fa_dtype f = FA_DTYPE_F32;
    float *o = out, *lse = o + HQ * D, *ck = lse + HQ, *cv = ck + NC;
    poison(o, HQ * D + HQ, payload);
    memcpy(ck, cache_k, sizeof cache_k);
    memcpy(cv, cache_v, sizeof cache_v);
    const int32_t lens[1] = {len};
    fa_kvcache c = {fa_tensor_bshd(ck, f, cpu, 1, MAXKV + NEWT, HKV, D),
                    fa_tensor_bshd(cv, f, cpu, 1, MAXKV + NEWT, HKV, D), lens, NULL, 0, 0};
    fa_tensor tq = fa_tensor_bshd(q, f, cpu, 1, 1, HQ, D);
    fa_tensor tkn = fa_tensor_bshd(knew, f, cpu, 1, NEWT, HKV, D);
    fa_tensor tvn = fa_tensor_bshd(vnew, f, cpu, 1, NEWT, HKV, D);
    fa_tensor to = fa_tensor_bshd(o, f, cpu, 1, 1, HQ, D);
    fa_tensor tl = fa_tensor_3d(lse, f, cpu, 1, HQ, 1);
    fa_params p = fa_params_default();
    p.causal = 1;
    assert_int_equal(fa_fwd_kvcache(ctx, &tq, &c, &tkn, &tvn, &p, splits, &to, &tl), FA_OK);
    assert_int_equal(fa_last_selection(ctx)->num_splits, splits);
    return fa_last_selection(ctx)->threads;
}

enum { OUT_ATTN = 3 * NQ + HQ * MAXS + 2 * NK, OUT_KV = HQ * D + HQ + 2 * NC };
static float out_small[OUT_ATTN > OUT_KV ? OUT_ATTN : OUT_KV];
static float out_team[OUT_ATTN > OUT_KV ? OUT_ATTN : OUT_KV];

/* The threads the default context must record for a call of `flops`. */
static int expected(double flops) { return flops < 1048576.0 ? 1 : 2; }

static void check_pair(int got_small, int got_team, double flops, size_t n, const char *what,
                       int size, int *seen) {
    if (got_small != expected(flops) || got_team != 2)
        fail_msg("%s %d (%.0f FLOPs): threads %d and %d recorded, %d and 2 expected", what, size,
                 flops, got_small, got_team, expected(flops));
    seen[got_small - 1] = 1;
    if (memcmp(out_small, out_team, n * sizeof(float)))
        fail_msg("%s %d (%.0f FLOPs): %d thread(s) without a team differs from the team", what,
                 size, flops, got_small);
}

/* Forward: 4 HQ s^2 D = 960 s^2 FLOPs (every key counted, causal or not), crossing 2^20
   between s 33 and 34: 1, 7 and 23 lie below, 37 and 64 above. */
static void fwd_crossing(void **state) {
    (void)state;
    fa_context *small = context(NULL, NULL), *team = context("0", NULL);
    static const int sizes[] = {1, 7, 23, 37, 64};
    int seen[2] = {0, 0};
    for (int i = 0; i < 5; i++) {
        const int s = sizes[i];
        const double flops = 4.0 * HQ * s * s * D;
        size_t n;
        const int a = run_attn(small, 0, s, out_small, 1, &n);
        const int b = run_attn(team, 0, s, out_team, 2, &n);
        check_pair(a, b, flops, n, "fwd causal s", s, seen);
    }
    assert_true(seen[0] && seen[1]); /* both sides of the threshold ran */
    fa_context_destroy(small);
    fa_context_destroy(team);
}

/* Backward (2.5x the forward's FLOPs: crossing between s 20 and 21), under each schedule. */
static void bwd_crossing(void **state) {
    (void)state;
    static const char *scheds[] = {"one-pass", "two-pass"};
    static const int sizes[] = {1, 9, 19, 23, 53};
    for (int c = 0; c < 2; c++) {
        fa_context *small = context(NULL, scheds[c]), *team = context("0", scheds[c]);
        int seen[2] = {0, 0};
        for (int i = 0; i < 5; i++) {
            const int s = sizes[i];
            const double flops = 2.5 * 4.0 * HQ * s * s * D;
            size_t n;
            const int a = run_attn(small, 1, s, out_small, 3, &n);
            const int b = run_attn(team, 1, s, out_team, 4, &n);
            check_pair(a, b, flops, n, scheds[c], s, seen);
        }
        assert_true(seen[0] && seen[1]);
        fa_context_destroy(small);
        fa_context_destroy(team);
    }
}

/* Decode: 4 HQ (len + 1) D = 960 (len + 1) FLOPs, crossing between 1091 and 1092 cached
   tokens; 1 and 3 splits (3 splits of a short cache: empty chunks, LSE -inf parts). */
static void kv_crossing(void **state) {
    (void)state;
    fa_context *small = context(NULL, NULL), *team = context("0", NULL);
    static const int lens[] = {0, 5, 300, 1091, 1092, MAXKV};
    for (int splits = 1; splits <= 3; splits += 2) {
        int seen[2] = {0, 0};
        for (int i = 0; i < 6; i++) {
            const double flops = 4.0 * HQ * (lens[i] + NEWT) * D;
            const int a = run_kv(small, lens[i], splits, out_small, 5);
            const int b = run_kv(team, lens[i], splits, out_team, 6);
            check_pair(a, b, flops, OUT_KV, splits == 1 ? "kvcache 1 split, len" :
                                                          "kvcache 3 splits, len",
                       lens[i], seen);
        }
        assert_true(seen[0] && seen[1]);
    }
    fa_context_destroy(small);
    fa_context_destroy(team);
}

/* A warm small call allocates nothing: the workspace is the context's buffer (grown only when
   a call needs more), and below the threshold no OpenMP team is started. */
static void no_allocation(void **state) {
    (void)state;
    if (!COUNT_ALLOCS) skip();
    const long created = g_allocs;
    fa_context *ctx = context(NULL, NULL);
    assert_true(g_allocs > created); /* the count sees the library's allocations */
    size_t n;
    for (int rep = 0; rep < 2; rep++) { /* the first round grows the buffer */
        const long before = g_allocs;
        for (int i = 0; i < 50; i++) {
            assert_int_equal(run_attn(ctx, 1, 7, out_small, 7, &n), 1);
            assert_int_equal(run_kv(ctx, 300, 1, out_small, 7), 1);
        }
        if (rep == 1 && g_allocs != before)
            fail_msg("100 warm small calls allocated %ld times", g_allocs - before);
    }
    fa_context_destroy(ctx);
}

/* A threshold that is not a number >= 0 refuses the context and says why. */
static void bad_threshold(void **state) {
    (void)state;
    static const char *bad[] = {"abc", "-1", "1e6x", "nan"};
    for (int i = 0; i < 4; i++) {
        setenv("FLASHATTN_CPU_SMALL_FLOPS", bad[i], 1);
        fa_context *ctx = NULL;
        const fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU);
        unsetenv("FLASHATTN_CPU_SMALL_FLOPS");
        assert_int_equal(st, FA_ERR_INVALID_ARGUMENT);
        assert_null(ctx);
        assert_non_null(strstr(fa_last_error(NULL), "FLASHATTN_CPU_SMALL_FLOPS"));
    }
}

int main(void) {
    fill(q, NQ, 1), fill(k, NK, 2), fill(v, NK, 3), fill(dout, NQ, 4);
    fill(cache_k, NC, 5), fill(cache_v, NC, 6), fill(knew, HKV * D, 7), fill(vnew, HKV * D, 8);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fwd_crossing),
        cmocka_unit_test(bwd_crossing),
        cmocka_unit_test(kv_crossing),
        cmocka_unit_test(no_allocation),
        cmocka_unit_test(bad_threshold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
