/*
 * cuda/backend.c — the CUDA backend's table (host side, plain C over the CUDA runtime API):
 * which GPUs it serves, the checks the kernels rely on beyond the dispatcher's (dtype, head
 * dim, 16-byte alignment, device memory, sizes that fit the kernels' 32-bit row indices), the
 * device index arrays (checked synchronously, or by the kernels into the context's error
 * word), the context's device, the workspace, the launch and its record.
 *
 * Stream capture: in FA_DEVICE_CHECKS_ASYNC mode nothing a call does here is illegal while
 * the stream is captured into a CUDA graph (cudaStreamCaptureModeGlobal included): launches,
 * cudaMemsetAsync on the stream, and queries that neither allocate nor synchronise
 * (cudaPointerGetAttributes, cudaFuncSetAttribute, cudaGetDevice). What would wait for the GPU
 * (the synchronous checks) fails with FA_ERR_UNSUPPORTED first, and the dispatcher refuses to
 * grow the context's own workspace (FA_ERR_WORKSPACE).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "merge_sm80.h"
#include "pad.h"
#include "pad_kv.h"

/* Bytes at the start of every CUDA workspace for the synchronous checks' answers
   (FA_CUDA_CHECK_BYTES); a varlen call's workspace then holds the sanitised copies of
   cu_seqlens_q and _k (FA_DEVICE_CHECKS_ASYNC), each in a 256-byte aligned slot. */
#define WS_HEAD 256
_Static_assert(WS_HEAD >= FA_CUDA_CHECK_BYTES, "the checks' answers fit the head");

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static size_t cu_copy_bytes(const fa_problem *p) {
    return round256((size_t)(p->batch + 1) * sizeof(int32_t));
}

/* The workspace's head: what comes before the padded operands (pad.h) and then the
   launchers' part (fa_cuda_launch.ws). */
static size_t ws_head(const fa_problem *p) {
    return WS_HEAD + (p->cu_q ? 2 * cu_copy_bytes(p) : 0);
}

/* ---- devices ---- */

typedef struct dev_info {
    int known;
    int cc, sms;
    size_t smem_optin;
    char name[96];
} dev_info;

#define MAX_DEVICES 64
static dev_info g_dev[MAX_DEVICES];
static char g_unavailable[256];

/* Facts of device d (cached per device: attribute queries are not free), or NULL with the
   reason in msg when the backend cannot use it. */
static const dev_info *device_info(int d, char *msg, size_t len) {
    if (d < 0 || d >= MAX_DEVICES) {
        snprintf(msg, len, "CUDA device %d is past the %d this build tracks", d, MAX_DEVICES);
        return NULL;
    }
    dev_info *i = &g_dev[d];
    if (!i->known) {
        struct cudaDeviceProp prop;
        int optin = 0;
        cudaError_t e = cudaGetDeviceProperties(&prop, d);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d);
        if (e != cudaSuccess) {
            cudaGetLastError();
            snprintf(msg, len, "cannot query CUDA device %d: %s", d, cudaGetErrorString(e));
            return NULL;
        }
        i->cc = prop.major * 10 + prop.minor;
        i->sms = prop.multiProcessorCount;
        i->smem_optin = (size_t)optin;
        snprintf(i->name, sizeof i->name, "%.90s", prop.name);
        i->known = 1;
    }
    if (i->cc < 80) {
        snprintf(msg, len, "GPU %d (%s) is sm_%d; the CUDA backend needs sm_80 or newer", d,
                 i->name, i->cc);
        return NULL;
    }
    return i;
}

/* Facts of the current device. */
static const dev_info *current_device(char *msg, size_t len) {
    int d = 0;
    cudaError_t e = cudaGetDevice(&d);
    if (e != cudaSuccess) {
        snprintf(msg, len, "no CUDA device: %s", cudaGetErrorString(e));
        return NULL;
    }
    return device_info(d, msg, len);
}

/* ---- checks ---- */

/* Strides of dimensions of size 1 are never used (frameworks set them freely): only the others
   must keep rows 16-byte aligned. A head dim that is not a multiple of 8 is copied element by
   element into the workspace (pad.h), so its rows need only the 2-byte alignment of the
   dtype. */
static fa_status check_operand(fa_context *ctx, const char *fn, const char *name,
                               const fa_operand *a, int64_t batch, int64_t tokens,
                               int64_t heads, int64_t d) {
    if (!a->data) return FA_OK;
    if (d % 8) {
        if ((uintptr_t)a->data % 2)
            return fa_fail(ctx, FA_ERR_STRIDE,
                           "%s: %s (%p) is not 2-byte aligned, as f16/bf16 elements must be",
                           fn, name, a->data);
        return FA_OK;
    }
    if ((uintptr_t)a->data % 16 || (batch > 1 && a->sb % 8) || (tokens > 1 && a->st % 8) ||
        (heads > 1 && a->sh % 8))
        return fa_fail(ctx, FA_ERR_STRIDE,
                       "%s: %s is not 16-byte aligned (data %p, strides %lld/%lld/%lld): the "
                       "CUDA kernels load rows in 16-byte pieces, so the pointer must be 16-byte "
                       "aligned and every outer stride a multiple of 8 elements",
                       fn, name, a->data, (long long)a->sb, (long long)a->st, (long long)a->sh);
    return FA_OK;
}

/* The pointer must be device (or managed) memory: a host pointer labelled FA_DEVICE_CUDA would
   fault inside a kernel. cudaPointerGetAttributes neither allocates nor synchronises, so it is
   legal while the stream is being captured. */
