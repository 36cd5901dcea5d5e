/*
 * cuda/fwd_sm90_serial.cuh — the Hopper forward with each consumer in series (sm_90a), beside
 * fwd_sm90.cuh's overlapped pipeline: the structure cuDNN's SDPA kernels showed under Nsight
 * Compute (perf fwd_sm90 S1), written here in our own terms.
 *
 *   warpgroup 0, the producer: one thread loads per work tile its Q (BM = 128 rows, into one
 *     of NQ buffers), then its K and V tiles of BN keys, each into a ring of STAGES slots (one
 *     at d 256: the 64 KB tiles leave room for no second), by the copy engine as in
 *     fwd_sm90.cuh.
 *   warpgroups 1 and 2, the consumers, 64 query rows each, per key tile in series:
 *       S = Q K^T   (wgmma, both from shared memory; the first k-step writes S without reading
 *                    it, so S's registers are free between a tile's P V and the next S)
 *       mask, row max; then, in turn with the other consumer (named barriers 1 and 2), the
 *                    exponentials straight into P's 16-bit A fragments; O rescaled when the
 *                    max moved by more than LAZY (log2)
 *       O += P V    (wgmma, P from registers; the tile's first overwrites O)
 *     A consumer's first key tile, where its rows see only the first half (consumer 0 at the
 *     causal diagonal), runs P V (d 64/128: S and the exponentials too) over that half.
 *     Nothing of one key tile overlaps the next within a consumer: the turns make the two
 *     consumers alternate, so one's exponentials run under the other's products. A thread
 *     holds O (D / 2 registers) and S (BN / 2) and little else, which is what lets 128-key
 *     tiles fit beside a d 256 O (fwd_sm90.cuh's overlapped loop needs S twice and spills).
 *   O leaves per warp (16 rows) through two 2 KB staging buffers of 64 columns and the copy
 *     engine, while the producer already loads the next tile's Q (given back after the last S).
 *
 * It serves what fa_sm90_fwd routes to it (serial_for; its tilings: tune_sm90.h's SerialTiles):
 * d 64/128/256, fp16/bf16, BSHD (no
 * varlen), windows and causal masks, GQA, without softcap or ALiBi (those take
 * fwd_sm90.cuh's kernel).
 */
#ifndef FA_CUDA_FWD_SM90_SERIAL_CUH
#define FA_CUDA_FWD_SM90_SERIAL_CUH

#include "fwd_sm90.cuh"

