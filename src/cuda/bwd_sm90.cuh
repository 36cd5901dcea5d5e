/*
 * cuda/bwd_sm90.cuh — the Hopper (sm_90a) main kernels of the backward: the sm80 kernel's job
 * (bwd_sm80_main.cuh: dK, dV of one key tile, dQ by fp32 atomics) on wgmma and the copy
 * engine. The passes around it (pre, post dQ, post dKV) and the workspace are the sm80
 * backward's (bwd_sm80.cu); the host side is bwd_sm90.cu.
 *
 * A block owns BN = 128 keys of one kv head (grid as the sm80 kernel: key tile, kv head x
 * query-head split, sequence) and walks the (query head, query tile of BM rows) pairs that
 * see them. Two warpgroups, 64 keys each; no producer warpgroup: thread 0 issues the copies.
 * Per query tile, in warpgroup c (its keys kc = 64c .. 64c + 63), with the key-major
 * ("transposed") scores so that P^T and dS^T come out of the accumulators in the A-fragment
 * layout of the products that need them:
 *
 *   S^T  = K_kc Q^T        wgmma m64n{BM}, A = K, B = Q, both K-major in shared memory
 *   dP^T = V_kc dO^T       same, issued with S^T; P^T = exp2(S^T scale log2e - LSE2) runs
 *                          while dP^T finishes
 *   dS^T = P^T (dP^T - D)  [* (1 - tanh^2) with softcap]
 *   dV  += P^T dO          wgmma m64n{D}, A = P^T from registers, B = dO MN-major
 *   dK  += dS^T Q          same with dS^T and Q
 *   dS^T -> shared memory (16 bits, [key][query], 128-byte swizzle); both warpgroups meet
 *   dQ(tile) += dS K       a 64 x 64 block per warpgroup (d 128: columns 64c..; d 64, whose
 *                          query tiles are 128 rows: rows 64c..), A = dS^T and B = K both
 *                          MN-major; red.global.add.v2 into the sm80 accumulator layout
 *
 * Shared memory (1024-byte aligned tiles in panels of 64 columns, as the copy engine writes
 * them): K, V [panel][128 keys][128 B]; Q, dO in a ring of 3 stages [panel][BM rows][128 B]
 * with LSE2 and D of the tile's rows, all completing on the stage's mbarrier; dS^T in two
 * buffers [query panel][128 keys][128 B]. The copy of tile it + 2 goes out when both
 * warpgroups have met in tile it (so they are done with tile it - 1, whose stage it takes);
 * the two dS^T buffers let one warpgroup write tile it + 1's while the other still reads
 * tile it's.
 *
 * d 64 and 128 (exactly), fp16/bf16, every mask, softcap, ALiBi, GQA (and its split), varlen;
 * without DQ (deterministic mode) the dQ part is left to the sm80 dQ kernel. d 256 has a
 * kernel of its own (bwd_sm90_d256_kernel, below: 64 keys, the warpgroups split by product
 * and by column half). The d 256 kernel keeps the mask rule for Inf and NaN (nf_hit, below);
 * the d 64/128 kernel not yet (its repair cost 4-12%:
 * bench/probes/masked_bwd_sm90_d64_d128.patch).
 */
#ifndef FA_CUDA_BWD_SM90_CUH
#define FA_CUDA_BWD_SM90_CUH

#include <cuda.h>
#include <math.h>

#include "bwd_sm80.cuh"
#include "bwd_sm80_tile.cuh"
#include "masked_specials.cuh"
#include "ptx.cuh"
#include "wgmma.cuh"

