/*
 * test_kvcache.c — fa_fwd_kvcache and fa_merge_attn, on the backend named by the first
 * argument ("cpu", the default, or "cuda": device buffers through testkit's hooks; exits 77
 * without a GPU).
 *
 *  - cases: every option against the float64 reference under the 2x rule, each laid out as a
 *    contiguous cache and as paged caches (page sizes 16, 64, 256, pages in shuffled order),
 *    with forced split counts 1..N and the heuristic's; appends that fill a sequence to its
 *    capacity and that cross page boundaries; cached lengths 0 and 1; variants in sequence
 *    on one context (kvtest.c);
 *  - fa_merge_attn against a direct float64 computation (parts of -inf LSE included) and as
 *    the merge of a sharded forward;
 *  - the split heuristic and the selection record;
 *  - (CPU) every bad-input branch: its status, and nothing written (kv_errors.c).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtest.h"

#define F32 FA_DTYPE_F32
#define F16 FA_DTYPE_F16
#define BF16 FA_DTYPE_BF16
#define SHAPE(nm, b, q, hq_, hkv_, d_, dt)                                                    \
    .name = nm, .batch = b, .sq = q, .hq = hq_, .hkv = hkv_, .d = d_, .dtype = dt
#define WIN(l, r) .window = 1, .wl = l, .wr = r
#define VARS(...)                                                                             \
    .var = {__VA_ARGS__}, .nvar = sizeof((kv_variant[]){__VA_ARGS__}) / sizeof(kv_variant)
/* {page size (0: contiguous), num_splits, threads} */
#define C(s) {0, s, 0}
#define P(pg, s) {pg, s, 0}

