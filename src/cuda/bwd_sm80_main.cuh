/*
 * cuda/bwd_sm80_main.cuh — the backward's main kernel: one block per (key tile, kv head and
 * query-head split, sequence) owns dK and dV of its BN keys in registers, and walks every
 * (query head of its split, query tile that can see the keys):
 *
 *   S = Q K^T                         (fp32 registers, warp grid SWM x SWN)
 *   P = exp2(S * scale * log2e - LSE * log2e), before dP = dO V^T so that the exponentials
 *   overlap that product (with softcap both products come first: dS needs tanh of S)
 *   dS = P * (dP - D) [* (1 - tanh^2) with softcap]
 *   P, dS -> shared memory (16-bit)   (the next products need them in other warp layouts)
 *   dV += P^T dO, dK += dS^T Q        (warp grid KWN x KWD, accumulators in registers)
 *   dQ(tile) += dS K                  (fp32 red.global.add into the workspace's 8x8-blocked
 *                                      accumulator, no bounds tests; skipped in deterministic
 *                                      mode, where bwd_sm80_dq.cuh computes dQ)
 *
 * Dropout (DROP, a template parameter: the kernels without it are unchanged), with the
 * forward's factors Z regenerated (dropout_sm80.cuh), as cpu/bwd_tiled.c: dS = P (Z dP - D)
 * and dV += (P Z)^T dO; D = rowsum(dO O) stays as it is (sum_j P Z dP = dO . O).
 *
 * Barriers per query tile: one after the loads land (also fences the previous tile's reads of
 * P/dS and of the buffer the next prefetch overwrites), one after P/dS are stored. With DB the
 * next Q/dO/LSE/D tile is in flight during all of this tile's math; without, it loads during
 * the dQ product (a third barrier guards the single buffer).
 */
#ifndef FA_CUDA_BWD_SM80_MAIN_CUH
#define FA_CUDA_BWD_SM80_MAIN_CUH

#include <math.h>

#include "bwd_sm80.cuh"
#include "bwd_sm80_pds.cuh"
#include "bwd_sm80_tile.cuh"
#include "masked_specials.cuh"

