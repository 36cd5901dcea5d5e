/*
 * test_hdim.c — head dims that are not multiples of 8 (1 .. 255), forward and backward, on the
 * backend named by the first argument ("cpu", the default, or "cuda"; exits 77 without a GPU).
 * The CUDA kernels take multiples of 8; other head dims run on zero-padded copies in the
 * workspace (src/cuda/pad.h). Every case is judged against the float64 reference under the
 * 2x rule with poisoned outputs (testkit), with contiguous rows that are not 16-byte aligned
 * and with gaps of any size (strided), GQA/MQA, masks, softcap, ALiBi and varlen; on CUDA the
 * selection record must name the padding, and the KV-cache path must refuse such a head dim
 * with FA_ERR_HEAD_DIM and write nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"
#include "tk_shapes.h"

/* Padded sizes: 1 and 3 (-> 8, kernel 32), 59 and 63 (-> 64: on sm_90 the Hopper kernels
   run), 111 (-> 112, kernel 128), 127 (-> 128: Hopper), 217 (-> 224, kernel 256), 250 and 255
   (-> 256: Hopper). Short sequences: the references are scalar double code. */
static const tk_case cases[] = {
    {SHAPE("d1", 2, 17, 33, 2, 2, 1, F16), .bwd = 1},
    {SHAPE("d3-gqa-causal", 1, 113, 113, 4, 2, 3, BF16), .causal = 1, .bwd = 1},
    {SHAPE("d5-decode-mqa", 2, 1, 113, 8, 1, 5, F16)},
    {SHAPE("d33-f32", 1, 17, 17, 2, 2, 33, F32), .bwd = 1},
    {SHAPE("d59-mqa-strided", 2, 65, 130, 4, 1, 59, F16), .strided = 1, .bwd = 1},
    {SHAPE("d59-causal-sq>sk", 2, 113, 17, 2, 2, 59, BF16), .causal = 1, .bwd = 1},
    {SHAPE("d63-gqa-causal-tiles", 2, 150, 200, 4, 2, 63, BF16), .causal = 1, .bwd = 1},
    {VARLEN("d111-varlen-causal", 3, 4, 2, 111, BF16), .lens_q = {17, 0, 40},
     .lens_k = {30, 9, 40}, .causal = 1, .bwd = 1},
    {SHAPE("d111-alibi-strided", 1, 40, 70, 4, 4, 111, F16), .alibi = TK_ALIBI_HEAD,
     .strided = 1, .bwd = 1},
    {SHAPE("d127-det-gqa", 1, 130, 257, 2, 1, 127, F16), .causal = 1, .deterministic = 1,
     .bwd = 1},
    {SHAPE("d217-window-softcap", 1, 70, 150, 2, 2, 217, F16), WIN(20, 5), .softcap = 2.0f,
     .bwd = 1},
    {VARLEN("d217-varlen-strided", 2, 2, 1, 217, BF16), .lens_q = {1, 40}, .lens_k = {40, 1},
     .strided = 1, .bwd = 1},
    {SHAPE("d250-alibi-batch", 2, 33, 40, 2, 1, 250, BF16), .alibi = TK_ALIBI_BATCH, .bwd = 1},
    {SHAPE("d255-strided-scale", 1, 40, 40, 2, 1, 255, BF16), .scale = 0.2f, .strided = 1,
     .bwd = 1},
};
#define N_CASES (sizeof cases / sizeof *cases)

static fa_backend g_backend = FA_BACKEND_CPU;

/* The compiled head dim the CUDA kernels run for head dim d: d rounded up to 8, then the
   next compiled size (src/cuda/fwd_sm80.cu, fa_cuda_kernel_dim). */
static int compiled_dim(int d) {
    static const int dims[] = {32, 64, 96, 128, 192, 256};
    const int dp = (d + 7) / 8 * 8;
    for (int i = 0; i < 6; i++)
        if (dp <= dims[i]) return dims[i];
    return 0;
}

/* On CUDA the record names the compiled size and ends with "_pad<d>". */
static void check_record(const char *what, const char *kernel, int d) {
    char pad[16], dim[16];
    snprintf(pad, sizeof pad, "_pad%d", d);
    snprintf(dim, sizeof dim, "_d%d_", compiled_dim(d));
    const size_t n = strlen(kernel), m = strlen(pad);
    if (n < m || strcmp(kernel + n - m, pad) != 0 || !strstr(kernel, dim))
        fail_msg("%s kernel \"%s\": expected the compiled size %s and the suffix %s", what,
                 kernel, dim, pad);
}

static void run_one(void **state) {
    const tk_case *c = *state;
    const char *v = getenv("FLASHATTN_TEST_VERBOSE");
    tk_opts o = {g_backend, FA_ALGO_AUTO, 0, v && *v && strcmp(v, "0") != 0};
    static tk_report r; /* large: keep it off the stack */
    const int st = tk_run_case(c, &o, tk_seed(), &r);
    if (st == TK_SKIP) {
        print_message("%s", r.msg);
        skip();
    }
    if (st == TK_FAIL) fail_msg("%s", r.msg);
    if (o.verbose) print_message("%s", r.msg);
    if (g_backend == FA_BACKEND_CUDA) {
        check_record("forward", r.kernel_fwd, c->d);
        if (c->bwd) check_record("backward", r.kernel_bwd, c->d);
    }
}

