/*
 * context.c — the small public pieces: status and dtype names, tensor and params
 * constructors, the context and its settings, error messages, the error word and the selection
 * record.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

const char *fa_version(void) {
    return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}

const char *fa_status_string(fa_status st) {
    switch (st) {
    case FA_OK: return "ok";
    case FA_ERR_NULL_POINTER: return "null pointer";
    case FA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERR_SHAPE: return "bad shape";
    case FA_ERR_DTYPE: return "unsupported or mismatched dtype";
    case FA_ERR_STRIDE: return "bad stride";
    case FA_ERR_HEAD_DIM: return "unsupported head dimension";
    case FA_ERR_GQA: return "heads_q is not a multiple of heads_kv";
    case FA_ERR_VARLEN: return "inconsistent varlen sequence lengths";
    case FA_ERR_OVERFLOW: return "size overflow";
    case FA_ERR_DEVICE: return "wrong device";
    case FA_ERR_UNSUPPORTED: return "unsupported by the selected kernel";
    case FA_ERR_NO_BACKEND: return "backend not available";
    case FA_ERR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERR_WORKSPACE: return "workspace too small";
    case FA_ERR_CUDA: return "CUDA error";
    case FA_ERR_INTERNAL: return "internal error";
    case FA_ERR_BUSY: return "context in use by another call";
    }
    return "unknown status";
}

const char *fa_dtype_name(fa_dtype dt) {
    switch (dt) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_F8_E4M3: return "f8e4m3";
    case FA_DTYPE_F8_E5M2: return "f8e5m2";
    case FA_DTYPE_F64: return "f64";
    }
    return "?";
}

size_t fa_dtype_size(fa_dtype dt) {
    switch (dt) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16: return 2;
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_F8_E4M3: return 1;
    case FA_DTYPE_F8_E5M2: return 1;
    case FA_DTYPE_F64: return 8;
    }
    return 0;
}

static fa_tensor contiguous(void *data, fa_dtype dt, fa_device dev, int ndim, const int64_t *shape) {
    fa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.device = dev;
    t.ndim = ndim;
    /* a product past 2^63 saturates (no signed overflow): the call's validation then reports
       FA_ERR_OVERFLOW for the view */
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = s;
        if (__builtin_mul_overflow(s, shape[i], &s)) s = INT64_MAX;
    }
    return t;
}

fa_tensor fa_tensor_bshd(void *data, fa_dtype dt, fa_device dev, int64_t b, int64_t s, int64_t h,
                         int64_t d) {
    int64_t shape[4] = {b, s, h, d};
    return contiguous(data, dt, dev, 4, shape);
}

fa_tensor fa_tensor_3d(void *data, fa_dtype dt, fa_device dev, int64_t d0, int64_t d1, int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    return contiguous(data, dt, dev, 3, shape);
}

fa_tensor fa_tensor_2d(void *data, fa_dtype dt, fa_device dev, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    return contiguous(data, dt, dev, 2, shape);
}

/* ---- errors ---- */

/* Failures of fa_context_create have no context to hold their message. */
static _Thread_local char g_create_err[FA_ERRMSG_LEN];

fa_status fa_fail(fa_context *ctx, fa_status st, const char *fmt, ...) {
    char *buf = ctx ? ctx->err : g_create_err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, FA_ERRMSG_LEN, fmt, ap);
    va_end(ap);
    if (ctx && ctx->log) fprintf(stderr, "flashattn: error: %s: %s\n", fa_status_string(st), buf);
    return st;
}

/* A call refused with FA_ERR_BUSY must not write the context another thread is using, so its
   message is kept per thread, with the context it was about; this thread's next call that
   enters that context forgets it. */
static _Thread_local const fa_context *t_busy_ctx;
static _Thread_local char t_busy_err[FA_ERRMSG_LEN];

const char *fa_last_error(const fa_context *ctx) {
    if (ctx && ctx == t_busy_ctx) return t_busy_err;
    return ctx ? ctx->err : g_create_err;
}

/* A compare-and-swap rather than a lock: the flag detects two threads on one context (the
   header's one-thread rule); waiting would hide the caller's bug and cost every call. */
fa_status fa_ctx_enter(fa_context *ctx, const char *fn) {
    int idle = 0;
    if (!__atomic_compare_exchange_n(&ctx->in_use, &idle, 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED)) {
        t_busy_ctx = ctx;
        snprintf(t_busy_err, sizeof t_busy_err,
                 "%s: the context is in use by a call on another thread (or by a callback of "
                 "its own call); a context serves one thread at a time: give each thread its "
                 "own. Nothing was written.",
                 fn);
        if (ctx->log) fprintf(stderr, "flashattn: error: %s: %s\n", fa_status_string(FA_ERR_BUSY),
                              t_busy_err);
        return FA_ERR_BUSY;
    }
    if (t_busy_ctx == ctx) t_busy_ctx = NULL;
    return FA_OK;
}

