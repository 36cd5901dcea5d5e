/*
 * cuda/merge_sm80.h — the LSE merge kernel's arguments (plain C: the host side fills them for
 * fa_merge_attn, the decode launcher for its splits).
 */
#ifndef FA_CUDA_MERGE_SM80_H
#define FA_CUDA_MERGE_SM80_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parts one launch merges (kernel parameters carry them; 64 x 64 bytes). */
#define FA_CUDA_MERGE_MAX_PARTS 64

typedef struct fa_cuda_merge_part {
    const void *o;            /* element (b, t, h, x) at o[b*sb + t*st + h*sh + x] */
    int64_t sb, st, sh;
    const float *lse;         /* (b, h, t) at lse[b*lse_sb + h*lse_sh + t*lse_st] */
    int64_t lse_sb, lse_sh, lse_st;
} fa_cuda_merge_part;

typedef struct fa_cuda_merge_args {
    int n;
    int64_t batch, seqlen, heads, d;
    void *o;
    int64_t sb, st, sh;
    float *lse; /* NULL: not written */
    int64_t lse_sb, lse_sh, lse_st;
    /* Either n parts listed one by one (fa_merge_attn) ... */
    fa_cuda_merge_part parts[FA_CUDA_MERGE_MAX_PARTS];
    /* ... or, when strided is set, parts[0] describes part 0 and part s lies o_step / lse_step
       elements further (the split-KV decode's partials: no list to read) */
    int strided;
    int64_t o_step, lse_step;
} fa_cuda_merge_args;

/* Queues the merge on stream. part_dtype: of every part (f32, f16, bf16); out_dtype: of o. */
fa_status fa_cuda_merge(const fa_cuda_merge_args *a, fa_dtype part_dtype, fa_dtype out_dtype,
                        void *stream, char *msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif
