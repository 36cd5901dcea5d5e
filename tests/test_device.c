/*
 * test_device.c — a context's device-side machinery, on the backend named by the first
 * argument ("cpu", the default, or "cuda": exits 77 without a GPU).
 *
 * cpu:  fa_context_check and the mode/device setters' argument checks; the workspace allocator
 *       (each call's alloc/release pair, sizes equal to the workspace queries, the stream passed
 *       through, results identical to the context's own buffer, precedence of a user workspace,
 *       a failing allocator, struct_size).
 * cuda: FA_DEVICE_CHECKS_ASYNC: bad cache seqlens / block_table entries and bad cu_seqlens
 *       (forward and backward) return FA_OK, write nothing outside the tensors (guard bytes
 *       around every device tensor), and fa_context_check then names the element, once; the
 *       next call after a bad one fails with the sticky error and writes nothing; good calls
 *       then match references. FA_DEVICE_CHECKS_SYNC (and FLASHATTN_DEVICE_CHECKS=1) fail at
 *       once with nothing written. CUDA-graph capture (cudaStreamCaptureModeGlobal, a
 *       non-default stream) of fa_fwd (BSHD, varlen), fa_bwd (deterministic or not, varlen)
 *       and fa_fwd_kvcache (contiguous and paged, with append), with an allocator on the
 *       stream (cudaMallocAsync) and with the context's own buffer warmed: replays equal the
 *       eager results bit for bit (dQ of the atomic backward within rounding). Calls that
 *       cannot be captured fail cleanly and leave the capture valid, and so does creating a
 *       context during a capture. fa_context_set_device.
 * Inputs are fresh random values each run (FLASHATTN_TEST_SEED repeats a run).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "testkit.h"

#ifdef FA_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#define F32 FA_DTYPE_F32
#define BF16 FA_DTYPE_BF16

#define FA_OK_OR_FAIL(ctx, x)                                                                 \
    do {                                                                                      \
        fa_status s_ = (x);                                                                   \
        if (s_ != FA_OK)                                                                      \
            fail_msg("line %d: %s: %s: %s", __LINE__, #x, fa_status_string(s_),               \
                     fa_last_error(ctx));                                                     \
    } while (0)

/* Status `want` and a message holding `frag`. */
static void expect_status(fa_context *ctx, fa_status got, fa_status want, const char *frag,
                          const char *what) {
    if (got != want)
        fail_msg("%s: status %s (%s), expected %s", what, fa_status_string(got),
                 fa_last_error(ctx), fa_status_string(want));
    if (frag && !strstr(fa_last_error(ctx), frag))
        fail_msg("%s: message \"%s\" does not say \"%s\"", what, fa_last_error(ctx), frag);
}

/* ---- an allocator that counts ---- */

typedef struct count_alloc {
    int device;   /* 0: malloc; 1: cudaMallocAsync / cudaFreeAsync on the stream */
    int fail;     /* 1: every alloc returns NULL */
    int allocs, releases, mismatched;
    void *ptr;    /* of the outstanding allocation */
    size_t bytes;
    void *stream;
    size_t last_bytes; /* of the last allocation */
} count_alloc;

static void *ca_alloc(void *user, size_t bytes, void *stream) {
    count_alloc *a = user;
    a->allocs++;
    if (a->fail) return NULL;
    void *p = NULL;
#ifdef FA_TEST_CUDA
    if (a->device && cudaMallocAsync(&p, bytes, (cudaStream_t)stream) != cudaSuccess) p = NULL;
#endif
    if (!a->device) p = malloc(bytes);
    if (a->ptr) a->mismatched++; /* one call, one workspace, returned before the next */
    a->ptr = p, a->bytes = bytes, a->stream = stream, a->last_bytes = bytes;
    return p;
}

static void ca_release(void *user, void *ptr, size_t bytes, void *stream) {
    count_alloc *a = user;
    a->releases++;
    if (ptr != a->ptr || bytes != a->bytes || stream != a->stream) a->mismatched++;
    a->ptr = NULL;
#ifdef FA_TEST_CUDA
    if (a->device) cudaFreeAsync(ptr, (cudaStream_t)stream);
#endif
    if (!a->device) free(ptr);
}

static fa_allocator allocator_of(count_alloc *a) {
    fa_allocator al = {.struct_size = sizeof al, .alloc = ca_alloc, .release = ca_release,
                       .user = a};
    return al;
}

/* ---- cpu ---- */

static void cpu_setters(void **state) {
    (void)state;
    assert_int_equal(fa_context_check(NULL), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_set_device(NULL, 0), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_set_allocator(NULL, NULL), FA_ERR_NULL_POINTER);
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_check(ctx), FA_OK); /* no error word on the CPU */
    const int bad_modes[] = {-1, 2, 7};
    for (int i = 0; i < 3; i++)
        expect_status(ctx, fa_context_set_device_checks(ctx, bad_modes[i]),
                      FA_ERR_INVALID_ARGUMENT, "FA_DEVICE_CHECKS_ASYNC", "device checks mode");
    assert_int_equal(fa_context_set_device_checks(ctx, FA_DEVICE_CHECKS_SYNC), FA_OK);
    assert_int_equal(fa_context_set_device_checks(ctx, FA_DEVICE_CHECKS_ASYNC), FA_OK);
    expect_status(ctx, fa_context_set_device(ctx, -2), FA_ERR_INVALID_ARGUMENT, "device = -2",
                  "device -2");
    assert_int_equal(fa_context_set_device(ctx, 3), FA_OK); /* ignored by the CPU backend */
    assert_int_equal(fa_context_set_device(ctx, -1), FA_OK);
    fa_context_destroy(ctx);
}

/* f32 BSHD problem on the CPU: q, k, v, out, lse, dout, dq, dk, dv. */
typedef struct cpu_set {
    tk_buf q, k, v, o, l, dout, dq, dk, dv;
} cpu_set;

static void cpu_set_init(cpu_set *s, tk_rng *r) {
    int64_t qs[4] = {2, 70, 4, 32}, ks[4] = {2, 90, 2, 32}, ls[3] = {2, 4, 70};
    tk_buf *qlike[] = {&s->q, &s->o, &s->dout, &s->dq}, *klike[] = {&s->k, &s->v, &s->dk, &s->dv};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tk_buf_alloc(qlike[i], F32, 4, qs, 0, r), 0);
        assert_int_equal(tk_buf_alloc(klike[i], F32, 4, ks, 0, r), 0);
    }
    assert_int_equal(tk_buf_alloc(&s->l, F32, 3, ls, 0, r), 0);
    tk_fill_normal(&s->q, r, 1);
    tk_fill_normal(&s->k, r, 1);
    tk_fill_normal(&s->v, r, 1);
    tk_fill_normal(&s->dout, r, 1);
}

static void cpu_set_free(cpu_set *s) {
    tk_buf *all[] = {&s->q, &s->k, &s->v, &s->o, &s->l, &s->dout, &s->dq, &s->dk, &s->dv};
    for (int i = 0; i < 9; i++) tk_buf_free(all[i]);
}

/* A contiguous f32 cache [2, 100, 2, 32] holding {50, 80} tokens, one query token. */
typedef struct cpu_kv {
    tk_buf q, k, v, o;
    int32_t lens[2];
    fa_kvcache cache;
} cpu_kv;

static void cpu_kv_init(cpu_kv *s, tk_rng *r) {
    int64_t qs[4] = {2, 1, 4, 32}, ks[4] = {2, 100, 2, 32};
    assert_int_equal(tk_buf_alloc(&s->q, F32, 4, qs, 0, r), 0);
    assert_int_equal(tk_buf_alloc(&s->o, F32, 4, qs, 0, r), 0);
    assert_int_equal(tk_buf_alloc(&s->k, F32, 4, ks, 0, r), 0);
    assert_int_equal(tk_buf_alloc(&s->v, F32, 4, ks, 0, r), 0);
    tk_fill_normal(&s->q, r, 1);
    tk_fill_normal(&s->k, r, 1);
    tk_fill_normal(&s->v, r, 1);
    s->lens[0] = 50, s->lens[1] = 80;
    fa_kvcache c = {s->k.t, s->v.t, s->lens, NULL, 0, 0};
    s->cache = c;
}

static void cpu_kv_free(cpu_kv *s) {
    tk_buf_free(&s->q);
    tk_buf_free(&s->k);
    tk_buf_free(&s->v);
    tk_buf_free(&s->o);
}