static const kv_case cases[] = {
    {SHAPE("decode", 2, 1, 4, 4, 64, F32), .lens = {100, 37}, .snew = 1,
     VARS(C(1), P(16, 1), P(64, 0), P(256, 3), C(4), P(16, 4))},
    {SHAPE("decode-gqa-len0-len1", 3, 1, 8, 2, 128, BF16), .lens = {0, 1, 200}, .snew = 1,
     .room = 9, VARS(C(0), P(16, 1), P(16, 2), P(64, 5), C(2))},
    {SHAPE("no-append-mqa", 2, 2, 4, 1, 40, F16), .lens = {1, 77}, .room = 3,
     VARS(C(1), P(16, 1), P(16, 3), C(3))},
    {SHAPE("len0-no-append", 2, 1, 2, 2, 32, F32), .lens = {0, 5},
     VARS(C(1), P(16, 1), P(16, 2))},
    {SHAPE("all-empty", 1, 3, 2, 1, 16, BF16), .lens = {0}, .room = 4, VARS(C(0), P(16, 2))},
    {SHAPE("speculative-causal", 2, 4, 4, 2, 64, F16), .lens = {30, 13}, .snew = 4,
     .causal = 1, VARS(P(16, 1), C(2), P(64, 0), P(16, 2))},
    {SHAPE("causal-sq>total", 1, 8, 2, 2, 32, F32), .lens = {2}, .snew = 3, .causal = 1,
     VARS(C(1), P(16, 1), C(3))},
    {SHAPE("sliding-window", 2, 3, 2, 2, 96, BF16), .lens = {300, 40}, .snew = 2,
     WIN(32, 0), VARS(P(16, 1), P(64, 4), C(3), P(16, 4))},
    {SHAPE("right-window", 1, 5, 2, 1, 8, F32), .lens = {60}, .snew = 2, WIN(-1, 1),
     .room = 1, VARS(C(1), P(16, 1), P(16, 2))},
    {SHAPE("softcap-d256", 1, 1, 2, 1, 256, F32), .lens = {50}, .snew = 1, .softcap = 2.5f,
     VARS(C(1), P(64, 1), P(16, 2))},
    {SHAPE("alibi-head-gqa", 2, 2, 8, 2, 64, F32), .lens = {120, 9}, .snew = 2, .causal = 1,
     .alibi = TK_ALIBI_HEAD, VARS(C(1), P(16, 1), P(16, 3))},
    {SHAPE("alibi-batch-window", 2, 2, 4, 4, 32, BF16), .lens = {70, 20}, .snew = 1,
     .alibi = TK_ALIBI_BATCH, WIN(16, -1), VARS(C(1), P(16, 1), P(64, 2))},
    {SHAPE("d1", 2, 2, 2, 1, 1, F32), .lens = {17, 3}, .snew = 2, .causal = 1,
     VARS(C(1), P(16, 1), P(16, 2))},
    {SHAPE("d17-strided", 2, 3, 6, 3, 17, F16), .lens = {33, 64}, .snew = 3, .strided = 1,
     VARS(C(1), P(16, 1), P(64, 2))},
    {SHAPE("d255-strided", 1, 1, 2, 2, 255, BF16), .lens = {70}, .snew = 1, .strided = 1,
     .room = 20, VARS(C(1), P(16, 2))},
    {SHAPE("strided-gqa", 2, 2, 8, 2, 64, F32), .lens = {40, 81}, .snew = 2, .strided = 1,
     .causal = 1, VARS(C(1), P(16, 1), P(64, 3))},
    {SHAPE("page-boundaries", 4, 1, 2, 1, 32, F32), .lens = {15, 16, 31, 48}, .snew = 17,
     VARS(P(16, 1), P(16, 2), P(64, 1), C(1))},
    {SHAPE("chunked-prefill", 1, 40, 8, 2, 64, F32), .lens = {500}, .snew = 40, .causal = 1,
     VARS(C(1), P(64, 3), {256, 0, 4})},
    {SHAPE("split-heuristic", 1, 1, 4, 1, 64, F16), .lens = {1500}, .snew = 1,
     VARS({0, 0, 4}, {256, 0, 4}, {0, 1, 4}, {0, 0, 1})},
    {SHAPE("gqa16-two-rows", 1, 2, 16, 1, 128, BF16), .lens = {130}, .snew = 2,
     VARS(C(1), P(64, 2))},
    /* scale 1 at d 64 makes the softmax peaked, where one score's rounding moves O: enough
       rows that the max error of the kernel and of the baseline are both typical (with a
       handful of rows the 2x rule fails for the tiled fa_fwd too, about 1 seed in 200) */
    {SHAPE("peaked-scale", 2, 2, 16, 2, 64, F32), .lens = {64, 65}, .snew = 1, .scale = 1.0f,
     VARS(C(1), P(16, 1), C(5))},
    {SHAPE("more-splits-than-keys", 2, 1, 2, 2, 32, F32), .lens = {3, 40}, .snew = 1,
     VARS(C(17), P(16, 17), C(1))},
    {SHAPE("softcap-causal-f16", 2, 3, 4, 4, 40, F16), .lens = {90, 200}, .snew = 3,
     .causal = 1, .softcap = 1.5f, VARS(P(256, 1), P(16, 3), C(0))},
    {SHAPE("splits-1-to-8", 1, 2, 4, 2, 64, BF16), .lens = {700}, .snew = 2, .causal = 1,
     VARS(C(1), C(2), C(3), C(4), C(5), C(6), C(7), C(8))},
    /* one context: a split count again (its counters left zero by the kernel, not cleared),
       other counts whose partials overwrite earlier counters, a paged call, the heuristic's */
    {SHAPE("one-context-splits", 2, 1, 8, 2, 128, BF16), .lens = {900, 301}, .snew = 1,
     .one_context = 1, VARS(C(2), C(2), C(5), C(2), P(16, 3), C(0), C(0), C(2))},
    /* GQA groups of 1, 2, 3, 4, 5, 8 and 16 query heads per kv head, odd head dims and
       lengths: the decode kernel packs exactly group x seqlen_q rows per kv head (no padding
       rows or columns), in tiles of 64 rows (gqa16-sq5: 80 rows, a tile of 64 and one of 16;
       gqa5-sq13: 65 rows, the last tile one row) */
    {SHAPE("gqa1-d33", 2, 1, 3, 3, 33, F32), .lens = {77, 4}, .snew = 1,
     VARS(C(1), P(16, 2), C(0))},
    {SHAPE("gqa2-d72", 2, 1, 4, 2, 72, F16), .lens = {129, 5}, .snew = 1,
     VARS(C(1), P(16, 3), C(0))},
    {SHAPE("gqa3-causal", 1, 3, 6, 2, 40, BF16), .lens = {91}, .snew = 3, .causal = 1,
     VARS(C(1), P(16, 2), C(0))},
    {SHAPE("gqa4-d128", 1, 1, 32, 8, 128, F32), .lens = {300}, .snew = 1,
     VARS(C(1), P(64, 2), C(0))},
    {SHAPE("gqa5-sq13", 1, 13, 5, 1, 20, F32), .lens = {50}, .snew = 13, .causal = 1,
     VARS(C(1), P(16, 2), C(0))},
    {SHAPE("gqa8-d24", 1, 2, 16, 2, 24, F32), .lens = {65}, .snew = 2,
     VARS(C(1), P(16, 3), C(0))},
    {SHAPE("gqa16-sq5", 1, 5, 16, 1, 48, F16), .lens = {100}, .snew = 5, .causal = 1,
     VARS(C(1), P(16, 2), C(0))},
    /* one-token decode (the case the kernel is for) at every group size with odd head dims
       and odd cache lengths, each dtype: the rows of a kv head are exactly the group */
    {SHAPE("dec1-gqa1-d17", 1, 1, 2, 2, 17, BF16), .lens = {203}, .snew = 1,
     VARS(C(1), P(16, 3), C(0))},
    {SHAPE("dec1-gqa3-d33", 2, 1, 6, 2, 33, F16), .lens = {127, 1}, .snew = 1,
     VARS(C(1), P(16, 2), C(0))},
    {SHAPE("dec1-gqa4-d127", 1, 1, 8, 2, 127, F16), .lens = {1021}, .snew = 1,
     VARS(C(1), P(64, 3), C(0))},
    {SHAPE("dec1-gqa5-d65", 2, 1, 10, 2, 65, F32), .lens = {333, 7}, .snew = 1,
     VARS(C(1), P(16, 2), C(0))},
    {SHAPE("dec1-gqa8-d35", 1, 1, 8, 1, 35, BF16), .lens = {515}, .snew = 1,
     VARS(C(1), P(16, 4), C(0))},
    {SHAPE("dec1-gqa16-d95", 1, 1, 16, 1, 95, F16), .lens = {257}, .snew = 1,
     VARS(C(1), P(16, 2), C(0))},
    {SHAPE("batch8-page-edges", 8, 1, 2, 2, 32, F16), .lens = {0, 1, 2, 15, 16, 17, 63, 64},
     .snew = 1, .room = 15, VARS(P(16, 1), P(16, 2), P(64, 0), C(1))},
    /* fused rotary (FlashAttention-2's rule): q and the new keys rotated at their positions,
       the first rot_dim columns in GPT-NeoX halves or GPT-J pairs; non-causal calls rotate
       every query at cache_seqlens, causal / windowed ones at cache_seqlens + i */
    {SHAPE("rotary-halves-d72", 3, 1, 4, 2, 72, F16), .lens = {37, 0, 100}, .snew = 1,
     .rot_dim = 32, VARS(C(1), P(16, 1), C(3), P(64, 0))},
    {SHAPE("rotary-pairs-causal-new5", 3, 5, 6, 3, 72, BF16), .lens = {20, 3, 64}, .snew = 5,
     .causal = 1, .rot_dim = 32, .rot_interleaved = 1, VARS(C(1), P(16, 2), C(0))},
    {SHAPE("rotary-full-noncausal-new5-f32tables", 3, 5, 4, 4, 64, F32),
     .lens = {10, 50, 7}, .snew = 5, .rot_dim = 64, .rot_interleaved = 1, .rot_f32 = 1,
     .strided = 1, VARS(C(1), P(16, 1), C(2))},
    {SHAPE("rotary-window-halves-d128", 2, 3, 4, 1, 128, F16), .lens = {90, 33}, .snew = 3,
     WIN(16, -1), .rot_dim = 96, .room = 5, VARS(C(1), P(64, 2), C(0))},
    {SHAPE("rotary-sq>new-causal", 2, 4, 2, 2, 32, F32), .lens = {12, 0}, .snew = 2,
     .causal = 1, .rot_dim = 2, VARS(C(1), P(16, 1))},
    /* left-padded caches (contiguous only): rows before cache_leftpad[b] hold loud values
       (kvtest.c) that no row may see; a pad equal to the length leaves only the new keys */
    {SHAPE("leftpad-decode", 3, 1, 4, 2, 64, F32), .lens = {40, 10, 100}, .snew = 1,
     .leftpad = 1, .lpad = {5, 10, 37}, VARS(C(1), C(3), C(0))},
    {SHAPE("leftpad-rotary-causal-d72", 3, 5, 4, 2, 72, BF16), .lens = {30, 8, 70}, .snew = 5,
     .causal = 1, .leftpad = 1, .lpad = {7, 0, 69}, .rot_dim = 32, VARS(C(1), C(2), C(0))},
    {SHAPE("leftpad-no-append-window-alibi", 2, 2, 4, 2, 32, F16), .lens = {50, 20},
     .leftpad = 1, .lpad = {12, 20}, WIN(8, -1), .alibi = TK_ALIBI_HEAD, .room = 3,
     VARS(C(1), C(2))},
    {SHAPE("leftpad-long-splits", 1, 1, 4, 1, 64, F16), .lens = {1500}, .snew = 1,
     .leftpad = 1, .lpad = {700}, VARS({0, 0, 4}, C(5), C(1))},
    /* head dims that are not multiples of 8: on CUDA zero-padded copies of q, k_new, v_new
       and the cache rows the call reads (a paged cache gathered through block_table), the
       appended rows and out copied back (src/cuda/pad_kv.h); rows there are 2 bytes apart
       (kvtest.c gives them no alignment), and the byte comparison of the cache shows that
       nothing but the appended rows (and only their d columns) was written */
    {SHAPE("pad-d59-rotary-gqa", 3, 1, 8, 2, 59, F16), .lens = {37, 0, 100}, .snew = 1,
     .rot_dim = 58, VARS(C(1), P(16, 1), C(3), P(64, 0))},
    {SHAPE("pad-d111-rotary-pairs-causal", 2, 3, 6, 3, 111, BF16), .lens = {20, 64}, .snew = 3,
     .causal = 1, .rot_dim = 64, .rot_interleaved = 1, .strided = 1,
     VARS(C(1), P(16, 2), C(0), P(64, 3))},
    {SHAPE("pad-d217-gqa4-splits", 2, 2, 8, 2, 217, F16), .lens = {300, 45}, .snew = 2,
     .room = 7, VARS(C(1), C(4), P(16, 3), P(64, 0))},
    {SHAPE("pad-d1-page-edges", 4, 1, 2, 1, 1, BF16), .lens = {15, 16, 31, 0}, .snew = 17,
     VARS(P(16, 1), P(16, 2), C(1), C(0))},
    {SHAPE("pad-d59-no-append-mqa", 2, 2, 4, 1, 59, BF16), .lens = {1, 77}, .room = 3,
     VARS(C(1), P(16, 1), P(16, 3))},
    {SHAPE("pad-d217-leftpad-rotary-window", 3, 3, 4, 2, 217, F16), .lens = {30, 8, 70},
     .snew = 3, .leftpad = 1, .lpad = {7, 0, 69}, WIN(16, -1), .rot_dim = 100,
     .rot_f32 = 1, VARS(C(1), C(2), C(0))},
    {SHAPE("pad-d111-softcap-alibi-strided", 2, 2, 4, 2, 111, F16), .lens = {90, 200},
     .snew = 2, .causal = 1, .softcap = 1.5f, .alibi = TK_ALIBI_HEAD, .strided = 1,
     VARS(P(16, 1), C(2), P(256, 0))},
};