namespace fa {
namespace bwd {

struct Sm90Args {
    BwdArgs a;
    CUtensorMap tq, tk, tv, tdo; /* (d, head, token, batch): Q, dO boxes of BM rows; K, V of BN */
};

/* d 64/128: 128 keys (64 per warpgroup), a 3-stage Q/dO ring, two dS^T buffers. d 256 (its
   own kernel below): 64 keys, 2 stages, one buffer each of P^T, dS^T (16 bits) and P^T in
   fp16 for the dS step (DS_BUFS 1, P_BUFS 2 buffers' worth). */
template <int D_> struct Sm90Cfg {
    static constexpr int D = D_, BN = D == 256 ? 64 : 128, BM = D == 64 ? 128 : 64;
    static constexpr int STAGES = D == 256 ? 2 : 3, THREADS = 256, PANELS = D / 64;
    static constexpr int DS_BUFS = D == 256 ? 1 : 2, P_BUFS = D == 256 ? 2 : 0;
    static constexpr uint32_t Q_PANEL = BM * 128, Q_TILE = PANELS * Q_PANEL;
    static constexpr uint32_t KV_PANEL = BN * 128, KV_TILE = PANELS * KV_PANEL;
    static constexpr uint32_t DS_PANEL = BN * 128, DS_TILE = (BM / 64) * DS_PANEL;
    static constexpr uint32_t OFF_K = 0, OFF_V = KV_TILE, OFF_Q = 2 * KV_TILE;
    static constexpr uint32_t OFF_DO = OFF_Q + STAGES * Q_TILE, OFF_DS = OFF_DO + STAGES * Q_TILE;
    static constexpr uint32_t OFF_P = OFF_DS + DS_BUFS * DS_TILE, OFF_PH = OFF_P + DS_TILE;
    static constexpr uint32_t OFF_L = OFF_DS + (DS_BUFS + P_BUFS) * DS_TILE;
    static constexpr uint32_t OFF_DD = OFF_L + STAGES * BM * 4;
    static constexpr uint32_t OFF_BAR = OFF_DD + STAGES * BM * 4;
    /* d 256: the dV table of masked dO specials (masked_specials.cuh), then two words: "K was
       zeroed" and "K holds an Inf or NaN" (the d 64/128 kernel does not keep the rule yet:
       docs/masked_specials_cuda.md) */
    static constexpr uint32_t NF_WORDS = D == 256 ? NfTable<BN, D>::WORDS + 2 : 0;
    static constexpr uint32_t OFF_NF = (OFF_BAR + 8 * (1 + STAGES) + 15) / 16 * 16;
    static constexpr uint32_t OFF_NFK = OFF_NF + (uint32_t)NfTable<BN, D>::BYTES;
    static constexpr size_t SMEM =
        (D == 256 ? OFF_NF + NF_WORDS * 4 : OFF_BAR + 8 * (1 + STAGES)) + 1024; /* + aligning */
    static_assert(BM % 64 == 0 && kRowPad % BM == 0, "query tiles inside the row padding");
};

/* What a block knows of its keys and of the (query head, query tile) pairs it walks. */
struct Blk {
    Seq s;
    fa_rows rk;
    int b, hkv, split, bt, j0, nk, m_first, nmb, h_begin, niter;
    int64_t wrow0;
    /* block (key tile kb, kv head x split, sequence b) of BN keys, query tiles of BM rows; no
       work (niter 0, and valid() false) when the sequence has fewer keys */
    __device__ __forceinline__ Blk(const BwdArgs &a, int BN, int BM)
        : s(seq_of(a, blockIdx.z)), rk(rows_of(a, s)) {
        b = blockIdx.z;
        split = blockIdx.y % a.nsplit;
        hkv = blockIdx.y / a.nsplit;
        bt = a.cu_q ? 0 : b; /* the maps' batch coordinate (varlen: one sequence) */
        j0 = blockIdx.x * BN;
        nk = min(BN, s.sk - j0);
        /* the query tiles of the rows that see a key of the tile */
        const fa_range mt = fa_range_tiles(fa_rows_seeing(rk, j0, j0 + nk), BM);
        m_first = mt.lo;
        nmb = mt.hi - mt.lo;
        h_begin = hkv * a.group + split * a.heads_per_split;
        const int h_end = min(h_begin + a.heads_per_split, (hkv + 1) * a.group);
        niter = h_end > h_begin && valid() ? (h_end - h_begin) * nmb : 0;
        wrow0 = ws_row0(a, b, s.q0);
    }
    __device__ __forceinline__ bool valid() const { return j0 < s.sk; }
    __device__ __forceinline__ int tile_h(int it) const { return h_begin + it / nmb; }
    __device__ __forceinline__ int tile_i0(int it, int BM) const { return (m_first + it % nmb) * BM; }
};

/* Thread 0: K and V of the block (on bar_kv), and Q, dO, LSE2 and D of tile `it` into stage
   it % STAGES (on that stage's barrier). */
template <typename C>
__device__ __forceinline__ void load_kv(const Sm90Args &g, const Blk &k, uint32_t base) {
    using namespace fa::sm90;
    const uint32_t bar = base + C::OFF_BAR;
    mbar_expect_tx(bar, 2 * C::KV_TILE);
#pragma unroll
    for (int x = 0; x < C::PANELS; x++) {
        tma_load4(base + C::OFF_K + x * C::KV_PANEL, &g.tk, bar, x * 64, k.hkv, k.s.k0 + k.j0, k.bt);
        tma_load4(base + C::OFF_V + x * C::KV_PANEL, &g.tv, bar, x * 64, k.hkv, k.s.k0 + k.j0, k.bt);
    }
}
template <typename C>
__device__ __forceinline__ void load_tile(const Sm90Args &g, const Blk &k, uint32_t base, int it) {
    using namespace fa::sm90;
    const int st = it % C::STAGES, h = k.tile_h(it), i0 = k.tile_i0(it, C::BM);
    const uint32_t bar = base + C::OFF_BAR + 8 + 8 * st;
    mbar_expect_tx(bar, 2 * C::Q_TILE + 2 * C::BM * 4);
#pragma unroll
    for (int x = 0; x < C::PANELS; x++) {
        tma_load4(base + C::OFF_Q + st * C::Q_TILE + x * C::Q_PANEL, &g.tq, bar, x * 64, h,
                  k.s.q0 + i0, k.bt);
        tma_load4(base + C::OFF_DO + st * C::Q_TILE + x * C::Q_PANEL, &g.tdo, bar, x * 64, h,
                  k.s.q0 + i0, k.bt);
    }
    const int64_t w = (int64_t)h * g.a.ws_rows + k.wrow0 + i0;
    bulk_load(base + C::OFF_L + st * C::BM * 4, g.a.lse2 + w, C::BM * 4, bar);
    bulk_load(base + C::OFF_DD + st * C::BM * 4, g.a.dsum + w, C::BM * 4, bar);
}

/* The block's mbarriers (K/V, one per stage), then thread 0's first copies: K, V and the first
   two query tiles. */
template <typename C>
__device__ __forceinline__ void start_block(const Sm90Args &g, const Blk &k, uint32_t base) {
    using namespace fa::sm90;
    const uint32_t bar_kv = base + C::OFF_BAR;
    if constexpr (C::NF_WORDS > 0) /* the barrier below publishes the zeros */
        nf_table_clear(base + C::OFF_NF, C::NF_WORDS, threadIdx.x, C::THREADS);
    if (threadIdx.x == 0) {
        mbar_init(bar_kv, 1);
        for (int st = 0; st < C::STAGES; st++) mbar_init(bar_kv + 8 + 8 * st, 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0 && k.niter > 0) {
        load_kv<C>(g, k, base);
        load_tile<C>(g, k, base, 0);
        if (k.niter > 1) load_tile<C>(g, k, base, 1);
    }
}

/* P^T in place of S^T (raw q.k) without softcap, in the accumulator layout of a warpgroup's
   64 keys (this thread's keys j0 + kl0 and + 8; queries i0 + 8j + 2t4 + 0/1). `full`: every
   key visible to every row of the tile, and no ALiBi: no per-element work. LSE2 is +inf for
   rows without keys and past the sequence, so P is 0 there without a test. */
template <int NQ>
__device__ __forceinline__ void p_of_t(float (&sc)[4 * NQ], const BwdArgs &a, const Blk &k,
                                       const float *sL, int i0, int kl0, int t4, float slope,
                                       bool full) {
    if (full) {
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            const float2 l2 = *(const float2 *)(sL + 8 * j + 2 * t4);
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                sc[4 * j + 2 * hr] = prob_exp2(sc[4 * j + 2 * hr], a.scale_log2, l2.x);
                sc[4 * j + 2 * hr + 1] = prob_exp2(sc[4 * j + 2 * hr + 1], a.scale_log2, l2.y);
            }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < NQ; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int i = i0 + 8 * j + 2 * t4 + e, ci = i + k.rk.diag;
            const float l2 = sL[8 * j + 2 * t4 + e];
            const int lo = fa_rows_lo(k.rk, i), hi = i < k.s.sq ? fa_rows_hi(k.rk, i) : 0;
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int kj = k.j0 + kl0 + 8 * hr;
                const float x = sc[4 * j + 2 * hr + e] * a.scale - slope * fabsf((float)(ci - kj));
                sc[4 * j + 2 * hr + e] = kj >= lo && kj < hi ? prob_exp2(x, kLog2e, l2) : 0.f;
            }
        }
}

/* dS^T of the masked pairs exactly 0, on a tile with a mask edge: their P is 0, but dP may be
   Inf or NaN (a special in V or dO), and 0 times it would reach dQ and dK */
template <int NQ>
__device__ __forceinline__ void ds_mask_t(float (&ds)[4 * NQ], const Blk &k, int i0, int kl0,
                                          int t4) {
#pragma unroll
    for (int j = 0; j < NQ; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int i = i0 + 8 * j + 2 * t4 + e;
            const int lo = fa_rows_lo(k.rk, i), hi = i < k.s.sq ? fa_rows_hi(k.rk, i) : 0;
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int kj = k.j0 + kl0 + 8 * hr;
                if (kj < lo || kj >= hi) ds[4 * j + 2 * hr + e] = 0.f;
            }
        }
}

