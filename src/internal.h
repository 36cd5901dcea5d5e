/*
 * internal.h — what the dispatcher hands a backend, and the helpers every kernel shares.
 *
 * The dispatcher (dispatch.c) validates the public tensors and options once and flattens them
 * into an fa_problem: base pointers, strides in elements, and resolved options (scale set,
 * causal folded into the window). Kernels never look at fa_tensor or fa_params.
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "flashattn.h"
#include "rows.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One strided BSHD/THD operand: element (b, t, h, x) is at data[b*sb + t*st + h*sh + x]. For
   varlen operands sb is 0 and t is the global token index (cu_seqlens[b] + position). */
typedef struct fa_operand {
    void *data;
    int64_t sb, st, sh;
} fa_operand;

typedef struct fa_problem {
    fa_dtype dtype;           /* of q, k, v, o (and do, dq, dk, dv) */
    fa_dtype odtype;          /* of o: dtype, except f32/f16/bf16 for FP8 inputs */
    int64_t batch, heads_q, heads_kv, d;
    int64_t group;            /* heads_q / heads_kv */
    int64_t seqlen_q, seqlen_k; /* BSHD: the lengths; varlen: the maxima */
    const int32_t *cu_q, *cu_k; /* varlen prefix sums (device of the tensors), NULL for BSHD */
    int64_t total_q, total_k;   /* varlen: tokens of the THD tensors; BSHD: 0 */

    /* forward inputs and outputs; backward reads o and writes dq/dk/dv */
    fa_operand q, k, v, o;
    fa_operand dout, dq, dk, dv; /* backward only */
    /* LSE: element (b, h, t) at lse[b*lse_sb + h*lse_sh + t*lse_st]; varlen: lse_sb = 0 and t
       global. NULL when the forward caller did not ask for it. Its dtype is f32, or f64 when
       dtype is f64. */
    void *lse;
    int64_t lse_sb, lse_sh, lse_st;

    float scale;              /* resolved: never 0 */
    int64_t win_left, win_right; /* normalised (fa_check_options, rows.h): causal folded in;
                                    -1 unbounded, else below the longest sequence */
    float softcap;            /* 0: off */
    const float *alibi;       /* NULL: off; slope(b, h) = alibi[b*alibi_sb + h] */
    int64_t alibi_sb;
    /* FP8 descales (NULL: 1), value (b, kv head hk) at [b * descale_sb + hk]; see fa_params */
    const float *q_descale, *k_descale, *v_descale;
    int64_t descale_sb;
    int causal;               /* informational: the caller asked for causal */
    int deterministic;
    /* Dropout on P (fa_fwd, fa_bwd): drop_p 0 is off; the mask rule is dropout.h's, keyed by
       drop_seed and drop_offset as fa_params gave them. */
    float drop_p;
    uint64_t drop_seed, drop_offset;

    /*
     * fa_fwd_kvcache only (kv_seqlens NULL otherwise). k and v are then the cache: for a
     * contiguous cache element (b, t, h) of sequence b's token t; for a paged one element
     * (page, row, h), token t of sequence b being page block_table[b * bt_stride +
     * t / page_size], row t % page_size. seqlen_k is the capacity of one sequence (max_len, or
     * max_pages * page_size): a bound on every total length. Sequence b attends to its
     * kv_seqlens[b] + seqlen_new keys, after k_new/v_new rows (b, 0..seqlen_new-1) were copied
     * into the cache at positions kv_seqlens[b].. (when k_new.data is not NULL). kv_seqlens and
     * block_table live on the tensors' device; the dispatcher has checked their contents
     * (counts within the capacity, page indices within the pool) only for CPU tensors.
     */
    const int32_t *kv_seqlens; /* [batch] tokens in the cache before the append */
    const int32_t *block_table; /* NULL: contiguous cache */
    int64_t bt_stride;        /* int32 elements between block_table rows */
    int64_t max_pages;        /* usable entries per block_table row */
    int64_t page_size;        /* rows per page (paged), 0 for a contiguous cache */
    int64_t num_pages;        /* pages in the pool (paged) */
    fa_operand k_new, v_new;  /* [batch, seqlen_new, heads_kv, d]; data NULL: no append */
    int64_t seqlen_new;       /* 0 when nothing is appended */
    /* Fused rotary embedding (fa_params.rotary_cos/sin; src/rotary.h has the rule): rot_dim 0
       is off, else the rotated columns (even, <= d) and only with an append. cos/sin element
       (pos, c) at rot_cos[pos * rot_cos_st + c] in rot_dtype (q's dtype or f32), rows >= the
       capacity. rot_q_per_token: query token i at kv_seqlens[b] + i (causal or a window), else
       every token at kv_seqlens[b]. */
    const void *rot_cos, *rot_sin;
    int64_t rot_cos_st, rot_sin_st;
    fa_dtype rot_dtype;
    int64_t rot_dim;
    int rot_interleaved, rot_q_per_token;
    /* Left padding (fa_params.cache_leftpad; contiguous caches only): sequence b attends to
       rows kv_leftpad[b] .. kv_seqlens[b] + seqlen_new - 1. NULL: every row from 0. Device of
       the tensors; checked (0 <= leftpad <= seqlens) by the dispatcher for CPU tensors. */
    const int32_t *kv_leftpad;
    int num_splits;           /* the caller's request: 0 = backend heuristic, n >= 1 forces n */
} fa_problem;