/* The three calls on ctx; outputs poisoned first. */
static void cpu_run_all(fa_context *ctx, cpu_set *s, cpu_kv *kv) {
    tk_buf *outs[] = {&s->o, &s->l, &s->dq, &s->dk, &s->dv, &kv->o};
    for (int i = 0; i < 6; i++) tk_poison(outs[i]);
    fa_params p = fa_params_default();
    p.causal = 1;
    FA_OK_OR_FAIL(ctx, fa_fwd(ctx, &s->q.t, &s->k.t, &s->v.t, &p, &s->o.t, &s->l.t));
    FA_OK_OR_FAIL(ctx, fa_bwd(ctx, &s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->dout.t, &s->l.t, &p,
                              &s->dq.t, &s->dk.t, &s->dv.t));
    FA_OK_OR_FAIL(ctx, fa_fwd_kvcache(ctx, &kv->q.t, &kv->cache, NULL, NULL, NULL, 4, &kv->o.t,
                                      NULL));
}

static int same_bytes(const tk_buf *a, const tk_buf *b) {
    return a->bytes == b->bytes && memcmp(a->base, b->base, a->bytes) == 0;
}

static void cpu_allocator(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0xa110c);
    cpu_set s, own;
    cpu_kv kv, kv_own;
    cpu_set_init(&s, &r);
    cpu_kv_init(&kv, &r);
    cpu_set_init(&own, &r);
    cpu_kv_init(&kv_own, &r);
    /* the same inputs in both sets */
    tk_copy(&own.q, &s.q), tk_copy(&own.k, &s.k), tk_copy(&own.v, &s.v);
    tk_copy(&own.dout, &s.dout);
    tk_copy(&kv_own.q, &kv.q), tk_copy(&kv_own.k, &kv.k), tk_copy(&kv_own.v, &kv.v);

    fa_context *ctx, *octx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_create(&octx, FA_BACKEND_CPU), FA_OK);
    void *fake_stream = (void *)(uintptr_t)0x5eed; /* passed through, never used on the CPU */
    assert_int_equal(fa_context_set_stream(ctx, fake_stream), FA_OK);
    count_alloc ca = {0};
    fa_allocator al = allocator_of(&ca);
    assert_int_equal(fa_context_set_allocator(ctx, &al), FA_OK);

    /* what each call asks for */
    fa_params p = fa_params_default();
    p.causal = 1;
    size_t want[3];
    FA_OK_OR_FAIL(ctx, fa_fwd_workspace_size(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &want[0]));
    FA_OK_OR_FAIL(ctx, fa_bwd_workspace_size(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &want[1]));
    FA_OK_OR_FAIL(ctx, fa_fwd_kvcache_workspace_size(ctx, &kv.q.t, &kv.cache, NULL, NULL, NULL, 4,
                                                     &want[2]));
    assert_int_equal(ca.allocs, 0); /* queries allocate nothing */
    for (int i = 0; i < 3; i++)
        if (want[i] == 0) fail_msg("call %d needs no workspace: nothing to allocate", i);

    /* each call: one alloc of the queried size, released with the same arguments */
    tk_buf *outs[] = {&s.o, &s.l, &s.dq, &s.dk, &s.dv, &kv.o};
    for (int i = 0; i < 6; i++) tk_poison(outs[i]);
    FA_OK_OR_FAIL(ctx, fa_fwd(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &s.o.t, &s.l.t));
    assert_int_equal(ca.allocs, 1);
    assert_int_equal(ca.releases, 1);
    assert_int_equal(ca.last_bytes, want[0]);
    FA_OK_OR_FAIL(ctx, fa_bwd(ctx, &s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.dout.t, &s.l.t, &p, &s.dq.t,
                              &s.dk.t, &s.dv.t));
    assert_int_equal(ca.allocs, 2);
    assert_int_equal(ca.releases, 2);
    assert_int_equal(ca.last_bytes, want[1]);
    FA_OK_OR_FAIL(ctx, fa_fwd_kvcache(ctx, &kv.q.t, &kv.cache, NULL, NULL, NULL, 4, &kv.o.t, NULL));
    assert_int_equal(ca.allocs, 3);
    assert_int_equal(ca.releases, 3);
    assert_int_equal(ca.last_bytes, want[2]);
    assert_int_equal(ca.mismatched, 0);
    assert_true(ca.stream == fake_stream);
    assert_int_equal(fa_last_selection(ctx)->workspace_bytes, want[2]);

    /* bit for bit what the context's own buffer gives */
    cpu_run_all(octx, &own, &kv_own);
    tk_buf *mine[] = {&s.o, &s.l, &s.dq, &s.dk, &s.dv, &kv.o};
    tk_buf *theirs[] = {&own.o, &own.l, &own.dq, &own.dk, &own.dv, &kv_own.o};
    const char *names[] = {"out", "lse", "dq", "dk", "dv", "kvcache out"};
    for (int i = 0; i < 6; i++)
        if (!same_bytes(mine[i], theirs[i]))
            fail_msg("%s with the allocator differs from the own buffer's", names[i]);

    /* a user workspace takes precedence */
    size_t big = want[0] > want[1] ? want[0] : want[1];
    big = big > want[2] ? big : want[2];
    void *user_ws = malloc(big);
    assert_non_null(user_ws);
    assert_int_equal(fa_context_set_workspace(ctx, user_ws, big), FA_OK);
    cpu_run_all(ctx, &s, &kv);
    assert_int_equal(ca.allocs, 3);
    assert_int_equal(fa_context_set_workspace(ctx, NULL, 0), FA_OK);

    /* an allocator that fails: FA_ERR_OUT_OF_MEMORY, nothing written, nothing released */
    ca.fail = 1;
    tk_poison(&s.o);
    tk_poison(&s.l);
    expect_status(ctx, fa_fwd(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &s.o.t, &s.l.t),
                  FA_ERR_OUT_OF_MEMORY, "allocator", "failing allocator");
    assert_null(fa_last_selection(ctx));
    char m[256];
    if (!tk_check_written(&s.o, "out", m, sizeof m)) fail_msg("a failed call wrote out");
    assert_int_equal(ca.allocs, 4);
    assert_int_equal(ca.releases, 3);
    ca.fail = 0;

    /* back to the own buffer */
    assert_int_equal(fa_context_set_allocator(ctx, NULL), FA_OK);
    cpu_run_all(ctx, &s, &kv);
    assert_int_equal(ca.allocs, 4);

    /* struct_size: smaller than the first version's is refused, a later (larger) one taken */
    fa_allocator small = al;
    small.struct_size = offsetof(fa_allocator, user) + sizeof(void *) - 1;
    expect_status(ctx, fa_context_set_allocator(ctx, &small), FA_ERR_INVALID_ARGUMENT,
                  "struct_size", "short struct_size");
    struct {
        fa_allocator a;
        void *later_field;
    } later = {al, NULL};
    later.a.struct_size = sizeof later;
    assert_int_equal(fa_context_set_allocator(ctx, &later.a), FA_OK);
    cpu_run_all(ctx, &s, &kv);
    assert_int_equal(ca.allocs, 7);
    assert_int_equal(ca.releases, 6); /* the failed alloc had nothing to release */
    /* version 2: calls whose workspace fits in own_max_bytes keep to the own buffer (the CPU
       never captures), larger ones still ask the allocator; a version-1 struct_size leaves
       own_max_bytes unread */
    const int before = ca.allocs;
    fa_allocator fits = al;
    fits.own_max_bytes = want[2];
    assert_int_equal(fa_context_set_allocator(ctx, &fits), FA_OK);
    FA_OK_OR_FAIL(ctx, fa_fwd_kvcache(ctx, &kv.q.t, &kv.cache, NULL, NULL, NULL, 4, &kv.o.t, NULL));
    assert_int_equal(ca.allocs, before);
    if (!same_bytes(&kv.o, &kv_own.o)) fail_msg("kvcache out on the own buffer (own_max_bytes)");
    fits.own_max_bytes = want[2] - 1;
    assert_int_equal(fa_context_set_allocator(ctx, &fits), FA_OK);
    FA_OK_OR_FAIL(ctx, fa_fwd_kvcache(ctx, &kv.q.t, &kv.cache, NULL, NULL, NULL, 4, &kv.o.t, NULL));
    assert_int_equal(ca.allocs, before + 1);
    fits.own_max_bytes = (size_t)-1;
    fits.struct_size = offsetof(fa_allocator, user) + sizeof(void *);
    assert_int_equal(fa_context_set_allocator(ctx, &fits), FA_OK);
    FA_OK_OR_FAIL(ctx, fa_fwd_kvcache(ctx, &kv.q.t, &kv.cache, NULL, NULL, NULL, 4, &kv.o.t, NULL));
    assert_int_equal(ca.allocs, before + 2);
    assert_int_equal(ca.releases, before + 1);
    fa_allocator no_alloc = al;
    no_alloc.alloc = NULL;
    expect_status(ctx, fa_context_set_allocator(ctx, &no_alloc), FA_ERR_NULL_POINTER, "alloc",
                  "alloc NULL");
    fa_allocator no_release = al;
    no_release.release = NULL;
    expect_status(ctx, fa_context_set_allocator(ctx, &no_release), FA_ERR_NULL_POINTER, "release",
                  "release NULL");
    assert_int_equal(ca.mismatched, 0);

    free(user_ws);
    fa_context_destroy(ctx);
    fa_context_destroy(octx);
    cpu_set_free(&s);
    cpu_set_free(&own);
    cpu_kv_free(&kv);
    cpu_kv_free(&kv_own);
}