/*
 * The mask rule for Inf and NaN (masked_specials.cuh). An Inf or NaN in Q or dO of a query row,
 * or in K of a key, that the other side of a masked pair cannot see would reach it through
 * dK += dS^T Q, dV += P^T dO or dQ += dS K (0 times it is NaN). Such a row has a non-finite
 * LSE (its scores are Inf or NaN) or D (rowsum dO O); K is scanned once, when the block starts
 * (nf_check_k, which sets the word at OFF_NFK + 4; only where the kernel has the dQ product).
 * nf_hit: whether this thread sees a reason for the repair on a tile with a mask edge: one of
 * its rows that does not see every key of the block has a non-finite LSE or D, or K holds a
 * special. The caller votes; on a hit, nf_zero_tile sets the specials of the rows some pair
 * cannot see to 0 (every warpgroup is past its S^T and dP^T products): Q's and K's reach the
 * pairs that do see them through S anyway, dO's terms go to the dV table. K, kept for the next
 * tiles, is restored after the dQ product (nf_restore_k).
 */
template <typename T, typename C, bool DQ>
__device__ __forceinline__ bool nf_check_k(const Blk &k, uint32_t base) {
    if (!DQ || k.niter == 0) return false; /* only the dQ product reads K's masked rows */
    fa::sm90::mbar_wait(base + C::OFF_BAR, 0); /* K and V have landed */
    const bool bad = nf_scan<T, NfSw128<C::KV_PANEL>, C::D / 8>(base + C::OFF_K, 0, k.nk, 0, 0,
                                                                 threadIdx.x, C::THREADS);
    if (bad) fa::sm90::st_shared_u32(base + C::OFF_NFK + 4, 1u);
    return bad;
}
template <typename C>
__device__ __forceinline__ bool nf_hit(const Blk &k, uint32_t base, const float *sL,
                                       const float *sDd, int i0) {
    const int nq = min(C::BM, k.s.sq - i0);
    const fa_range q = fa_rows_seeing_all(k.rk, k.j0, k.j0 + k.nk);
    bool hit = false;
    for (int r = threadIdx.x; r < nq; r += C::THREADS)
        if ((i0 + r < q.lo || i0 + r >= q.hi) && !(nf_finite(sL[r]) && nf_finite(sDd[r])))
            hit = true;
    uint32_t kbad;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(kbad) : "r"(base + C::OFF_NFK + 4));
    return hit || kbad != 0;
}
template <typename T, typename C, bool DQ>
__device__ __forceinline__ void nf_zero_tile(const Blk &k, uint32_t base, uint32_t sQ,
                                             uint32_t sdO, int i0) {
    using L = NfSw128<C::Q_PANEL>;
    const int nq = min(C::BM, k.s.sq - i0), t = threadIdx.x;
    const fa_range q = fa_rows_seeing_all(k.rk, k.j0, k.j0 + k.nk);
    const fa_range kc = fa_rows_common(k.rk, i0, i0 + nq);
    const NfMap m{k.rk, 0, 1, false, k.j0, i0};
    nf_scan_zero<T, L, C::D / 8>(sQ, 0, nq, q.lo - i0, q.hi - i0, m, NfNoSink{}, t, C::THREADS);
    nf_scan_zero<T, L, C::D / 8>(sdO, 0, nq, q.lo - i0, q.hi - i0, m,
                                 NfTableSink{base + C::OFF_NF, C::BN, C::D}, t, C::THREADS);
    if (DQ)
        nf_scan_zero<T, NfSw128<C::KV_PANEL>, C::D / 8>(
            base + C::OFF_K, 0, k.nk, kc.lo - k.j0, kc.hi - k.j0,
            NfMap{k.rk, 0, 1, true, i0, k.j0}, NfFlagSink{base + C::OFF_NFK}, t, C::THREADS);
    fa::sm90::fence_async_smem(); /* the products read the zeros through the async proxy */
    __syncthreads();
}
template <typename T, typename C>
__device__ __forceinline__ void nf_restore_k(const BwdArgs &a, const Blk &k, uint32_t base) {
    const T *kg = (const T *)a.k + k.s.bk * a.k_sb + (int64_t)(k.s.k0 + k.j0) * a.k_st +
                  (int64_t)k.hkv * a.k_sh;
    nf_restore<T, NfSw128<C::KV_PANEL>, C::D / 8>(base + C::OFF_K, kg, a.k_st, k.nk, C::D,
                                                  base + C::OFF_NFK, threadIdx.x, C::THREADS);
    fa::sm90::fence_async_smem();
    __syncthreads();
}