static fa_status check_device_ptr(fa_context *ctx, const char *fn, const char *name,
                                  const void *ptr) {
    if (!ptr) return FA_OK;
    struct cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error of an unknown pointer */
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%p) is not CUDA memory (%s)", fn, name, ptr,
                       cudaGetErrorString(e));
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%p) is host memory, not device memory", fn,
                       name, ptr);
    int cur = 0;
    cudaGetDevice(&cur);
    if (at.type == cudaMemoryTypeDevice && at.device != cur)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s lives on GPU %d but the current device is %d",
                       fn, name, at.device, cur);
    return FA_OK;
}

#define TRY(x)                                                                                \
    do {                                                                                      \
        fa_status st_ = (x);                                                                  \
        if (st_ != FA_OK) return st_;                                                         \
    } while (0)

/* FP8 inputs: only fa_fwd's sm90 e4m3 kernel takes them (fwd_sm90.cu's f8_refusal has the
   shapes built), with no fallback: anything else is FA_ERR_DTYPE naming why. */
static fa_status check_fp8(fa_context *ctx, const char *fn, const fa_problem *p) {
    const char *name = fa_dtype_name(p->dtype);
    if (strcmp(fn, "fa_fwd") != 0)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: dtype %s: FP8 on CUDA is fa_fwd's only (the sm90 "
                       "kernel)", fn, name);
    const char *why = fa_sm90_fwd_f8_refusal(p);
    if (why)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: dtype %s: FP8 needs the sm90 kernel, which does not "
                       "take %s", fn, name, why);
    if (p->drop_p > 0)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: dtype %s: FP8 needs the sm90 kernel, which has no "
                       "dropout", fn, name);
    /* the copy engine's strides are multiples of 16 bytes: 16 FP8 elements */
    const fa_operand *ops[] = {&p->q, &p->k, &p->v};
    static const char *const names[] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        const fa_operand *a = ops[i];
        if ((uintptr_t)a->data % 16 || (p->batch > 1 && a->sb % 16) || a->st % 16 || a->sh % 16)
            return fa_fail(ctx, FA_ERR_STRIDE,
                           "%s: %s (FP8) is not 16-byte aligned (data %p, strides %lld/%lld/%lld): "
                           "the sm90 kernel's copy engine needs the pointer 16-byte aligned and "
                           "every outer stride a multiple of 16 elements",
                           fn, names[i], a->data, (long long)a->sb, (long long)a->st,
                           (long long)a->sh);
    }
    return FA_OK;
}

/* What every CUDA call needs of its scalars: algorithm, dtype, head dim, 32-bit sizes. */
static fa_status check_problem_scalars(fa_context *ctx, const char *fn, const fa_problem *p) {
    if (ctx->algo != FA_ALGO_AUTO)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "%s: the naive and plain reference algorithms run on the CPU backend only",
                       fn);
    if (p->dtype == FA_DTYPE_F8_E4M3 || p->dtype == FA_DTYPE_F8_E5M2)
        TRY(check_fp8(ctx, fn, p));
    else if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: dtype %s; the CUDA backend takes f16 and bf16", fn,
                       fa_dtype_name(p->dtype));
    /* d not a multiple of 8 runs on zero-padded copies (pad.h) */
    if (p->d < 1 || fa_cuda_kernel_dim(p->d) == 0)
        return fa_fail(ctx, FA_ERR_HEAD_DIM,
                       "%s: head_dim = %lld; the CUDA backend takes head dims 1 to 256", fn,
                       (long long)p->d);
    /* kernels index rows, sequences and grid dimensions with 32-bit integers */
    const int64_t big = (int64_t)1 << 30;
    if (p->seqlen_q >= big || p->seqlen_k >= big || p->total_q >= big || p->total_k >= big)
        return fa_fail(ctx, FA_ERR_OVERFLOW, "%s: sequences of 2^30 tokens or more", fn);
    if (p->heads_q > 65535 || p->batch > 65535)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "%s: heads_q = %lld, batch = %lld; the CUDA grid allows 65535 of each", fn,
                       (long long)p->heads_q, (long long)p->batch);
    return FA_OK;
}

static fa_status check_problem(fa_context *ctx, const char *fn, const fa_problem *p, int bwd) {
    TRY(check_problem_scalars(ctx, fn, p));
    const fa_operand *ops[] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    const char *names[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    int n = bwd ? 8 : 4;
    /* q-like operands (q, out, dout, dq) and k-like ones (k, v, dk, dv) */
    const int klike[] = {0, 1, 1, 0, 0, 0, 1, 1};
    for (int i = 0; i < n; i++) {
        int64_t tokens = p->cu_q ? 2 : klike[i] ? p->seqlen_k : p->seqlen_q;
        int64_t heads = klike[i] ? p->heads_kv : p->heads_q;
        TRY(check_operand(ctx, fn, names[i], ops[i], p->cu_q ? 1 : p->batch, tokens, heads,
                          p->d));
        TRY(check_device_ptr(ctx, fn, names[i], ops[i]->data));
    }
    TRY(check_device_ptr(ctx, fn, "lse", p->lse));
    TRY(check_device_ptr(ctx, fn, "alibi_slopes", p->alibi));
    TRY(check_device_ptr(ctx, fn, "cu_seqlens_q", p->cu_q));
    TRY(check_device_ptr(ctx, fn, "cu_seqlens_k", p->cu_k));
    TRY(check_device_ptr(ctx, fn, "q_descale", p->q_descale));
    TRY(check_device_ptr(ctx, fn, "k_descale", p->k_descale));
    TRY(check_device_ptr(ctx, fn, "v_descale", p->v_descale));
    return FA_OK;
}

/* The launch's device facts, the launchers' part of the workspace (after `head` bytes) and
   the error word. */
static fa_status launch_init(fa_context *ctx, const char *fn, fa_cuda_launch *l, void *ws,
                             size_t ws_bytes, size_t head) {
    memset(l, 0, sizeof *l);
    char msg[256];
    const dev_info *d = current_device(msg, sizeof msg);
    if (!d) return fa_fail(ctx, FA_ERR_NO_BACKEND, "%s: %s", fn, msg);
    l->stream = ctx->stream;
    l->num_sms = d->sms;
    l->cc = d->cc;
    l->smem_optin = d->smem_optin;
    l->ws = ws ? (char *)ws + head : NULL;
    l->ws_bytes = ws_bytes > head ? ws_bytes - head : 0;
    l->err = (fa_bad_index *)ctx->errw_dev;
    return FA_OK;
}

static int cuda_capturing(const fa_context *ctx) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)ctx->stream, &cs) != cudaSuccess) {
        /* the legacy stream while another stream captures: as forbidden as a capture */
        cudaGetLastError();
        return 1;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* What waits for the GPU must not run while the stream is being captured into a graph (it
   would invalidate the capture): fail first, saying what to change. */
static fa_status no_capture(fa_context *ctx, const char *fn, const char *what) {
    if (!cuda_capturing(ctx)) return FA_OK;
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "%s: %s waits for the GPU, which is not allowed while the stream is being "
                   "captured into a CUDA graph",
                   fn, what);
}

