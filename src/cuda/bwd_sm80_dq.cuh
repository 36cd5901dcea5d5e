/*
 * cuda/bwd_sm80_dq.cuh — dQ for deterministic mode: one block per (query tile, query head,
 * sequence) walks the key tiles its rows can see and recomputes S, P, dP and dS for them (two
 * extra products per tile pair, in exchange for no atomics: the sum over key tiles runs in one
 * fixed order, so results are bit-identical run to run).
 *
 * Each of the 4 warps owns 16 query rows and all BN keys of a tile, so dS leaves the S
 * registers as the A operand of dQ += dS K without touching shared memory (the C-to-A
 * fragment identity of ptx.cuh). K and V tiles are double-buffered: tile n+1 loads during
 * tile n's math.
 *
 * Dropout (DROP): dS = P (Z dP - D), Z the forward's factors regenerated (cpu/bwd_tiled.c).
 */
#ifndef FA_CUDA_BWD_SM80_DQ_CUH
#define FA_CUDA_BWD_SM80_DQ_CUH

#include "bwd_sm80.cuh"
#include "bwd_sm80_pds.cuh"
#include "bwd_sm80_tile.cuh"
#include "masked_specials.cuh"

namespace fa {
namespace bwd {

template <typename T, typename C, bool DROP>
__global__ void __launch_bounds__(C::THREADS) bwd_dq_kernel(const __grid_constant__ BwdArgs a) {
    constexpr int D = C::D, BM = C::BM, BN = C::BN, NT = C::NT, DT = C::DT, LCH = D / 8;
    constexpr int LD = C::LD_D, THREADS = C::THREADS;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t s0 = smem_addr(smem);
    const uint32_t sQ = s0 + (uint32_t)C::OFF_Q, sdO = s0 + (uint32_t)C::OFF_DO;
    const float *sL = (const float *)(smem + C::OFF_L), *sDd = (const float *)(smem + C::OFF_D);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / a.group;
    const Seq s = seq_of(a, b);
    const int i0 = blockIdx.x * BM;
    if (i0 >= s.sq) return;
    const int rows = min(BM, s.sq - i0);
    const fa_rows rk = rows_of(a, s);
    const fa_range kt = fa_range_tiles(fa_rows_union(rk, i0, i0 + rows), BN);

    float acc[1][DT][4];
    zero(acc);

    if (kt.hi > kt.lo) {
        const int nb_first = kt.lo, nb_last = kt.hi - 1;
        const T *qg = (const T *)a.q + s.bq * a.q_sb + (int64_t)(s.q0 + i0) * a.q_st + (int64_t)h * a.q_sh;
        const T *dog = (const T *)a.dout + s.bq * a.do_sb + (int64_t)(s.q0 + i0) * a.do_st +
                       (int64_t)h * a.do_sh;
        const T *kg = (const T *)a.k + s.bk * a.k_sb + (int64_t)s.k0 * a.k_st + (int64_t)hkv * a.k_sh;
        const T *vg = (const T *)a.v + s.bk * a.v_sb + (int64_t)s.k0 * a.v_st + (int64_t)hkv * a.v_sh;
        load_rows<BM, LCH, LD, THREADS>(sQ, qg, a.q_st, rows, a.d, tid);
        load_rows<BM, LCH, LD, THREADS>(sdO, dog, a.do_st, rows, a.d, tid);
        const int64_t w = (int64_t)h * a.ws_rows + ws_row0(a, b, s.q0) + i0;
        load_floats(s0 + (uint32_t)C::OFF_L, a.lse2 + w, BM, tid, 0);
        load_floats(s0 + (uint32_t)C::OFF_D, a.dsum + w, BM, tid, BM / 4);

        auto load_kv = [&](int nb, int buf) {
            const int j0 = nb * BN;
            const uint32_t o = (uint32_t)(buf * C::SZ_KV);
            load_rows<BN, LCH, LD, THREADS>(s0 + (uint32_t)C::OFF_K + o, kg + (int64_t)j0 * a.k_st,
                                             a.k_st, s.sk - j0, a.d, tid);
            load_rows<BN, LCH, LD, THREADS>(s0 + (uint32_t)C::OFF_V + o, vg + (int64_t)j0 * a.v_st,
                                             a.v_st, s.sk - j0, a.d, tid);
            cp_async_commit();
        };
        load_kv(nb_first, 0); /* the group also holds Q, dO, LSE2 and D */

        const bool fancy = a.softcap > 0.f || a.alibi != nullptr;
        const float slope = a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;
        const fa_range every = fa_rows_common(rk, i0, i0 + BM);

        for (int nb = nb_first; nb <= nb_last; nb++) {
            const int buf = (nb - nb_first) & 1;
            cp_async_wait<0>();
            __syncthreads(); /* tile nb visible; every warp is done with tile nb-1's buffer */
            if (nb < nb_last) load_kv(nb + 1, buf ^ 1);
            const uint32_t sKb = s0 + (uint32_t)(C::OFF_K + buf * C::SZ_KV);
            const uint32_t sVb = s0 + (uint32_t)(C::OFF_V + buf * C::SZ_KV);
            const int j0 = nb * BN;

            float sc[1][NT][4], dp[1][NT][4];
            zero(sc);
            zero(dp);
            warp_mma<T, 1, NT, D / 16, LD, false, LD, false>(sc, sQ, warp * 16, 0, sKb, 0, 0, lane);
            warp_mma<T, 1, NT, D / 16, LD, false, LD, false>(dp, sdO, warp * 16, 0, sVb, 0, 0, lane);
            const bool full = i0 + BM <= s.sq && fa_range_holds(every, j0, j0 + BN);
            if constexpr (DROP) { /* the gradient of P is Z o dP */
                uint32_t keep[1][2][(NT + 7) / 8];
                drop_mask<1, NT>(a.drop, (uint32_t)(b * a.heads_q + h),
                                 (uint32_t)(i0 + warp * 16 + g), (uint32_t)j0, lane, keep);
                drop_mul<1, NT>(dp, keep, a.drop.scale);
            }
            p_ds(sc, dp, a, rk, sL, sDd, warp * 16, i0, j0, s.sq, full && !fancy, slope, lane);
            /* an Inf or NaN in K of a key some row cannot see must not reach it through dS K
               (0 times it is NaN): on tiles with a mask edge, those keys' rows are scanned
               (every warp is past S before the vote) and zeroed on a hit; the rows that see it
               keep it through dS (masked_specials.cuh) */
            const int nk = min(BN, s.sk - j0);
            using NfL = NfRows<LD>;
            if (!fa_range_holds(every, j0, j0 + nk) &&
                __syncthreads_or(nf_scan<T, NfL, LCH>(sKb, 0, nk, every.lo - j0, every.hi - j0,
                                                      tid, THREADS))) {
                nf_scan_zero<T, NfL, LCH>(sKb, 0, nk, every.lo - j0, every.hi - j0,
                                          NfMap{rk, 0, 1, true, i0, j0}, NfNoSink{}, tid, THREADS);
                __syncthreads();
            }
            /* dQ += dS K: dS straight from the registers as A fragments */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t af[4];
                af[0] = pack2<T>(dp[0][2 * kk][0], dp[0][2 * kk][1]);
                af[1] = pack2<T>(dp[0][2 * kk][2], dp[0][2 * kk][3]);
                af[2] = pack2<T>(dp[0][2 * kk + 1][0], dp[0][2 * kk + 1][1]);
                af[3] = pack2<T>(dp[0][2 * kk + 1][2], dp[0][2 * kk + 1][3]);
#pragma unroll
                for (int jd = 0; jd < DT / 2; jd++) {
                    uint32_t b0, b1, b2, b3;
                    ld_b_t<LD>(sKb, jd * 16, kk * 16, lane, b0, b1, b2, b3);
                    mma16816<T>(acc[0][2 * jd], af, b0, b1);
                    mma16816<T>(acc[0][2 * jd + 1], af, b2, b3);
                }
            }
        }
    }

