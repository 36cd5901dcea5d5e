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
 * P from the raw products q.k of a warp's MT x NT fragment tiles, in place, for scores without
 * softcap (p_ds below covers softcap):
 *   r0: the warp's first row within the query tile (sL is indexed by it)
 *   i0: the tile's first query row in the sequence; jw: the warp's first key in the sequence
 *   fast: the whole tile is visible and there is no ALiBi (no per-element work)
 * LSE arrives in log2 units, +inf for rows that see no key (and rows past the sequence), so
 * P is 0 there without a test.
 */
template <int MT, int NT>
__device__ __forceinline__ void p_of(float (&sc)[MT][NT][4], const BwdArgs &a, const fa_rows &rk,
                                     const float *sL, int r0, int i0, int jw, int sq, bool fast,
                                     float slope, int lane) {
    const int g = lane >> 2, t4 = lane & 3;
    if (fast) {
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const float l2 = sL[r0 + mi * 16 + g + hr * 8];
#pragma unroll
                for (int ni = 0; ni < NT; ni++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        sc[mi][ni][2 * hr + e] =
                            prob_exp2(sc[mi][ni][2 * hr + e], a.scale_log2, l2);
            }
        return;
    }
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = r0 + mi * 16 + g + hr * 8;
            const float l2 = sL[r];
            const int i = i0 + r, c = i + rk.diag;
            const int lo = fa_rows_lo(rk, i), hi = i < sq ? fa_rows_hi(rk, i) : 0;
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = jw + ni * 8 + 2 * t4 + e;
                    const float x = sc[mi][ni][2 * hr + e] * a.scale - slope * fabsf((float)(c - j));
                    sc[mi][ni][2 * hr + e] =
                        (j >= lo && j < hi) ? prob_exp2(x, kLog2e, l2) : 0.f;
                }
        }
}

/* dS = P (dP - D) in place of dP, from P in sc (no softcap); sD indexed like sL above. With
   `masked` (a tile with a mask edge), dS is exactly 0 where P is: a masked key's Inf or NaN in
   V, or a row's in dO, makes dP Inf or NaN there, and 0 times it would reach dQ and dK. */
template <int MT, int NT>
__device__ __forceinline__ void ds_of(const float (&sc)[MT][NT][4], float (&dp)[MT][NT][4],
                                      const float *sD, int r0, bool masked, int lane) {
    const int g = lane >> 2;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float dd = sD[r0 + mi * 16 + g + hr * 8];
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = sc[mi][ni][2 * hr + e], x = p * (dp[mi][ni][2 * hr + e] - dd);
                    dp[mi][ni][2 * hr + e] = masked && p == 0.f ? 0.f : x;
                }
        }
}

/*
 * P and dS together: on entry sc holds q.k and dp holds dO.v, on exit sc holds P and dp holds
 * dS = P (dP - D) [(1 - tanh^2) with softcap], the gradient with respect to the pre-softcap
 * score scale * q.k. Arguments as for p_of; `fast` applies only without softcap.
 */
template <int MT, int NT>
__device__ __forceinline__ void p_ds(float (&sc)[MT][NT][4], float (&dp)[MT][NT][4],
                                     const BwdArgs &a, const fa_rows &rk, const float *sL,
                                     const float *sD, int r0, int i0, int jw, int sq, bool fast,
                                     float slope, int lane) {
    if (!(a.softcap > 0.f)) {
        p_of(sc, a, rk, sL, r0, i0, jw, sq, fast, slope, lane);
        ds_of(sc, dp, sD, r0, !fast, lane);
        return;
    }
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = r0 + mi * 16 + g + hr * 8;
            const float l2 = sL[r], dd = sD[r];
            const int i = i0 + r, c = i + rk.diag;
            const int lo = fa_rows_lo(rk, i), hi = i < sq ? fa_rows_hi(rk, i) : 0;
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = jw + ni * 8 + 2 * t4 + e;
                    const float th = tanhf(sc[mi][ni][2 * hr + e] * a.softcap_inv);
                    const float x = a.softcap * th - slope * fabsf((float)(c - j));
                    const bool seen = j >= lo && j < hi;
                    const float p = seen ? prob_exp2(x, kLog2e, l2) : 0.f;
                    /* masked: exactly 0, as in ds_of */
                    dp[mi][ni][2 * hr + e] =
                        seen ? p * (dp[mi][ni][2 * hr + e] - dd) * (1.f - th * th) : 0.f;
                    sc[mi][ni][2 * hr + e] = p;
                }
        }
}

} // namespace bwd
} // namespace fa

#endif
