/*
 * cuda/bwd_sm80.cuh — what the backward's host side and its kernels share: the flattened
 * arguments, the tile configurations per head dim, and the launch plan (workspace layout,
 * GQA split). Kernels live in bwd_sm80_main.cuh (dK, dV and atomic dQ), bwd_sm80_dq.cuh
 * (deterministic dQ) and bwd_sm80_aux.cu (pre/post passes); the design is described at the top
 * of bwd_sm80.cu.
 */
#ifndef FA_CUDA_BWD_SM80_CUH
#define FA_CUDA_BWD_SM80_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "dropout_sm80.cuh"
#include "kernels.h"
#include "masked_specials.cuh"

namespace fa {
namespace bwd {

constexpr float kLog2e = 1.4426950408889634f;
/* Query rows of the workspace's per-row arrays are padded so that every sequence owns whole
   tiles of this many rows (the largest query tile of any configuration). */
constexpr int kRowPad = 128;
/* Varlen: sequence b's rows start at round_up4(cu_q[b]) + b * kVarlenGap, which leaves every
   sequence kRowPad rows of slack and keeps row starts 16-byte aligned. */
constexpr int kVarlenGap = kRowPad + 4;

/* Everything the kernels read, flattened from fa_problem (kernel parameters live in constant
   memory, so unused fields cost nothing). */
struct BwdArgs {
    const void *q, *k, *v, *o, *dout;
    void *dq, *dk, *dv;
    const float *lse;
    int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, o_sb, o_st, o_sh;
    int64_t do_sb, do_st, do_sh, dq_sb, dq_st, dq_sh, dk_sb, dk_st, dk_sh, dv_sb, dv_st, dv_sh;
    int64_t lse_sb, lse_sh, lse_st;
    const int *cu_q, *cu_k;
    int batch, heads_q, heads_kv, group, d;
    int seqlen_q, seqlen_k; /* lengths (BSHD) or maxima (varlen) */
    int win_left, win_right; /* normalised (rows.h); -1: unbounded */
    float scale, scale_log2;
    float softcap, softcap_inv; /* softcap_inv = 1 / softcap; 0 when off */
    const float *alibi;
    int64_t alibi_sb;

    /* workspace (see bwd_sm80.cu) */
    float *dsum;    /* [heads_q][ws_rows]: D_i = rowsum(dO * O) */
    float *lse2;    /* [heads_q][ws_rows]: LSE * log2(e); +inf for rows without keys / padding */
    float *dq_acc;  /* [heads_q][ws_rows][D] fp32 dQ (unscaled, 8x8-blocked); NULL in
                       deterministic mode */
    float *dk_part; /* [nsplit][heads_kv][kv_rows][D] fp32 partial dK (scaled); NULL if nsplit 1 */
    float *dv_part;
    int64_t ws_rows, kv_rows;
    int sq_pad;     /* BSHD: seqlen_q rounded up to kRowPad */
    int nsplit;     /* query-head groups of a kv head handled by separate blocks */
    int heads_per_split;
    DropArgs drop;  /* read by the dropout kernels only (Plan::drop) */
};

/* Sequence b: first token and length of its queries and keys; bq/bk multiply the batch
   strides (0 for varlen, whose operands have sb = 0 and global token indices). */
struct Seq {
    int q0, sq, k0, sk;
    int64_t bq, bk;
};

__device__ __forceinline__ Seq seq_of(const BwdArgs &a, int b) {
    Seq s;
    if (a.cu_q) {
        s.q0 = a.cu_q[b];
        s.sq = a.cu_q[b + 1] - s.q0;
        s.k0 = a.cu_k[b];
        s.sk = a.cu_k[b + 1] - s.k0;
        s.bq = s.bk = 0;
    } else {
        s.q0 = s.k0 = 0;
        s.sq = a.seqlen_q;
        s.sk = a.seqlen_k;
        s.bq = s.bk = b;
    }
    return s;
}

/* Row of the workspace's per-row arrays where sequence b's query row 0 lives (per head). */
__device__ __forceinline__ int64_t ws_row0(const BwdArgs &a, int b, int q0) {
    return a.cu_q ? (int64_t)((q0 + 3) & ~3) + (int64_t)b * kVarlenGap : (int64_t)b * a.sq_pad;
}
/* Row of the dK/dV partials where sequence b's key 0 lives (per kv head). */
__device__ __forceinline__ int64_t kv_row0(const BwdArgs &a, int b, int k0) {
    return a.cu_k ? (int64_t)k0 : (int64_t)b * a.seqlen_k;
}

/* The mask of sequence s (rows.h, the one rule): row i sees keys [fa_rows_lo, fa_rows_hi). */
__device__ __forceinline__ fa_rows rows_of(const BwdArgs &a, const Seq &s) {
    return fa_rows_of(s.sq, s.sk, a.win_left, a.win_right);
}

/*
 * A configuration of the dK/dV kernel: BM query rows per inner step, BN keys per block, 8
 * warps. Each of its three products has its own warp grid:
 *   S, dP (BM x BN, k = D):   SWM x (8 / SWM) warps, SSPLIT column slices per warp
 *   dK, dV (BN x D, k = BM):  KWN x (8 / KWN) warps
 *   dQ (BM x D, k = BN):      QWM x (8 / QWM) warps, QPN n8 tiles per pass
 * DB: Q and dO are double-buffered (the next query tile loads during this one's math).
 */
template <int D_, int BM_, int BN_, int SWM_, int KWN_, int QWM_, bool DB_, int SSPLIT_ = 1>
struct MainCfg {
    static constexpr int D = D_, BM = BM_, BN = BN_;
    static constexpr int NW = 8, THREADS = NW * 32;
    static constexpr bool DB = DB_;