namespace fa {
namespace sm90 {

/* NQ Q buffers: with two, the next tile's Q lands while this one's key loop runs */
template <int D_, int BN_, int STAGES_, int NQ_> struct SerialCfg {
    static constexpr int D = D_, BN = BN_, STAGES = STAGES_, NQ = NQ_, PANELS = D / 64;
    static constexpr int NC = 2, BM = 128, THREADS = 384, CTHREADS = 256;
    static constexpr bool ALIGN_END = false; /* tile_of: its O copies start at row 0 */
    /* as Cfg: the producer's release covers the consumers' raise (168 x 384 = 40 + 2 x 232) */
    static constexpr int REG_P = 40, REG_C = 232;
    static constexpr uint32_t Q_PANEL = 64 * 128, Q_WG = PANELS * Q_PANEL; /* bytes */
    static constexpr uint32_t KV_PANEL = BN * 128, KV_TILE = PANELS * KV_PANEL;
    static constexpr uint32_t O_STAGE = 16 * 128; /* a warp's 16 rows of one 64-column panel */
    static constexpr uint32_t OFF_K = NQ * NC * Q_WG, OFF_V = OFF_K + STAGES * KV_TILE;
    static constexpr uint32_t OFF_O = OFF_V + STAGES * KV_TILE; /* 2 buffers per consumer warp */
    static constexpr uint32_t OFF_BAR = OFF_O + 2 * 4 * NC * O_STAGE;
    static constexpr uint32_t OFF_TILE = OFF_BAR + 8 * (2 * NQ + 4 * STAGES);
    static constexpr uint32_t OFF_MUL = OFF_TILE + 4 * NQ; /* the softmax's scale (a float) */
    static constexpr size_t SMEM = OFF_MUL + 4 + 1024;  /* + aligning */
    static_assert(D % 64 == 0 && BN % 16 == 0 && KV_PANEL % 1024 == 0, "1024-byte tiles");
};
template <typename T, typename C>
__global__ void __launch_bounds__(C::THREADS, 1) fwd_sm90_serial_kernel(const __grid_constant__ Args a) {
#ifdef FA_SM90A_DEVICE
    constexpr int D = C::D, BN = C::BN, STAGES = C::STAGES, NQ = C::NQ, PANELS = C::PANELS;
    constexpr uint32_t Q_PANEL = C::Q_PANEL, Q_WG = C::Q_WG, KV_PANEL = C::KV_PANEL;
    constexpr uint32_t KV_TILE = C::KV_TILE, OFF_K = C::OFF_K, OFF_V = C::OFF_V;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    /* mbarriers: per Q buffer full and empty; per stage K full, V full, K empty, V empty.
       Beside them, per Q buffer the tile whose Q it holds (-1: none left). */
    const uint32_t bar_q = base + C::OFF_BAR, bar_qempty = bar_q + 8 * NQ;
    const uint32_t bar_kfull = bar_qempty + 8 * NQ, bar_vfull = bar_kfull + 8 * STAGES;
    const uint32_t bar_kempty = bar_vfull + 8 * STAGES, bar_vempty = bar_kempty + 8 * STAGES;
    const uint32_t tile_slot = base + C::OFF_TILE;
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        init_ring<NQ, STAGES, C::CTHREADS>(bar_q);
        mbar_init_fence();
        st_shared_u32(base + C::OFF_MUL, __float_as_uint(a.m.scale_log2));
    }
    __syncthreads();
    Tile w;
    Tracer tr; /* the bring-up timeline (trace_sm90.cuh): empty unless FA_SM90_TRACE */

    /* ---- the producer: tiles as fwd_sm90.cuh's (the grid's stride or a counter), per tile
       its Q once the consumers are done with the last one's S, then its K/V tiles from the
       last (the diagonal one under a causal mask) to the first ---- */
    if (wg == 0) {
        regs_dec<C::REG_P>();
        if (tid != 0) return;
        tr.init(0, true);
        auto find = [&](int t) {
            while (t < a.tiles && !tile_of<C>(a, t, w)) t = next_tile(a, t);
            return t;
        };
        auto load_kv = [&](int pos, uint32_t off, uint32_t full, uint32_t empty,
                           const CUtensorMap *map, int hk, int tok) {
            const int s = pos % STAGES;
            mbar_wait(empty + 8 * s, ((uint32_t)(pos / STAGES) & 1u) ^ 1u);
            mbar_expect_tx(full + 8 * s, KV_TILE);
            tr(TR_P_KV, 2 * pos + (off == OFF_V));
#pragma unroll 1
            for (int x = 0; x < PANELS; x++)
                tma_load4(base + off + s * KV_TILE + x * KV_PANEL, map, full + 8 * s, x * 64, hk,
                          tok, w.bt);
        };
        int pos = 0; /* the ring position: key tiles so far */
        for (int tc = 0, t = find((int)blockIdx.x);; tc++, t = find(next_tile(a, t))) {
            const int qb = tc % NQ;
            const uint32_t full = bar_q + 8 * qb;
            mbar_wait(bar_qempty + 8 * qb, ((uint32_t)(tc / NQ) & 1u) ^ 1u); /* fresh: 1 */
            st_shared_s32(tile_slot + 4 * qb, t < a.tiles ? t : -1);
            if (t >= a.tiles || w.ntiles == 0) { /* no Q to load: the slot says why */
                mbar_arrive(full);
                if (t >= a.tiles) break;
                continue;
            }
            mbar_expect_tx(full, 2 * Q_WG);
            tr(TR_P_Q, tc);
#pragma unroll 1
            for (int c = 0; c < 2; c++)
#pragma unroll 1
                for (int x = 0; x < PANELS; x++)
                    tma_load4(base + (2 * qb + c) * Q_WG + x * Q_PANEL, &a.tq, full, x * 64, w.h,
                              w.q0 + w.row0 + 64 * c, w.bt);
            const int hk = w.h / a.group;
#pragma unroll 1
            for (int it = 0; it < w.ntiles; it++, pos++) {
                const int tok = w.k0 + (w.t_first + w.ntiles - 1 - it) * BN;
                load_kv(pos, OFF_K, bar_kfull, bar_kempty, &a.tk, hk, tok);
                load_kv(pos, OFF_V, bar_vfull, bar_vempty, &a.tv, hk, tok);
            }
        }
        tr(TR_DONE);
        tr.finish();
        return;
    }
    regs_inc<C::REG_C>();