/* Total keys of sequence b of a KV-cache problem (host kv_seqlens only). */
static inline int64_t fa_kv_len(const fa_problem *p, int64_t b) {
    return (int64_t)p->kv_seqlens[b] + p->seqlen_new;
}

/*
 * fa_merge_attn: n partial results over disjoint key sets, merged row by row. Rows are
 * (b, t, h) with d values; THD tensors arrive as batch 1, seqlen = total tokens, sb = 0 (and
 * lse_sb = 0), so kernels see one layout.
 */
typedef struct fa_merge_part {
    fa_operand o;             /* partial output, dtype fa_merge_problem.part_dtype */
    const float *lse;         /* element (b, h, t) at lse[b*lse_sb + h*lse_sh + t*lse_st] */
    int64_t lse_sb, lse_sh, lse_st;
} fa_merge_part;

typedef struct fa_merge_problem {
    int n;
    const fa_merge_part *parts; /* host array of n (the tensors they point to: any device) */
    fa_dtype part_dtype;      /* of every partial output */
    fa_dtype dtype;           /* of out */
    int64_t batch, seqlen, heads, d;
    fa_operand o;
    float *lse;               /* NULL: not wanted */
    int64_t lse_sb, lse_sh, lse_st;
} fa_merge_problem;

/* Start (global token index for varlen, 0 for BSHD) and length of sequence b. Host pointers
   only: CPU kernels call this; CUDA kernels read cu_seqlens on the device. */
static inline void fa_seq_bounds(const fa_problem *p, int64_t b, int64_t *q0, int64_t *sq,
                                 int64_t *k0, int64_t *sk) {
    if (p->cu_q) {
        *q0 = p->cu_q[b];
        *sq = p->cu_q[b + 1] - p->cu_q[b];
        *k0 = p->cu_k[b];
        *sk = p->cu_k[b + 1] - p->cu_k[b];
    } else {
        *q0 = 0;
        *sq = p->seqlen_q;
        *k0 = 0;
        *sk = p->seqlen_k;
    }
}

#ifndef __CUDACC__
/* The key run [*lo, *hi) of query row i of a sequence of sq queries and sk keys: rows.h's rule
   (the one every kernel uses) in the CPU kernels' 64-bit form. Empty when *lo >= *hi. */
static inline void fa_row_keys(const fa_problem *p, int64_t i, int64_t sq, int64_t sk, int64_t *lo,
                               int64_t *hi) {
    const fa_rows r = fa_rows_of(sq, sk, p->win_left, p->win_right);
    *lo = fa_rows_lo(r, i);
    *hi = fa_rows_hi(r, i);
}
#endif

static inline int fa_dtype_is_fp8(fa_dtype dt) {
    return dt == FA_DTYPE_F8_E4M3 || dt == FA_DTYPE_F8_E5M2;
}

/* Descale (b, hk) of one of the problem's descale arrays: 1 when it is NULL. */
static inline float fa_descale(const fa_problem *p, const float *ds, int64_t b, int64_t hk) {
    return ds ? ds[b * p->descale_sb + hk] : 1.0f;
}