#ifdef FA_TEST_CUDA

/* ---- device buffers with guard bytes ---- */

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess)                                                                \
            fail_msg("line %d: %s: %s", __LINE__, #x, cudaGetErrorString(e_));                \
    } while (0)

enum { GUARD = 4096 }; /* bytes of poison before and after every device tensor */

/* A device tensor's memory with GUARD poisoned bytes on each side, and its host mirror. */
typedef struct dbuf {
    size_t bytes;
    unsigned char *host, *dev;
} dbuf;

static size_t db_total(const dbuf *b) { return b->bytes + 2 * GUARD; }
static void *db_dev(const dbuf *b) { return b->dev + GUARD; }
static void *db_host(const dbuf *b) { return b->host + GUARD; }

/* The host mirror to the device. A pageable upload may still be landing when cudaMemcpy
   returns, and the calls run on other streams: wait for it. */
static void db_upload(dbuf *b) {
    CK(cudaMemcpy(b->dev, b->host, db_total(b), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

static void db_download(dbuf *b) {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b->host, b->dev, db_total(b), cudaMemcpyDeviceToHost));
}

static void db_alloc(dbuf *b, size_t bytes) {
    b->bytes = bytes;
    b->host = malloc(db_total(b));
    assert_non_null(b->host);
    memset(b->host, 0xff, db_total(b));
    CK(cudaMalloc((void **)&b->dev, db_total(b)));
    db_upload(b);
}

static void db_free(dbuf *b) {
    free(b->host);
    if (b->dev) cudaFree(b->dev);
    memset(b, 0, sizeof *b);
}

static void db_poison(dbuf *b) {
    memset(b->host, 0xff, db_total(b));
    db_upload(b);
}

static int all_ff(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xff) return 0;
    return 1;
}

/* After a download: nothing written before or after the tensor. */
static void db_expect_guards(const dbuf *b, const char *what) {
    if (!all_ff(b->host, GUARD) || !all_ff(b->host + GUARD + b->bytes, GUARD))
        fail_msg("%s: written outside the tensor (guard bytes changed)", what);
}

/* After a download: nothing written at all. */
static void db_expect_untouched(const dbuf *b, const char *what) {
    if (!all_ff(b->host, db_total(b))) fail_msg("%s: written although it should not be", what);
}

static void db_fill_bf16(dbuf *b, tk_rng *r) {
    uint16_t *h = db_host(b);
    for (size_t i = 0; i < b->bytes / 2; i++) h[i] = tk_bf16_bits(tk_rng_normal(r));
    db_upload(b);
}

/* max |a - b| over n bf16 values, and max |b| */
static double bf16_diff(const uint16_t *a, const uint16_t *b, size_t n, double *bmax) {
    double m = 0;
    *bmax = 0;
    for (size_t i = 0; i < n; i++) {
        double x = tk_bf16_value(a[i]), y = tk_bf16_value(b[i]);
        if (!(fabs(x - y) <= m)) m = isnan(x - y) ? INFINITY : fabs(x - y);
        if (fabs(y) > *bmax) *bmax = fabs(y);
    }
    return m;
}

/* The GPU result against the CPU's under a loose bound: a sanity check of the values (the
   sweeps test accuracy); the kernels round P to bf16. */
static void expect_close_bf16(const void *gpu, const void *cpu, size_t n, const char *what) {
    double ref_max, d = bf16_diff(gpu, cpu, n, &ref_max);
    double tol = 1.0 / 64 * (ref_max > 1 ? ref_max : 1);
    if (!(d <= tol)) fail_msg("%s: GPU and CPU differ by %g (bound %g)", what, d, tol);
}

static void expect_close_lse(const float *gpu, const float *cpu, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(gpu[i] - cpu[i]) <= 1e-2f) && !(isinf(gpu[i]) && gpu[i] == cpu[i]))
            fail_msg("%s: LSE %zu is %g on the GPU, %g on the CPU", what, i, gpu[i], cpu[i]);
}

static fa_context *cuda_ctx(cudaStream_t s, int mode) {
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_OK);
    assert_int_equal(fa_context_set_stream(ctx, s), FA_OK);
    assert_int_equal(fa_context_set_device_checks(ctx, mode), FA_OK);
    return ctx;
}

/* ---- a KV cache: bf16, 3 sequences of {20, 33, 7} tokens + 2 appended, capacity 64 ---- */

enum { KB = 3, KSQ = 2, KHQ = 8, KHK = 2, KD = 128, KPAGE = 16, KMAXP = 4, KCAP = 64, KNP = 14,
       KSNEW = 2 };

typedef struct kvset {
    int paged;
    dbuf q, k, v, kn, vn, out, lse, seqlens, table;
    unsigned char *k0, *v0; /* the cache as filled (whole mirrors), to restore it */
    int32_t lens[KB], bt[KB * KMAXP];
    fa_tensor tq, tk, tv, tkn, tvn, tout, tlse;
    fa_kvcache cache;
} kvset;

static void kv_arrays(kvset *s) {
    memcpy(db_host(&s->seqlens), s->lens, sizeof s->lens);
    db_upload(&s->seqlens);
    if (!s->paged) return;
    memcpy(db_host(&s->table), s->bt, sizeof s->bt);
    db_upload(&s->table);
}

/* The cache and the arrays as filled, the outputs poisoned. */
static void kv_restore(kvset *s) {
    memcpy(s->k.host, s->k0, db_total(&s->k));
    memcpy(s->v.host, s->v0, db_total(&s->v));
    db_upload(&s->k);
    db_upload(&s->v);
    kv_arrays(s);
    db_poison(&s->out);
    db_poison(&s->lse);
}