    /* ---- consumer warpgroup c: query rows row0 + 64 c .. + 63 of each tile ---- */
    const int c = wg - 1, wtid = tid - 128 * wg, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    constexpr int NS = BN / 8; /* n8 tiles of S */
    constexpr bool NARROW_S = D <= 128; /* a half tile's S and exponentials at half width */
    const uint32_t o_stage = base + C::OFF_O + (4 * c + warp) * 2 * C::O_STAGE;
    /* accumulators in the m16n8 C layout of each warp's 16 rows, as in fwd_sm90.cuh */
    float o[D / 2], sc[BN / 2], m[2], l[2];
    uint32_t pa[BN / 16][4];
    const float mul = a.m.scale_log2;

    /* the turns: consumer c waits on barrier 1 + c and passes to the other on 2 - c; consumer 1
       passes first, so consumer 0 goes first */
    const int my_bar = 1 + c, other_bar = 2 - c;
    tr.init(1 + c, wtid == 0);
    if (c == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");

#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f; /* defined before the first product reads it */
    int pos = 0;
    for (int tc = 0;; tc++) {
        const int qb = tc % NQ;
        const uint32_t sQ = base + (2 * qb + c) * Q_WG, q_empty = bar_qempty + 8 * qb;
        mbar_wait(bar_q + 8 * qb, (uint32_t)(tc / NQ) & 1u);
        const int t = ld_shared_s32(tile_slot + 4 * qb);
        if (t < 0) break;
        tr(TR_FETCH, t);
        tile_of<C>(a, t, w); /* true: the producer passed it */
        const int nt = w.ntiles, r_lo = w.row0 + 64 * c + 16 * warp + g;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        if (nt == 0) { /* every key masked: O = 0, LSE = -inf */
            mbar_arrive(q_empty);
#pragma unroll
            for (int i = 0; i < D / 2; i++) o[i] = 0.f;
        }
#pragma unroll 1
        for (int it = 0; it < nt; it++, pos++) {
            const int s = pos % STAGES;
            const uint32_t ph = (uint32_t)(pos / STAGES) & 1u;
            const int kcol0 = (w.t_first + nt - 1 - it) * BN;
            tr(TR_ITER, it);
            const int there = mbar_done(bar_kfull + 8 * s, ph) | 2 * mbar_done(bar_vfull + 8 * s, ph);
            mbar_wait(bar_kfull + 8 * s, ph);
            tr(TR_READY, 4 * pos + there);
            wg_fence();
            /* half: this consumer's rows see none of the tile's last BN / 2 keys (consumer 0
               at the causal diagonal, a sequence's partial last tile), so P V runs over the
               first half only, and at d 64/128 S and the exponentials too (at d 256 their
               second shape spills). Only a tile's first (its last keys) can be. As a vote:
               behind a branch ptxas cannot prove warp-uniform, it serialises every wgmma of
               the kernel (C7520). */
            const bool half = __all_sync(0xffffffffu, it == 0 &&
                                         hi_of(a, w, w.row0 + 64 * c + 63) <= kcol0 + BN / 2);
            const bool half_s = NARROW_S && half;
            auto s_product = [&](auto n) {
                constexpr int N = decltype(n)::value;
                float(&sn)[N / 2] = reinterpret_cast<float(&)[N / 2]>(sc);
                const Desc dq = desc_sw128(sQ, 16, 1024);
                const Desc dk = desc_sw128(base + OFF_K + s * KV_TILE, 16, 1024);
                Wgmma<T, N>::ss_new(sn, desc_at(dq, 0), desc_at(dk, 0), 0);
#pragma unroll
                for (int kk = 1; kk < D / 16; kk++) {
                    const uint32_t off = (kk % 4) * 32u;
                    Wgmma<T, N>::ss(sn, desc_at(dq, (kk / 4) * Q_PANEL + off),
                                    desc_at(dk, (kk / 4) * KV_PANEL + off), 1);
                }
            };
            if (half_s)
                s_product(Int<BN / 2>{});
            else
                s_product(Int<BN>{});
            wg_commit();
            wg_wait<0>();
            wg_pin(sc);
            if (half_s) {
#pragma unroll
                for (int i = BN / 4; i < BN / 2; i++) sc[i] = -INFINITY;
            }
            tr(TR_S_DONE, it);
            mbar_arrive(bar_kempty + 8 * s);
            if (it == nt - 1) mbar_arrive(q_empty); /* the tile's last S has read Q */

            /* keys outside a row's range (past the sequence included): -inf */
            if (!fa_range_holds(w.every, kcol0, kcol0 + BN)) mask_rows(sc, a, w, kcol0, r_lo, t4);
            float mx[2];
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                float x = -INFINITY;
#pragma unroll
                for (int j = 0; j < NS; j++) x = fmaxf(x, fmaxf(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
                mx[hr] = __fmul_ru(quad_max(x), mul); /* rounded up: with_row_exp (ptx.cuh) */
            }
            /* the max before the turn, the exponentials (from mul_t, loaded in it) in it */
            const float mul_t = bar_sync_after(my_bar, 256, mx[0] + mx[1], base + C::OFF_MUL);
            tr(TR_TURN, it);
            float alpha[2];
            /* the exponentials of the first NE n8 tiles (a half tile's P V reads no more) */
            auto exps = [&](auto ne) {
                constexpr int NE = decltype(ne)::value;
                float m_use[2];
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    /* lazy: the reference max moves only when the tile's exceeds it by more
                       than LAZY, so most tiles leave O as it is (fwd_sm90.cuh) */
                    const float m_new = mx[hr] > m[hr] + a.lazy ? mx[hr] : m[hr];
                    m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
                    alpha[hr] = fast_exp2(m[hr] - m_use[hr]);
                    m[hr] = m_new;
                }
                float sum[2] = {0.f, 0.f};
                with_row_exp(m_use, [&](auto ex) {
#pragma unroll
                    for (int j = 0; j < NE; j++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const float p0 = ex(hr, sc[4 * j + 2 * hr], mul_t, m_use[hr]);
                            const float p1 = ex(hr, sc[4 * j + 2 * hr + 1], mul_t, m_use[hr]);
                            sum[hr] += p0 + p1;
                            pa[j / 2][hr + 2 * (j % 2)] = pack2<T>(p0, p1);
                        }
                });
#pragma unroll
                for (int hr = 0; hr < 2; hr++) l[hr] = l[hr] * alpha[hr] + sum[hr];
            };
            if (half_s)
                exps(Int<NS / 2>{});
            else
                exps(Int<NS>{});
            bar_arrive_after(other_bar, 256, l[0] + l[1]); /* every exponential in the turn */
            tr(TR_SOFTMAX, it);
            if (it > 0 && __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
                rescale_o(o, alpha);
            mbar_wait(bar_vfull + 8 * s, ph);
            tr(TR_V_READY, it);
            wg_pin(o);
            wg_fence();
            {
                /* k-step kk: keys 16 kk.. = rows 16 kk.. of every V panel (MN-major) */
                const Desc dv = desc_sw128(base + OFF_V + s * KV_TILE, KV_PANEL, 1024);
                auto pv = [&](auto nk) {
#pragma unroll
                    for (int kk = 0; kk < decltype(nk)::value; kk++)
                        Wgmma<T, D>::rs(o, pa[kk], desc_at(dv, kk * 16 * 128), it > 0 || kk > 0);
                };
                if (half)
                    pv(Int<BN / 32>{});
                else
                    pv(Int<BN / 16>{});
            }
            wg_commit();
            wg_wait<0>();
            wg_pin(o);
            wg_pin(pa);
            tr(TR_PV_DONE, it);
            mbar_arrive(bar_vempty + 8 * s);
        }

        /* O / l in 16 bits, per warp and 64-column panel through a staging buffer (the 128-byte
           swizzle of the O map) and the copy engine, which clips rows past the sequence;
           LSE = m ln 2 + log l */
        float lt[2], inv[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            lt[hr] = quad_sum(l[hr]);
            inv[hr] = lt[hr] > 0.f ? 1.f / lt[hr] : 0.f;
        }
        if (lane == 0) bulk_wait_read(); /* the last tile's copies have left the buffers */
        __syncwarp();
        const int hi = lane / 16, r = 8 * ((lane / 8) % 2) + lane % 8; /* stmatrix's rows */
#pragma unroll
        for (int p = 0; p < PANELS; p++) {
            const uint32_t buf = o_stage + (p % 2) * C::O_STAGE;
            if (p >= 2) {
                if (lane == 0) bulk_wait_read_but<1>(); /* panel p - 2's copy has read buf */
                __syncwarp();
            }
#pragma unroll
            for (int jq = 0; jq < 4; jq++) {
                const int jp = 4 * p + jq, j0 = 2 * jp, j1 = 2 * jp + 1; /* n8 tiles */
                stmatrix_x4(buf + r * 128 + (((j0 % 8) ^ hi ^ (r % 8)) << 4),
                            pack2<T>(o[4 * j0] * inv[0], o[4 * j0 + 1] * inv[0]),
                            pack2<T>(o[4 * j0 + 2] * inv[1], o[4 * j0 + 3] * inv[1]),
                            pack2<T>(o[4 * j1] * inv[0], o[4 * j1 + 1] * inv[0]),
                            pack2<T>(o[4 * j1 + 2] * inv[1], o[4 * j1 + 3] * inv[1]));
            }
            fence_async_smem();
            __syncwarp();
            if (lane == 0) {
                tma_store4(&a.to, buf, p * 64, w.h, w.q0 + w.row0 + 64 * c + 16 * warp, w.bo);
                bulk_commit();
            }
        }
        tr(TR_O_ISSUED);
        if (a.lse && t4 == 0) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int row = r_lo + 8 * hr;
                if (row < w.sq)
                    a.lse[(int64_t)w.bo * a.lse_sb + (int64_t)w.h * a.lse_sh +
                          (int64_t)(w.q0 + row) * a.lse_st] =
                        lt[hr] > 0.f ? m[hr] * 0.6931471805599453f + logf(lt[hr]) : -INFINITY;
            }
        }
    }
    tr(TR_DONE);
    tr.finish();
    if (lane == 0) bulk_wait(); /* the shared memory stays until the last copy is done */
    /* consumer 0 takes consumer 1's last pass, so no barrier is left half-arrived */
    if (c == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
#endif
}

} // namespace sm90
} // namespace fa

#endif