/* fa_fwd_kvcache on CUDA with d = 59 runs on zero-padded copies (src/cuda/pad_kv.h;
   test_kvcache_cuda checks its results): an error found before the kernels (here a length
   past the capacity, checked synchronously) writes nothing of the caller's, neither out nor
   the cache that the append would have written, and leaves no selection record. */
static void kvcache_pad_error_writes_nothing(void **state) {
    (void)state;
    enum { B = 2, L = 32, H = 2, D = 59 };
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    const int64_t qs[4] = {B, 1, H, D}, cs[4] = {B, L, H, D}, ls[3] = {B, H, 1};
    tk_buf q, k, v, kn, vn, o, lse;
    assert_int_equal(tk_buf_alloc(&q, F16, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&k, F16, 4, cs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&v, F16, 4, cs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&kn, F16, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&vn, F16, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&o, F16, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&lse, F32, 3, ls, 0, &r), 0);
    tk_buf *all[] = {&q, &k, &v, &kn, &vn, &o, &lse};
    for (int i = 0; i < 5; i++) tk_fill_normal(all[i], &r, 1);
    unsigned char *snap = malloc(k.bytes);
    assert_non_null(snap);
    memcpy(snap, k.base, k.bytes);
    const int32_t lens[B] = {20, L}; /* sequence 1: no room for the appended token */
    for (int i = 0; i < 7; i++) assert_int_equal(tk_device_upload(all[i]), 0);
    int32_t *dlens = (int32_t *)tk_device_copy_array(lens, sizeof lens);
    assert_non_null(dlens);
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_OK);
    assert_int_equal(fa_context_set_device_checks(ctx, FA_DEVICE_CHECKS_SYNC), FA_OK);
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = tk_device_view(&k);
    cache.v = tk_device_view(&v);
    cache.seqlens = dlens;
    const fa_tensor dq = tk_device_view(&q), dkn = tk_device_view(&kn), dvn = tk_device_view(&vn);
    fa_tensor dout = tk_device_view(&o), dlse = tk_device_view(&lse);
    const fa_status st = fa_fwd_kvcache(ctx, &dq, &cache, &dkn, &dvn, NULL, 0, &dout, &dlse);
    if (st != FA_ERR_VARLEN)
        fail_msg("fa_fwd_kvcache at d %d with a length past the capacity returned %s (%s), "
                 "expected FA_ERR_VARLEN", D, fa_status_string(st), fa_last_error(ctx));
    if (fa_last_selection(ctx)) fail_msg("a failed call left a selection record");
    assert_int_equal(tk_device_download(&o), 0);
    assert_int_equal(tk_device_download(&k), 0);
    for (size_t i = 0; i < o.bytes; i++)
        if (((const unsigned char *)o.base)[i] != 0xFF)
            fail_msg("the refused call wrote out (byte %zu)", i);
    if (memcmp(snap, k.base, k.bytes) != 0) fail_msg("the refused call wrote the cache");
    fa_context_destroy(ctx);
    tk_device_free_array(dlens);
    free(snap);
    for (int i = 0; i < 7; i++) tk_buf_free(all[i]);
}

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "cpu") != 0 && strcmp(argv[1], "cuda") != 0)) {
        fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
        return 2;
    }
    if (argc == 2 && strcmp(argv[1], "cuda") == 0) {
        if (!sweep_have_cuda() || !tk_device_available()) {
            printf("no CUDA backend or device here: the GPU run is skipped\n");
            return SWEEP_SKIPPED;
        }
        g_backend = FA_BACKEND_CUDA;
    }
    const char *bname = g_backend == FA_BACKEND_CUDA ? "cuda" : "cpu";
    struct CMUnitTest tests[N_CASES + 1];
    tk_case mine[N_CASES];
    char names[N_CASES][256];
    size_t n = 0;
    for (size_t i = 0; i < N_CASES; i++, n++) {
        mine[i] = tk_case_on(&cases[i], g_backend);
        char line[224];
        tk_case_format(&mine[i], line, sizeof line);
        snprintf(names[i], sizeof names[i], "%s %s", bname, line);
        tests[n] = (struct CMUnitTest){names[i], run_one, NULL, NULL, &mine[i]};
    }
    if (g_backend == FA_BACKEND_CUDA) tests[n++] = (struct CMUnitTest)cmocka_unit_test(kvcache_pad_error_writes_nothing);
    printf("[ SEED     ] %llu (set FLASHATTN_TEST_SEED to repeat)\n",
           (unsigned long long)tk_seed());
    return _cmocka_run_group_tests("hdim", tests, n, NULL, NULL) != 0;
}