namespace fa {
namespace bwd {

template <typename T, typename C, bool DQ_ATOMIC, bool DROP>
__global__ void __launch_bounds__(C::THREADS, 1) bwd_main_kernel(const __grid_constant__ BwdArgs a) {
    constexpr int D = C::D, BM = C::BM, BN = C::BN, LCH = D / 8;
    constexpr int LD_D = C::LD_D, LD_N = C::LD_N, THREADS = C::THREADS;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t s0 = smem_addr(smem);
    const uint32_t sK = s0 + (uint32_t)C::OFF_K, sV = s0 + (uint32_t)C::OFF_V;
    const uint32_t sP = s0 + (uint32_t)C::OFF_P, sdS = s0 + (uint32_t)C::OFF_DS;
    /* masked specials (masked_specials.cuh): dV's table, the word "K was zeroed" */
    const uint32_t sNfV = s0 + (uint32_t)C::OFF_NF, sNfK = s0 + (uint32_t)C::OFF_NFK;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int kb = blockIdx.x, split = blockIdx.y % a.nsplit, hkv = blockIdx.y / a.nsplit;
    const int b = blockIdx.z;
    const Seq s = seq_of(a, b);
    const int j0 = kb * BN;
    if (j0 >= s.sk) return; /* varlen: this sequence has fewer keys */
    const int nk = min(BN, s.sk - j0);
    const fa_rows rk = rows_of(a, s);

    /* the query tiles of the rows that see a key of [j0, j0 + nk) */
    const fa_range mt = fa_range_tiles(fa_rows_seeing(rk, j0, j0 + nk), BM);
    const int m_first = mt.lo, nmb = mt.hi - mt.lo;
    const int h_begin = hkv * a.group + split * a.heads_per_split;
    const int h_end = min(h_begin + a.heads_per_split, (hkv + 1) * a.group);
    const int niter = h_end > h_begin ? (h_end - h_begin) * nmb : 0;

    const int64_t wrow0 = ws_row0(a, b, s.q0);

    float dk[C::K_MT][C::K_NT][4], dv[C::K_MT][C::K_NT][4];
    zero(dk);
    zero(dv);

    /* warp coordinates in the three warp grids */
    const int wm_s = warp / C::SWN, wn_s = warp % C::SWN;
    const int wn_k = warp / C::KWD, wd_k = warp % C::KWD;
    const int wm_q = warp / C::QWD, wd_q = warp % C::QWD;

    if (niter > 0) {
        const T *kg = (const T *)a.k + s.bk * a.k_sb + (int64_t)(s.k0 + j0) * a.k_st +
                      (int64_t)hkv * a.k_sh;
        const T *vg = (const T *)a.v + s.bk * a.v_sb + (int64_t)(s.k0 + j0) * a.v_st +
                      (int64_t)hkv * a.v_sh;
        load_rows<BN, LCH, LD_D, THREADS>(sK, kg, a.k_st, nk, a.d, tid);
        load_rows<BN, LCH, LD_D, THREADS>(sV, vg, a.v_st, nk, a.d, tid);

        /* Q, dO, LSE2 and D of (query head h, tile rows i0..) into buffer `buf`, as one
           cp.async group. */
        auto load_q = [&](int h, int i0, int buf) {
            const T *qg = (const T *)a.q + s.bq * a.q_sb + (int64_t)(s.q0 + i0) * a.q_st +
                          (int64_t)h * a.q_sh;
            const T *dog = (const T *)a.dout + s.bq * a.do_sb + (int64_t)(s.q0 + i0) * a.do_st +
                           (int64_t)h * a.do_sh;
            const uint32_t qo = (uint32_t)(buf * C::SZ_Q);
            load_rows<BM, LCH, LD_D, THREADS>(s0 + (uint32_t)C::OFF_Q + qo, qg, a.q_st,
                                               s.sq - i0, a.d, tid);
            load_rows<BM, LCH, LD_D, THREADS>(s0 + (uint32_t)C::OFF_DO + qo, dog, a.do_st,
                                               s.sq - i0, a.d, tid);
            const int64_t w = (int64_t)h * a.ws_rows + wrow0 + i0;
            load_floats(s0 + (uint32_t)(C::OFF_L + buf * BM * 4), a.lse2 + w, BM, tid, 0);
            load_floats(s0 + (uint32_t)(C::OFF_D + buf * BM * 4), a.dsum + w, BM, tid, BM / 4);
            cp_async_commit();
        };
        /* iteration `it` visits query head h, tile mb (loop-carried: no division per tile) */
        int h = h_begin, mb = 0;
        load_q(h, m_first * BM, 0); /* the group also holds K and V */
        /* and the two words after it: sNfK, and sNfK + 4 "K holds an Inf or NaN" */
        nf_table_clear(sNfV, NfTable<BN, D>::WORDS + 2, tid, THREADS);

        const bool fancy = a.softcap > 0.f || a.alibi != nullptr;
        /* This thread's slot in a query tile of the dQ accumulator, whose 8x8 blocks of 64
           floats make each red.v2 of a C fragment tile one 256-byte run (bwd_sm80.cu). The
           other fragment tiles sit at compile-time offsets from it. */
        const int dq_slot = wm_q * C::QTM * D + wd_q * C::QTN * 8 + 2 * lane;

        for (int it = 0; it < niter; it++) {
            const int buf = C::DB ? (it & 1) : 0;
            const int i0 = (m_first + mb) * BM;
            const bool last_mb = mb + 1 == nmb;
            const int h_next = last_mb ? h + 1 : h, i0_next = last_mb ? m_first * BM : i0 + BM;
            cp_async_wait<0>();
            /* tile `it` visible to all; every warp is done with tile it-1 (P, dS, and the
               buffer the prefetch below overwrites) */
            __syncthreads();
            if (C::DB && it + 1 < niter) load_q(h_next, i0_next, buf ^ 1);

            const uint32_t sQb = s0 + (uint32_t)(C::OFF_Q + buf * C::SZ_Q);
            const uint32_t sdOb = s0 + (uint32_t)(C::OFF_DO + buf * C::SZ_Q);
            const float *sL = (const float *)(smem + C::OFF_L) + buf * BM;
            const float *sDd = (const float *)(smem + C::OFF_D) + buf * BM;

            const bool full =
                i0 + BM <= s.sq && fa_range_holds(fa_rows_common(rk, i0, i0 + BM), j0, j0 + BN);
            const float slope = a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;
#pragma unroll
            for (int sl = 0; sl < C::SSPLIT; sl++) {
                const int n0 = wn_s * C::STN + sl * C::S_NTS * 8; /* slice's first key */

                /* P or dS (at byte offset OFF) to shared memory, [query][key] */
                auto store = [&](const float (&x)[C::S_MT][C::S_NTS][4], size_t OFF) {
#pragma unroll
                    for (int mi = 0; mi < C::S_MT; mi++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const int r = wm_s * C::STM + mi * 16 + g + hr * 8;
#pragma unroll
                            for (int ni = 0; ni < C::S_NTS; ni++)
                                *(uint32_t *)(smem + OFF + elem_off<LD_N>(r, n0 + ni * 8 + 2 * t4)) =
                                    pack2<T>(x[mi][ni][2 * hr], x[mi][ni][2 * hr + 1]);
                        }
                };

                /* S = Q K^T, then dP = dO V^T */
                float sc[C::S_MT][C::S_NTS][4], dp[C::S_MT][C::S_NTS][4];
                zero(sc);
                zero(dp);
                warp_mma<T, C::S_MT, C::S_NTS, D / 16, LD_D, false, LD_D, false>(
                    sc, sQb, wm_s * C::STM, 0, sK, n0, 0, lane);
                uint32_t keep[DROP ? C::S_MT : 1][2][(C::S_NTS + 7) / 8];
                if constexpr (DROP) {
                    /* Z o dP, then dS; P leaves as P Z for dV (dS took P itself). The
                       product dO V^T comes first here: P must wait for dS. */
                    drop_mask<C::S_MT, C::S_NTS>(a.drop, (uint32_t)(b * a.heads_q + h),
                                                 (uint32_t)(i0 + wm_s * C::STM + g),
                                                 (uint32_t)(j0 + n0), lane, keep);
                    warp_mma<T, C::S_MT, C::S_NTS, D / 16, LD_D, false, LD_D, false>(
                        dp, sdOb, wm_s * C::STM, 0, sV, n0, 0, lane);
                    drop_mul<C::S_MT, C::S_NTS>(dp, keep, a.drop.scale);
                    p_ds(sc, dp, a, rk, sL, sDd, wm_s * C::STM, i0, j0 + n0, s.sq,
                         full && !fancy, slope, lane);
                    drop_mul<C::S_MT, C::S_NTS>(sc, keep, a.drop.scale);
                    store(sc, C::OFF_P);
                } else if (!(a.softcap > 0.f)) {
                    /* P before the dP product, so that the exponentials overlap it */
                    p_of(sc, a, rk, sL, wm_s * C::STM, i0, j0 + n0, s.sq, full && !fancy, slope,
                         lane);
                    store(sc, C::OFF_P);
                    warp_mma<T, C::S_MT, C::S_NTS, D / 16, LD_D, false, LD_D, false>(
                        dp, sdOb, wm_s * C::STM, 0, sV, n0, 0, lane);
                    if (full) /* two instances: the full tiles' has no select */
                        ds_of(sc, dp, sDd, wm_s * C::STM, false, lane);
                    else
                        ds_of(sc, dp, sDd, wm_s * C::STM, true, lane);
                } else {
                    /* softcap: dS needs tanh of the raw score, so both products come first */
                    warp_mma<T, C::S_MT, C::S_NTS, D / 16, LD_D, false, LD_D, false>(
                        dp, sdOb, wm_s * C::STM, 0, sV, n0, 0, lane);
                    p_ds(sc, dp, a, rk, sL, sDd, wm_s * C::STM, i0, j0 + n0, s.sq, false, slope,
                         lane);
                    store(sc, C::OFF_P);
                }
                store(dp, C::OFF_DS);
            }
            /* An Inf or NaN in Q or dO of a row, or in K of a key, that the other side of a
               masked pair cannot see must not reach it through the products below (0 times it
               is NaN). Such a row has a non-finite LSE (its scores are Inf or NaN) or D
               (rowsum dO O), so on tiles with a mask edge those rows' LSE and D are checked,
               and K once, on the first tile; a hit (the vote takes the place of the barrier)
               zeroes the specials of the rows some pair cannot see (masked_specials.cuh).
               Pairs that see each other keep them through P and dS (from S and dP), except
               dV's terms of dO, which go to the dV table. K, kept for the next tiles, is
               restored after the dQ product. */
            const int nq = min(BM, s.sq - i0);
            using NfL = NfRows<LD_D>;
            auto qall = [&] { return fa_rows_seeing_all(rk, j0, j0 + nk); };
            auto kall = [&] { return fa_rows_common(rk, i0, i0 + nq); };
            bool hit = false, nf = false;
            if (DQ_ATOMIC && it == 0 && nf_scan<T, NfL, LCH>(sK, 0, nk, 0, 0, tid, THREADS)) {
                asm volatile("st.shared.u32 [%0], 1;\n" ::"r"(sNfK + 4)); /* for the tiles after */
                hit = true;
            }
            if (full) {
                __syncthreads(); /* P, dS complete */
            } else {
                const fa_range q = qall();
                for (int r = tid; r < nq; r += THREADS)
                    if ((i0 + r < q.lo || i0 + r >= q.hi) &&
                        !(nf_finite(sL[r]) && nf_finite(sDd[r])))
                        hit = true;
                if (DQ_ATOMIC) {
                    uint32_t kbad;
                    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(kbad) : "r"(sNfK + 4));
                    hit |= kbad != 0;
                }
                nf = __syncthreads_or(hit); /* P, dS complete */
            }
            if (nf) {
                const fa_range q = qall(), k = kall();
                const NfMap m{rk, 0, 1, false, j0, i0};
                nf_scan_zero<T, NfL, LCH>(sQb, 0, nq, q.lo - i0, q.hi - i0, m, NfNoSink{}, tid,
                                          THREADS);
                nf_scan_zero<T, NfL, LCH>(sdOb, 0, nq, q.lo - i0, q.hi - i0, m,
                                          NfTableSink{sNfV, BN, D}, tid, THREADS);
                if (DQ_ATOMIC)
                    nf_scan_zero<T, NfL, LCH>(sK, 0, nk, k.lo - j0, k.hi - j0,
                                              NfMap{rk, 0, 1, true, i0, j0}, NfFlagSink{sNfK},
                                              tid, THREADS);
                __syncthreads();
            }

            /* dV += P^T dO, dK += dS^T Q */
            warp_mma<T, C::K_MT, C::K_NT, BM / 16, LD_N, true, LD_D, true>(
                dv, sP, wn_k * C::KTM, 0, sdOb, wd_k * C::KTN, 0, lane);
            warp_mma<T, C::K_MT, C::K_NT, BM / 16, LD_N, true, LD_D, true>(
                dk, sdS, wn_k * C::KTM, 0, sQb, wd_k * C::KTN, 0, lane);
            if (!C::DB) {
                __syncthreads(); /* every warp is done with the single Q/dO/LSE/D buffer */
                if (it + 1 < niter) load_q(h_next, i0_next, 0);
            }

            if (DQ_ATOMIC) {
                /* dQ(tile) += dS K, added to the fp32 accumulator. Rows past the sequence and
                   columns past d add exact zeros (their Q, dO, K columns were zero-filled and
                   their LSE is +inf) into the workspace's padding, so no lane tests bounds. */
                float *dqt = a.dq_acc + ((int64_t)h * a.ws_rows + wrow0 + i0) * D + dq_slot;
#pragma unroll
                for (int pass = 0; pass < C::Q_NT / C::QPN; pass++) {
                    const int n0 = wd_q * C::QTN + pass * C::QPN * 8;
                    if (n0 >= a.d) break;
                    float acc[C::Q_MT][C::QPN][4];
                    zero(acc);
                    warp_mma<T, C::Q_MT, C::QPN, BN / 16, LD_N, false, LD_D, true>(
                        acc, sdS, wm_q * C::QTM, 0, sK, n0, 0, lane);
#pragma unroll
                    for (int mi = 0; mi < C::Q_MT; mi++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++)
#pragma unroll
                            for (int ni = 0; ni < C::QPN; ni++)
                                red_add2(dqt + (mi * 16 + hr * 8) * D + (pass * C::QPN + ni) * 64,
                                         acc[mi][ni][2 * hr], acc[mi][ni][2 * hr + 1]);
                }
            }
            if (DQ_ATOMIC && nf)
                nf_restore<T, NfL, LCH>(sK, kg, a.k_st, nk, a.d, sNfK, tid, THREADS);
            h = h_next;
            mb = last_mb ? 0 : mb + 1;
        }
    }

    if (niter > 0) nf_table_apply<D>(dv, sNfV, wn_k * C::KTM, wd_k * C::KTN, lane);

    /* dK = scale * sum dS^T Q (Q was not scaled on load) */
#pragma unroll
    for (int mi = 0; mi < C::K_MT; mi++)
#pragma unroll
        for (int ni = 0; ni < C::K_NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[mi][ni][e] *= a.scale;

    if (a.nsplit == 1) {
        /* Stage dK, dV as T in the K and V tiles, then store whole 16-byte chunks. */
        __syncthreads(); /* every warp is done reading K (dQ product) and V */
#pragma unroll
        for (int mi = 0; mi < C::K_MT; mi++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = wn_k * C::KTM + mi * 16 + g + hr * 8;
#pragma unroll
                for (int ni = 0; ni < C::K_NT; ni++) {
                    const uint32_t off = elem_off<LD_D>(r, wd_k * C::KTN + ni * 8 + 2 * t4);
                    *(uint32_t *)(smem + C::OFF_K + off) =
                        pack2<T>(dk[mi][ni][2 * hr], dk[mi][ni][2 * hr + 1]);
                    *(uint32_t *)(smem + C::OFF_V + off) =
                        pack2<T>(dv[mi][ni][2 * hr], dv[mi][ni][2 * hr + 1]);
                }
            }
        __syncthreads();
        T *dkg = (T *)a.dk + s.bk * a.dk_sb + (int64_t)(s.k0 + j0) * a.dk_st + (int64_t)hkv * a.dk_sh;
        T *dvg = (T *)a.dv + s.bk * a.dv_sb + (int64_t)(s.k0 + j0) * a.dv_st + (int64_t)hkv * a.dv_sh;
        for (int idx = tid; idx < nk * LCH; idx += THREADS) {
            const int r = idx / LCH, c = idx % LCH;
            if (c * 8 >= a.d) continue;
            const uint32_t off = chunk_off<LD_D>(r, c);
            *(uint4 *)(dkg + (int64_t)r * a.dk_st + c * 8) = *(const uint4 *)(smem + C::OFF_K + off);
            *(uint4 *)(dvg + (int64_t)r * a.dv_st + c * 8) = *(const uint4 *)(smem + C::OFF_V + off);
        }
    } else {
        /* fp32 partials of this split; bwd_sm80_aux.cu sums the splits in order */
        const int64_t prow = (int64_t)(split * a.heads_kv + hkv) * a.kv_rows + kv_row0(a, b, s.k0) + j0;
        float *dkp = a.dk_part + prow * D, *dvp = a.dv_part + prow * D;
#pragma unroll
        for (int mi = 0; mi < C::K_MT; mi++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = wn_k * C::KTM + mi * 16 + g + hr * 8;
                if (r >= nk) continue;
#pragma unroll
                for (int ni = 0; ni < C::K_NT; ni++) {
                    const int col = wd_k * C::KTN + ni * 8 + 2 * t4;
                    if (wd_k * C::KTN + ni * 8 >= a.d) continue;
                    *(float2 *)(dkp + (int64_t)r * D + col) =
                        make_float2(dk[mi][ni][2 * hr], dk[mi][ni][2 * hr + 1]);
                    *(float2 *)(dvp + (int64_t)r * D + col) =
                        make_float2(dv[mi][ni][2 * hr], dv[mi][ni][2 * hr + 1]);
                }
            }
    }
}

/* Queues the main kernel of configuration C. */
template <typename T, typename C, bool DQ_ATOMIC, bool DROP>
cudaError_t launch_main(const BwdArgs &a, cudaStream_t st) {
    auto kern = bwd_main_kernel<T, C, DQ_ATOMIC, DROP>;
    cudaError_t e = (cudaError_t)fa_cuda_smem_limit((const void *)kern, (int)C::SMEM);
    if (e != cudaSuccess) return e;
    const dim3 grid((a.seqlen_k + C::BN - 1) / C::BN, a.heads_kv * a.nsplit, a.batch);
    if (grid.x == 0) return cudaSuccess;
    kern<<<grid, C::THREADS, C::SMEM, st>>>(a);
    return cudaGetLastError();
}

} // namespace bwd
} // namespace fa

#endif
