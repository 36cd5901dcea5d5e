/*
 * cuda/bwd_sm80_pds.cuh — P and dS from the recomputed scores, on fp32 C fragments, with the
 * forward's exact score semantics (scale, softcap, ALiBi, the [lo, hi) key range per row).
 */
#ifndef FA_CUDA_BWD_SM80_PDS_CUH
#define FA_CUDA_BWD_SM80_PDS_CUH

#include <math.h>

#include "bwd_sm80.cuh"
#include "ptx.cuh"

namespace fa {
namespace bwd {

/*
 * On entry sc holds the raw products q.k and dp holds dO.v of a warp's MT x NT fragment
 * tiles; on exit sc holds P and dp holds dS = P (dP - D) [(1 - tanh^2) with softcap], the
 * gradient with respect to the pre-softcap score scale * q.k.
 *   r0: the warp's first row within the query tile (sL, sD are indexed by it)
 *   i0: the tile's first query row in the sequence; jw: the warp's first key in the sequence
 *   fast: the whole tile is visible and there is neither softcap nor ALiBi
 * LSE arrives in log2 units, +inf for rows that see no key (and rows past the sequence), so
 * P is 0 there without a test.
 */
template <int MT, int NT>
__device__ __forceinline__ void p_ds(float (&sc)[MT][NT][4], float (&dp)[MT][NT][4],
                                     const BwdArgs &a, const RowKeys &rk, const float *sL,
                                     const float *sD, int r0, int i0, int jw, int sq, bool fast,
                                     float slope, int lane) {
    const int g = lane >> 2, t4 = lane & 3;
    if (fast) {
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = r0 + mi * 16 + g + hr * 8;
                const float l2 = sL[r], dd = sD[r];
#pragma unroll
                for (int ni = 0; ni < NT; ni++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float p = fast_exp2(fmaf(sc[mi][ni][2 * hr + e], a.scale_log2, -l2));
                        dp[mi][ni][2 * hr + e] = p * (dp[mi][ni][2 * hr + e] - dd);
                        sc[mi][ni][2 * hr + e] = p;
                    }
            }
        return;
    }
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = r0 + mi * 16 + g + hr * 8;
            const float l2 = sL[r], dd = sD[r];
            const int i = i0 + r, c = i + rk.diag;
            const int lo = rk.lo(i), hi = i < sq ? rk.hi(i) : 0;
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = jw + ni * 8 + 2 * t4 + e;
                    const float raw = sc[mi][ni][2 * hr + e];
                    float x, gc = 1.f;
                    if (a.softcap > 0.f) {
                        const float th = tanhf(raw * a.softcap_inv);
                        x = a.softcap * th;
                        gc = 1.f - th * th;
                    } else {
                        x = raw * a.scale;
                    }
                    x -= slope * fabsf((float)(c - j));
                    const float p = (j >= lo && j < hi) ? fast_exp2(fmaf(x, kLog2e, -l2)) : 0.f;
                    dp[mi][ni][2 * hr + e] = p * (dp[mi][ni][2 * hr + e] - dd) * gc;
                    sc[mi][ni][2 * hr + e] = p;
                }
        }
}

} // namespace bwd
} // namespace fa

#endif
