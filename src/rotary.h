/*
 * rotary.h — the rotary embedding of fa_fwd_kvcache on host rows (the CPU backend; the CUDA
 * backend has its own kernel, cuda/rotary_sm80.cu, with the same rule).
 *
 * Position pos rotates the first rot_dim columns of a row pairwise by the angles whose cos
 * and sin are row pos of the tables: pair c (c < rot_dim / 2) is (x[2c], x[2c + 1])
 * interleaved (GPT-J) or (x[c], x[c + rot_dim / 2]) not (GPT-NeoX), and
 *     (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos).
 * Each product pair is formed in double and rounded once to fp32, so the rotation adds no
 * error beyond that rounding (the float64 test reference does the same in double).
 */
#ifndef FA_ROTARY_H
#define FA_ROTARY_H

#include "internal.h"

/* Rotates x (fp32, at least rot_dim values) in place as position pos of p's tables. */
static inline void fa_rotary_row(float *x, const fa_problem *p, int64_t pos) {
    const int64_t half = p->rot_dim / 2;
    const char *cr = (const char *)p->rot_cos + (size_t)(pos * p->rot_cos_st) *
                                                    fa_dtype_size(p->rot_dtype);
    const char *sr = (const char *)p->rot_sin + (size_t)(pos * p->rot_sin_st) *
                                                    fa_dtype_size(p->rot_dtype);
    for (int64_t c = 0; c < half; c++) {
        const int64_t i1 = p->rot_interleaved ? 2 * c : c;
        const int64_t i2 = p->rot_interleaved ? 2 * c + 1 : c + half;
        const double co = fa_load(cr, p->rot_dtype, c), si = fa_load(sr, p->rot_dtype, c);
        const double x1 = x[i1], x2 = x[i2];
        x[i1] = (float)(x1 * co - x2 * si);
        x[i2] = (float)(x1 * si + x2 * co);
    }
}

/* The position of query token i of sequence b (FlashAttention-2's rule: per token when the
   call is causal or windowed, else every token at the end of the old cache). */
static inline int64_t fa_rotary_q_pos(const fa_problem *p, int64_t b, int64_t i) {
    return (int64_t)p->kv_seqlens[b] + (p->rot_q_per_token ? i : 0);
}

#endif /* FA_ROTARY_H */