static void kv_init(kvset *s, int paged, tk_rng *r) {
    memset(s, 0, sizeof *s);
    s->paged = paged;
    const int32_t lens[KB] = {20, 33, 7};
    memcpy(s->lens, lens, sizeof lens);
    const int64_t outer = paged ? KNP : KB, rows = paged ? KPAGE : KCAP;
    const size_t qn = (size_t)KB * KSQ * KHQ * KD, cn = (size_t)(outer * rows) * KHK * KD,
                 nn = (size_t)KB * KSNEW * KHK * KD;
    db_alloc(&s->q, qn * 2), db_alloc(&s->out, qn * 2);
    db_alloc(&s->k, cn * 2), db_alloc(&s->v, cn * 2);
    db_alloc(&s->kn, nn * 2), db_alloc(&s->vn, nn * 2);
    db_alloc(&s->lse, (size_t)KB * KHQ * KSQ * 4);
    db_alloc(&s->seqlens, sizeof s->lens);
    db_alloc(&s->table, sizeof s->bt);
    db_fill_bf16(&s->q, r), db_fill_bf16(&s->k, r), db_fill_bf16(&s->v, r);
    db_fill_bf16(&s->kn, r), db_fill_bf16(&s->vn, r);
    s->k0 = malloc(db_total(&s->k));
    s->v0 = malloc(db_total(&s->v));
    assert_non_null(s->k0);
    assert_non_null(s->v0);
    memcpy(s->k0, s->k.host, db_total(&s->k));
    memcpy(s->v0, s->v.host, db_total(&s->v));
    int perm[KNP];
    for (int i = 0; i < KNP; i++) perm[i] = i;
    for (int i = KNP - 1; i > 0; i--) { /* pages in shuffled pool order */
        int j = (int)tk_rng_range(r, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < KB * KMAXP; i++) s->bt[i] = perm[i];
    kv_restore(s);
    s->tq = fa_tensor_bshd(db_dev(&s->q), BF16, FA_DEVICE_CUDA, KB, KSQ, KHQ, KD);
    s->tout = fa_tensor_bshd(db_dev(&s->out), BF16, FA_DEVICE_CUDA, KB, KSQ, KHQ, KD);
    s->tk = fa_tensor_bshd(db_dev(&s->k), BF16, FA_DEVICE_CUDA, outer, rows, KHK, KD);
    s->tv = fa_tensor_bshd(db_dev(&s->v), BF16, FA_DEVICE_CUDA, outer, rows, KHK, KD);
    s->tkn = fa_tensor_bshd(db_dev(&s->kn), BF16, FA_DEVICE_CUDA, KB, KSNEW, KHK, KD);
    s->tvn = fa_tensor_bshd(db_dev(&s->vn), BF16, FA_DEVICE_CUDA, KB, KSNEW, KHK, KD);
    s->tlse = fa_tensor_3d(db_dev(&s->lse), F32, FA_DEVICE_CUDA, KB, KHQ, KSQ);
    fa_kvcache c = {s->tk, s->tv, db_dev(&s->seqlens), paged ? db_dev(&s->table) : NULL,
                    paged ? KMAXP : 0, paged ? KMAXP : 0};
    s->cache = c;
}

static void kv_free(kvset *s) {
    dbuf *all[] = {&s->q, &s->k, &s->v, &s->kn, &s->vn, &s->out, &s->lse, &s->seqlens, &s->table};
    for (int i = 0; i < 9; i++) db_free(all[i]);
    free(s->k0);
    free(s->v0);
}

static fa_status kv_call(fa_context *ctx, kvset *s, int splits) {
    return fa_fwd_kvcache(ctx, &s->tq, &s->cache, &s->tkn, &s->tvn, NULL, splits, &s->tout,
                          &s->tlse);
}

static void kv_download(kvset *s) {
    db_download(&s->out);
    db_download(&s->lse);
    db_download(&s->k);
    db_download(&s->v);
}

/* The same call on the CPU (host mirrors of the inputs as filled): out, lse and the cache. */
static void kv_reference(kvset *s, uint16_t *out, float *lse, unsigned char *k, unsigned char *v) {
    memcpy(k, s->k0, db_total(&s->k));
    memcpy(v, s->v0, db_total(&s->v));
    fa_context *cpu;
    assert_int_equal(fa_context_create(&cpu, FA_BACKEND_CPU), FA_OK);
    fa_tensor q = s->tq, kn = s->tkn, vn = s->tvn, o = s->tout, l = s->tlse;
    fa_kvcache c = s->cache;
    q.data = db_host(&s->q), kn.data = db_host(&s->kn), vn.data = db_host(&s->vn);
    o.data = out, l.data = lse;
    c.k.data = k + GUARD, c.v.data = v + GUARD;
    fa_tensor *all[] = {&q, &kn, &vn, &o, &l, &c.k, &c.v};
    for (int i = 0; i < 7; i++) all[i]->device = FA_DEVICE_CPU;
    c.seqlens = s->lens;
    c.block_table = s->paged ? s->bt : NULL;
    FA_OK_OR_FAIL(cpu, fa_fwd_kvcache(cpu, &q, &c, &kn, &vn, NULL, 0, &o, &l));
    fa_context_destroy(cpu);
}

/* Downloads the results of a good call and compares them with the CPU's. */
static void kv_expect_reference(kvset *s, const char *what) {
    kv_download(s);
    const size_t on = s->out.bytes / 2, ln = s->lse.bytes / 4;
    uint16_t *out = malloc(s->out.bytes);
    float *lse = malloc(s->lse.bytes);
    unsigned char *k = malloc(db_total(&s->k)), *v = malloc(db_total(&s->v));
    assert_true(out && lse && k && v);
    kv_reference(s, out, lse, k, v);
    expect_close_bf16(db_host(&s->out), out, on, what);
    expect_close_lse(db_host(&s->lse), lse, ln, what);
    /* the append is a copy: the cache must match the CPU's bit for bit, guards included */
    if (memcmp(s->k.host, k, db_total(&s->k)) || memcmp(s->v.host, v, db_total(&s->v)))
        fail_msg("%s: the cache after the append differs from the CPU's", what);
    free(out);
    free(lse);
    free(k);
    free(v);
}

/* One bad element of the arrays: seqlens[i] (table 0) or block_table entry i (table 1). */
typedef struct kv_bad {
    int table, i;
    int32_t value;
    const char *frag, *frag_paged; /* frag_paged NULL: the same message for a paged cache */
} kv_bad;

static const kv_bad kv_bads[] = {
    {0, 1, -5, "cache->seqlens[1] = -5 is negative"},
    {0, 0, KCAP - 1, "cache->seqlens[0] = 63 with 2 new tokens exceeds the cache's capacity of 64",
     "cache->seqlens[0] = 63 with 2 new tokens exceeds the 64 tokens that a row of "
     "cache->block_table maps"},
    {1, 2 * KMAXP + 0, 9999, "cache->block_table[2][0] = 9999 is outside the pool of 14 pages"},
    {1, 1 * KMAXP + 2, -1, "cache->block_table[1][2] = -1 is outside the pool of 14 pages"},
};
enum { N_KV_BADS = sizeof kv_bads / sizeof kv_bads[0] };

/* The message a bad element gives, paged or not (the paged one names the block table). */
static const char *kv_frag(const kv_bad *b, int paged) {
    return paged && b->frag_paged ? b->frag_paged : b->frag;
}

static void kv_apply(kvset *s, const kv_bad *b) {
    dbuf *d = b->table ? &s->table : &s->seqlens;
    ((int32_t *)db_host(d))[b->i] = b->value;
    db_upload(d);
}

static void kv_expect_guards(kvset *s) {
    db_expect_guards(&s->out, "out");
    db_expect_guards(&s->lse, "lse");
    db_expect_guards(&s->k, "cache k");
    db_expect_guards(&s->v, "cache v");
}

static void kv_expect_untouched(kvset *s, const char *what) {
    kv_download(s);
    db_expect_untouched(&s->out, what);
    db_expect_untouched(&s->lse, what);
    if (memcmp(s->k.host, s->k0, db_total(&s->k)) || memcmp(s->v.host, s->v0, db_total(&s->v)))
        fail_msg("%s: the cache was written", what);
}

/* ---- (a) KV cache, FA_DEVICE_CHECKS_ASYNC ---- */

static void cuda_kvcache_async(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x6b76);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int paged = 0; paged < 2; paged++) {
        kvset s;
        kv_init(&s, paged, &r);
        fa_context *ctx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
        for (int i = 0; i < N_KV_BADS; i++) {
            const kv_bad *b = &kv_bads[i];
            if (b->table && !paged) continue;
            for (int splits = 1; splits <= 3; splits += 2) {
                kv_restore(&s);
                kv_apply(&s, b);
                FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, splits)); /* no synchronisation, no error */
                CK(cudaStreamSynchronize(st));
                kv_download(&s);
                kv_expect_guards(&s);
                expect_status(ctx, fa_context_check(ctx), FA_ERR_VARLEN, kv_frag(b, paged),
                              kv_frag(b, paged));
                assert_int_equal(fa_context_check(ctx), FA_OK); /* reported once */
            }
        }
        /* a good call on the same context */
        kv_restore(&s);
        FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, 0));
        CK(cudaStreamSynchronize(st));
        assert_int_equal(fa_context_check(ctx), FA_OK);
        kv_expect_reference(&s, paged ? "paged, after the bad calls"
                                      : "contiguous, after the bad calls");

        /* the call after a bad one fails with its error and writes nothing */
        kv_restore(&s);
        kv_apply(&s, &kv_bads[0]);
        FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, 3));
        CK(cudaStreamSynchronize(st));
        kv_restore(&s);
        expect_status(ctx, kv_call(ctx, &s, 3), FA_ERR_VARLEN, kv_bads[0].frag, "sticky error");
        if (!strstr(fa_last_error(ctx), "earlier call"))
            fail_msg("the sticky error does not say it comes from an earlier call: %s",
                     fa_last_error(ctx));
        assert_null(fa_last_selection(ctx));
        kv_expect_untouched(&s, "the call that reported a sticky error");
        FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, 3));
        kv_expect_reference(&s, "after the sticky error");
        fa_context_destroy(ctx);
        kv_free(&s);
    }
    CK(cudaStreamDestroy(st));
}

/* ---- varlen: bf16, 3 sequences, q {5, 17, 9} (31 tokens), k {12, 30, 7} (49) ---- */

enum { VB = 3, VHQ = 4, VHK = 2, VTQ = 31, VTK = 49, VMQ = 17, VMK = 30 };
/* The head dim of the varlen set: 64, or 59 for cuda_varlen_async_d59 (the padded path of
   src/cuda/pad.h must keep the same promises). */
static int g_vd = 64;

typedef struct vset {
    dbuf q, k, v, out, lse, dout, dq, dk, dv, cuq, cuk;
    fa_tensor tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv;
    fa_params p;
} vset;

static const int32_t v_cuq[VB + 1] = {0, 5, 22, 31}, v_cuk[VB + 1] = {0, 12, 42, 49};

static void vl_arrays(vset *s) {
    memcpy(db_host(&s->cuq), v_cuq, sizeof v_cuq);
    memcpy(db_host(&s->cuk), v_cuk, sizeof v_cuk);
    db_upload(&s->cuq);
    db_upload(&s->cuk);
    s->p.max_seqlen_q = VMQ;
    s->p.max_seqlen_k = VMK;
}

static void vl_init(vset *s, tk_rng *r) {
    memset(s, 0, sizeof *s);
    const size_t qn = (size_t)VTQ * VHQ * g_vd, kn = (size_t)VTK * VHK * g_vd;
    dbuf *qlike[] = {&s->q, &s->out, &s->dout, &s->dq}, *klike[] = {&s->k, &s->v, &s->dk, &s->dv};
    fa_tensor *tq[] = {&s->tq, &s->tout, &s->tdout, &s->tdq};
    fa_tensor *tk[] = {&s->tk, &s->tv, &s->tdk, &s->tdv};
    for (int i = 0; i < 4; i++) {
        db_alloc(qlike[i], qn * 2);
        db_alloc(klike[i], kn * 2);
        *tq[i] = fa_tensor_3d(db_dev(qlike[i]), BF16, FA_DEVICE_CUDA, VTQ, VHQ, g_vd);
        *tk[i] = fa_tensor_3d(db_dev(klike[i]), BF16, FA_DEVICE_CUDA, VTK, VHK, g_vd);
    }
    db_alloc(&s->lse, (size_t)VHQ * VTQ * 4);
    s->tlse = fa_tensor_2d(db_dev(&s->lse), F32, FA_DEVICE_CUDA, VHQ, VTQ);
    db_alloc(&s->cuq, sizeof v_cuq);
    db_alloc(&s->cuk, sizeof v_cuk);
    db_fill_bf16(&s->q, r), db_fill_bf16(&s->k, r), db_fill_bf16(&s->v, r);
    db_fill_bf16(&s->dout, r);
    s->p = fa_params_default();
    s->p.causal = 1;
    s->p.cu_seqlens_q = db_dev(&s->cuq);
    s->p.cu_seqlens_k = db_dev(&s->cuk);
    s->p.batch = VB;
    vl_arrays(s);
}

static void vl_free(vset *s) {
    dbuf *all[] = {&s->q, &s->k, &s->v, &s->out, &s->lse, &s->dout, &s->dq, &s->dk, &s->dv,
                   &s->cuq, &s->cuk};
    for (int i = 0; i < 11; i++) db_free(all[i]);
}

static fa_status vl_fwd(fa_context *ctx, vset *s) {
    return fa_fwd(ctx, &s->tq, &s->tk, &s->tv, &s->p, &s->tout, &s->tlse);
}

static fa_status vl_bwd(fa_context *ctx, vset *s) {
    return fa_bwd(ctx, &s->tq, &s->tk, &s->tv, &s->tout, &s->tdout, &s->tlse, &s->p, &s->tdq,
                  &s->tdk, &s->tdv);
}

/* One bad element of the varlen arrays (or a max_seqlen_q too small for them). */
typedef struct vl_bad {
    int k, i;        /* cu_seqlens_k (1) or _q (0), element i; i < 0: max_seqlen_q = value */
    int32_t value;
    const char *frag;
} vl_bad;

static const vl_bad vl_bads[] = {
    {1, 2, 5, "cu_seqlens_k[2] = 5 is less than cu_seqlens_k[1] = 12"},
    {0, 2, 400, "cu_seqlens_q[2] = 400 is past the 31 tokens of q"},
    {0, 0, 1, "cu_seqlens_q[0] = 1, must be 0"},
    {1, 3, 48, "cu_seqlens_k[batch = 3] = 48 but k holds 49 tokens"},
    {0, -1, 10, "cu_seqlens_q[2] - cu_seqlens_q[1] = 22 - 5 exceeds max_seqlen_q = 10"},
};
enum { N_VL_BADS = sizeof vl_bads / sizeof vl_bads[0] };

static void vl_apply(vset *s, const vl_bad *b) {
    if (b->i < 0) {
        s->p.max_seqlen_q = b->value;
        return;
    }
    dbuf *d = b->k ? &s->cuk : &s->cuq;
    ((int32_t *)db_host(d))[b->i] = b->value;
    db_upload(d);
}

static void copy_host(dbuf *dst, const dbuf *src) { memcpy(dst->host, src->host, db_total(src)); }

/* ---- (b) varlen, FA_DEVICE_CHECKS_ASYNC ---- */