/* Varlen: cu_seqlens checked before the launch reads them. With FA_DEVICE_CHECKS_ASYNC and
   both maxima given, the launch reads sanitised copies in the workspace (no synchronisation);
   else a synchronous check, which also settles the launch's maxima. */
static fa_status varlen(fa_context *ctx, const char *fn, fa_problem *p, void *ws) {
    if (!p->cu_q) return FA_OK;
    char msg[256];
    fa_status st;
    if (ctx->device_checks == FA_DEVICE_CHECKS_ASYNC && p->seqlen_q > 0 && p->seqlen_k > 0) {
        int32_t *san_q = (int32_t *)((char *)ws + WS_HEAD);
        int32_t *san_k = (int32_t *)((char *)san_q + cu_copy_bytes(p));
        st = fa_cuda_varlen_sanitize(p, san_q, san_k, (fa_bad_index *)ctx->errw_dev,
                                     ctx->stream, msg, sizeof msg);
        if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, msg);
        p->cu_q = san_q;
        p->cu_k = san_k;
        return FA_OK;
    }
    TRY(no_capture(ctx, fn,
                   ctx->device_checks == FA_DEVICE_CHECKS_SYNC
                       ? "checking cu_seqlens synchronously (FA_DEVICE_CHECKS_SYNC)"
                       : "computing max_seqlen_q/k from cu_seqlens (they are 0; pass them)"));
    int64_t mq, mk;
    st = fa_cuda_varlen_check(p, ws, ctx->stream, &mq, &mk, msg, sizeof msg);
    if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, msg);
    p->seqlen_q = mq;
    p->seqlen_k = mk;
    return FA_OK;
}

/* Whether the sm90 kernels take p: their head dims, and no dropout (they have none; the sm80
   kernels have it and run on sm_90 too, see drop_reason). */
static int sm90_fwd_takes(const fa_problem *p) { return !(p->drop_p > 0) && fa_sm90_fwd_covers(p); }
static int sm90_bwd_takes(const fa_problem *p) { return !(p->drop_p > 0) && fa_sm90_bwd_covers(p); }

static void record(fa_context *ctx, const char *op, const fa_cuda_launch *l, size_t ws) {
    fa_select(ctx, "cuda", op, l->kernel);
    ctx->sel.tile_q = l->tile_q;
    ctx->sel.tile_k = l->tile_k;
    ctx->sel.threads = l->threads;
    ctx->sel.workspace_bytes = ws;
}

/* ---- the table ---- */

/* The problem the kernels see: p itself, or p with d rounded up to 8 (pad.h; only its shapes
   matter here, the buffers are placed by fa_cuda_pad_in). */
static fa_problem kernel_shape(const fa_problem *p) {
    fa_problem k = *p;
    k.d = (p->d + 7) & ~(int64_t)7;
    return k;
}

/* The varlen check's answer and copies, the padded operands, and on sm_90 the persistent
   grid's tile counter. */
static size_t fwd_workspace(const fa_context *ctx, const fa_problem *p) {
    char msg[256];
    const dev_info *d = current_device(msg, sizeof msg);
    const fa_problem k = kernel_shape(p);
    const size_t pad = fa_cuda_pad_bytes(p, 0);
    if (d && d->cc == 90 && ctx->sm90_fwd && sm90_fwd_takes(&k))
        return ws_head(p) + pad + FA_SM90_FWD_WORKSPACE;
    return p->cu_q || pad ? ws_head(p) + pad : 0;
}

static fa_status cuda_fwd_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    TRY(check_problem(ctx, "fa_fwd", p, 0));
    *bytes = fwd_workspace(ctx, p);
    return FA_OK;
}

typedef fa_status (*launch_fn)(const fa_problem *, fa_cuda_launch *);

/* Dropout runs the sm80 kernels on every GPU (the sm90 ones have no dropout, as
   FlashAttention-3's have none): on sm_90 the record says so, so that no one reads an sm80
   time as a Hopper kernel's. The kernel name's "_dropout" suffix says it everywhere. */
static void drop_reason(fa_context *ctx, const fa_cuda_launch *l, const fa_problem *p) {
    if (!(p->drop_p > 0) || l->cc != 90) return;
    const size_t n = strlen(ctx->sel.reason);
    snprintf(ctx->sel.reason + n, sizeof ctx->sel.reason - n, "%sdropout_p > 0: the sm90 "
             "kernels have no dropout, sm80 kernel", n ? "; " : "");
}