static inline float fa_alibi_slope(const fa_problem *p, int64_t b, int64_t h) {
    return p->alibi ? p->alibi[b * p->alibi_sb + h] : 0.0f;
}

/* ---- scalar dtype conversions (portable; SIMD kernels have their own) ---- */

static inline float fa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, with overflow to inf and correct subnormals. */
static inline uint16_t fa_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* result is subnormal or zero: add 0.5 and let the FPU round */
        float a;
        memcpy(&a, &ax, 4);
        a += 0.5f;
        uint32_t r;
        memcpy(&r, &a, 4);
        return (uint16_t)(sign | (r - 0x3f000000u));
    }
    uint32_t mant_odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

static inline float fa_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t fa_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan stays a quiet nan */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Load element i of a row of dtype dt as float / store a float into it. */
static inline float fa_load(const void *row, fa_dtype dt, int64_t i) {
    switch (dt) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)row)[i]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)row)[i]);
    case FA_DTYPE_F64: return (float)((const double *)row)[i];
    default: return ((const float *)row)[i];
    }
}

static inline void fa_store(void *row, fa_dtype dt, int64_t i, float x) {
    switch (dt) {
    case FA_DTYPE_F16: ((uint16_t *)row)[i] = fa_f32_to_f16(x); break;
    case FA_DTYPE_BF16: ((uint16_t *)row)[i] = fa_f32_to_bf16(x); break;
    case FA_DTYPE_F64: ((double *)row)[i] = x; break;
    default: ((float *)row)[i] = x; break;
    }
}

/* Address of element (b, t, h, 0) of an operand. */
static inline void *fa_at(const fa_operand *a, fa_dtype dt, int64_t b, int64_t t, int64_t h) {
    return (char *)a->data + (size_t)(b * a->sb + t * a->st + h * a->sh) * fa_dtype_size(dt);
}

/* ---- device index arrays found bad by kernels ---- */

/*
 * One bad element of a device index array (varlen cu_seqlens, a KV cache's seqlens and
 * block_table), as the CUDA kernels report it: into the context's error word (host memory the
 * GPU writes: FA_DEVICE_CHECKS_ASYNC) or into the workspace of a check kernel the host waits
 * for (FA_DEVICE_CHECKS_SYNC). Writers fill the fields first and `kind` last, so a reader that
 * sees kind != 0 sees the whole record.
 */
typedef enum fa_bad_kind {
    FA_BAD_NONE = 0,
    FA_BAD_SEQLEN_NEGATIVE = 1, /* cache->seqlens[i] = value < 0 */
    FA_BAD_SEQLEN_ROOM = 2,     /* cache->seqlens[i] = value, + prev new tokens > limit */
    FA_BAD_PAGE = 3,            /* cache->block_table[i][j] = value outside [0, limit) */
    FA_BAD_CU_START = 4,        /* cu_seqlens[0] = value != 0 */
    FA_BAD_CU_DECREASE = 5,     /* cu_seqlens[i] = value < cu_seqlens[i - 1] = prev */
    FA_BAD_CU_PAST = 6,         /* cu_seqlens[i] = value > limit, the tensor's tokens */
    FA_BAD_CU_LONG = 7,         /* cu_seqlens[i] - cu_seqlens[i - 1] = value - prev > limit */
    FA_BAD_CU_END = 8,          /* cu_seqlens[i = batch] = value != limit, the tensor's tokens */
    FA_BAD_LEFTPAD = 9          /* cache_leftpad[i] = value outside [0, limit = seqlens[i]] */
} fa_bad_kind;

typedef struct fa_bad_index {
    int32_t kind;   /* fa_bad_kind; FA_BAD_NONE: nothing recorded */
    int32_t array;  /* cu_seqlens: 0 for _q, 1 for _k; seqlens past the room: 1 when paged */
    int32_t i, j;   /* the element: sequence (or prefix index) and block_table column */
    int32_t value;  /* what it holds */
    int32_t prev;   /* the element before it (cu_seqlens), or seqlen_new (seqlens) */
    int64_t limit;  /* the bound it breaks */
} fa_bad_index;