void fa_ctx_leave(fa_context *ctx) { __atomic_store_n(&ctx->in_use, 0, __ATOMIC_RELEASE); }

/* ---- context ---- */

static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end;
    long v = strtol(s, &end, 10);
    return (*end == 0 && v >= 0 && v < 1 << 20) ? (int)v : fallback;
}

fa_status fa_context_create(fa_context **out, fa_backend backend) {
    if (!out) return fa_fail(NULL, FA_ERR_NULL_POINTER, "fa_context_create: ctx is NULL");
    *out = NULL;
    g_create_err[0] = 0;
    const fa_backend_ops *ops;
    switch (backend) {
    case FA_BACKEND_AUTO:
    case FA_BACKEND_CPU: ops = &fa_cpu_backend; break;
    case FA_BACKEND_CUDA:
        ops = fa_has_cuda() ? fa_cuda_backend_get() : NULL;
        if (!ops)
            return fa_fail(NULL, FA_ERR_NO_BACKEND, "fa_context_create: %s",
                           fa_cuda_unavailable());
        break;
    default:
        return fa_fail(NULL, FA_ERR_INVALID_ARGUMENT, "fa_context_create: unknown backend %d",
                       (int)backend);
    }
    fa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fa_fail(NULL, FA_ERR_OUT_OF_MEMORY, "fa_context_create: out of memory");
    ctx->backend = backend;
    ctx->ops = ops;
    ctx->threads = env_int("FLASHATTN_NUM_THREADS", 0);
    ctx->log = env_int("FLASHATTN_LOG", 0) != 0;
    ctx->strict = env_int("FLASHATTN_STRICT", 0) != 0;
    ctx->device_checks = env_int("FLASHATTN_DEVICE_CHECKS", 0) != 0 ? FA_DEVICE_CHECKS_SYNC
                                                                     : FA_DEVICE_CHECKS_ASYNC;
    ctx->device = -1;
    if (ops->ctx_init) {
        fa_status st = ops->ctx_init(ctx);
        if (st != FA_OK) {
            free(ctx);
            return st;
        }
    }
    if (t_busy_ctx == ctx) t_busy_ctx = NULL; /* a record about a freed context at this address */
    *out = ctx;
    return FA_OK;
}

void fa_context_destroy(fa_context *ctx) {
    if (!ctx) return;
    if (t_busy_ctx == ctx) t_busy_ctx = NULL;
    if (ctx->ops->fence_free) ctx->ops->fence_free(ctx);
    if (ctx->own_ws) ctx->ops->ws_free(ctx->own_ws, ctx->own_ws_device);
    if (ctx->ops->ctx_free) ctx->ops->ctx_free(ctx);
    free(ctx);
}

/* A setter's public door: ctx required, marked in use (fa_ctx_enter) around `expr`, which
   may then write its message. */
#define GUARDED(fn, expr)                                                                     \
    do {                                                                                      \
        if (!ctx) return fa_fail(NULL, FA_ERR_NULL_POINTER, fn ": ctx is NULL");              \
        fa_status st_ = fa_ctx_enter(ctx, fn);                                                \
        if (st_ != FA_OK) return st_;                                                         \
        ctx->err[0] = 0;                                                                      \
        st_ = (expr);                                                                         \
        fa_ctx_leave(ctx);                                                                    \
        return st_;                                                                           \
    } while (0)

static fa_status ctx_set_threads(fa_context *ctx, int threads) {
    if (threads < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "fa_context_set_threads: threads = %d < 0",
                       threads);
    ctx->threads = threads;
    return FA_OK;
}

fa_status fa_context_set_threads(fa_context *ctx, int threads) {
    GUARDED("fa_context_set_threads", ctx_set_threads(ctx, threads));
}

static fa_status ctx_set_stream(fa_context *ctx, void *stream) {
    /* the own buffer's next use on this stream waits for its last use on the old one (the
       fence), so what that left zero stays known zero */
    ctx->stream = stream;
    return FA_OK;
}

fa_status fa_context_set_stream(fa_context *ctx, void *stream) {
    GUARDED("fa_context_set_stream", ctx_set_stream(ctx, stream));
}