    static constexpr int SWM = SWM_, SWN = NW / SWM_;
    static constexpr int STM = BM / SWM, STN = BN / SWN;
    static constexpr int S_MT = STM / 16, S_NT = STN / 8;
    /* S and dP are computed in SSPLIT column slices of the warp tile (fewer live registers,
       at the price of reloading the Q and dO fragments per slice) */
    static constexpr int SSPLIT = SSPLIT_, S_NTS = S_NT / SSPLIT_;

    static constexpr int KWN = KWN_, KWD = NW / KWN_;
    static constexpr int KTM = BN / KWN, KTN = D / KWD;
    static constexpr int K_MT = KTM / 16, K_NT = KTN / 8;

    static constexpr int QWM = QWM_, QWD = NW / QWM_;
    static constexpr int QTM = BM / QWM, QTN = D / QWD;
    static constexpr int Q_MT = QTM / 16, Q_NT = QTN / 8;
    static constexpr int QPN = Q_NT % 4 == 0 ? 4 : Q_NT; /* n8 tiles per dQ pass */

    /* shared memory: rows padded by 16 bytes (bwd_sm80_tile.cuh) */
    static constexpr int LD_D = D + 8, LD_N = BN + 8;
    static constexpr int NBUF = DB ? 2 : 1;
    static constexpr size_t SZ_KV = (size_t)BN * LD_D * 2, SZ_Q = (size_t)BM * LD_D * 2;
    static constexpr size_t SZ_P = (size_t)BM * LD_N * 2;
    static constexpr size_t OFF_K = 0, OFF_V = SZ_KV, OFF_Q = 2 * SZ_KV;
    static constexpr size_t OFF_DO = OFF_Q + NBUF * SZ_Q;
    static constexpr size_t OFF_P = OFF_DO + NBUF * SZ_Q, OFF_DS = OFF_P + SZ_P;
    static constexpr size_t OFF_L = OFF_DS + SZ_P, OFF_D = OFF_L + NBUF * BM * 4;
    /* masked specials (masked_specials.cuh): dV's table, then a word */
    static constexpr size_t OFF_NF = OFF_D + NBUF * BM * 4;
    static constexpr size_t OFF_NFK = OFF_NF + NfTable<BN, D>::BYTES;
    static constexpr size_t SMEM = OFF_NFK + 16;