/* The Hopper kernel where `hopper` says it has the problem, else the sm80 one. The Hopper
   kernel declining a call (strides, shared memory, a build without sm_90a code, ...) is a
   fallback, recorded in why (an error in strict mode). */
static fa_status run_kernel(fa_context *ctx, const char *fn, int hopper, launch_fn sm90,
                            launch_fn sm80, const fa_problem *p, fa_cuda_launch *l, char *why,
                            size_t why_len) {
    fa_status st = FA_ERR_UNSUPPORTED;
    why[0] = 0;
    if (hopper) {
        st = sm90(p, l);
        if (st == FA_ERR_UNSUPPORTED && ctx->strict)
            return fa_fail(ctx, st, "%s: strict mode: %s", fn, l->msg);
        if (st == FA_ERR_UNSUPPORTED) { /* the record's reason field is shorter than msg */
            const size_t n = strnlen(l->msg, why_len - 1);
            memcpy(why, l->msg, n);
            why[n] = 0;
        }
        else if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, l->msg);
    }
    if (st != FA_OK) {
        st = sm80(p, l);
        if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, l->msg);
    }
    return FA_OK;
}

/* The workspace bytes the context knows zero (internal.h: ws_zero_off), for the launcher. */
static void zero_in(const fa_context *ctx, const void *ws, fa_cuda_launch *l) {
    if (!ctx->ws_zero_bytes) return;
    l->zero = (const char *)ws + ctx->ws_zero_off;
    l->zero_bytes = ctx->ws_zero_bytes;
}

/* What the launch left zero of the workspace, for the context's next call. */
static void zero_out(fa_context *ctx, const void *ws, const fa_cuda_launch *l) {
    if (!l->left_zero) return;
    ctx->ws_zero_off = (size_t)((const char *)l->left_zero - (const char *)ws);
    ctx->ws_zero_bytes = l->left_zero_bytes;
    ctx->ws_zero_set = 1;
}

/* The record of a padded call: the kernel's name (its compiled head dim) with "_pad<d>", and
   the reason saying what was copied, so that the slower path is never silent. */
static void record_pad(fa_context *ctx, const fa_problem *p, const fa_problem *k,
                       const char *why) {
    char name[sizeof ctx->sel.kernel];
    snprintf(name, sizeof name, "%.50s_pad%lld", ctx->sel.kernel, (long long)p->d);
    snprintf(ctx->sel.kernel, sizeof ctx->sel.kernel, "%s", name);
    snprintf(ctx->sel.reason, sizeof ctx->sel.reason,
             "head_dim %lld is not a multiple of 8: operands copied into zero-padded buffers "
             "of %lld columns%s%.100s",
             (long long)p->d, (long long)k->d, why[0] ? "; " : "", why);
}

/* The padded buffers are read by the kernels in 16-byte pieces (cp.async, TMA): a workspace
   the caller handed over must start 16-byte aligned (cudaMalloc's always does). */
static fa_status pad_ws_aligned(fa_context *ctx, const char *fn, const void *ws) {
    if ((uintptr_t)ws % 16 == 0) return FA_OK;
    return fa_fail(ctx, FA_ERR_WORKSPACE,
                   "%s: the workspace (%p) is not 16-byte aligned; a head dim that is not a "
                   "multiple of 8 keeps zero-padded copies of the operands there",
                   fn, ws);
}

/* Padded calls (pad.h): the inputs are copied into the workspace after the head, the kernels
   run on the copies, and the outputs are copied back. The launcher gets no known-zero range
   then: the copies may have overwritten it. */
static fa_status cuda_fwd(fa_context *ctx, const fa_problem *pin, void *ws, size_t ws_bytes) {
    fa_problem p = *pin, k;
    fa_cuda_launch l;
    const int pad = fa_cuda_padded(pin);
    char why[sizeof ctx->sel.reason];
    TRY(launch_init(ctx, "fa_fwd", &l, ws, ws_bytes, ws_head(&p) + fa_cuda_pad_bytes(pin, 0)));
    if (pad) TRY(pad_ws_aligned(ctx, "fa_fwd", ws));
    TRY(varlen(ctx, "fa_fwd", &p, ws));
    if (pad) {
        fa_status st = fa_cuda_pad_in(&p, 0, (char *)ws + ws_head(pin), &k, ctx->stream, l.msg,
                                      sizeof l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "fa_fwd: %s", l.msg);
    } else {
        k = p;
        zero_in(ctx, ws, &l);
    }
    if (k.dtype == FA_DTYPE_F8_E4M3) { /* the sm90 kernel or nothing (check_fp8) */
        if (l.cc != 90 || !ctx->sm90_fwd)
            return fa_fail(ctx, FA_ERR_DTYPE, "fa_fwd: dtype f8e4m3: FP8 needs the sm90 kernel, %s",
                           l.cc != 90 ? "which runs on sm_90 GPUs only"
                                      : "which this context has switched off");
        fa_status st = fa_sm90_fwd(&k, &l);
        if (st == FA_ERR_UNSUPPORTED)
            return fa_fail(ctx, FA_ERR_DTYPE, "fa_fwd: dtype f8e4m3: FP8 needs the sm90 kernel: %s",
                           l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "fa_fwd: %s", l.msg);
        why[0] = 0;
    } else
    TRY(run_kernel(ctx, "fa_fwd", l.cc == 90 && ctx->sm90_fwd && sm90_fwd_takes(&k),
                   fa_sm90_fwd, fa_sm80_fwd, &k, &l, why, sizeof why));
    zero_out(ctx, ws, &l);
    if (pad) {
        fa_status st = fa_cuda_pad_out(&p, &k, 0, ctx->stream, l.msg, sizeof l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "fa_fwd: %s", l.msg);
    }
    record(ctx, "fwd", &l, fwd_workspace(ctx, pin));
    if (pad) record_pad(ctx, pin, &k, why);
    else if (why[0]) snprintf(ctx->sel.reason, sizeof ctx->sel.reason, "%s", why);
    drop_reason(ctx, &l, &p);
    return FA_OK;
}