static fa_status ctx_set_algo(fa_context *ctx, fa_algo algo) {
    if (algo != FA_ALGO_AUTO && algo != FA_ALGO_NAIVE && algo != FA_ALGO_PLAIN)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "fa_context_set_algo: unknown algo %d",
                       (int)algo);
    ctx->algo = algo;
    return FA_OK;
}

fa_status fa_context_set_algo(fa_context *ctx, fa_algo algo) {
    GUARDED("fa_context_set_algo", ctx_set_algo(ctx, algo));
}

static fa_status ctx_set_device_checks(fa_context *ctx, int mode) {
    if (mode != FA_DEVICE_CHECKS_ASYNC && mode != FA_DEVICE_CHECKS_SYNC)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "fa_context_set_device_checks: mode = %d, must be FA_DEVICE_CHECKS_ASYNC "
                       "(0) or FA_DEVICE_CHECKS_SYNC (1)",
                       mode);
    ctx->device_checks = mode;
    return FA_OK;
}

fa_status fa_context_set_device_checks(fa_context *ctx, int mode) {
    GUARDED("fa_context_set_device_checks", ctx_set_device_checks(ctx, mode));
}

static fa_status ctx_check(fa_context *ctx) {
    return fa_take_device_error(ctx, "fa_context_check");
}

fa_status fa_context_check(fa_context *ctx) {
    GUARDED("fa_context_check", ctx_check(ctx));
}

static fa_status ctx_set_device(fa_context *ctx, int device) {
    if (device < -1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "fa_context_set_device: device = %d, must be >= 0 (or -1: the caller's "
                       "current device)",
                       device);
    fa_status st = device >= 0 && ctx->ops->set_device ? ctx->ops->set_device(ctx, device) : FA_OK;
    if (st == FA_OK) ctx->device = device;
    return st;
}

fa_status fa_context_set_device(fa_context *ctx, int device) {
    GUARDED("fa_context_set_device", ctx_set_device(ctx, device));
}

/* The first version of fa_allocator ends with `user`; the second adds own_max_bytes. A
   struct_size between two versions' sizes is read as the smaller one. */
#define FA_ALLOCATOR_V1_SIZE (offsetof(fa_allocator, user) + sizeof(void *))
#define FA_ALLOCATOR_V2_SIZE (offsetof(fa_allocator, own_max_bytes) + sizeof(size_t))

static fa_status ctx_set_allocator(fa_context *ctx, const fa_allocator *a) {
    if (!a) {
        memset(&ctx->alloc, 0, sizeof ctx->alloc);
        return FA_OK;
    }
    if (a->struct_size < FA_ALLOCATOR_V1_SIZE)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                       "fa_context_set_allocator: struct_size = %zu, at least %zu expected "
                       "(set it to sizeof(fa_allocator))",
                       a->struct_size, (size_t)FA_ALLOCATOR_V1_SIZE);
    if (!a->alloc || !a->release)
        return fa_fail(ctx, FA_ERR_NULL_POINTER, "fa_context_set_allocator: %s is NULL",
                       a->alloc ? "release" : "alloc");
    memset(&ctx->alloc, 0, sizeof ctx->alloc);
    memcpy(&ctx->alloc, a, a->struct_size >= FA_ALLOCATOR_V2_SIZE ? FA_ALLOCATOR_V2_SIZE
                                                                  : FA_ALLOCATOR_V1_SIZE);
    ctx->alloc.struct_size = sizeof ctx->alloc;
    return FA_OK;
}

fa_status fa_context_set_allocator(fa_context *ctx, const fa_allocator *a) {
    GUARDED("fa_context_set_allocator", ctx_set_allocator(ctx, a));
}

static fa_status ctx_set_strict(fa_context *ctx, int strict) {
    ctx->strict = strict != 0;
    return FA_OK;
}

fa_status fa_context_set_strict(fa_context *ctx, int strict) {
    GUARDED("fa_context_set_strict", ctx_set_strict(ctx, strict));
}

static fa_status ctx_set_workspace(fa_context *ctx, void *ptr, size_t bytes) {
    if (!ptr && bytes)
        return fa_fail(ctx, FA_ERR_NULL_POINTER,
                       "fa_context_set_workspace: ptr is NULL but bytes = %zu", bytes);
    ctx->user_ws = ptr;
    ctx->user_ws_bytes = ptr ? bytes : 0;
    return FA_OK;
}

fa_status fa_context_set_workspace(fa_context *ctx, void *ptr, size_t bytes) {
    GUARDED("fa_context_set_workspace", ctx_set_workspace(ctx, ptr, bytes));
}

const fa_selection *fa_last_selection(const fa_context *ctx) {
    if (ctx && ctx == t_busy_ctx) return NULL; /* this thread's last call was refused */
    return ctx && ctx->has_selection ? &ctx->sel : NULL;
}

