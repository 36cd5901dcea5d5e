/*
 * test_big.c — memory stays O(tile) at a long sequence.
 *
 * Forward, causal, seqlen 32768, 1 head, d 64, f32: the score matrix a naive implementation
 * would build is 32768^2 * 4 bytes = 4 GiB (8192 under sanitizers, see below). The tiled kernel must run in a user workspace of
 * the size it reports, that size must be small, the process's peak memory must barely move,
 * and spot-checked rows must satisfy the correctness rule against a per-row float64 reference
 * computed here (with a per-row plain-fp32 computation as the rule's baseline).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <sys/resource.h>
#endif

#include "sweep.h"

/* Under AddressSanitizer every load of the kernel is instrumented (about 10x slower); the
   sanitized run is there for memory safety, the normal run checks the O(tile) claim at full
   length, so the sanitized one uses a quarter of the length (still 256 MiB of scores). */
#if defined(__SANITIZE_ADDRESS__)
#define FA_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_TEST_SANITIZED 1
#endif
#endif
#ifdef FA_TEST_SANITIZED
enum { S = 8192, D = 64 };
#else
enum { S = 32768, D = 64 };
#endif
#define WS_LIMIT ((size_t)4 << 20)    /* "a few MB": tiles per thread, never O(seqlen^2) */
#define RSS_LIMIT_KB (32L * 1024)     /* the 4 GiB of scores would show up here */

static long peak_rss_kb(void) {
#ifndef _WIN32
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss; /* kilobytes on Linux */
#else
    return 0;
#endif
}

/* Row i of causal attention over keys 0..i, exactly (double) and as a plain fp32
   implementation computes it (fp32 dot products, fp32 softmax, fp32 P.V). */
static void row_ref(const float *q, const float *k, const float *v, int64_t i, float scale,
                    double *o64, double *lse64, float *o32, float *lse32, double *s64, float *s32) {
    const float *qi = q + i * D;
    double m64 = -INFINITY;
    float m32 = -INFINITY;
    for (int64_t j = 0; j <= i; j++) {
        double a = 0;
        float b = 0;
        for (int x = 0; x < D; x++) {
            a += (double)qi[x] * k[j * D + x];
            b += qi[x] * k[j * D + x];
        }
        s64[j] = a * scale;
        s32[j] = b * scale;
        if (s64[j] > m64) m64 = s64[j];
        if (s32[j] > m32) m32 = s32[j];
    }
    double sum64 = 0;
    float sum32 = 0;
    for (int64_t j = 0; j <= i; j++) {
        s64[j] = exp(s64[j] - m64);
        s32[j] = expf(s32[j] - m32);
        sum64 += s64[j];
        sum32 += s32[j];
    }
    for (int x = 0; x < D; x++) {
        o64[x] = 0;
        o32[x] = 0;
    }
    for (int64_t j = 0; j <= i; j++) {
        float p32 = s32[j] / sum32;
        for (int x = 0; x < D; x++) {
            o64[x] += s64[j] * v[j * D + x];
            o32[x] += p32 * v[j * D + x];
        }
    }
    for (int x = 0; x < D; x++) o64[x] /= sum64;
    *lse64 = m64 + log(sum64);
    *lse32 = m32 + logf(sum32);
}

static void accumulate(tk_err *e, double got, double ref) {
    double d = fabs(got - ref);
    if (!isfinite(got)) e->nonfinite++;
    if (d > e->max_abs) e->max_abs = d;
    e->mean_abs += d; /* sum for now */
    e->count++;
    if (fabs(ref) > e->ref_max) e->ref_max = fabs(ref);
}