static fa_backend g_backend = FA_BACKEND_CPU;

static int verbose(void) {
    const char *v = getenv("FLASHATTN_TEST_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

static void run_case(void **state) {
    const kv_case *c = *state;
    static tk_report r; /* large: keep it off the stack */
    int st = kv_run_case(c, g_backend, tk_seed(), verbose(), &r);
    if (st == TK_SKIP) {
        print_message("%s", r.msg);
        skip();
    }
    if (st == TK_FAIL) fail_msg("%s", r.msg);
    if (verbose()) print_message("%s", r.msg);
}

/* ---- fa_merge_attn against a direct float64 computation ---- */

static int on_dev(void) { return g_backend == FA_BACKEND_CUDA; }

static fa_tensor dview(tk_buf *b) { return on_dev() ? tk_device_view(b) : b->t; }

static void upload(tk_buf *b) {
    if (on_dev()) assert_int_equal(tk_device_upload(b), 0);
}

static void download(tk_buf *b) {
    if (on_dev()) assert_int_equal(tk_device_download(b), 0);
}

/* n parts over a BSHD [2, 5, 3, 24] or THD [7, 3, 24] output; about a quarter of the part
   LSEs are -inf (their outputs NaN: never to be read), and row 0 has no part at all. */
static void merge_one(int thd, int n, fa_dtype pdt, fa_dtype odt, int with_lse, tk_rng *r) {
    enum { MAXN = 5 };
    int64_t os[4] = {2, 5, 3, 24}, ls[3] = {2, 3, 5};
    int64_t os3[3] = {7, 3, 24}, ls2[2] = {3, 7};
    int nd = thd ? 3 : 4;
    const int64_t *oshape = thd ? os3 : os, *lshape = thd ? ls2 : ls;
    tk_buf op[MAXN], lp[MAXN], o, l;
    memset(&l, 0, sizeof l);
    for (int s = 0; s < n; s++) {
        assert_int_equal(tk_buf_alloc_aligned(&op[s], pdt, nd, oshape, 1, 8, r), 0);
        assert_int_equal(tk_buf_alloc_aligned(&lp[s], FA_DTYPE_F32, nd - 1, lshape, 1, 1, r), 0);
        tk_fill_normal(&op[s], r, 1.0);
    }
    assert_int_equal(tk_buf_alloc_aligned(&o, odt, nd, oshape, 1, 8, r), 0);
    if (with_lse) assert_int_equal(tk_buf_alloc_aligned(&l, FA_DTYPE_F32, nd - 1, lshape, 1, 1, r), 0);
    const int64_t heads = 3, d = 24, rows = thd ? 7 : 10, nl = heads * rows;
    /* lse element li <-> output row: BSHD lse (b, h, t), out (b, t, h); THD lse (h, t) */
    for (int64_t li = 0; li < nl; li++)
        for (int s = 0; s < n; s++) {
            double v = li == 0 || tk_rng_uniform(r) < 0.25 ? -INFINITY : 3.0 * tk_rng_normal(r);
            tk_set(&lp[s].t, li, v);
        }
    double *want = calloc((size_t)(rows * heads * d), sizeof *want), *want_lse = calloc((size_t)nl, sizeof *want_lse);
    assert_non_null(want);
    assert_non_null(want_lse);
    double omax = 0;
    for (int64_t li = 0; li < nl; li++) {
        int64_t h, t;
        if (thd) {
            h = li / rows;
            t = li % rows;
        } else {
            int64_t b = li / (heads * 5);
            h = li / 5 % heads;
            t = b * 5 + li % 5;
        }
        int64_t oi = (t * heads + h) * d; /* logical index of the output row */
        double m = -INFINITY, sum = 0;
        for (int s = 0; s < n; s++) m = fmax(m, tk_get(&lp[s].t, li));
        want_lse[li] = m;
        if (m == -INFINITY) continue;
        for (int s = 0; s < n; s++) {
            double ls_ = tk_get(&lp[s].t, li);
            if (ls_ == -INFINITY) { /* poison the unread output */
                for (int x = 0; x < d; x++) tk_set(&op[s].t, oi + x, NAN);
                continue;
            }
            double w = exp(ls_ - m);
            sum += w;
            for (int x = 0; x < d; x++) {
                double v = tk_get(&op[s].t, oi + x);
                want[oi + x] += w * v;
                omax = fmax(omax, fabs(v));
            }
        }
        for (int x = 0; x < d; x++) want[oi + x] /= sum;
        want_lse[li] = m + log(sum);
    }
    fa_tensor ov[MAXN], lv[MAXN];
    for (int s = 0; s < n; s++) {
        upload(&op[s]);
        upload(&lp[s]);
        ov[s] = dview(&op[s]);
        lv[s] = dview(&lp[s]);
    }
    upload(&o);
    if (with_lse) upload(&l);
    fa_tensor ot = dview(&o), lt = with_lse ? dview(&l) : o.t;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, g_backend), FA_OK);
    fa_status st = fa_merge_attn(ctx, n, ov, lv, &ot, with_lse ? &lt : NULL);
    if (st != FA_OK) fail_msg("fa_merge_attn: %s: %s", fa_status_string(st), fa_last_error(ctx));
    download(&o);
    if (with_lse) download(&l);
    const fa_selection *sel = fa_last_selection(ctx);
    assert_non_null(sel);
    assert_string_equal(sel->op, "merge");
    char m[256];
    if (tk_check_written(&o, "out", m, sizeof m) ||
        (with_lse && tk_check_written(&l, "lse", m, sizeof m)))
        fail_msg("%s", m);
    /* fp32 arithmetic over n parts, then one rounding to the output dtype */
    double u32 = tk_unit_roundoff(FA_DTYPE_F32), tol_o = 2 * tk_unit_roundoff(odt) * omax + 8 * n * u32 * omax;
    for (int64_t i = 0; i < rows * heads * d; i++) {
        double got = tk_get(&o.t, i);
        if (!(fabs(got - want[i]) <= tol_o))
            fail_msg("merge %s n=%d %s->%s: out element %lld is %.9g, expected %.9g (tol %.3g)",
                     thd ? "THD" : "BSHD", n, fa_dtype_name(pdt), fa_dtype_name(odt),
                     (long long)i, got, want[i], tol_o);
    }
    for (int64_t li = 0; with_lse && li < nl; li++) {
        double got = tk_get(&l.t, li), w = want_lse[li];
        int ok = w == -INFINITY ? got == -INFINITY : fabs(got - w) <= 8 * n * u32 * fmax(1, fabs(w));
        if (!ok)
            fail_msg("merge n=%d: lse element %lld is %.9g, expected %.9g", n, (long long)li, got, w);
    }
    free(want);
    free(want_lse);
    for (int s = 0; s < n; s++) {
        tk_buf_free(&op[s]);
        tk_buf_free(&lp[s]);
    }
    tk_buf_free(&o);
    tk_buf_free(&l);
    fa_context_destroy(ctx);
}