void fa_select(fa_context *ctx, const char *backend, const char *op, const char *kernel) {
    memset(&ctx->sel, 0, sizeof ctx->sel);
    snprintf(ctx->sel.backend, sizeof ctx->sel.backend, "%s", backend);
    snprintf(ctx->sel.op, sizeof ctx->sel.op, "%s", op);
    snprintf(ctx->sel.kernel, sizeof ctx->sel.kernel, "%s", kernel);
    ctx->sel.num_splits = 1;
}

/* ---- bad device index arrays ---- */

void fa_bad_index_format(const fa_bad_index *r, char *buf, size_t len) {
    const char *cu = r->array ? "cu_seqlens_k" : "cu_seqlens_q", *t = r->array ? "k" : "q";
    switch ((fa_bad_kind)r->kind) {
    case FA_BAD_SEQLEN_NEGATIVE:
        snprintf(buf, len, "cache->seqlens[%d] = %d is negative", r->i, r->value);
        return;
    case FA_BAD_SEQLEN_ROOM:
        if (r->array) /* paged: the room is the block table's row, pages times page_size */
            snprintf(buf, len,
                     "cache->seqlens[%d] = %d with %d new tokens exceeds the %lld tokens that a "
                     "row of cache->block_table maps (max_pages * page_size): the block table is "
                     "too small",
                     r->i, r->value, r->prev, (long long)r->limit);
        else if (r->prev)
            snprintf(buf, len,
                     "cache->seqlens[%d] = %d with %d new tokens exceeds the cache's capacity of "
                     "%lld tokens",
                     r->i, r->value, r->prev, (long long)r->limit);
        else
            snprintf(buf, len,
                     "cache->seqlens[%d] = %d exceeds the cache's capacity of %lld tokens", r->i,
                     r->value, (long long)r->limit);
        return;
    case FA_BAD_PAGE:
        snprintf(buf, len, "cache->block_table[%d][%d] = %d is outside the pool of %lld pages",
                 r->i, r->j, r->value, (long long)r->limit);
        return;
    case FA_BAD_CU_START: snprintf(buf, len, "%s[0] = %d, must be 0", cu, r->value); return;
    case FA_BAD_CU_DECREASE:
        snprintf(buf, len, "%s[%d] = %d is less than %s[%d] = %d (the array must not decrease)",
                 cu, r->i, r->value, cu, r->i - 1, r->prev);
        return;
    case FA_BAD_CU_PAST:
        snprintf(buf, len, "%s[%d] = %d is past the %lld tokens of %s", cu, r->i, r->value,
                 (long long)r->limit, t);
        return;
    case FA_BAD_CU_LONG:
        snprintf(buf, len, "%s[%d] - %s[%d] = %d - %d exceeds max_seqlen_%s = %lld", cu, r->i, cu,
                 r->i - 1, r->value, r->prev, t, (long long)r->limit);
        return;
    case FA_BAD_CU_END:
        snprintf(buf, len, "%s[batch = %d] = %d but %s holds %lld tokens", cu, r->i, r->value, t,
                 (long long)r->limit);
        return;
    case FA_BAD_LEFTPAD:
        snprintf(buf, len, "cache_leftpad[%d] = %d is outside [0, cache->seqlens[%d] = %lld]",
                 r->i, r->value, r->i, (long long)r->limit);
        return;
    case FA_BAD_NONE: break;
    }
    snprintf(buf, len, "a device index array holds a bad element (record kind %d)", r->kind);
}

/* The device writes the word's fields, then its kind (internal.h): an acquire load of the kind
   orders the reads of the fields after it; the release store that clears it lets the device
   record the next one. */
fa_status fa_take_device_error(fa_context *ctx, const char *fn) {
    fa_bad_index *w = ctx->errw;
    if (!w) return FA_OK;
    const int32_t kind = __atomic_load_n(&w->kind, __ATOMIC_ACQUIRE);
    if (kind == FA_BAD_NONE) return FA_OK;
    const volatile fa_bad_index *v = w;
    fa_bad_index r = {kind, v->array, v->i, v->j, v->value, v->prev, v->limit};
    __atomic_store_n(&w->kind, FA_BAD_NONE, __ATOMIC_RELEASE);
    char what[256];
    fa_bad_index_format(&r, what, sizeof what);
    return fa_fail(ctx, FA_ERR_VARLEN,
                   "%s: %s, found by the kernels of an earlier call on this context "
                   "(FA_DEVICE_CHECKS_ASYNC; that call's outputs are not to be trusted); the "
                   "record is now cleared",
                   fn, what);
}