static void cuda_varlen_async(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x766c);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    vset s;
    vl_init(&s, &r);
    fa_context *ctx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
    fa_context *sync_ctx = cuda_ctx(st, FA_DEVICE_CHECKS_SYNC);
    for (int i = 0; i < N_VL_BADS; i++) {
        const vl_bad *b = &vl_bads[i];
        vl_arrays(&s);
        db_poison(&s.out);
        db_poison(&s.lse);
        vl_apply(&s, b);
        FA_OK_OR_FAIL(ctx, vl_fwd(ctx, &s));
        CK(cudaStreamSynchronize(st));
        db_download(&s.out);
        db_download(&s.lse);
        /* every sequence taken as empty: nothing computed, nothing written */
        db_expect_untouched(&s.out, b->frag);
        db_expect_untouched(&s.lse, b->frag);
        expect_status(ctx, fa_context_check(ctx), FA_ERR_VARLEN, b->frag, b->frag);
        assert_int_equal(fa_context_check(ctx), FA_OK);
    }
    /* good calls: as the synchronous context computes them, and close to the CPU */
    vl_arrays(&s);
    FA_OK_OR_FAIL(ctx, vl_fwd(ctx, &s));
    CK(cudaStreamSynchronize(st));
    assert_int_equal(fa_context_check(ctx), FA_OK);
    db_download(&s.out);
    db_download(&s.lse);
    dbuf out_a = {0}, lse_a = {0};
    out_a.host = malloc(db_total(&s.out)), lse_a.host = malloc(db_total(&s.lse));
    assert_true(out_a.host && lse_a.host);
    copy_host(&out_a, &s.out), copy_host(&lse_a, &s.lse);
    db_poison(&s.out);
    db_poison(&s.lse);
    FA_OK_OR_FAIL(sync_ctx, vl_fwd(sync_ctx, &s));
    db_download(&s.out);
    db_download(&s.lse);
    if (memcmp(out_a.host, s.out.host, db_total(&s.out)) ||
        memcmp(lse_a.host, s.lse.host, db_total(&s.lse)))
        fail_msg("varlen forward: the asynchronous checks changed the result");
    {
        fa_context *cpu;
        assert_int_equal(fa_context_create(&cpu, FA_BACKEND_CPU), FA_OK);
        uint16_t *o = malloc(s.out.bytes);
        float *l = malloc(s.lse.bytes);
        assert_true(o && l);
        fa_tensor q = s.tq, k = s.tk, v = s.tv, to = s.tout, tl = s.tlse;
        q.data = db_host(&s.q), k.data = db_host(&s.k), v.data = db_host(&s.v);
        to.data = o, tl.data = l;
        fa_tensor *all[] = {&q, &k, &v, &to, &tl};
        for (int i = 0; i < 5; i++) all[i]->device = FA_DEVICE_CPU;
        fa_params p = s.p;
        p.cu_seqlens_q = v_cuq, p.cu_seqlens_k = v_cuk;
        FA_OK_OR_FAIL(cpu, fa_fwd(cpu, &q, &k, &v, &p, &to, &tl));
        expect_close_bf16(db_host(&s.out), o, s.out.bytes / 2, "varlen forward");
        expect_close_lse(db_host(&s.lse), l, s.lse.bytes / 4, "varlen forward");
        free(o);
        free(l);
        fa_context_destroy(cpu);
    }

    /* the backward: a bad cu_seqlens_k writes none of dq, dk, dv */
    s.p.deterministic = 1;
    for (int i = 0; i < 2; i++) {
        const vl_bad *b = &vl_bads[i];
        vl_arrays(&s);
        db_poison(&s.dq), db_poison(&s.dk), db_poison(&s.dv);
        vl_apply(&s, b);
        FA_OK_OR_FAIL(ctx, vl_bwd(ctx, &s));
        CK(cudaStreamSynchronize(st));
        dbuf *g[] = {&s.dq, &s.dk, &s.dv};
        for (int j = 0; j < 3; j++) {
            db_download(g[j]);
            db_expect_untouched(g[j], b->frag);
        }
        expect_status(ctx, fa_context_check(ctx), FA_ERR_VARLEN, b->frag, b->frag);
    }
    vl_arrays(&s);
    dbuf *g[] = {&s.dq, &s.dk, &s.dv};
    unsigned char *ga[3];
    FA_OK_OR_FAIL(ctx, vl_bwd(ctx, &s));
    CK(cudaStreamSynchronize(st));
    assert_int_equal(fa_context_check(ctx), FA_OK);
    for (int j = 0; j < 3; j++) {
        db_download(g[j]);
        db_expect_guards(g[j], "varlen backward");
        ga[j] = malloc(db_total(g[j]));
        assert_non_null(ga[j]);
        memcpy(ga[j], g[j]->host, db_total(g[j]));
        db_poison(g[j]);
    }
    FA_OK_OR_FAIL(sync_ctx, vl_bwd(sync_ctx, &s));
    for (int j = 0; j < 3; j++) {
        db_download(g[j]);
        if (memcmp(ga[j], g[j]->host, db_total(g[j])))
            fail_msg("varlen backward (deterministic): gradient %d differs from the synchronous "
                     "context's",
                     j);
        free(ga[j]);
    }
    free(out_a.host);
    free(lse_a.host);
    fa_context_destroy(ctx);
    fa_context_destroy(sync_ctx);
    vl_free(&s);
    CK(cudaStreamDestroy(st));
}

/* The same at head dim 59: the operands are copied into zero-padded buffers, and a bad
   array must still leave out, lse, dq, dk and dv untouched (only the rows the sanitised
   cu_seqlens cover are copied back). */
static void cuda_varlen_async_d59(void **state) {
    g_vd = 59;
    cuda_varlen_async(state);
    g_vd = 64;
}

/* ---- (c) FA_DEVICE_CHECKS_SYNC: at once, nothing written ---- */

static void cuda_sync_checks(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x73796e63);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    kvset s;
    kv_init(&s, 1, &r);
    fa_context *ctx = cuda_ctx(st, FA_DEVICE_CHECKS_SYNC);
    for (int i = 0; i < N_KV_BADS; i++) {
        kv_restore(&s);
        kv_apply(&s, &kv_bads[i]);
        const char *frag = kv_frag(&kv_bads[i], 1);
        expect_status(ctx, kv_call(ctx, &s, 3), FA_ERR_VARLEN, frag, frag);
        assert_null(fa_last_selection(ctx));
        kv_expect_untouched(&s, frag);
    }
    assert_int_equal(fa_context_check(ctx), FA_OK);
    kv_restore(&s);
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, 3));
    kv_expect_reference(&s, "synchronous checks");

    /* FLASHATTN_DEVICE_CHECKS=1: new contexts are synchronous; unset: asynchronous */
    setenv("FLASHATTN_DEVICE_CHECKS", "1", 1);
    fa_context *env_ctx;
    assert_int_equal(fa_context_create(&env_ctx, FA_BACKEND_CUDA), FA_OK);
    unsetenv("FLASHATTN_DEVICE_CHECKS");
    fa_context *dflt;
    assert_int_equal(fa_context_create(&dflt, FA_BACKEND_CUDA), FA_OK);
    assert_int_equal(fa_context_set_stream(env_ctx, st), FA_OK);
    assert_int_equal(fa_context_set_stream(dflt, st), FA_OK);
    kv_restore(&s);
    kv_apply(&s, &kv_bads[0]);
    expect_status(env_ctx, kv_call(env_ctx, &s, 1), FA_ERR_VARLEN, kv_bads[0].frag,
                  "FLASHATTN_DEVICE_CHECKS=1");
    kv_expect_untouched(&s, "FLASHATTN_DEVICE_CHECKS=1");
    FA_OK_OR_FAIL(dflt, kv_call(dflt, &s, 1));
    CK(cudaStreamSynchronize(st));
    expect_status(dflt, fa_context_check(dflt), FA_ERR_VARLEN, kv_bads[0].frag, "default mode");
    fa_context_destroy(env_ctx);
    fa_context_destroy(dflt);

    /* varlen: the synchronous check, and the asynchronous mode without max_seqlen (which
       needs the synchronous one to learn them) */
    vset v;
    vl_init(&v, &r);
    fa_context *actx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
    for (int i = 0; i < N_VL_BADS; i++) {
        for (int mode = 0; mode < 2; mode++) {
            const vl_bad *b = &vl_bads[i];
            fa_context *c = mode ? ctx : actx;
            vl_arrays(&v);
            if (!mode) v.p.max_seqlen_q = v.p.max_seqlen_k = 0;
            db_poison(&v.out);
            db_poison(&v.lse);
            vl_apply(&v, b);
            expect_status(c, vl_fwd(c, &v), FA_ERR_VARLEN, b->frag, b->frag);
            db_download(&v.out);
            db_download(&v.lse);
            db_expect_untouched(&v.out, b->frag);
            db_expect_untouched(&v.lse, b->frag);
        }
    }
    assert_int_equal(fa_context_check(actx), FA_OK);
    fa_context_destroy(actx);
    fa_context_destroy(ctx);
    vl_free(&v);
    kv_free(&s);
    CK(cudaStreamDestroy(st));
}

/* ---- (d) CUDA-graph capture ---- */

/* BSHD: B 2, 300 tokens, heads 8/2, d 128, causal; the backward reads the forward's out/lse. */
enum { GB = 2, GS = 300, GHQ = 8, GHK = 2, GD = 128 };

typedef struct gset {
    dbuf q, k, v, out, lse, dout, dq, dk, dv, dq2, dk2, dv2;
    fa_tensor tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv, tdq2, tdk2, tdv2;
    vset vl;
    kvset kc, kp;
} gset;

static void g_init(gset *g, tk_rng *r) {
    memset(g, 0, sizeof *g);
    const size_t qn = (size_t)GB * GS * GHQ * GD, kn = (size_t)GB * GS * GHK * GD;
    dbuf *qlike[] = {&g->q, &g->out, &g->dout, &g->dq, &g->dq2};
    fa_tensor *tq[] = {&g->tq, &g->tout, &g->tdout, &g->tdq, &g->tdq2};
    dbuf *klike[] = {&g->k, &g->v, &g->dk, &g->dv, &g->dk2, &g->dv2};
    fa_tensor *tk[] = {&g->tk, &g->tv, &g->tdk, &g->tdv, &g->tdk2, &g->tdv2};
    for (int i = 0; i < 5; i++) {
        db_alloc(qlike[i], qn * 2);
        *tq[i] = fa_tensor_bshd(db_dev(qlike[i]), BF16, FA_DEVICE_CUDA, GB, GS, GHQ, GD);
    }
    for (int i = 0; i < 6; i++) {
        db_alloc(klike[i], kn * 2);
        *tk[i] = fa_tensor_bshd(db_dev(klike[i]), BF16, FA_DEVICE_CUDA, GB, GS, GHK, GD);
    }
    db_alloc(&g->lse, (size_t)GB * GHQ * GS * 4);
    g->tlse = fa_tensor_3d(db_dev(&g->lse), F32, FA_DEVICE_CUDA, GB, GHQ, GS);
    db_fill_bf16(&g->q, r), db_fill_bf16(&g->k, r), db_fill_bf16(&g->v, r);
    db_fill_bf16(&g->dout, r);
    vl_init(&g->vl, r);
    kv_init(&g->kc, 0, r);
    kv_init(&g->kp, 1, r);
}