static void merge_direct(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x6d65726765ull);
    const fa_dtype combos[][2] = {{F32, F32}, {F32, BF16}, {F16, F16}, {BF16, F32}, {F32, F16}};
    for (int thd = 0; thd < 2; thd++)
        for (int c = 0; c < 5; c++)
            for (int n = 1; n <= 5; n += 2)
                merge_one(thd, n, combos[c][0], combos[c][1], (n + c) % 3 != 0, &r);
}

/* ---- fa_merge_attn as the last step of a forward sharded by keys ---- */

/* Keys [0, 40) and [40, 100) attended separately (fa_fwd, f32, no mask), plus a third part
   that saw nothing (LSE -inf, output NaN), merged: the result must pass the 2x rule against
   the float64 reference over all 100 keys, like any single-pass forward. */
static void merge_sharded(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x7368617264ull);
    fa_dtype dt = on_dev() ? BF16 : F32;
    enum { B = 2, SQ = 3, SK = 100, SPLIT = 40, H = 4, HK = 2, D = 64 };
    int64_t qs[4] = {B, SQ, H, D}, ks[4] = {B, SK, HK, D}, ls[3] = {B, H, SQ};
    tk_buf q, k, v, q64, k64, v64, ref_o, ref_l, base_o, base_l, part_o[3], part_l[3], o, l;
    assert_int_equal(tk_buf_alloc_aligned(&q, dt, 4, qs, 0, 8, &r), 0);
    assert_int_equal(tk_buf_alloc_aligned(&k, dt, 4, ks, 0, 8, &r), 0);
    assert_int_equal(tk_buf_alloc_aligned(&v, dt, 4, ks, 0, 8, &r), 0);
    assert_int_equal(tk_buf_alloc(&q64, FA_DTYPE_F64, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&k64, FA_DTYPE_F64, 4, ks, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&v64, FA_DTYPE_F64, 4, ks, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&ref_o, FA_DTYPE_F64, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&ref_l, FA_DTYPE_F64, 3, ls, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&base_o, dt, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&base_l, F32, 3, ls, 0, &r), 0);
    assert_int_equal(tk_buf_alloc_aligned(&o, dt, 4, qs, 1, 8, &r), 0);
    assert_int_equal(tk_buf_alloc_aligned(&l, F32, 3, ls, 1, 1, &r), 0);
    for (int s = 0; s < 3; s++) {
        assert_int_equal(tk_buf_alloc_aligned(&part_o[s], dt, 4, qs, 0, 8, &r), 0);
        assert_int_equal(tk_buf_alloc_aligned(&part_l[s], F32, 3, ls, 0, 1, &r), 0);
    }
    tk_fill_normal(&q, &r, 1);
    tk_fill_normal(&k, &r, 1);
    tk_fill_normal(&v, &r, 1);
    tk_copy(&q64, &q);
    tk_copy(&k64, &k);
    tk_copy(&v64, &v);
    fa_context *nctx, *pctx, *kctx;
    assert_int_equal(fa_context_create(&nctx, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_create(&pctx, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_create(&kctx, g_backend), FA_OK);
    assert_int_equal(fa_context_set_algo(nctx, FA_ALGO_NAIVE), FA_OK);
    assert_int_equal(fa_context_set_algo(pctx, FA_ALGO_PLAIN), FA_OK);
    assert_int_equal(fa_fwd(nctx, &q64.t, &k64.t, &v64.t, NULL, &ref_o.t, &ref_l.t), FA_OK);
    assert_int_equal(fa_fwd(pctx, &q.t, &k.t, &v.t, NULL, &base_o.t, &base_l.t), FA_OK);
    tk_buf *up[] = {&q, &k, &v, &o, &l, &part_o[0], &part_o[1], &part_o[2], &part_l[0],
                    &part_l[1], &part_l[2]};
    for (int s = 0; s < 3; s++) tk_poison(&part_o[s]); /* part 2 stays NaN */
    for (int64_t i = 0; i < tk_numel(&part_l[2].t); i++) tk_set(&part_l[2].t, i, -INFINITY);
    for (size_t i = 0; i < sizeof up / sizeof *up; i++) upload(up[i]);
    fa_tensor qd = dview(&q), kd = dview(&k), vd = dview(&v), po[3], pl[3];
    for (int s = 0; s < 3; s++) {
        po[s] = dview(&part_o[s]);
        pl[s] = dview(&part_l[s]);
    }
    for (int s = 0; s < 2; s++) { /* a shard: the same tensors, fewer keys from an offset */
        fa_tensor ksh = kd, vsh = vd;
        int64_t off = s ? SPLIT : 0, n = s ? SK - SPLIT : SPLIT;
        size_t es = fa_dtype_size(dt);
        ksh.data = (char *)kd.data + (size_t)(off * kd.stride[1]) * es;
        vsh.data = (char *)vd.data + (size_t)(off * vd.stride[1]) * es;
        ksh.shape[1] = vsh.shape[1] = n;
        fa_status st = fa_fwd(kctx, &qd, &ksh, &vsh, NULL, &po[s], &pl[s]);
        if (st != FA_OK) fail_msg("shard %d: %s: %s", s, fa_status_string(st), fa_last_error(kctx));
    }
    fa_tensor od = dview(&o), ld = dview(&l);
    fa_status st = fa_merge_attn(kctx, 3, po, pl, &od, &ld);
    if (st != FA_OK) fail_msg("fa_merge_attn: %s: %s", fa_status_string(st), fa_last_error(kctx));
    download(&o);
    download(&l);
    char m[256];
    if (tk_check_written(&o, "out", m, sizeof m) || tk_check_written(&l, "lse", m, sizeof m))
        fail_msg("%s", m);
    tk_err eo[2] = {tk_compare(&o.t, &ref_o.t), tk_compare(&base_o.t, &ref_o.t)};
    tk_err el[2] = {tk_compare(&l.t, &ref_l.t), tk_compare(&base_l.t, &ref_l.t)};
    double so, sl;
    if (!tk_rule(&eo[0], &eo[1], dt, 0, &so) || !tk_rule(&el[0], &el[1], dt, 0, &sl))
        fail_msg("sharded + merged forward breaks the rule: O max %.3g (plain %.3g), LSE max "
                 "%.3g (plain %.3g), seed %llu",
                 eo[0].max_abs, eo[1].max_abs, el[0].max_abs, el[1].max_abs,
                 (unsigned long long)tk_seed());
    tk_buf *all[] = {&q, &k, &v, &q64, &k64, &v64, &ref_o, &ref_l, &base_o, &base_l, &o, &l,
                     &part_o[0], &part_o[1], &part_o[2], &part_l[0], &part_l[1], &part_l[2]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tk_buf_free(all[i]);
    fa_context_destroy(nctx);
    fa_context_destroy(pctx);
    fa_context_destroy(kctx);
}

/* ---- the split heuristic, the selection record, the workspace query (CPU) ---- */

typedef struct small_kv {
    tk_buf q, k, v, o;
    int32_t lens[2];
} small_kv;

/* batch x heads_kv work items over a contiguous f32 cache of `len` tokens. */
static void small_init(small_kv *s, int batch, int hq, int hkv, int len) {
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    int64_t qs[4] = {batch, 1, hq, 32}, ks[4] = {batch, len, hkv, 32};
    assert_int_equal(tk_buf_alloc(&s->q, F32, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->o, F32, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->k, F32, 4, ks, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->v, F32, 4, ks, 0, &r), 0);
    tk_fill_normal(&s->q, &r, 1);
    tk_fill_normal(&s->k, &r, 1);
    tk_fill_normal(&s->v, &r, 1);
    s->lens[0] = s->lens[1] = len;
}

static void small_free(small_kv *s) {
    tk_buf_free(&s->q);
    tk_buf_free(&s->k);
    tk_buf_free(&s->v);
    tk_buf_free(&s->o);
}

/* Runs with `threads` threads and `splits`; returns the recorded split count. The record
   shows the threads asked for, or 1 for a call under 2^20 FLOPs (src/cpu/team.h). */
static int splits_used(small_kv *s, int threads, int splits, size_t *ws_query, size_t *ws_used) {
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_threads(ctx, threads), FA_OK);
    fa_kvcache cache = {s->k.t, s->v.t, s->lens, NULL, 0, 0};
    assert_int_equal(fa_fwd_kvcache_workspace_size(ctx, &s->q.t, &cache, NULL, NULL, NULL,
                                                   splits, ws_query),
                     FA_OK);
    fa_status st = fa_fwd_kvcache(ctx, &s->q.t, &cache, NULL, NULL, NULL, splits, &s->o.t, NULL);
    if (st != FA_OK) fail_msg("%s: %s", fa_status_string(st), fa_last_error(ctx));
    const fa_selection *sel = fa_last_selection(ctx);
    assert_non_null(sel);
    /* cpu_fwd_kvcache_<isa level>_f32_<tile_q>x<tile_k> */
    assert_true(strncmp(sel->kernel, "cpu_fwd_kvcache_", 16) == 0);
    assert_non_null(strstr(sel->kernel, "_f32_64x64"));
    assert_string_equal(sel->backend, "cpu");
    const double flops = 4.0 * (double)s->q.t.shape[2] * 32 * s->lens[0] * s->q.t.shape[0];
    assert_int_equal(sel->threads, flops < 1048576.0 ? 1 : threads);
    *ws_used = sel->workspace_bytes;
    int n = sel->num_splits;
    fa_context_destroy(ctx);
    return n;
}

static void split_heuristic(void **state) {
    (void)state;
    small_kv s;
    size_t wq, wu, wq1, wu1;
    small_init(&s, 1, 4, 1, 4096); /* 2.1 MFLOP: a team's worth */
    /* one work item, eight threads: the cache is cut so the threads have work */
    int n8 = splits_used(&s, 8, 0, &wq, &wu);
    assert_in_range(n8, 2, 64);
    assert_int_equal(wq, wu);
    /* one thread: nothing to gain */
    assert_int_equal(splits_used(&s, 1, 0, &wq1, &wu1), 1);
    assert_true(wq1 < wq); /* no partials without splits */
    /* forced: the caller's count, whatever the threads */
    assert_int_equal(splits_used(&s, 1, 7, &wq, &wu), 7);
    assert_int_equal(wq, wu);
    small_free(&s);
    /* a short cache is not split (nor given a team: 51 kFLOP) */
    small_init(&s, 1, 4, 1, 100);
    assert_int_equal(splits_used(&s, 8, 0, &wq, &wu), 1);
    small_free(&s);
    /* enough items to fill the threads: one per sequence (a decode's kv heads share one) */
    small_init(&s, 2, 4, 2, 2000);
    assert_int_equal(splits_used(&s, 2, 0, &wq, &wu), 1);
    small_free(&s);
}

/* The library lists the new kernels (`flashattn info`). */
static void kernel_names_listed(void **state) {
    (void)state;
    const char *want[] = {"cpu_fwd_kvcache_scalar_f32_64x64",
                          "cpu_fwd_kvcache_paged_scalar_bf16_64x64", "cpu_merge_attn_f16"};
    for (size_t w = 0; w < sizeof want / sizeof *want; w++) {
        int found = 0;
        for (int i = 0; i < fa_kernel_count(); i++) found |= strcmp(fa_kernel_name(i), want[w]) == 0;
        if (!found) fail_msg("%s is not in fa_kernel_name()", want[w]);
    }
}

/* kv_errors.c */
const struct CMUnitTest *kv_error_tests(size_t *n);

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        g_backend = FA_BACKEND_CUDA;
        fa_context *ctx = NULL;
        int have = fa_context_create(&ctx, FA_BACKEND_CUDA) == FA_OK;
        fa_context_destroy(ctx);
        if (!have) {
            printf("no CUDA backend or device here: the GPU run is skipped\n");
            return 77;
        }
    } else if (argc > 1 && strcmp(argv[1], "cpu") != 0) {
        fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
        return 2;
    }
    enum { NC = sizeof cases / sizeof *cases };
    const struct CMUnitTest both[] = {cmocka_unit_test(merge_direct),
                                      cmocka_unit_test(merge_sharded)};
    const struct CMUnitTest cpu_only[] = {cmocka_unit_test(split_heuristic),
                                          cmocka_unit_test(kernel_names_listed)};
    size_t nerr = 0;
    const struct CMUnitTest *errs = kv_error_tests(&nerr);
    int cpu = g_backend == FA_BACKEND_CPU;
    size_t total = NC + 2 + (cpu ? 2 + nerr : 0);
    struct CMUnitTest *tests = calloc(total, sizeof *tests);
    char (*names)[256] = calloc(NC, sizeof *names);
    if (!tests || !names) return 1;
    size_t k = 0;
    for (int i = 0; i < NC; i++) {
        char line[224];
        kv_case_format(&cases[i], line, sizeof line);
        snprintf(names[i], sizeof names[i], "%s %s", cpu ? "cpu" : "cuda", line);
        tests[k++] = (struct CMUnitTest){names[i], run_case, NULL, NULL, (void *)&cases[i]};
    }
    for (int i = 0; i < 2; i++) tests[k++] = both[i];
    for (int i = 0; cpu && i < 2; i++) tests[k++] = cpu_only[i];
    for (size_t i = 0; cpu && i < nerr; i++) tests[k++] = errs[i];
    printf("[ SEED     ] %llu (set FLASHATTN_TEST_SEED to repeat)\n",
           (unsigned long long)tk_seed());
    int failed = _cmocka_run_group_tests(cpu ? "kvcache" : "kvcache_cuda", tests, k, NULL, NULL);
    free(tests);
    free(names);
    return failed != 0;
}