    /* dQ = scale * sum dS K, staged as T in the warp's own rows of the Q tile (no other warp
       reads them), then stored in 16-byte chunks */
    __syncwarp();
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = warp * 16 + g + hr * 8;
#pragma unroll
        for (int ni = 0; ni < DT; ni++)
            *(uint32_t *)(smem + C::OFF_Q + elem_off<LD>(r, ni * 8 + 2 * t4)) =
                pack2<T>(acc[0][ni][2 * hr] * a.scale, acc[0][ni][2 * hr + 1] * a.scale);
    }
    __syncwarp();
    T *dqg = (T *)a.dq + s.bq * a.dq_sb + (int64_t)(s.q0 + i0) * a.dq_st + (int64_t)h * a.dq_sh;
    for (int idx = lane; idx < 16 * LCH; idx += 32) {
        const int r = warp * 16 + idx / LCH, c = idx % LCH;
        if (r >= rows || c * 8 >= a.d) continue;
        *(uint4 *)(dqg + (int64_t)r * a.dq_st + c * 8) =
            *(const uint4 *)(smem + C::OFF_Q + chunk_off<LD>(r, c));
    }
}

template <typename T, typename C, bool DROP>
cudaError_t launch_dq(const BwdArgs &a, cudaStream_t st) {
    auto kern = bwd_dq_kernel<T, C, DROP>;
    cudaError_t e = (cudaError_t)fa_cuda_smem_limit((const void *)kern, (int)C::SMEM);
    if (e != cudaSuccess) return e;
    const dim3 grid((a.seqlen_q + C::BM - 1) / C::BM, a.heads_q, a.batch);
    if (grid.x == 0) return cudaSuccess;
    kern<<<grid, C::THREADS, C::SMEM, st>>>(a);
    return cudaGetLastError();
}

} // namespace bwd
} // namespace fa

#endif