/* dV's accumulator (this thread: keys kl0, kl0 + 8; columns c0 + 8j + 2t4 + 0/1) plus the
   terms of masked dO specials in the table (masked_specials.cuh) */
template <typename C, int NJ>
__device__ __forceinline__ void nf_apply_dv(float (&dv)[4 * NJ], uint32_t base, int kl0, int c0,
                                            int t4) {
    const uint32_t table = base + C::OFF_NF;
    uint32_t dirty;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(dirty) : "r"(table));
    if (!dirty) return;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t bits =
                nf_table_bits(table, C::D, kl0 + 8 * (i / 2), c0 + 8 * j + 2 * t4 + i % 2);
            if (bits) dv[4 * j + i] += __uint_as_float(nf_value(bits));
        }
}

/* acc (64 x N) = A B^T: A the 64 rows of a K or V tile from sA, B the N rows of a Q or dO tile
   at sB, both K-major in 64-column panels (k-step kk reads 32 bytes into the 128-byte rows of
   panel kk / 4). Issued and committed, not waited for. */
template <typename T, typename C, int N>
__device__ __forceinline__ void issue_rows(float (&acc)[N / 2], uint32_t sA, uint32_t sB) {
    using namespace fa::sm90;
    const Desc da = desc_sw128(sA, 16, 1024), db = desc_sw128(sB, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < C::D / 16; kk++) {
        const uint32_t off = (kk % 4) * 32u;
        Wgmma<T, N>::ss(acc, desc_at(da, (kk / 4) * C::KV_PANEL + off),
                        desc_at(db, (kk / 4) * C::Q_PANEL + off), 1);
    }
    wg_commit();
}

/* The 16-bit pair (key kl, queries 8j + 2t4 ..) of a [key][query] tile in 128-byte-swizzled
   panels of 64 queries: chunk j % 8 of the row XOR the row's low bits */