static fa_status cuda_bwd_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    TRY(check_problem(ctx, "fa_bwd", p, 1));
    fa_cuda_launch l;
    TRY(launch_init(ctx, "fa_bwd", &l, NULL, 0, 0));
    const fa_problem k = kernel_shape(p);
    *bytes = ws_head(p) + fa_cuda_pad_bytes(p, 1) + fa_sm80_bwd_workspace(&k, &l);
    return FA_OK;
}

/* Padded calls as cuda_fwd: q, k, v, out and dout copied in, dq, dk, dv copied back. */
static fa_status cuda_bwd(fa_context *ctx, const fa_problem *pin, void *ws, size_t ws_bytes) {
    fa_problem p = *pin, k;
    fa_cuda_launch l;
    const int pad = fa_cuda_padded(pin);
    const size_t head = ws_head(&p) + fa_cuda_pad_bytes(pin, 1);
    TRY(launch_init(ctx, "fa_bwd", &l, ws, ws_bytes, head));
    if (pad) TRY(pad_ws_aligned(ctx, "fa_bwd", ws));
    TRY(varlen(ctx, "fa_bwd", &p, ws));
    k = kernel_shape(&p);
    size_t need = fa_sm80_bwd_workspace(&k, &l);
    if (need > l.ws_bytes)
        return fa_fail(ctx, FA_ERR_INTERNAL, "fa_bwd: workspace of %zu bytes, kernels need %zu",
                       l.ws_bytes, need);
    if (pad) {
        fa_status st = fa_cuda_pad_in(&p, 1, (char *)ws + ws_head(pin), &k, ctx->stream, l.msg,
                                      sizeof l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "fa_bwd: %s", l.msg);
    }
    char why[sizeof ctx->sel.reason];
    TRY(run_kernel(ctx, "fa_bwd", l.cc == 90 && ctx->sm90_bwd && sm90_bwd_takes(&k),
                   fa_sm90_bwd, fa_sm80_bwd, &k, &l, why, sizeof why));
    if (pad) {
        fa_status st = fa_cuda_pad_out(&p, &k, 1, ctx->stream, l.msg, sizeof l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "fa_bwd: %s", l.msg);
    }
    record(ctx, "bwd", &l, head + need);
    if (pad) record_pad(ctx, pin, &k, why);
    else if (why[0]) snprintf(ctx->sel.reason, sizeof ctx->sel.reason, "%s", why);
    drop_reason(ctx, &l, &p);
    return FA_OK;
}

/* ---- KV cache and merge ---- */

static fa_status check_kvcache(fa_context *ctx, const fa_problem *p) {
    const char *fn = "fa_fwd_kvcache";
    TRY(check_problem_scalars(ctx, fn, p));
    /* d not a multiple of 8 runs on zero-padded copies of the rows the call reads (pad_kv.h),
       in a workspace of batch x capacity padded rows for K and V: a size that does not fit
       the address space is refused here, before any byte count wraps */
    int64_t rows, elems;
    if (p->d % 8 &&
        (__builtin_mul_overflow(p->batch, p->seqlen_k, &rows) ||
         __builtin_mul_overflow(rows, p->heads_kv * ((p->d + 7) & ~(int64_t)7), &elems) ||
         elems > ((int64_t)1 << 58)))
        return fa_fail(ctx, FA_ERR_OVERFLOW,
                       "%s: head_dim = %lld runs on zero-padded copies of the cache, and a copy "
                       "of batch %lld x capacity %lld x heads_kv %lld rows is too large",
                       fn, (long long)p->d, (long long)p->batch, (long long)p->seqlen_k,
                       (long long)p->heads_kv);
    /* the decode kernels have no dropout (FlashAttention-2's KV-cache path has none either:
       inference does not drop); refused before anything runs rather than ignored */
    if (p->drop_p > 0)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "%s: dropout_p = %g: the CUDA KV-cache path has no dropout (fa_fwd and "
                       "fa_bwd have it)",
                       fn, (double)p->drop_p);
    const int64_t cache_outer = p->block_table ? p->num_pages : p->batch;
    const int64_t cache_rows = p->block_table ? p->page_size : p->seqlen_k;
    TRY(check_operand(ctx, fn, "q", &p->q, p->batch, p->seqlen_q, p->heads_q, p->d));
    TRY(check_operand(ctx, fn, "out", &p->o, p->batch, p->seqlen_q, p->heads_q, p->d));
    TRY(check_operand(ctx, fn, "cache->k", &p->k, cache_outer, cache_rows, p->heads_kv, p->d));
    TRY(check_operand(ctx, fn, "cache->v", &p->v, cache_outer, cache_rows, p->heads_kv, p->d));
    TRY(check_operand(ctx, fn, "k_new", &p->k_new, p->batch, p->seqlen_new, p->heads_kv, p->d));
    TRY(check_operand(ctx, fn, "v_new", &p->v_new, p->batch, p->seqlen_new, p->heads_kv, p->d));
    const void *ptrs[] = {p->q.data, p->o.data, p->k.data, p->v.data, p->k_new.data,
                          p->v_new.data, p->lse, p->alibi, p->kv_seqlens, p->block_table,
                          p->rot_cos, p->rot_sin, p->kv_leftpad};
    const char *names[] = {"q", "out", "cache->k", "cache->v", "k_new", "v_new", "lse",
                           "alibi_slopes", "cache->seqlens", "cache->block_table", "rotary_cos",
                           "rotary_sin", "cache_leftpad"};
    for (int i = 0; i < (int)(sizeof ptrs / sizeof *ptrs); i++)
        TRY(check_device_ptr(ctx, fn, names[i], ptrs[i]));
    return FA_OK;
}

static fa_status cuda_fwd_kvcache_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    TRY(check_kvcache(ctx, p));
    fa_cuda_launch l;
    TRY(launch_init(ctx, "fa_fwd_kvcache", &l, NULL, 0, 0));
    const fa_problem k = kernel_shape(p);
    *bytes = WS_HEAD + fa_cuda_pad_kv_bytes(p) + fa_sm80_kvcache_workspace(&k, &l);
    return FA_OK;
}

/* The record of a padded KV-cache call: the kernel that ran (its compiled head dim; a paged
   cache ran as the contiguous copy, "_paged" says the call was paged) with "_pad<d>", and the
   reason saying what was copied. */
static void record_pad_kv(fa_context *ctx, const fa_problem *p, const fa_problem *k) {
    char name[sizeof ctx->sel.kernel];
    snprintf(name, sizeof name, "%.48s%s_pad%lld", ctx->sel.kernel,
             p->block_table ? "_paged" : "", (long long)p->d);
    snprintf(ctx->sel.kernel, sizeof ctx->sel.kernel, "%s", name);
    snprintf(ctx->sel.reason, sizeof ctx->sel.reason,
             "head_dim %lld is not a multiple of 8: q, k_new, v_new and the cache rows read%s "
             "copied into zero-padded buffers of %lld columns; appended rows and out copied back",
             (long long)p->d, p->block_table ? " (gathered through block_table)" : "",
             (long long)k->d);
}

/* seqlens and block_table: FA_DEVICE_CHECKS_SYNC checks them first (one synchronisation);
   else the append and decode kernels report what they meet into the error word. */
static fa_status cuda_fwd_kvcache(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes) {
    const char *fn = "fa_fwd_kvcache";
    fa_cuda_launch l;
    char msg[256];
    const int pad = fa_cuda_padded(p);
    const size_t head = WS_HEAD + fa_cuda_pad_kv_bytes(p);
    TRY(launch_init(ctx, fn, &l, ws, ws_bytes, head));
    if (pad) TRY(pad_ws_aligned(ctx, fn, ws));
    if (ctx->device_checks == FA_DEVICE_CHECKS_SYNC) {
        TRY(no_capture(ctx, fn,
                       "checking seqlens/block_table synchronously (FA_DEVICE_CHECKS_SYNC)"));
        fa_status st = fa_sm80_kvcache_check(p, ws, ctx->stream, msg, sizeof msg);
        if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, msg);
    }
    /* padded: the copies in write only the workspace, the caller's cache and out are written
       by the copies back after the kernels succeeded (nothing of the caller's on an error) */
    fa_problem k = *p;
    if (pad) {
        const fa_problem shape = kernel_shape(p);
        const size_t need = fa_sm80_kvcache_workspace(&shape, &l);
        if (need > l.ws_bytes)
            return fa_fail(ctx, FA_ERR_INTERNAL, "%s: workspace of %zu bytes, kernels need %zu",
                           fn, l.ws_bytes, need);
        fa_status st = fa_cuda_pad_kv_in(p, (char *)ws + WS_HEAD, l.err, &k, ctx->stream, l.msg,
                                         sizeof l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, l.msg);
    } else {
        zero_in(ctx, ws, &l);
    }
    int splits = 1;
    fa_status st = fa_sm80_fwd_kvcache(&k, &l, &splits);
    if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, l.msg);
    zero_out(ctx, ws, &l);
    if (pad) {
        st = fa_cuda_pad_kv_out(p, &k, l.err, ctx->stream, l.msg, sizeof l.msg);
        if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, l.msg);
    }
    record(ctx, "fwd", &l, head + fa_sm80_kvcache_workspace(&k, &l));
    if (pad) record_pad_kv(ctx, p, &k);
    ctx->sel.num_splits = splits;
    return FA_OK;
}

static fa_status cuda_merge(fa_context *ctx, const fa_merge_problem *m) {
    const char *fn = "fa_merge_attn";
    if (m->n > FA_CUDA_MERGE_MAX_PARTS)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: n = %d parts; the CUDA backend merges at most %d",
                       fn, m->n, FA_CUDA_MERGE_MAX_PARTS);
    if (m->dtype == FA_DTYPE_F64 || m->part_dtype == FA_DTYPE_F64 || m->dtype == FA_DTYPE_F8_E4M3 ||
        m->part_dtype == FA_DTYPE_F8_E4M3)
        return fa_fail(ctx, FA_ERR_DTYPE, "%s: the CUDA backend merges f32, f16 and bf16", fn);
    fa_cuda_merge_args a;
    memset(&a, 0, sizeof a);
    a.n = m->n;
    a.batch = m->batch, a.seqlen = m->seqlen, a.heads = m->heads, a.d = m->d;
    a.o = m->o.data, a.sb = m->o.sb, a.st = m->o.st, a.sh = m->o.sh;
    a.lse = m->lse, a.lse_sb = m->lse_sb, a.lse_sh = m->lse_sh, a.lse_st = m->lse_st;
    TRY(check_device_ptr(ctx, fn, "out", m->o.data));
    TRY(check_device_ptr(ctx, fn, "lse", m->lse));
    for (int s = 0; s < m->n; s++) {
        const fa_merge_part *p = &m->parts[s];
        TRY(check_device_ptr(ctx, fn, "out_parts[s]", p->o.data));
        TRY(check_device_ptr(ctx, fn, "lse_parts[s]", p->lse));
        a.parts[s].o = p->o.data;
        a.parts[s].sb = p->o.sb, a.parts[s].st = p->o.st, a.parts[s].sh = p->o.sh;
        a.parts[s].lse = p->lse;
        a.parts[s].lse_sb = p->lse_sb, a.parts[s].lse_sh = p->lse_sh, a.parts[s].lse_st = p->lse_st;
    }
    char msg[200];
    fa_status st = fa_cuda_merge(&a, m->part_dtype, m->dtype, ctx->stream, msg, sizeof msg);
    if (st != FA_OK) return fa_fail(ctx, st, "%s: %s", fn, msg);
    char name[64];
    snprintf(name, sizeof name, "sm80_merge_attn_%s", fa_dtype_name(m->dtype));
    fa_select(ctx, "cuda", "merge", name);
    ctx->sel.threads = 128;
    ctx->sel.num_splits = m->n;
    return FA_OK;
}

