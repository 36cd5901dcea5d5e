/*
 * cuda/kernels.h — the contract between the CUDA backend's host side (backend.c, plain C) and
 * its kernel launchers (*.cu). The host side has validated the problem (fa_problem of
 * internal.h: device pointers, strides in elements, resolved options) and checked what every
 * launcher needs: dtype f16/bf16, head dim a multiple of 8 up to 256, 16-byte aligned rows
 * (base pointers and the three outer strides of every operand multiples of 8 elements). Other
 * head dims reach the launchers as zero-padded copies in the workspace (pad.h). A launcher
 * picks its kernel variant, queues it on l->stream and fills the rest of *l.
 */
#ifndef FA_CUDA_KERNELS_H
#define FA_CUDA_KERNELS_H

#include <stddef.h>

#include "../internal.h"
#include "fwd_sm90_force.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa_cuda_launch {
    /* in */
    void *stream;      /* cudaStream_t */
    int num_sms;       /* multiprocessors of the current device */
    int cc;            /* compute capability, major * 10 + minor (80, 86, 89, 90, ...) */
    size_t smem_optin; /* largest dynamic shared memory per block the device allows */
    void *ws;          /* device workspace of at least the size the *_workspace function gave */
    size_t ws_bytes;
    const void *zero;  /* bytes of the workspace known to be zero (NULL: none) ... */
    size_t zero_bytes;
    fa_bad_index *err; /* the context's error word as kernels address it (NULL: none) */
    /* out */
    void *left_zero;   /* bytes of the workspace this call leaves zero (NULL: none): the
                          context then passes them as `zero` to its next call */
    size_t left_zero_bytes;
    char kernel[64];   /* e.g. "sm80_fwd_d128_bf16_causal" */
    int tile_q, tile_k, threads;
    char msg[256];     /* on failure: what went wrong */
} fa_cuda_launch;

/* Whether bytes [p, p + n) of l's workspace are known to be zero (l->zero), so that a launcher
   whose kernel leaves them zero need not clear them again. */
static inline int fa_cuda_ws_zero(const fa_cuda_launch *l, const void *p, size_t n) {
    const char *c = (const char *)p, *z = (const char *)l->zero;
    return z && c >= z && c + n <= z + l->zero_bytes;
}

/* Raises kernel `kern`'s dynamic shared memory limit to `bytes` on the current device (the
   launchers' cudaFuncSetAttribute), once per kernel and device: smem_limit.cu. Returns the
   cudaError_t as an int. */
int fa_cuda_smem_limit(const void *kern, int bytes);

/* Head dims the kernels are compiled for; a call with another d (a multiple of 8) runs the
   next larger one with the extra columns zero-filled on load and not stored. A d that is not
   a multiple of 8 first becomes one (pad.h). */
int fa_cuda_kernel_dim(int64_t d); /* 0 when d > 256 */

/* The mask part of a kernel name: "_causal", "_causal_local" (a causal window), "_local" (any
   other window) or "" (cuda/fwd_sm80.cu). */
const char *fa_cuda_mask_name(const fa_problem *p);

/* Device cu_seqlens (cuda/varlen_check.cu): they start at 0, never decrease, end at the
   tensors' token counts, and no sequence is longer than p->seqlen_q/k where those are > 0.
   The check reads its answer back (FA_DEVICE_CHECKS_SYNC, or maxima to compute): it uses
   FA_CUDA_CHECK_BYTES of ws and synchronises the stream; FA_ERR_VARLEN (with msg) for a bad
   array, else the longest sequences.
   The sanitiser does not wait (FA_DEVICE_CHECKS_ASYNC, maxima given): it writes copies of the
   arrays into san_q/san_k (p->batch + 1 values each) for the kernels to read instead, equal to
   the arrays when they are good and all zero (every sequence empty: nothing is computed or
   written) when not, and reports the first bad element into err. */
#define FA_CUDA_CHECK_BYTES 64
fa_status fa_cuda_varlen_check(const fa_problem *p, void *ws, void *stream, int64_t *max_q,
                               int64_t *max_k, char *msg, size_t msg_len);
fa_status fa_cuda_varlen_sanitize(const fa_problem *p, int32_t *san_q, int32_t *san_k,
                                  fa_bad_index *err, void *stream, char *msg, size_t msg_len);

/* KV-cache attention (cuda/decode_sm80.cu): workspace for the split partials, the device
   check of seqlens/block_table (FA_DEVICE_CHECKS_SYNC: FA_CUDA_CHECK_BYTES of ws; synchronises
   the stream), and the launch of append + decode (+ merge); *splits_used gets the split count.
   The append and decode kernels clamp lengths and page indices, so a bad array never sends
   them outside the cache, and report the first bad element into l->err: a sequence's length,
   the block_table entries of the pages of its keys (the decode, after its main loop), of the
   rows appended (the append, which then skips them). A sequence whose length is bad appends
   nothing. */
size_t fa_sm80_kvcache_workspace(const fa_problem *p, const fa_cuda_launch *l);
fa_status fa_sm80_kvcache_check(const fa_problem *p, void *ws, void *stream, char *msg,
                                size_t len);
fa_status fa_sm80_fwd_kvcache(const fa_problem *p, fa_cuda_launch *l, int *splits_used);

/* Forward (cuda/fwd_sm80.cu). Workspace: none. */
fa_status fa_sm80_fwd(const fa_problem *p, fa_cuda_launch *l);

/* Hopper forward (cuda/fwd_sm90.cu, kernels in fwd_sm90.cuh and fwd_sm90_serial.cuh).
   Workspace: FA_SM90_FWD_WORKSPACE bytes at l->ws (its tile counter, which the kernel leaves
   zero: l->left_zero; without it the persistent grid takes tiles in static order).
   FA_ERR_UNSUPPORTED, with the reason in l->msg and nothing queued, for a problem or GPU it
   does not take. */
fa_status fa_sm90_fwd(const fa_problem *p, fa_cuda_launch *l);
/* Whether the Hopper forward has a kernel for p's head dim (it may still decline p). */
int fa_sm90_fwd_covers(const fa_problem *p);
/* What the sm90 FP8 forward does not take of p (inputs FP8), as "this head dim (...)", or
   NULL: it takes it (given an sm_90 GPU and a build with sm_90a code). */
const char *fa_sm90_fwd_f8_refusal(const fa_problem *p);
/* Workspace bytes the sm90 forward uses (its persistent grid's tile counter). */
#define FA_SM90_FWD_WORKSPACE 256

/* Backward (cuda/bwd_sm80.cu): bytes of device workspace (fp32 dQ accumulator, D = rowsum(dO*O),
   GQA dK/dV accumulators, ...), and the launch of its kernels in order on l->stream. */
size_t fa_sm80_bwd_workspace(const fa_problem *p, const fa_cuda_launch *l);
fa_status fa_sm80_bwd(const fa_problem *p, fa_cuda_launch *l);
/* The same with the Hopper main kernel (cuda/bwd_sm90.cuh) and the same workspace, for the
   head dims fa_sm90_bwd_covers; FA_ERR_UNSUPPORTED, with the reason in l->msg and nothing
   queued, for a problem or GPU it does not take. */
fa_status fa_sm90_bwd(const fa_problem *p, fa_cuda_launch *l);
int fa_sm90_bwd_covers(const fa_problem *p);

#ifdef __cplusplus
}
#endif
#endif