/* "cache->block_table[1][7] = 9999 is outside the pool of 512 pages" */
void fa_bad_index_format(const fa_bad_index *r, char *buf, size_t len);

/* ---- the context ---- */

#define FA_ERRMSG_LEN 512

/* Kernel request handed to a backend: the problem plus the context's settings. */
struct fa_backend_ops;

struct fa_context {
    fa_backend backend;
    const struct fa_backend_ops *ops;
    int threads;      /* 0: all cores */
    void *stream;
    fa_algo algo;
    int strict;
    int device_checks; /* FA_DEVICE_CHECKS_ASYNC or _SYNC (fa_context_set_device_checks) */
    int device;       /* fa_context_set_device: -1 the caller's current device */
    int call_device;  /* the device the running call runs on (the backend's enter); 0 on CPU */
    int log;
    void *user_ws;    /* set by fa_context_set_workspace, not owned */
    size_t user_ws_bytes;
    fa_allocator alloc; /* fa_context_set_allocator; alloc.alloc NULL: none */
    void *own_ws;     /* owned, grown on demand */
    size_t own_ws_bytes;
    int own_ws_device; /* the call_device own_ws was allocated on */
    int own_ws_graphed; /* a call on own_ws was captured into a CUDA graph, whose replays write
                           it unseen: no bytes of it are known zero from then on */
    /* CUDA: an event recorded after the last call that used own_ws outside capture, on
       own_ws_stream. A call on another stream waits for it first: kernels of the earlier
       stream may still be using the buffer (and the bytes it left zero stay known zero).
       NULL: none recorded since the buffer was allocated. */
    void *own_ws_fence;
    void *own_ws_stream;
    /* Bytes [ws_zero_off, + ws_zero_bytes) of own_ws that the last call left zero (the CUDA
       decode's split counters and the Hopper forward's tile counter, which their kernels set
       back to zero), so that the next call need not clear them (a memset launch per call:
       decode_sm80.md, v10). Valid for the next call only, and only for the context's
       own memory that no graph uses: fa_call_finish. */
    size_t ws_zero_off, ws_zero_bytes;
    int ws_zero_set;  /* the running call renewed the range */
    /* The error word: where kernels of this context record the first bad index they meet
       (FA_DEVICE_CHECKS_ASYNC). Host memory the device writes (errw), and the address kernels
       use (errw_dev); both NULL where the backend has none (CPU). */
    fa_bad_index *errw;
    void *errw_dev;
    /* CUDA: whether the Hopper forward and backward may run (FLASHATTN_CUDA_SM90=0 turns both
       off, FLASHATTN_CUDA_SM90_FWD=0 and FLASHATTN_CUDA_SM90_BWD=0 one), read once when the
       context is created */
    int sm90_fwd, sm90_bwd;
    /* CPU: whether the amx level takes fp32 (FLASHATTN_CPU_F32_AMX=0: no) and the backward's
       schedule (FLASHATTN_CPU_BWD_SCHEDULE: 0 the choice, 1 one-pass, 2 two-pass), read once
       when the context is created */
    int cpu_f32_amx, cpu_bwd_schedule;
    /* CPU: the FLOPs below which a call runs without a thread team (cpu/team.h;
       FLASHATTN_CPU_SMALL_FLOPS, read when the context is created: tests and the bench set 0
       to force the team path on a small call) */
    double cpu_small_flops;
    int has_selection;
    fa_selection sel;
    char err[FA_ERRMSG_LEN];
    /* 1 while a call runs on the context (fa_ctx_enter/leave): a second call meanwhile is
       refused with FA_ERR_BUSY before it touches anything. Accessed only atomically. */
    int in_use;
};

/* Marks ctx in use for the call fn; FA_ERR_BUSY (ctx untouched: the message goes to this
   thread's record, which fa_last_error(ctx) reads) when another call holds it. Every public
   function that reads or writes a context's state brackets its work with these two. */
fa_status fa_ctx_enter(fa_context *ctx, const char *fn);
void fa_ctx_leave(fa_context *ctx);

/* Returns, and clears, the bad index recorded in ctx's error word as FA_ERR_VARLEN with a
   message for fn; FA_OK when none is recorded. Reads host memory only: no device work. */
fa_status fa_take_device_error(fa_context *ctx, const char *fn);

/*
 * A backend: a small table of entry points (ggml style). Each entry chooses its kernel,
 * fills ctx->sel (kernel name, tiles, threads, reason) and runs it. *_workspace reports the
 * bytes the same call would need without running anything. Problems arrive validated.
 * Entries after `merge` may be NULL where a backend has nothing to do.
 */
typedef struct fa_backend_ops {
    const char *name;
    fa_status (*fwd_workspace)(fa_context *ctx, const fa_problem *p, size_t *bytes);
    fa_status (*fwd)(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes);
    fa_status (*bwd_workspace)(fa_context *ctx, const fa_problem *p, size_t *bytes);
    fa_status (*bwd)(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes);
    /* Memory the context owns for workspaces: host memory for the CPU, device memory of the
       current device for CUDA. ws_alloc returns NULL on failure; ws_free takes the device the
       memory was allocated on (ctx->own_ws_device). */
    void *(*ws_alloc)(size_t bytes);
    void (*ws_free)(void *ptr, int device);
    /* fa_fwd_kvcache (problem with kv_seqlens set) and fa_merge_attn. NULL: the backend has no
       such kernel, and the dispatcher answers FA_ERR_UNSUPPORTED. The kvcache entry appends
       k_new/v_new (if any) and then attends; it records the split count it used in
       ctx->sel.num_splits. merge needs no workspace. */
    fa_status (*fwd_kvcache)(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes);
    fa_status (*fwd_kvcache_workspace)(fa_context *ctx, const fa_problem *p, size_t *bytes);
    fa_status (*merge)(fa_context *ctx, const fa_merge_problem *m);
    /* Per-context state: ctx_init in fa_context_create (the CUDA error word is allocated
       there, never inside a call, which may run under stream capture; failures reported with
       fa_fail(NULL, ...)), ctx_free in fa_context_destroy. */
    fa_status (*ctx_init)(fa_context *ctx);
    void (*ctx_free)(fa_context *ctx);
    /* fa_context_set_device: whether `device` (>= 0) can serve calls. */
    fa_status (*set_device)(fa_context *ctx, int device);
    /* Around the backend entries of every call: enter makes the context's device current
       (setting ctx->call_device) and *saved what leave restores. */
    fa_status (*enter)(fa_context *ctx, const char *fn, int *saved);
    void (*leave)(int saved);
    /* 1 when the context's stream is being captured into a CUDA graph, where nothing may be
       allocated, freed or waited for. */
    int (*capturing)(const fa_context *ctx);
    /* The own buffer's fence (ctx->own_ws_fence): fence_wait orders ctx->stream after it (a
       no-op when the stream is the one it was recorded on), fence_record records it on
       ctx->stream after a call queued its work, fence_free destroys it. NULL on the CPU. */
    fa_status (*fence_wait)(fa_context *ctx, const char *fn);
    fa_status (*fence_record)(fa_context *ctx, const char *fn);
    void (*fence_free)(fa_context *ctx);
} fa_backend_ops;

extern const fa_backend_ops fa_cpu_backend;
/* The CUDA backend's table, or NULL when no device is usable (or the build has no CUDA); then
   fa_cuda_unavailable() says why. */
const fa_backend_ops *fa_cuda_backend_get(void);
const char *fa_cuda_unavailable(void);
/* Kernels of each backend, for fa_kernel_count/fa_kernel_name. */
int fa_cpu_kernel_count(void);
const char *fa_cpu_kernel_name(int i);
int fa_cuda_kernel_count(void);
const char *fa_cuda_kernel_name(int i);

/* Records an error message on ctx (printf-style) and returns st. ctx may be NULL. */
fa_status fa_fail(fa_context *ctx, fa_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Starts a selection record for an op; kernels then fill the rest. */
void fa_select(fa_context *ctx, const char *backend, const char *op, const char *kernel);

/* Resolved worker-thread count for the CPU backend (context setting, else all cores). */
int fa_cpu_threads(const fa_context *ctx);

#ifdef __cplusplus
}
#endif
#endif /* FA_INTERNAL_H */
