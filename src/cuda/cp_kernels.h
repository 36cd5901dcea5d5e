/*
 * cuda/cp_kernels.h — the two small kernels of the context-parallel ring (cp_sm80.cu): the
 * LSE merge of a shard's partial output into the fp32 accumulators, and a strided 4-d copy
 * that converts or accumulates (packing K/V, summing dQ/dK/dV in fp32, writing the results).
 */
#ifndef FA_CUDA_CP_KERNELS_H
#define FA_CUDA_CP_KERNELS_H

#include "../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 4-d strided view: element (b, t, h, x) at data[b*sb + t*st + h*sh + x]. */
typedef struct fa_cp_view {
    void *data;
    fa_dtype dtype; /* f32, f16 or bf16 */
    int64_t sb, st, sh;
} fa_cp_view;

/* dst := src (add 0) or dst += src (add 1, dst f32) over [B, T, H, X]; in fp32. */
fa_status fa_cp_copy(const fa_cp_view *dst, const fa_cp_view *src, int64_t B, int64_t T,
                     int64_t H, int64_t X, int add, void *stream, char *msg, size_t len);

/* Rows [q0, q1) of the accumulators acc_o (f32 [B, n, H, D] contiguous) and acc_lse (f32
   [B, H, n] contiguous) take in the partial result part_o (dtype, [B, n, H, D] contiguous)
   and part_lse (f32 [B, H, n] contiguous) by their LSEs; first: the accumulators hold nothing
   yet (they are set). */
fa_status fa_cp_merge(float *acc_o, float *acc_lse, const void *part_o, fa_dtype dtype,
                      const float *part_lse, int64_t B, int64_t n, int64_t H, int64_t D,
                      int64_t q0, int64_t q1, int first, void *stream, char *msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif
