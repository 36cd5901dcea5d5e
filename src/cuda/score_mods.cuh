/*
 * cuda/score_mods.cuh — what the forward kernels (prefill and decode) do to a raw score q.k
 * besides the mask: scale, softcap, ALiBi, all in log2 units so that the softmax is exp2.
 */
#ifndef FA_CUDA_SCORE_MODS_CUH
#define FA_CUDA_SCORE_MODS_CUH

#include <math.h>

#include "kernels.h"

namespace fa {

constexpr float kLog2E = 1.4426950408889634f;

struct ScoreMods {
    int win_left, win_right; /* normalised (rows.h); -1: unbounded */
    float scale_log2;        /* scale * log2(e) */
    float softcap;           /* 0: off */
    float softcap_inv;       /* scale / softcap */
    const float *alibi;      /* NULL: off; slope(b, h) = alibi[b * alibi_sb + h] */
    int64_t alibi_sb;
};

/* The windows arrive normalised (rows.h: -1, or below the longest sequence, which the backend
   holds below 2^30), so they fit an int as they are. */
inline ScoreMods score_mods_of(const fa_problem *p) {
    ScoreMods m;
    m.win_left = (int)p->win_left;
    m.win_right = (int)p->win_right;
    m.scale_log2 = p->scale * kLog2E;
    m.softcap = p->softcap;
    m.softcap_inv = p->softcap > 0.f ? p->scale / p->softcap : 0.f;
    m.alibi = p->alibi;
    m.alibi_sb = p->alibi_sb;
    return m;
}

/* ALiBi slope of (batch b, query head h), pre-multiplied by log2(e); 0 when off. */
__device__ __forceinline__ float alibi_slope_log2(const ScoreMods &m, int b, int h) {
    return m.alibi ? m.alibi[b * m.alibi_sb + h] * kLog2E : 0.f;
}

/* A raw score x of query diagonal c and key column col, in log2 units: softcap or plain
   scale, then the ALiBi bias. (Plain scores skip this: the softmax folds the scale into its
   exponent.) */
__device__ __forceinline__ float score_log2(const ScoreMods &m, float x, float slope_log2, int c,
                                            int col) {
    x = m.softcap > 0.f ? m.softcap * tanhf(x * m.softcap_inv) * kLog2E : x * m.scale_log2;
    return x - slope_log2 * fabsf((float)(c - col));
}

} // namespace fa

#endif