static void g_free(gset *g) {
    dbuf *all[] = {&g->q, &g->k, &g->v, &g->out, &g->lse, &g->dout, &g->dq, &g->dk, &g->dv,
                   &g->dq2, &g->dk2, &g->dv2};
    for (int i = 0; i < 12; i++) db_free(all[i]);
    vl_free(&g->vl);
    kv_free(&g->kc);
    kv_free(&g->kp);
}

/* Every output of the calls below, in a fixed order. */
static int g_outputs(gset *g, dbuf **o) {
    dbuf *all[] = {&g->out, &g->lse, &g->dq, &g->dk, &g->dv, &g->dq2, &g->dk2, &g->dv2,
                   &g->vl.out, &g->vl.lse, &g->vl.dq, &g->vl.dk, &g->vl.dv,
                   &g->kc.out, &g->kc.lse, &g->kc.k, &g->kc.v,
                   &g->kp.out, &g->kp.lse, &g->kp.k, &g->kp.v};
    int n = (int)(sizeof all / sizeof *all);
    for (int i = 0; i < n; i++) o[i] = all[i];
    return n;
}
enum { G_DQ_ATOMIC = 5, G_MAX_OUT = 24 }; /* g->dq2: the atomic backward's dQ */

/* Outputs poisoned, caches as filled (before a run, outside any capture). */
static void g_prepare(gset *g) {
    dbuf *o[G_MAX_OUT];
    int n = g_outputs(g, o);
    for (int i = 0; i < n; i++) db_poison(o[i]);
    kv_restore(&g->kc);
    kv_restore(&g->kp);
    vl_arrays(&g->vl);
}

/* The calls, in order; every one must queue its work and return FA_OK. */
static void g_run(fa_context *ctx, gset *g) {
    fa_params p = fa_params_default();
    p.causal = 1;
    FA_OK_OR_FAIL(ctx, fa_fwd(ctx, &g->tq, &g->tk, &g->tv, &p, &g->tout, &g->tlse));
    p.deterministic = 1;
    FA_OK_OR_FAIL(ctx, fa_bwd(ctx, &g->tq, &g->tk, &g->tv, &g->tout, &g->tdout, &g->tlse, &p,
                              &g->tdq, &g->tdk, &g->tdv));
    p.deterministic = 0;
    FA_OK_OR_FAIL(ctx, fa_bwd(ctx, &g->tq, &g->tk, &g->tv, &g->tout, &g->tdout, &g->tlse, &p,
                              &g->tdq2, &g->tdk2, &g->tdv2));
    FA_OK_OR_FAIL(ctx, vl_fwd(ctx, &g->vl));
    g->vl.p.deterministic = 1;
    FA_OK_OR_FAIL(ctx, vl_bwd(ctx, &g->vl));
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &g->kc, 3));
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &g->kp, 0));
}

/* Downloads every output into a fresh host copy (whole mirrors, guards included). */
static void g_snapshot(gset *g, unsigned char **snap) {
    dbuf *o[G_MAX_OUT];
    int n = g_outputs(g, o);
    for (int i = 0; i < n; i++) {
        db_download(o[i]);
        snap[i] = malloc(db_total(o[i]));
        assert_non_null(snap[i]);
        memcpy(snap[i], o[i]->host, db_total(o[i]));
    }
}

static void g_compare(gset *g, unsigned char **eager, const char *what) {
    dbuf *o[G_MAX_OUT];
    int n = g_outputs(g, o);
    for (int i = 0; i < n; i++) {
        db_download(o[i]);
        if (i == G_DQ_ATOMIC) { /* fp32 atomics: the order of the sums varies */
            db_expect_guards(o[i], what);
            expect_close_bf16(db_host(o[i]), eager[i] + GUARD, o[i]->bytes / 2, what);
        } else if (memcmp(o[i]->host, eager[i], db_total(o[i])) != 0) {
            fail_msg("%s: output %d differs from the eager run's", what, i);
        }
    }
}

static void g_snapshot_free(gset *g, unsigned char **snap) {
    dbuf *o[G_MAX_OUT];
    int n = g_outputs(g, o);
    for (int i = 0; i < n; i++) free(snap[i]);
}

/* Eager run, capture, two replays, each compared with the eager results. */
static void capture_and_replay(fa_context *ctx, cudaStream_t st, gset *g, const char *what) {
    unsigned char *eager[G_MAX_OUT];
    g_prepare(g);
    g_run(ctx, g);
    CK(cudaStreamSynchronize(st));
    assert_int_equal(fa_context_check(ctx), FA_OK);
    g_snapshot(g, eager);

    g_prepare(g);
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    g_run(ctx, g);
    CK(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    /* nothing ran during the capture */
    dbuf *o[G_MAX_OUT];
    int n = g_outputs(g, o);
    for (int i = 0; i < n; i++)
        if (o[i] == &g->kc.k || o[i] == &g->kc.v || o[i] == &g->kp.k || o[i] == &g->kp.v) continue;
        else {
            db_download(o[i]);
            db_expect_untouched(o[i], "an output, during the capture");
        }
    for (int round = 0; round < 2; round++) {
        g_prepare(g);
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
        g_compare(g, eager, what);
        assert_int_equal(fa_context_check(ctx), FA_OK);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    g_snapshot_free(g, eager);
}

/* Capture and replay on a context with a counting allocator. own_max_bytes > 0: eager calls
   first, which must keep to the own buffer (no allocation); captured ones take the
   allocator's memory either way, and replays equal the eager results. */
static void capture_with_allocator(uint64_t tag, size_t own_max, const char *what) {
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ tag);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    gset g;
    g_init(&g, &r);
    fa_context *ctx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
    count_alloc ca = {0};
    ca.device = 1;
    fa_allocator al = allocator_of(&ca);
    al.own_max_bytes = own_max;
    assert_int_equal(fa_context_set_allocator(ctx, &al), FA_OK);
    if (own_max) {
        g_prepare(&g);
        g_run(ctx, &g);
        CK(cudaStreamSynchronize(st));
        assert_int_equal(ca.allocs, 0);
    }
    capture_and_replay(ctx, st, &g, what);
    if (ca.allocs == 0 || ca.allocs != ca.releases || ca.mismatched)
        fail_msg("allocator: %d allocs, %d releases, %d mismatched", ca.allocs, ca.releases,
                 ca.mismatched);
    if (!own_max) assert_true(ca.stream == (void *)st);
    fa_context_destroy(ctx);
    g_free(&g);
    CK(cudaStreamDestroy(st));
}

static void cuda_capture_allocator(void **state) {
    (void)state;
    capture_with_allocator(0x67726170, 0, "captured with an allocator");
}

static void cuda_capture_own_max(void **state) {
    (void)state;
    capture_with_allocator(0x6f6d6178, (size_t)1 << 30,
                           "captured with an allocator past own_max_bytes");
}

static void cuda_capture_own_buffer(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x6f776e);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    gset g;
    g_init(&g, &r);
    fa_context *ctx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
    /* the eager run inside warms the buffer before the capture */
    capture_and_replay(ctx, st, &g, "captured on the warmed own buffer");
    /* eager calls after the capture, between replays, still right */
    unsigned char *eager[G_MAX_OUT];
    g_prepare(&g);
    g_run(ctx, &g);
    CK(cudaStreamSynchronize(st));
    g_snapshot(&g, eager);
    g_prepare(&g);
    g_run(ctx, &g);
    CK(cudaStreamSynchronize(st));
    g_compare(&g, eager, "eager calls after a capture");
    g_snapshot_free(&g, eager);
    fa_context_destroy(ctx);
    g_free(&g);
    CK(cudaStreamDestroy(st));
}