static void *cuda_ws_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

/* cudaFree with the memory's device current. */
static void cuda_ws_free(void *p, int device) {
    int cur = -1;
    const int other = cudaGetDevice(&cur) == cudaSuccess && device >= 0 && device != cur &&
                      cudaSetDevice(device) == cudaSuccess;
    cudaFree(p);
    if (other) cudaSetDevice(cur);
    cudaGetLastError();
}

/* The capture mode of this thread: cudaHostAlloc and cudaFreeHost are no stream work, and a
   context created or destroyed while some stream is being captured (a framework creating a
   thread's context lazily) must not invalidate that capture, which the global mode would. */
static enum cudaStreamCaptureMode capture_mode(enum cudaStreamCaptureMode m) {
    cudaThreadExchangeStreamCaptureMode(&m);
    return m;
}

/* The context's error word: mapped (the GPU writes it over the bus, the host reads it without
   a copy or a synchronisation) and portable (every device's context maps it; with unified
   addressing, which every sm_80+ platform has, the device address is the same on all of
   them), allocated here because a call may run under stream capture. */
/* A backend switch: the variable set to "0" turns its kernel off. */
static int env_off(const char *name) {
    const char *e = getenv(name);
    return e && strcmp(e, "0") == 0;
}

static fa_status cuda_ctx_init(fa_context *ctx) {
    /* On sm_90 the Hopper kernels are preferred for the head dims they have;
       FLASHATTN_CUDA_SM90=0 turns both off (the sm80 kernels then run there too, e.g. to test
       them), FLASHATTN_CUDA_SM90_FWD=0 the forward alone, FLASHATTN_CUDA_SM90_BWD=0 the
       backward alone */
    const int sm90 = !env_off("FLASHATTN_CUDA_SM90");
    ctx->sm90_fwd = sm90 && !env_off("FLASHATTN_CUDA_SM90_FWD");
    ctx->sm90_bwd = sm90 && !env_off("FLASHATTN_CUDA_SM90_BWD");
    void *h = NULL, *d = NULL;
    const enum cudaStreamCaptureMode was = capture_mode(cudaStreamCaptureModeRelaxed);
    cudaError_t e = cudaHostAlloc(&h, sizeof(fa_bad_index),
                                  cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(&d, h, 0);
    if (e != cudaSuccess && h) cudaFreeHost(h);
    capture_mode(was);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fa_fail(NULL, e == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_CUDA,
                       "fa_context_create: cannot allocate the context's error word in mapped "
                       "host memory: %s",
                       cudaGetErrorString(e));
    }
    memset(h, 0, sizeof(fa_bad_index));
    ctx->errw = h;
    ctx->errw_dev = d;
    return FA_OK;
}

static void cuda_ctx_free(fa_context *ctx) {
    const enum cudaStreamCaptureMode was = capture_mode(cudaStreamCaptureModeRelaxed);
    if (ctx->errw) cudaFreeHost(ctx->errw);
    capture_mode(was);
    cudaGetLastError();
    ctx->errw = NULL;
    ctx->errw_dev = NULL;
}

static fa_status cuda_set_device(fa_context *ctx, int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fa_fail(ctx, FA_ERR_DEVICE, "fa_context_set_device: no CUDA device: %s",
                       cudaGetErrorString(e));
    }
    if (device >= n)
        return fa_fail(ctx, FA_ERR_DEVICE,
                       "fa_context_set_device: device = %d, but this machine has %d CUDA "
                       "device%s (0..%d)",
                       device, n, n == 1 ? "" : "s", n - 1);
    char msg[256];
    if (!device_info(device, msg, sizeof msg))
        return fa_fail(ctx, FA_ERR_DEVICE, "fa_context_set_device: %s", msg);
    return FA_OK;
}

/* cudaGetDevice reads a thread-local: cheap, so the device is switched only when it differs. */
static fa_status cuda_enter(fa_context *ctx, const char *fn, int *saved) {
    int cur = 0;
    *saved = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && ctx->device >= 0 && ctx->device != cur) {
        e = cudaSetDevice(ctx->device);
        if (e == cudaSuccess) *saved = cur, cur = ctx->device;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: cannot make CUDA device %d current: %s", fn,
                       ctx->device >= 0 ? ctx->device : cur, cudaGetErrorString(e));
    }
    ctx->call_device = cur;
    return FA_OK;
}

static void cuda_leave(int saved) {
    if (saved >= 0) cudaSetDevice(saved);
}

/* The own buffer's fence (internal.h, own_ws_fence). Work of the call is queued on the
   buffer's device, which is current during the call, so the event lives there too. */