    static_assert(SWM * SWN == NW && KWN * KWD == NW && QWM * QWD == NW, "warp grids");
    static_assert(STM % 16 == 0 && STN % 16 == 0, "S warp tile: m16 rows, pairs of n8 tiles");
    static_assert(S_NT % SSPLIT == 0 && S_NTS % 2 == 0, "S slices: pairs of n8 tiles");
    static_assert(KTM % 16 == 0 && KTN % 16 == 0, "dK/dV warp tile");
    static_assert(QTM % 16 == 0 && QTN % 16 == 0 && Q_NT % QPN == 0 && QPN % 2 == 0, "dQ tile");
    static_assert(BM % 16 == 0 && BN % 16 == 0 && D % 16 == 0, "k16 steps");
    static_assert(kRowPad % BM == 0, "query tiles never cross the workspace row padding");
};

/* The deterministic dQ kernel: 4 warps of 16 query rows, key tiles of BN (double-buffered). */
template <int D_, int BN_> struct DqCfg {
    static constexpr int D = D_, BM = 64, BN = BN_;
    static constexpr int NW = 4, THREADS = NW * 32;
    static constexpr int NT = BN / 8, DT = D / 8;
    static constexpr int LD_D = D + 8;
    static constexpr size_t SZ_Q = (size_t)BM * LD_D * 2, SZ_KV = (size_t)BN * LD_D * 2;
    static constexpr size_t OFF_Q = 0, OFF_DO = SZ_Q, OFF_K = 2 * SZ_Q;
    static constexpr size_t OFF_V = OFF_K + 2 * SZ_KV, OFF_L = OFF_V + 2 * SZ_KV;
    static constexpr size_t OFF_D = OFF_L + BM * 4;
    static constexpr size_t SMEM = OFF_D + BM * 4;
    static_assert(BN % 16 == 0 && D % 16 == 0, "k16 steps");
    static_assert(kRowPad % BM == 0, "query tiles never cross the workspace row padding");
};

/*
 * Per kernel head dim: Big is tuned for sm_90 (227 KB of shared memory per block), Mid for
 * sm_80 (163 KB), Small for sm_86/89/120 (99 KB); the first that fits the device's opt-in
 * limit runs (shared memory sizes in the comments). Dq / DqSmall likewise for the
 * deterministic dQ kernel.
 */
template <int D> struct Tiles;
template <> struct Tiles<32> {
    using Big = MainCfg<32, 128, 128, 4, 4, 4, true>; /* 131 KB */
    using Mid = Big;
    using Small = MainCfg<32, 64, 64, 2, 4, 4, true>; /* 50 KB */
    using Dq = DqCfg<32, 64>;
    using DqSmall = Dq;
};
template <> struct Tiles<64> {
    using Big = MainCfg<64, 128, 128, 4, 4, 4, true, 2>;  /* 180 KB */
    using Mid = MainCfg<64, 128, 128, 4, 4, 4, false, 2>; /* 143 KB */
    using Small = MainCfg<64, 64, 64, 2, 4, 4, true>;  /* 74 KB */
    using Dq = DqCfg<64, 64>;
    using DqSmall = Dq;
};
template <> struct Tiles<96> {
    using Big = MainCfg<96, 64, 128, 2, 4, 4, true>; /* 142 KB */
    using Mid = Big;
    using Small = MainCfg<96, 64, 64, 2, 4, 4, true>; /* 98.5 KB */
    using Dq = DqCfg<96, 64>;
    using DqSmall = Dq;
};
template <> struct Tiles<128> {
    using Big = MainCfg<128, 64, 128, 2, 4, 2, true>;  /* 175 KB */
    using Mid = MainCfg<128, 64, 128, 2, 4, 2, false>; /* 141 KB */
    using Small = MainCfg<128, 64, 64, 2, 2, 2, false>; /* 89 KB */
    using Dq = DqCfg<128, 64>;
    using DqSmall = DqCfg<128, 32>;
};
template <> struct Tiles<192> {
    using Big = MainCfg<192, 64, 64, 2, 2, 2, true>;  /* 172 KB */
    using Mid = MainCfg<192, 64, 64, 2, 2, 2, false>; /* 122 KB */
    using Small = MainCfg<192, 64, 32, 4, 2, 2, false>; /* 87 KB */
    using Dq = DqCfg<192, 32>;
    using DqSmall = DqCfg<192, 16>;
};
template <> struct Tiles<256> {
    using Big = MainCfg<256, 64, 64, 2, 2, 2, true>;  /* 221 KB */
    using Mid = MainCfg<256, 64, 64, 2, 2, 2, false>; /* 155 KB */
    using Small = Mid; /* nothing with 8 warps fits 99 KB: the plan refuses such GPUs */
    using Dq = DqCfg<256, 32>;
    using DqSmall = Dq;
};

/* Which configuration a launch uses, and the workspace it needs. */
struct Plan {
    int D;
    bool sm90;        /* the main kernel is the Hopper one (bwd_sm90.cuh): run_d<D> skips its own */
    bool drop;        /* dropout: the DROP instances of the main and dQ kernels */
    int cfg;          /* 0 Big, 1 Mid, 2 Small; -1: nothing fits the device */
    int bm, bn;       /* main kernel tiles */
    size_t smem;      /* main kernel dynamic shared memory */
    int dq_cfg;       /* 0 Dq, 1 DqSmall, -1: neither fits */
    size_t dq_smem;
    int nsplit, heads_per_split;
    int64_t ws_rows, kv_rows;
    int sq_pad;
    /* byte offsets into the (256-aligned) workspace */
    size_t off_dsum, off_lse2, off_dq, off_dk, off_dv, bytes;
};

/* Per head dim: queues the main kernel (unless plan.sm90) and, when deterministic, the dQ
   kernel for plan.cfg. Defined in bwd_sm80_d<D>.cu. */
#define FA_BWD_RUN_DECL(D)                                                                    \
    cudaError_t run_d##D(const BwdArgs &a, const Plan &pl, fa_dtype dt, bool det,             \
                         cudaStream_t st);
FA_BWD_RUN_DECL(32)
FA_BWD_RUN_DECL(64)
FA_BWD_RUN_DECL(96)
FA_BWD_RUN_DECL(128)
FA_BWD_RUN_DECL(192)
FA_BWD_RUN_DECL(256)
#undef FA_BWD_RUN_DECL

/* The pre/post passes (bwd_sm80_aux.cu). */
cudaError_t run_pre(const BwdArgs &a, const Plan &pl, fa_dtype dt, bool zero_dq, cudaStream_t st);
cudaError_t run_post_dq(const BwdArgs &a, const Plan &pl, fa_dtype dt, cudaStream_t st);
cudaError_t run_post_dkv(const BwdArgs &a, const Plan &pl, fa_dtype dt, cudaStream_t st);

} // namespace bwd
} // namespace fa

#endif