/* Holds its stream until *flag is set (a host function: the stream's later work waits). */
static void CUDART_CB hold_stream(void *flag) {
    while (!__atomic_load_n((int *)flag, __ATOMIC_ACQUIRE)) {
    }
}

/* The own buffer across streams: a call on stream B after one on stream A (held back, so its
   kernels have not run) must wait for A's (the fence); without it both would share the
   buffer's split partials and counters at once. Then both results are right. */
static void cuda_own_buffer_streams(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x66656e63);
    cudaStream_t a, b;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    kvset kc, kp;
    kv_init(&kc, 0, &r);
    kv_init(&kp, 1, &r);
    fa_context *ctx = cuda_ctx(a, FA_DEVICE_CHECKS_ASYNC);
    /* the buffer grown for both calls (growing frees memory, which would wait for the held
       stream), its fence on a */
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &kc, 3));
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &kp, 3));
    CK(cudaStreamSynchronize(a));
    kv_restore(&kc);
    kv_restore(&kp);
    int flag = 0;
    CK(cudaLaunchHostFunc(a, hold_stream, &flag));
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &kc, 3));
    assert_int_equal(fa_context_set_stream(ctx, b), FA_OK);
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &kp, 3));
    cudaEvent_t done;
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CK(cudaEventRecord(done, b));
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    const cudaError_t q = cudaEventQuery(done);
    __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(a));
    CK(cudaStreamSynchronize(b));
    if (q != cudaErrorNotReady)
        fail_msg("the call on stream b finished while stream a, which used the buffer before "
                 "it, was held (cudaEventQuery: %s)",
                 cudaGetErrorString(q));
    assert_int_equal(fa_context_check(ctx), FA_OK);
    kv_expect_reference(&kc, "own buffer, stream a");
    kv_expect_reference(&kp, "own buffer, stream b after a");
    CK(cudaEventDestroy(done));
    fa_context_destroy(ctx);
    kv_free(&kc);
    kv_free(&kp);
    CK(cudaStreamDestroy(a));
    CK(cudaStreamDestroy(b));
}

/* Ends a capture that must still be valid, and drops its graph. */
static void end_valid_capture(cudaStream_t st, const char *what) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail_msg("%s: the capture was invalidated (%s)", what, cudaGetErrorString(e));
    }
    CK(cudaGraphDestroy(graph));
}

static void cuda_capture_refusals(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x726566);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    gset g;
    g_init(&g, &r);
    fa_params p = fa_params_default();

    /* the own buffer would have to grow */
    fa_context *ctx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    expect_status(ctx, fa_bwd(ctx, &g.tq, &g.tk, &g.tv, &g.tout, &g.tdout, &g.tlse, &p, &g.tdq,
                              &g.tdk, &g.tdv),
                  FA_ERR_WORKSPACE, "captured", "unwarmed own buffer under capture");
    end_valid_capture(st, "unwarmed own buffer");
    fa_context_destroy(ctx);

    /* what waits for the GPU: the synchronous checks, varlen maxima to compute */
    count_alloc ca = {0};
    ca.device = 1;
    fa_allocator al = allocator_of(&ca);
    fa_context *sctx = cuda_ctx(st, FA_DEVICE_CHECKS_SYNC);
    fa_context *actx = cuda_ctx(st, FA_DEVICE_CHECKS_ASYNC);
    assert_int_equal(fa_context_set_allocator(sctx, &al), FA_OK);
    assert_int_equal(fa_context_set_allocator(actx, &al), FA_OK);
    kv_restore(&g.kp);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    expect_status(sctx, kv_call(sctx, &g.kp, 0), FA_ERR_UNSUPPORTED, "captured",
                  "synchronous checks under capture");
    end_valid_capture(st, "synchronous checks");
    vl_arrays(&g.vl);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    expect_status(sctx, vl_fwd(sctx, &g.vl), FA_ERR_UNSUPPORTED, "captured",
                  "synchronous varlen check under capture");
    g.vl.p.max_seqlen_q = 0;
    expect_status(actx, vl_fwd(actx, &g.vl), FA_ERR_UNSUPPORTED, "max_seqlen",
                  "varlen maxima to compute under capture");
    end_valid_capture(st, "varlen checks");
    /* a context created and destroyed while a stream captures (its error word is host
       memory) */
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    fa_context *mid;
    assert_int_equal(fa_context_create(&mid, FA_BACKEND_CUDA), FA_OK);
    fa_context_destroy(mid);
    end_valid_capture(st, "a context created during a capture");
    if (ca.allocs != ca.releases || ca.mismatched)
        fail_msg("allocator: %d allocs, %d releases, %d mismatched", ca.allocs, ca.releases,
                 ca.mismatched);
    fa_context_destroy(sctx);
    fa_context_destroy(actx);
    g_free(&g);
    CK(cudaStreamDestroy(st));
}

/* ---- (f) fa_context_set_device ---- */

static void cuda_set_device(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x646576);
    int n = 0, cur = -1;
    CK(cudaGetDeviceCount(&n));
    CK(cudaGetDevice(&cur));
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CUDA), FA_OK);
    expect_status(ctx, fa_context_set_device(ctx, n), FA_ERR_DEVICE, "CUDA device", "device n");
    expect_status(ctx, fa_context_set_device(ctx, 1000), FA_ERR_DEVICE, NULL, "device 1000");
    expect_status(ctx, fa_context_set_device(ctx, -2), FA_ERR_INVALID_ARGUMENT, "device = -2",
                  "device -2");
    assert_int_equal(fa_context_set_device(ctx, cur), FA_OK);
    kvset s;
    kv_init(&s, 1, &r);
    FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, 0));
    kv_expect_reference(&s, "fa_context_set_device(current)");
    int after = -1;
    CK(cudaGetDevice(&after));
    assert_int_equal(after, cur);
    if (n >= 2) { /* the call switches to the context's device and back */
        const int other = cur == 0 ? 1 : 0;
        CK(cudaSetDevice(other));
        kv_restore(&s);
        FA_OK_OR_FAIL(ctx, kv_call(ctx, &s, 0));
        CK(cudaGetDevice(&after));
        assert_int_equal(after, other);
        CK(cudaSetDevice(cur));
        kv_expect_reference(&s, "fa_context_set_device(another device than the current)");
        /* -1: the caller's current device, where the tensors are not */
        assert_int_equal(fa_context_set_device(ctx, -1), FA_OK);
        CK(cudaSetDevice(other));
        expect_status(ctx, kv_call(ctx, &s, 0), FA_ERR_DEVICE, "lives on GPU",
                      "tensors on another device");
        CK(cudaSetDevice(cur));
    } else {
        print_message("one GPU: switching between devices is not exercised\n");
    }
    kv_free(&s);
    fa_context_destroy(ctx);
}

#endif /* FA_TEST_CUDA */

int main(int argc, char **argv) {
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (argc > 1 && !cuda && strcmp(argv[1], "cpu") != 0) {
        fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
        return 2;
    }
    printf("[ SEED     ] %llu (set FLASHATTN_TEST_SEED to repeat)\n",
           (unsigned long long)tk_seed());
    if (!cuda) {
        const struct CMUnitTest tests[] = {cmocka_unit_test(cpu_setters),
                                           cmocka_unit_test(cpu_allocator)};
        return _cmocka_run_group_tests("device_cpu", tests, 2, NULL, NULL) != 0;
    }
    fa_context *ctx = NULL;
    int have = fa_context_create(&ctx, FA_BACKEND_CUDA) == FA_OK;
    fa_context_destroy(ctx);
#ifdef FA_TEST_CUDA
    if (have) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(cuda_kvcache_async),     cmocka_unit_test(cuda_varlen_async),
            cmocka_unit_test(cuda_varlen_async_d59),
            cmocka_unit_test(cuda_sync_checks),       cmocka_unit_test(cuda_capture_allocator),
            cmocka_unit_test(cuda_capture_own_buffer), cmocka_unit_test(cuda_capture_own_max),
            cmocka_unit_test(cuda_own_buffer_streams), cmocka_unit_test(cuda_capture_refusals),
            cmocka_unit_test(cuda_set_device),
        };
        return _cmocka_run_group_tests("device_cuda", tests, sizeof tests / sizeof *tests, NULL,
                                       NULL) != 0;
    }
#endif
    printf("no CUDA backend or device here: the GPU run is skipped (%s)\n",
           have ? "test built without CUDA" : "no usable device");
    return 77;
}