__device__ __forceinline__ uint32_t kq_off(uint32_t panel_bytes, int kl, int j, int t4) {
    return (j / 8) * panel_bytes + kl * 128 + (((j % 8) ^ (kl % 8)) * 16) + 4 * t4;
}

/* dQ(rows r0.., columns n0.. of the tile at workspace row `row`) += a warpgroup's 64 x 8NJ
   block, red.v2 into the sm80 accumulator's 8x8 blocks; rows past the sequence add exact
   zeros into the workspace's padding rows */
template <int D, int NJ>
__device__ __forceinline__ void red_dq(const BwdArgs &a, int64_t row, int r0, int n0, int warp,
                                       int g4, int t4, const float (&dq)[4 * NJ]) {
    float *dqt = a.dq_acc + (row + r0 + 16 * warp) * D + (n0 / 8) * 64 + g4 * 8 + 2 * t4;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
            red_add2(dqt + 8 * hr * D + j * 64, dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
}

/* dK (scaled) and dV of the block from the warpgroups' accumulators (this thread: keys kl0,
   kl0 + 8; columns c0 + 8j + 2t4 ..): staged as T in the K and V tiles (16-byte chunks XOR the
   row's low bits; the caller has synchronised, every product is done with K and V) and
   stored in whole chunks, or written as fp32 partials when the GQA group is split */
template <typename T, typename C, int NJ>
__device__ __forceinline__ void store_dkv(const BwdArgs &a, const Blk &k, uint32_t base,
                                          unsigned char *sm, float (&dk)[4 * NJ],
                                          const float (&dv)[4 * NJ], int kl0, int c0, int t4) {
    using namespace fa::sm90;
    constexpr int D = C::D, ND = D / 8;
#pragma unroll
    for (int i = 0; i < 4 * NJ; i++) dk[i] *= a.scale; /* Q was not scaled */
    if (a.nsplit == 1) {
        __syncthreads();
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = kl0 + 8 * hr, ch = c0 / 8 + j;
                const uint32_t off = r * (D * 2) + ((ch ^ (r % 8)) * 16) + 4 * t4;
                st_shared_u32(base + C::OFF_K + off, pack2<T>(dk[4 * j + 2 * hr], dk[4 * j + 2 * hr + 1]));
                st_shared_u32(base + C::OFF_V + off, pack2<T>(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]));
            }
        __syncthreads();
        T *dkg = (T *)a.dk + k.s.bk * a.dk_sb + (int64_t)(k.s.k0 + k.j0) * a.dk_st + (int64_t)k.hkv * a.dk_sh;
        T *dvg = (T *)a.dv + k.s.bk * a.dv_sb + (int64_t)(k.s.k0 + k.j0) * a.dv_st + (int64_t)k.hkv * a.dv_sh;
        for (int idx = threadIdx.x; idx < k.nk * ND; idx += C::THREADS) {
            const int r = idx / ND, ch = idx % ND;
            const uint32_t off = r * (D * 2) + ((ch ^ (r % 8)) * 16);
            *(uint4 *)(dkg + (int64_t)r * a.dk_st + ch * 8) = *(const uint4 *)(sm + C::OFF_K + off);
            *(uint4 *)(dvg + (int64_t)r * a.dv_st + ch * 8) = *(const uint4 *)(sm + C::OFF_V + off);
        }
    } else {
        /* bwd_sm80_aux.cu sums the splits in order */
        const int64_t prow =
            (int64_t)(k.split * a.heads_kv + k.hkv) * a.kv_rows + kv_row0(a, k.b, k.s.k0) + k.j0;
        float *dkp = a.dk_part + prow * D, *dvp = a.dv_part + prow * D;
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = kl0 + 8 * hr;
            if (r >= k.nk) continue;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int col = c0 + 8 * j + 2 * t4;
                *(float2 *)(dkp + (int64_t)r * D + col) = make_float2(dk[4 * j + 2 * hr], dk[4 * j + 2 * hr + 1]);
                *(float2 *)(dvp + (int64_t)r * D + col) = make_float2(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]);
            }
        }
    }
}