static fa_status cuda_fence_wait(fa_context *ctx, const char *fn) {
    if (!ctx->own_ws_fence || ctx->own_ws_stream == ctx->stream) return FA_OK;
    const cudaError_t e = cudaStreamWaitEvent((cudaStream_t)ctx->stream,
                                              (cudaEvent_t)ctx->own_ws_fence, 0);
    if (e == cudaSuccess) return FA_OK;
    cudaGetLastError();
    return fa_fail(ctx, FA_ERR_CUDA,
                   "%s: cannot order the stream after the workspace's last use on another "
                   "stream: %s",
                   fn, cudaGetErrorString(e));
}

static fa_status cuda_fence_record(fa_context *ctx, const char *fn) {
    cudaError_t e = cudaSuccess;
    if (!ctx->own_ws_fence) {
        cudaEvent_t ev = NULL;
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess) ctx->own_ws_fence = ev;
    }
    if (e == cudaSuccess)
        e = cudaEventRecord((cudaEvent_t)ctx->own_ws_fence, (cudaStream_t)ctx->stream);
    if (e == cudaSuccess) {
        ctx->own_ws_stream = ctx->stream;
        return FA_OK;
    }
    cudaGetLastError();
    return fa_fail(ctx, FA_ERR_CUDA, "%s: cannot record the workspace's last use: %s", fn,
                   cudaGetErrorString(e));
}

static void cuda_fence_free(fa_context *ctx) {
    if (!ctx->own_ws_fence) return;
    int cur = -1;
    const int dev = ctx->own_ws_device;
    const int other = cudaGetDevice(&cur) == cudaSuccess && dev >= 0 && dev != cur &&
                      cudaSetDevice(dev) == cudaSuccess;
    cudaEventDestroy((cudaEvent_t)ctx->own_ws_fence);
    if (other) cudaSetDevice(cur);
    cudaGetLastError();
    ctx->own_ws_fence = NULL;
    ctx->own_ws_stream = NULL;
}

static const fa_backend_ops cuda_ops = {
    .name = "cuda",
    .fwd_workspace = cuda_fwd_workspace,
    .fwd = cuda_fwd,
    .bwd_workspace = cuda_bwd_workspace,
    .bwd = cuda_bwd,
    .ws_alloc = cuda_ws_alloc,
    .ws_free = cuda_ws_free,
    .fwd_kvcache = cuda_fwd_kvcache,
    .fwd_kvcache_workspace = cuda_fwd_kvcache_workspace,
    .merge = cuda_merge,
    .ctx_init = cuda_ctx_init,
    .ctx_free = cuda_ctx_free,
    .set_device = cuda_set_device,
    .enter = cuda_enter,
    .leave = cuda_leave,
    .capturing = cuda_capturing,
    .fence_wait = cuda_fence_wait,
    .fence_record = cuda_fence_record,
    .fence_free = cuda_fence_free,
};

int fa_has_cuda(void) { return 1; }

const fa_backend_ops *fa_cuda_backend_get(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(g_unavailable, sizeof g_unavailable, "no usable CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return NULL;
    }
    if (!current_device(g_unavailable, sizeof g_unavailable)) return NULL;
    return &cuda_ops;
}

const char *fa_cuda_unavailable(void) { return g_unavailable; }

/* ---- what `flashattn info` lists: one kernel per op, head dim and dtype, and the merges ---- */

static const int k_dims[] = {32, 64, 96, 128, 192, 256};
static const char *const k_ops[] = {"fwd", "bwd", "fwd_kvcache"};
static const char *const k_dts[] = {"f16", "bf16", "f32"};
#define N_DIMS ((int)(sizeof k_dims / sizeof k_dims[0]))
#define N_OPS ((int)(sizeof k_ops / sizeof k_ops[0]))
#define N_ATTN (N_OPS * N_DIMS * 2)
static const int k_sm90_dims[] = {64, 128, 256};
#define N_SM90 ((int)(sizeof k_sm90_dims / sizeof k_sm90_dims[0]) * 2)
static const int k_sm90_bwd_dims[] = {64, 128, 256};
#define N_SM90_BWD ((int)(sizeof k_sm90_bwd_dims / sizeof k_sm90_bwd_dims[0]) * 2)
static char g_names[N_ATTN + 3 + N_SM90 + N_SM90_BWD][40];

int fa_cuda_kernel_count(void) { return N_ATTN + 3 + N_SM90 + N_SM90_BWD; }

const char *fa_cuda_kernel_name(int i) {
    if (i < 0 || i >= fa_cuda_kernel_count()) return NULL;
    if (!g_names[i][0]) {
        if (i < N_ATTN)
            snprintf(g_names[i], sizeof g_names[i], "sm80_%s_d%d_%s", k_ops[i / (N_DIMS * 2)],
                     k_dims[(i / 2) % N_DIMS], k_dts[i % 2]);
        else if (i < N_ATTN + 3)
            snprintf(g_names[i], sizeof g_names[i], "sm80_merge_attn_%s", k_dts[i - N_ATTN]);
        else if (i < N_ATTN + 3 + N_SM90)
            snprintf(g_names[i], sizeof g_names[i], "sm90_fwd_d%d_%s",
                     k_sm90_dims[(i - N_ATTN - 3) / 2], k_dts[(i - N_ATTN - 3) % 2]);
        else
            snprintf(g_names[i], sizeof g_names[i], "sm90_bwd_d%d_%s",
                     k_sm90_bwd_dims[(i - N_ATTN - 3 - N_SM90) / 2],
                     k_dts[(i - N_ATTN - 3 - N_SM90) % 2]);
    }
    return g_names[i];
}