static void long_causal_forward(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    int64_t shape[4] = {1, S, 1, D}, lshape[3] = {1, 1, S};
    tk_buf q, k, v, o, lse;
    assert_int_equal(tk_buf_alloc(&q, FA_DTYPE_F32, 4, shape, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&k, FA_DTYPE_F32, 4, shape, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&v, FA_DTYPE_F32, 4, shape, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&o, FA_DTYPE_F32, 4, shape, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&lse, FA_DTYPE_F32, 3, lshape, 0, &r), 0);
    tk_fill_normal(&q, &r, 1);
    tk_fill_normal(&k, &r, 1);
    tk_fill_normal(&v, &r, 1);

    fa_context *c;
    assert_int_equal(fa_context_create(&c, FA_BACKEND_CPU), FA_OK);
    /* the workspace holds tiles per thread: two threads make WS_LIMIT the same bound on every
       machine (16 cores took 10 MB) */
    assert_int_equal(fa_context_set_threads(c, 2), FA_OK);
    fa_params p = fa_params_default();
    p.causal = 1;
    size_t ws_bytes = 0;
    assert_int_equal(fa_fwd_workspace_size(c, &q.t, &k.t, &v.t, &p, &ws_bytes), FA_OK);
    print_message("workspace for seqlen %d: %zu bytes\n", S, ws_bytes);
    if (ws_bytes >= WS_LIMIT) fail_msg("workspace %zu bytes is not O(tile)", ws_bytes);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    assert_non_null(ws);
    memset(ws, 0, ws_bytes);
    assert_int_equal(fa_context_set_workspace(c, ws, ws_bytes), FA_OK);

    long rss0 = peak_rss_kb();
    struct timespec t0, t1;
    timespec_get(&t0, TIME_UTC);
    fa_status st = fa_fwd(c, &q.t, &k.t, &v.t, &p, &o.t, &lse.t);
    timespec_get(&t1, TIME_UTC);
    long rss1 = peak_rss_kb();
    if (st != FA_OK) fail_msg("fa_fwd: %s: %s", fa_status_string(st), fa_last_error(c));
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const fa_selection *sel = fa_last_selection(c);
    print_message("%s: %.2f s, %.1f GFLOP/s, peak RSS +%ld KiB\n", sel->kernel, secs,
                  2.0 * S * (double)S * D / secs * 1e-9, rss1 - rss0);
    assert_true(sel->workspace_bytes <= ws_bytes);
    if (rss1 - rss0 > RSS_LIMIT_KB)
        fail_msg("peak memory grew by %ld KiB during the call", rss1 - rss0);
    char m[256];
    if (tk_check_written(&o, "out", m, sizeof m) || tk_check_written(&lse, "lse", m, sizeof m))
        fail_msg("%s", m);

    /* spot rows: both ends, tile-boundary neighbours, and random ones */
    int64_t rows[24] = {0, 1, 2, 63, 64, 65, 127, 128, 1000, 4095, 4096, S / 2 - 1, S / 2,
                        S - 2, S - 1};
    int nrows = 15;
    while (nrows < 24) rows[nrows++] = tk_rng_range(&r, 0, S - 1);
    const float *Q = q.t.data, *K = k.t.data, *V = v.t.data, *O = o.t.data, *L = lse.t.data;
    double *s64 = malloc(sizeof(double) * S);
    float *s32 = malloc(sizeof(float) * S);
    assert_non_null(s64);
    assert_non_null(s32);
    tk_err eo[2] = {{0}}, el[2] = {{0}};
    float scale = (float)(1.0 / sqrt((double)D));
    for (int n = 0; n < nrows; n++) {
        int64_t i = rows[n];
        double o64[D], lse64;
        float o32[D], lse32;
        row_ref(Q, K, V, i, scale, o64, &lse64, o32, &lse32, s64, s32);
        for (int x = 0; x < D; x++) {
            accumulate(&eo[0], O[i * D + x], o64[x]);
            accumulate(&eo[1], o32[x], o64[x]);
        }
        accumulate(&el[0], L[i], lse64);
        accumulate(&el[1], lse32, lse64);
    }
    for (int w = 0; w < 2; w++) {
        eo[w].mean_abs /= (double)eo[w].count;
        el[w].mean_abs /= (double)el[w].count;
    }
    double so, sl;
    int ok_o = tk_rule(&eo[0], &eo[1], FA_DTYPE_F32, 0, &so);
    int ok_l = tk_rule(&el[0], &el[1], FA_DTYPE_F32, 0, &sl);
    print_message("O   kernel max %.3g mean %.3g | plain fp32 max %.3g mean %.3g | slack %.2g\n",
                  eo[0].max_abs, eo[0].mean_abs, eo[1].max_abs, eo[1].mean_abs, so);
    print_message("LSE kernel max %.3g mean %.3g | plain fp32 max %.3g mean %.3g | slack %.2g\n",
                  el[0].max_abs, el[0].mean_abs, el[1].max_abs, el[1].mean_abs, sl);
    if (!ok_o || !ok_l)
        fail_msg("spot rows break the rule (seed %llu)", (unsigned long long)tk_seed());

    free(s64);
    free(s32);
    fa_context_destroy(c);
    free(ws);
    tk_buf_free(&q);
    tk_buf_free(&k);
    tk_buf_free(&v);
    tk_buf_free(&o);
    tk_buf_free(&lse);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(long_causal_forward)};
    printf("[ SEED     ] %llu\n", (unsigned long long)tk_seed());
    return cmocka_run_group_tests(tests, NULL, NULL) != 0;
}