template <typename T, typename C, bool DQ>
__global__ void __launch_bounds__(C::THREADS, 1) bwd_sm90_kernel(const __grid_constant__ Sm90Args g) {
#ifdef FA_SM90A_DEVICE
    using namespace fa::sm90;
    constexpr int D = C::D, BM = C::BM, BN = C::BN, STAGES = C::STAGES;
    constexpr int NQ = BM / 8, ND = D / 8; /* n8 tiles of S^T (queries) and of dK/dV (d) */
    const BwdArgs &a = g.a;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *const sm = smem_raw + (base - raw);
    const uint32_t sK = base + C::OFF_K, sV = base + C::OFF_V;
    const uint32_t bar_kv = base + C::OFF_BAR, bar_full = bar_kv + 8;

    const int tid = threadIdx.x, c = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g4 = lane / 4, t4 = lane % 4;
    const Blk k(a, BN, BM);
    if (!k.valid()) return; /* varlen: this sequence has fewer keys (uniform per block) */
    const int niter = k.niter;

    start_block<C>(g, k, base);

    /* accumulators of the warpgroup's 64 keys: n8 tile j holds (key kl0, columns 8j + 2t4 +
       0/1) in [4j], [4j+1] and (key kl0 + 8, ...) in [4j+2], [4j+3] */
    const int kl0 = 64 * c + 16 * warp + g4;
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;

    const bool softcap = a.softcap > 0.f;
#pragma unroll 1
    for (int it = 0; it < niter; it++) {
        const int st = it % STAGES, h = k.tile_h(it), i0 = k.tile_i0(it, BM);
        if (it == 0) mbar_wait(bar_kv, 0);
        mbar_wait(bar_full + 8 * st, (uint32_t)(it / STAGES) & 1u);
        const uint32_t sQ = base + C::OFF_Q + st * C::Q_TILE, sdO = base + C::OFF_DO + st * C::Q_TILE;
        const float *sL = (const float *)(sm + C::OFF_L) + st * BM;
        const float *sDd = (const float *)(sm + C::OFF_DD) + st * BM;

        /* S^T and dP^T of this warpgroup's 64 keys */
        float sc[BM / 2], dp[BM / 2];
#pragma unroll
        for (int i = 0; i < BM / 2; i++) sc[i] = dp[i] = 0.f;
        wg_pin(sc);
        wg_pin(dp);
        wg_fence();
        issue_rows<T, C, BM>(sc, sK + c * 64 * 128, sQ);
        issue_rows<T, C, BM>(dp, sV + c * 64 * 128, sdO);

        /* P^T while dP^T finishes (softcap: below, with dS) */
        const bool full = i0 + BM <= k.s.sq &&
                          fa_range_holds(fa_rows_common(k.rk, i0, i0 + BM), k.j0, k.j0 + BN);
        const float slope = a.alibi ? a.alibi[k.b * a.alibi_sb + h] : 0.f;
        wg_wait<1>();
        wg_pin(sc);
        if (!softcap) p_of_t<NQ>(sc, a, k, sL, i0, kl0, t4, slope, full && !a.alibi);
        wg_wait<0>();
        wg_pin(dp);
        if (!softcap) {
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                const float2 dd = *(const float2 *)(sDd + 8 * j + 2 * t4);
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    dp[4 * j + 2 * hr] = sc[4 * j + 2 * hr] * (dp[4 * j + 2 * hr] - dd.x);
                    dp[4 * j + 2 * hr + 1] = sc[4 * j + 2 * hr + 1] * (dp[4 * j + 2 * hr + 1] - dd.y);
                }
            }
        } else {
            /* softcap: the gradient with respect to the pre-softcap score (bwd_sm80_pds.cuh) */
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int i = i0 + 8 * j + 2 * t4 + e, ci = i + k.rk.diag;
                    const float l2 = sL[8 * j + 2 * t4 + e], dd = sDd[8 * j + 2 * t4 + e];
                    const int lo = fa_rows_lo(k.rk, i), hi = i < k.s.sq ? fa_rows_hi(k.rk, i) : 0;
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int kj = k.j0 + kl0 + 8 * hr, r = 4 * j + 2 * hr + e;
                        const float th = tanhf(sc[r] * a.softcap_inv);
                        const float x = a.softcap * th - slope * fabsf((float)(ci - kj));
                        const float p = kj >= lo && kj < hi ? prob_exp2(x, kLog2e, l2) : 0.f;
                        dp[r] = p * (dp[r] - dd) * (1.f - th * th);
                        sc[r] = p;
                    }
                }
        }

        /* P^T and dS^T as 16-bit A fragments (k-step kk: queries 16kk.., n8 tiles 2kk, 2kk+1) */
        uint32_t pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                pa[j / 2][hr + 2 * (j % 2)] = pack2<T>(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]);
                da[j / 2][hr + 2 * (j % 2)] = pack2<T>(dp[4 * j + 2 * hr], dp[4 * j + 2 * hr + 1]);
            }
        /* dV += P^T dO, dK += dS^T Q: k-step kk is query rows 16kk.. of every panel */
        wg_fence();
        {
            const Desc dob = desc_sw128(sdO, C::Q_PANEL, 1024), dqb = desc_sw128(sQ, C::Q_PANEL, 1024);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) Wgmma<T, D>::rs(dv, pa[kk], desc_at(dob, kk * 2048), 1);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) Wgmma<T, D>::rs(dk, da[kk], desc_at(dqb, kk * 2048), 1);
            wg_commit();
        }

        const uint32_t sdS = base + C::OFF_DS + (it & 1) * C::DS_TILE;
        if (DQ) {
            /* dS^T [key][query] for the dQ product */
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    st_shared_u32(sdS + kq_off(C::DS_PANEL, kl0 + 8 * hr, j, t4), da[j / 2][hr + 2 * (j % 2)]);
            fence_async_smem();
        }
        /* both warpgroups are here: tile it - 1 is done everywhere, so its stage takes the
           copy of tile it + 2 */
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (tid == 0 && it + 2 < niter) load_tile<C>(g, k, base, it + 2);

        if (DQ) {
            /* dQ block of this warpgroup: rows 64 mq.., columns 64 nd.. of the tile */
            constexpr int MQ = D == 64 ? 1 : 0, NDQ = D == 128 ? 1 : 0;
            const int mq = MQ * c, nd = NDQ * c;
            float dq[32];
#pragma unroll
            for (int i = 0; i < 32; i++) dq[i] = 0.f;
            wg_pin(dq);
            wg_fence();
            const Desc dsa = desc_sw128(sdS + mq * C::DS_PANEL, C::DS_PANEL, 1024);
            const Desc dkb = desc_sw128(sK + nd * C::KV_PANEL, C::KV_PANEL, 1024);
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                Wgmma<T, 64>::ss_t(dq, desc_at(dsa, kk * 2048), desc_at(dkb, kk * 2048), 1);
            wg_commit();
            wg_wait<0>();
            wg_pin(dq);
            wg_pin(dv);
            wg_pin(dk);
            wg_pin(pa);
            wg_pin(da);
            red_dq<D, 8>(a, (int64_t)h * a.ws_rows + k.wrow0 + i0, 64 * mq, 64 * nd, warp, g4, t4, dq);
        } else {
            wg_wait<0>();
            wg_pin(dv);
            wg_pin(dk);
            wg_pin(pa);
            wg_pin(da);
        }
    }
    store_dkv<T, C, ND>(a, k, base, sm, dk, dv, kl0, 0, t4);
#endif
}

/*
 * d 256: the dK/dV accumulators of 64 keys x 256 columns would take every register of one
 * warpgroup, so the block holds 64 keys and warpgroup c owns columns 128c .. 128c + 127 of
 * dK, dV and of the tile's dQ. The scores are split by product instead: warpgroup 0 computes
 * S^T = K Q^T and P^T (both to shared memory: 16-bit for the products, fp16 for the dS step),
 * warpgroup 1 dP^T = V dO^T and, from P^T, dS^T (to shared memory); then each warpgroup takes
 * its column half of dV += P^T dO, dK += dS^T Q and dQ = dS K, every operand from shared
 * memory. Three barriers per query tile (P^T ready, dS^T ready, the tile done); no softcap
 * (fa_sm90_bwd declines it: the sm80 kernel runs).
 */
template <typename T, typename C, bool DQ>
__global__ void __launch_bounds__(C::THREADS, 1) bwd_sm90_d256_kernel(const __grid_constant__ Sm90Args g) {
#ifdef FA_SM90A_DEVICE
    using namespace fa::sm90;
    constexpr int BM = C::BM, BN = C::BN, STAGES = C::STAGES;
    static_assert(C::D == 256 && BM == 64 && BN == 64, "the d 256 split");
    constexpr int NQ = BM / 8;
    const BwdArgs &a = g.a;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *const sm = smem_raw + (base - raw);
    const uint32_t sK = base + C::OFF_K, sV = base + C::OFF_V;
    const uint32_t sP = base + C::OFF_P, sPh = base + C::OFF_PH, sdS = base + C::OFF_DS;
    const uint32_t bar_kv = base + C::OFF_BAR, bar_full = bar_kv + 8;

    const int tid = threadIdx.x, c = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g4 = lane / 4, t4 = lane % 4;
    const Blk k(a, BN, BM);
    if (!k.valid()) return;
    const int niter = k.niter;

    start_block<C>(g, k, base);
    const bool kbad = nf_check_k<T, C, DQ>(k, base);

    /* this thread's keys kl0, kl0 + 8 (of the block's 64) in every accumulator */
    const int kl0 = 16 * warp + g4;
    float dk[64], dv[64];
#pragma unroll
    for (int i = 0; i < 64; i++) dk[i] = dv[i] = 0.f;

#pragma unroll 1
    for (int it = 0; it < niter; it++) {
        const int st = it % STAGES, h = k.tile_h(it), i0 = k.tile_i0(it, BM);
        /* every thread finished tile it - 1 (the barrier at the loop's end): its stage takes
           tile it + 1 (tiles 0 and 1 came with the prologue) */
        if (tid == 0 && it >= 1 && it + 1 < niter) load_tile<C>(g, k, base, it + 1);
        if (it == 0) mbar_wait(bar_kv, 0);
        mbar_wait(bar_full + 8 * st, (uint32_t)(it / STAGES) & 1u);
        const uint32_t sQ = base + C::OFF_Q + st * C::Q_TILE, sdO = base + C::OFF_DO + st * C::Q_TILE;
        const float *sL = (const float *)(sm + C::OFF_L) + st * BM;
        const float *sDd = (const float *)(sm + C::OFF_DD) + st * BM;

        /* warpgroup 0: S^T = K Q^T; 1: dP^T = V dO^T (16 k-steps over the four panels) */
        float sc[BM / 2];
#pragma unroll
        for (int i = 0; i < BM / 2; i++) sc[i] = 0.f;
        wg_pin(sc);
        wg_fence();
        issue_rows<T, C, BM>(sc, c == 0 ? sK : sV, c == 0 ? sQ : sdO);
        wg_wait<0>();
        wg_pin(sc);
        const bool full = i0 + BM <= k.s.sq &&
                          fa_range_holds(fa_rows_common(k.rk, i0, i0 + BM), k.j0, k.j0 + BN);
        if (c == 0) {
            const float slope = a.alibi ? a.alibi[k.b * a.alibi_sb + h] : 0.f;
            p_of_t<NQ>(sc, a, k, sL, i0, kl0, t4, slope, full && !a.alibi);
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const uint32_t off = kq_off(C::DS_PANEL, kl0 + 8 * hr, j, t4);
                    st_shared_u32(sP + off, pack2<T>(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
                    st_shared_u32(sPh + off, pack2<__half>(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
                }
            fence_async_smem();
        }
        asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* P^T is in shared memory */
        if (c == 1) {
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                const float2 dd = *(const float2 *)(sDd + 8 * j + 2 * t4);
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const uint32_t off = kq_off(C::DS_PANEL, kl0 + 8 * hr, j, t4);
                    const float2 p = unpack2<__half>(*(const uint32_t *)(sm + C::OFF_PH + off));
                    sc[4 * j + 2 * hr] = p.x * (sc[4 * j + 2 * hr] - dd.x);
                    sc[4 * j + 2 * hr + 1] = p.y * (sc[4 * j + 2 * hr + 1] - dd.y);
                }
            }
            if (!full) ds_mask_t<NQ>(sc, k, i0, kl0, t4);
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    st_shared_u32(sdS + kq_off(C::DS_PANEL, kl0 + 8 * hr, j, t4),
                                  pack2<T>(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
            fence_async_smem();
        }
        /* dS^T is in shared memory; masked specials (nf_hit): a tile with a mask edge votes
           in this barrier's place and repairs on a hit */
        bool nf = false;
        if (full) {
            asm volatile("bar.sync 1, 256;\n" ::: "memory");
        } else {
            nf = __syncthreads_or(kbad || nf_hit<C>(k, base, sL, sDd, i0));
            if (nf) nf_zero_tile<T, C, DQ>(k, base, sQ, sdO, i0);
        }

        /* this warpgroup's column half (panels 2c, 2c + 1) of dV += P^T dO and dK += dS^T Q
           (A K-major: k-step kk is queries 16kk.., 32 bytes into the rows; B MN-major: query
           rows 16kk..), then of dQ = dS K (A = dS^T and B = K MN-major: keys 16kk..) */
        wg_fence();
        {
            const Desc pa_ = desc_sw128(sP, 16, 1024), sa_ = desc_sw128(sdS, 16, 1024);
            const Desc dob = desc_sw128(sdO + 2 * c * C::Q_PANEL, C::Q_PANEL, 1024);
            const Desc dqb = desc_sw128(sQ + 2 * c * C::Q_PANEL, C::Q_PANEL, 1024);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                Wgmma<T, 128>::ss_bt(dv, desc_at(pa_, kk * 32), desc_at(dob, kk * 2048), 1);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                Wgmma<T, 128>::ss_bt(dk, desc_at(sa_, kk * 32), desc_at(dqb, kk * 2048), 1);
            wg_commit();
        }
        if (DQ) {
            float dq[64];
#pragma unroll
            for (int i = 0; i < 64; i++) dq[i] = 0.f;
            wg_pin(dq);
            wg_fence();
            const Desc dsa = desc_sw128(sdS, C::DS_PANEL, 1024);
            const Desc dkb = desc_sw128(sK + 2 * c * C::KV_PANEL, C::KV_PANEL, 1024);
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                Wgmma<T, 128>::ss_t(dq, desc_at(dsa, kk * 2048), desc_at(dkb, kk * 2048), 1);
            wg_commit();
            wg_wait<0>();
            wg_pin(dq);
            wg_pin(dv);
            wg_pin(dk);
            red_dq<256, 16>(a, (int64_t)h * a.ws_rows + k.wrow0 + i0, 0, 128 * c, warp, g4, t4, dq);
        } else {
            wg_wait<0>();
            wg_pin(dv);
            wg_pin(dk);
        }
        asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* the tile is done everywhere */
        if (DQ && nf) nf_restore_k<T, C>(a, k, base);
    }
    nf_apply_dv<C, 16>(dv, base, kl0, 128 * c, t4);
    store_dkv<T, C, 16>(a, k, base, sm, dk, dv, kl0, 128 * c, t4);
#endif
}

/* Host side (bwd_sm90.cu). Whether the kernel has p's head dim; why it cannot take p on this
   GPU (NULL: it can, and g's maps and *bm, its query tile, are set); its launch for g.a. */
int sm90_bwd_covers(const fa_problem *p);
const char *sm90_bwd_prepare(const fa_problem *p, const fa_cuda_launch *l, Sm90Args *g, int *bm);
cudaError_t run_sm90_main(const Sm90Args &g, fa_dtype dt, bool det, cudaStream_t st);

} // namespace bwd
} // namespace fa

#endif
