/*
 * cuda/fwd_sm90.cuh — the Hopper forward (sm_90a), FlashAttention-3's structure in CUDA C with
 * inline PTX (wgmma.cuh). A persistent grid (one block per SM) loops over work tiles of BM
 * query rows of one (batch, head), tile_of's order, statically or through a counter.
 *
 *   warpgroup 0, the producer: one thread issues every load. Per work tile its Q (into one of
 *     NQ buffers), then its K and V tiles of BN keys into a ring of STAGES slots, by the copy
 *     engine (TMA, 128-byte swizzle, zero fill past the tensor's end), each completing on its
 *     `full` mbarrier; it waits on the matching `empty` mbarrier before refilling a buffer. It
 *     gives its registers away (setmaxnreg) and keeps REG_P.
 *   warpgroups 1 .. NC, the consumers: 64 query rows each. Per key tile:
 *       S = Q K^T      wgmma m64n{BN}k16, A and B from shared memory (K-major), D/16 k-steps
 *       mask / online softmax in registers (running max and sum; O rescaled only when the
 *                      max grows by more than 2^LAZY, FP8: whenever it grows), P to 16 bits
 *                      in the A-fragment layout (C-to-A identity, ptx.cuh)
 *       O += P V       wgmma m64n{D}k16, A from registers, B = V from shared memory (MN-major)
 *     S of key tile j + 1 is issued with P V of tile j (across work tiles too). At d 256 the
 *     softmax of j + 1 runs while the latter finishes (FENCED); at d 64/128 it runs after it,
 *     against the running max straight into P (exp_at_max), while the other consumers'
 *     products hold the tensor cores. K is released after S, V after P V.
 *     Schedule PINGPONG adds turns between the two consumers (tune_sm90.h's schedule_of
 *     picks it). O leaves through the finished tile's Q
 *     buffer and the copy engine where there are two Q buffers or more, else from the threads
 *     (`store`); with one Q buffer the last P V of a tile goes first and the next tile's Q is
 *     awaited under it (at d 256 while O is stored).
 *
 * It serves head dims 64, 128 and 256, fp16/bf16, BSHD and varlen, every mask (causal
 * bottom-right, windows), softcap, ALiBi, GQA; fa_sm90_fwd refuses everything else (other
 * head dims, strides the copy engine cannot take) with a reason, and the dispatcher then runs
 * the sm80 kernel and records why.
 *
 * Shared memory (1024-byte aligned pieces): a 128-byte-swizzled tile is rows of 128 bytes = 64
 * columns, so a tile of D columns is D / 64 "panels" of 64 columns:
 *   Q   [buffer][consumer][panel][64 rows][128 B]  D / 64 x 8 KB per consumer and buffer
 *   K   [stage][panel][BN keys][128 B]             D / 64 x BN x 128 B per stage
 *   V   [stage][panel][BN keys][128 B]             same
 *   mbarriers (Q full/empty per buffer, K and V full/empty per stage), the buffers' tiles
 * Tilings per head dim: tune_sm90.h's Tiles (fa_sm90_fwd picks the short or the long one).
 */
#ifndef FA_CUDA_FWD_SM90_CUH
#define FA_CUDA_FWD_SM90_CUH

#include <cuda.h>
#include <math.h>

#include "kernels.h"
#include "ptx.cuh"
#include "score_mods.cuh"
#include "trace_sm90.cuh"
#include "tune_sm90.h"
#include "vt_layout.h"
#include "wgmma.cuh"

namespace fa {
namespace sm90 {

/* rows of O per copy-engine store (the O map's box): a warp's 16, so that no warp waits for
   the others of its warpgroup before its rows leave (perf fwd_sm90 K7) */
constexpr int O_ROWS = 16;
/* a compile-time count as an argument (the product shapes and unrolled loops it sizes) */
template <int N> struct Int {
    static constexpr int value = N;
};
/* in a tile slot beside the tile's index (< 2^30): the tile sees no key, so the hand-over
   knows whether to start its first S before working the tile out */
constexpr int NO_KEYS = 1 << 30;

/* NQ Q buffers: with 2 or more, the next tile's Q arrives while this one's products run (with
   3 it is asked for at the tile's first K/V, as no O copy still holds its buffer). NC consumer
   warpgroups of 64 query rows each (a work tile is BM = 64 NC rows); the producer keeps
   REG_P registers and the consumers take the rest (setmaxnreg). */
template <int D_, int BN_, int STAGES_, int NQ_, int NC_, int REG_P_, int E_> struct Cfg {
    /* E bytes per input element: a 128-byte swizzled row holds COLS = 128 / E columns */
    static constexpr int E = E_, COLS = 128 / E;
    static constexpr int D = D_, BN = BN_, STAGES = STAGES_, NQ = NQ_, PANELS = D * E / 128;
    static constexpr int NC = NC_, BM = 64 * NC, THREADS = 128 * (NC + 1), CTHREADS = 128 * NC;
    static constexpr bool ALIGN_END = true; /* tile_of: blocks end at a sequence's last row */
    /* setmaxnreg moves registers within the block's launch allocation (THREADS x what
       ptxas gives a thread at launch: a multiple of 8 that fits 64K): the producer's release
       has to cover the consumers' raise, else the raise waits for ever (perf fwd_sm90 K2) */
    static constexpr int REG_P = REG_P_, REG_LAUNCH = 65536 / THREADS / 8 * 8;
    static constexpr int REG_C = (REG_LAUNCH * THREADS / 128 - REG_P) / NC / 8 * 8;
    static constexpr uint32_t Q_PANEL = 64 * 128, Q_WG = PANELS * Q_PANEL; /* bytes */
    static constexpr uint32_t KV_PANEL = BN * 128, KV_TILE = PANELS * KV_PANEL;
    /* FP8: V^T per stage, [BN / 128 panels][D rows][128 keys] (K-major, as the FP8 product
       needs its B operand), written by the producer's warps 1..3 from the stage's V */
    static constexpr uint32_t VT_PANEL = D * 128, VT_TILE = E == 1 ? BN * D : 0;
    static constexpr uint32_t OFF_K = NQ * NC * Q_WG, OFF_V = OFF_K + STAGES * KV_TILE;
    static constexpr uint32_t OFF_VT = OFF_V + STAGES * KV_TILE;
    static constexpr uint32_t OFF_BAR = OFF_VT + STAGES * VT_TILE;
    /* mbarriers: Q full/empty per buffer, K/V full/empty per stage, FP8: V^T full per stage */
    static constexpr uint32_t OFF_TILE = OFF_BAR + 8 * (2 * NQ + 4 * STAGES + (E == 1 ? STAGES : 0));
    static constexpr uint32_t OFF_STOP = OFF_TILE + 4 * NQ; /* FP8: the transposers' last position */
    static constexpr size_t SMEM = OFF_STOP + 4 + 1024; /* + aligning */
    static_assert(D * E % 128 == 0 && BN % 16 == 0 && KV_PANEL % 1024 == 0, "1024-byte tiles");
    static_assert(E == 2 || (E == 1 && BN % 128 == 0), "FP8: V^T rows of 128-key panels");
};
/* Division by a launch constant d (1 <= d < 2^31) of n in [0, 2^31) as a multiply-high and a
   shift (the round-up method: l = ceil(log2 d), m = 2^32 (2^l - d) / d + 1, n / d =
   (umulhi(n, m) + n) >> l): tile_of runs at every hand-over, and its divisions would take
   MUFU.RCP slots from the softmax's exponentials and a few hundred cycles of latency. */
struct FastDiv {
    uint32_t d, m, l;
    static FastDiv of(uint32_t d) {
        if (d == 0) d = 1; /* an empty launch's (never divided by) */
        uint32_t l = 0;
        while ((1ull << l) < d) l++;
        return FastDiv{d, (uint32_t)((((1ull << l) - d) << 32) / d + 1), l};
    }
    __device__ __forceinline__ int div(int n) const {
        return (int)((__umulhi((uint32_t)n, m) + (uint32_t)n) >> l);
    }
};

struct Args {
    CUtensorMap tq, tk, tv; /* (d, head, token, batch); boxes (64, 1, rows, 1): Q 64, K/V BN */
    CUtensorMap to;         /* O, boxes of O_ROWS rows; used when o_tma */
    void *o;
    float *lse;
    int64_t o_sb, o_st, o_sh, lse_sb, lse_sh, lse_st;
    const int *cu_q, *cu_k; /* varlen: token offsets (the maps then span all tokens, batch 1) */
    int seqlen_q, seqlen_k, group;
    int heads, batch, mblocks, tiles, group_hb; /* work tiles: tile_of */
    FastDiv div_group, div_heads, div_gsz, div_gsz_last; /* by per group, heads, group sizes */
    int *counter; /* persistent grid, dynamic order: the next tile to take (zero at the
                     start of a call, and left zero: next_tile) */
    /* m before the two below: after them ptxas spills more in d 64's long tiling (perf fwd_sm90
       K13) */
    ScoreMods m; /* windows (causal: right window 0, bottom-right), scale, softcap, ALiBi */
    int o_tma;    /* O leaves through the tile's Q buffer and the copy engine (NQ >= 2) */
    float lazy;   /* LAZY, passed at launch: as a compile-time constant ptxas spills at d 64
                     (perf fwd_sm90 K13) */
    /* FP8: descales per (batch, kv head) at [b * ds_sb + hk] (NULL: 1); see fa_params */
    const float *q_descale, *k_descale, *v_descale;
    int64_t ds_sb;
};

/* FP8's descale (b, hk) of ds (1 for none) */
__device__ __forceinline__ float descale_at(const float *ds, int64_t sb, int b, int hk) {
    return ds ? ds[(int64_t)b * sb + hk] : 1.f;
}

/* Probabilities p0, p1 of n8 tile j of S (row half hr) into P's A fragments: 16 bits a value
   (k16 steps: n8 tiles 2 kk, 2 kk + 1, the C-to-A identity), or e4m3 (k32 steps: n8 tiles
   4 kk .. 4 kk + 3). The e4m3 A fragment wants columns 4 t4 .. + 3 (and 16 + 4 t4 ..) of a
   32-key step where the accumulator holds 2 t4, 2 t4 + 1, 8 + 2 t4, 9 + 2 t4 (and + 16):
   rather than moving bytes between threads, each thread's values go in as they are, so A's
   column c holds key fa_perm_key(c) (vt_layout.h), and V^T's column c is written from V's
   row fa_perm_key(c) by the transposers: P V sums over keys in either order. */
template <typename T> struct PutP {
    template <int KP>
    __device__ __forceinline__ static void put(uint32_t (&pa)[KP][4], int j, int hr, float p0, float p1) {
        pa[j / 2][hr + 2 * (j % 2)] = pack2<T>(p0, p1);
    }
};
template <> struct PutP<__nv_fp8_e4m3> {
    template <int KP>
    __device__ __forceinline__ static void put(uint32_t (&pa)[KP][4], int j, int hr, float p0, float p1) {
        const uint32_t v = __nv_cvt_float2_to_fp8x2(make_float2(p0, p1), __NV_SATFINITE, __NV_E4M3);
        uint32_t &r = pa[j / 4][hr + 2 * ((j % 4) / 2)];
        r = j % 2 ? (r & 0xffffu) | (v << 16) : v;
    }
};

/* The work tile a block takes after t: the grid's stride (static), or the next of the counter
   (dynamic). A call's draws from the counter are 0 .. tiles - 1 exactly: every block stops at
   its first draw past the tiles (grid draws) and the others took a tile each (tiles - grid).
   So the draw of tiles - 1 is the call's last, and it sets the counter back to zero for the
   next call, which then needs no memset and its launch gap (perf fwd_sm90 K12). */
__device__ __forceinline__ int next_tile(const Args &a, int t) {
    if (!a.counter) return t + (int)gridDim.x;
    const int v = atomicAdd(a.counter, 1);
    if (v == a.tiles - 1) *a.counter = 0;
    return v + (int)gridDim.x;
}

/* One work tile: query block m of head h in sequence b, and the key tiles it visits. */
struct Tile {
    int h, b, bt, bo;  /* head, sequence; the maps' batch coordinate, o's and lse's batch */
    int q0, k0, sq, sk; /* the sequence's first query and key tokens (varlen) and lengths */
    int row0, diag;     /* first query row; sk - sq (masks align bottom-right) */
    int t_first, ntiles; /* key tiles t_first .. t_first + ntiles - 1 */
    fa_range every;      /* the keys every row of the block sees (rows.h) */
};

/* What storing a tile's output needs of it. */
struct Out {
    int row0, sq, q0, bo, h;
};
__device__ __forceinline__ Out out_of(const Tile &w) { return Out{w.row0, w.sq, w.q0, w.bo, w.h}; }

/* The key tile that a work tile of key tiles t_first .. t_first + ntiles - 1 visits it-th:
   from the first to the last, so that under a causal mask the diagonal (masked) ones come at
   the end of the key loop, where their masks run beside the products, and the hand-over's
   first softmax, which nothing overlaps, is an unmasked one (perf fwd_sm90 K1) */
__device__ __forceinline__ int key_tile(int t_first, int ntiles, int it) {
    return t_first + it;
}

/* The mask of tile w's sequence (rows.h, the one rule): a block visits the key tiles some of
   its rows see, never loading the others, and masks per element only tiles that not every row
   sees whole. lo_of, hi_of: the key range [lo(i), hi(i)) of query row i. */
__device__ __forceinline__ fa_rows rows_of(const Args &a, const Tile &w) {
    return fa_rows_of(w.sq, w.sk, a.m.win_left, a.m.win_right);
}
__device__ __forceinline__ int lo_of(const Args &a, const Tile &w, int i) {
    return fa_rows_lo(rows_of(a, w), i);
}
__device__ __forceinline__ int hi_of(const Args &a, const Tile &w, int i) {
    return fa_rows_hi(rows_of(a, w), i);
}

/* Scores of keys outside the ranges of rows r_lo and r_lo + 8 (past the sequence included)
   to -inf: a thread's part of key tile kcol0 in the m16n8 C layout (n8 tile j: columns
   8 j + 2 t4 + 0/1 of row r_lo in [4 j], [4 j + 1], of row r_lo + 8 in [4 j + 2], [4 j + 3]) */
template <int NR>
__device__ __forceinline__ void mask_rows(float (&sc)[NR], const Args &a, const Tile &w, int kcol0,
                                          int r_lo, int t4) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = r_lo + 8 * hr;
        const int lo = lo_of(a, w, row) - kcol0 - 2 * t4;
        const int hi = hi_of(a, w, row) - kcol0 - 2 * t4;
#pragma unroll
        for (int j = 0; j < NR / 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (8 * j + e < lo || 8 * j + e >= hi) sc[4 * j + 2 * hr + e] = -INFINITY;
    }
}

/* The ring's mbarriers from bar_q on, 8 bytes each: per Q buffer full (one arrival: the
   producer's, with the copies' bytes) and empty (the consumers' threads), then per stage K
   full, V full, K empty, V empty. One thread, before mbar_init_fence. */
template <int NQ, int STAGES, int CTHREADS> __device__ __forceinline__ void init_ring(uint32_t bar_q) {
    const uint32_t bar_qempty = bar_q + 8 * NQ, bar_kfull = bar_qempty + 8 * NQ;
    const uint32_t bar_vfull = bar_kfull + 8 * STAGES, bar_kempty = bar_vfull + 8 * STAGES;
    const uint32_t bar_vempty = bar_kempty + 8 * STAGES;
    for (int q = 0; q < NQ; q++) {
        mbar_init(bar_q + 8 * q, 1);
        mbar_init(bar_qempty + 8 * q, CTHREADS);
    }
    for (int s = 0; s < STAGES; s++) {
        mbar_init(bar_kfull + 8 * s, 1);
        mbar_init(bar_vfull + 8 * s, 1);
        mbar_init(bar_kempty + 8 * s, CTHREADS);
        mbar_init(bar_vempty + 8 * s, CTHREADS);
    }
}

/* O (m16n8 C layout: [4 j], [4 j + 1] of row g, [4 j + 2], [4 j + 3] of row g + 8) times each
   row's alpha */
template <int N> __device__ __forceinline__ void rescale_o(float (&o)[N], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < N / 4; j++) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
    }
}

/*
 * Tile t of the launch. The order: (batch, head) pairs in groups of a.group_hb whose K and V
 * fit in the L2 together; in a group, query blocks from the last (the longest under a causal
 * mask) to the first, and per block the group's pairs. Blocks taken in this order (by the
 * hardware, or in strides of the grid by the persistent launch) share K/V through the L2 and
 * start with the longest work. False: the block lies past its (varlen) sequence.
 */
template <typename C>
__device__ __forceinline__ bool tile_of(const Args &a, int t, Tile &w) {
    constexpr int BM = C::BM, BN = C::BN;
    const int grp = a.div_group.div(t), r = t - grp * (int)a.div_group.d;
    const bool last = (grp + 1) * a.group_hb >= a.heads * a.batch; /* it may be smaller */
    const FastDiv &by_gsz = last ? a.div_gsz_last : a.div_gsz;
    const int rq = by_gsz.div(r);
    const int m_block = a.mblocks - 1 - rq, hb = grp * a.group_hb + (r - rq * (int)by_gsz.d);
    w.b = a.div_heads.div(hb);
    w.h = hb - w.b * a.heads;
    w.q0 = 0, w.k0 = 0, w.sq = a.seqlen_q, w.sk = a.seqlen_k, w.bt = w.b, w.bo = w.b;
    if (a.cu_q) {
        w.q0 = a.cu_q[w.b];
        w.sq = a.cu_q[w.b + 1] - w.q0;
        w.k0 = a.cu_k[w.b];
        w.sk = a.cu_k[w.b + 1] - w.k0;
        w.bt = w.bo = 0;
    }
    w.diag = w.sk - w.sq;
    /* align_end: the blocks end at the sequence's last row, so that where BM does not divide
       it (d 64's 192 rows at every power of two) the partial block is the first, the shortest
       under a causal mask, not the last, the longest; its rows before the sequence (zero Q)
       are computed and never stored */
    const int nb = (w.sq + BM - 1) / BM;
    if (m_block >= nb) return false;
    w.row0 = m_block * BM - (C::ALIGN_END ? nb * BM - w.sq : 0);
    const int row_end = min(w.row0 + BM, w.sq);
    const fa_range kt = fa_range_tiles(fa_rows_union(rows_of(a, w), w.row0, row_end), BN);
    w.every = fa_rows_common(rows_of(a, w), w.row0, row_end);
    w.t_first = kt.lo;
    w.ntiles = kt.hi - kt.lo;
    return true;
}

/* FP8: the V tile at sv (BN keys x D columns, 128-byte swizzled panels of 128 columns, as
   the copy engine lands it) into V^T at svt (D rows x BN keys, panels of 128 keys, same
   swizzle), key columns in fa_perm_key's order per 32-key step. Warp i / 32 of the 3
   transposers takes every third block of 32 keys x 16 columns, each lane a 4 x 4 byte block:
   four 32-bit words of four keys' rows, transposed by byte permutes, written as four words of
   four V^T rows, in the order vt_layout.h gives, in which no load or store of the warp has a
   bank conflict. The items are unrolled with the block index a template constant, so each
   access is the lane's offset XOR a constant plus an immediate (vt_layout.h's kernel form):
   the address arithmetic of the general form was 185 instructions an item and made the
   transposers the kernel's limit (fp8.md T3). */
template <typename C, int BLK>
__device__ __forceinline__ void transpose_from(const uint32_t (&ld)[4], const uint32_t (&st)[4], bool r, bool s) {
    constexpr uint32_t LX = fa_vt_ld_xor(BLK, C::BN), LA = fa_vt_ld_add(BLK, C::BN, C::KV_PANEL);
    constexpr uint32_t SX = fa_vt_st_xor(BLK, C::BN), SA = fa_vt_st_add(BLK, C::BN, C::VT_PANEL);
    uint32_t v[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        asm volatile("ld.shared.u32 %0, [%1+%2];\n" : "=r"(v[q]) : "r"(ld[q] ^ LX), "n"(LA) : "memory");
    /* w[k]: the V row of the item's key k (load q read key (q + r) % 4) */
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = r ? v[(k + 3) & 3] : v[k];
    /* out[x] = byte x of w[0..3]: V^T row n + x */
    const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
    const uint32_t out[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                             __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
    for (int j = 0; j < 4; j++) /* store j: row n + (j ^ s), s 0 or 2 */
        asm volatile("st.shared.u32 [%0+%1], %2;\n" ::"r"(st[j] ^ SX), "n"(SA), "r"(s ? out[j ^ 2] : out[j])
                     : "memory");
    constexpr int BLOCKS = 8 * (C::BN / 32); /* one 128-column panel of V */
    if constexpr (BLK + 3 < BLOCKS) transpose_from<C, BLK + 3>(ld, st, r, s);
}
template <typename C> __device__ __forceinline__ void transpose_v(uint32_t sv, uint32_t svt, int i) {
    static_assert(C::E != 1 || (C::BN % 128 == 0 && C::OFF_V % 1024 == 0 && C::KV_TILE % 1024 == 0 &&
                                C::OFF_VT % 1024 == 0 && C::VT_TILE % 1024 == 0),
                  "the kernel form needs stage bases with bits 4..6 clear (vt_layout.h)");
    if constexpr (C::E != 1) return; /* 16-bit inputs: no transpose (never called) */
    const int lane = i % 32, warp = i / 32;
    const fa_vt_lane l = fa_vt_lane_of(lane);
    const bool r = lane % 8 >= 4, s = lane / 8 >= 2; /* fa_vt_item_of's r and s */
    /* per 128 columns of V (V^T rows), a loop: unrolled over d 256, ptxas kept every item's
       XORed base live and spilled them (448 bytes at d 256 against 20 at d 128) */
#pragma unroll 1
    for (int h = 0; h < C::D / 128; h++) {
        uint32_t ld[4], st[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            ld[q] = sv + h * C::KV_PANEL + l.ld[q], st[q] = svt + h * FA_VT_PANEL_ROWS + l.st[q];
        if (warp == 0)
            transpose_from<C, 0>(ld, st, r, s);
        else if (warp == 1)
            transpose_from<C, 1>(ld, st, r, s);
        else
            transpose_from<C, 2>(ld, st, r, s);
    }
}

/* T: the inputs' type (FP8: __nv_fp8_e4m3, with C::E 1); TO: O's (T for 16-bit inputs) */
template <typename T, typename C, int SCHED, typename TO = T>
__global__ void __launch_bounds__(C::THREADS, 1) fwd_sm90_kernel(const __grid_constant__ Args a) {
#ifdef FA_SM90A_DEVICE
    constexpr int D = C::D, BN = C::BN, STAGES = C::STAGES, NQ = C::NQ, PANELS = C::PANELS;
    constexpr int NC = C::NC, COLS = C::COLS;
    constexpr bool F8 = C::E == 1;
    /* k-steps of 32 bytes: of S (over D) and of P V (over BN), i.e. P's A fragments */
    constexpr int KS = D * C::E / 32, KP = BN * C::E / 32;
    constexpr uint32_t Q_PANEL = C::Q_PANEL, Q_WG = C::Q_WG, KV_PANEL = C::KV_PANEL;
    constexpr uint32_t KV_TILE = C::KV_TILE, OFF_K = C::OFF_K, OFF_V = C::OFF_V;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    /* mbarriers: per Q buffer full and empty; per stage K full, V full, K empty, V empty (a
       slot's K is released after S = Q K^T, its V after P V: in the overlapped schedules
       these are an iteration apart). Per Q buffer, the tile whose Q it holds (-1: none left). */
    const uint32_t bar_q = base + C::OFF_BAR, bar_qempty = bar_q + 8 * NQ;
    const uint32_t bar_kfull = bar_qempty + 8 * NQ, bar_vfull = bar_kfull + 8 * STAGES;
    const uint32_t bar_kempty = bar_vfull + 8 * STAGES, bar_vempty = bar_kempty + 8 * STAGES;
    const uint32_t tile_slot = base + C::OFF_TILE;
    /* FP8: per stage V^T full (the transposers' 96 threads); the consumers' V wait is on it */
    const uint32_t bar_vtfull = bar_vempty + 8 * STAGES, stop_slot = base + C::OFF_STOP;
    const uint32_t bar_vready = F8 ? bar_vtfull : bar_vfull;
#ifdef FA_SM90_WATCHDOG
    if (blockIdx.x == 0 && threadIdx.x == 0)
        printf("watchdog: d %d bn %d nq %d nc %d: q full at %u, q empty %u, k full %u, v full %u, "
               "k empty %u, v empty %u (8 bytes each)\n", D, BN, NQ, NC, bar_q, bar_qempty,
               bar_kfull, bar_vfull, bar_kempty, bar_vempty);
#endif
    const int tid = threadIdx.x, wg = tid / 128;

    if (tid == 0) {
        init_ring<NQ, STAGES, C::CTHREADS>(bar_q);
        if (F8) {
            for (int s = 0; s < STAGES; s++) mbar_init(bar_vtfull + 8 * s, 96);
            st_shared_s32(stop_slot, -1);
        }
        mbar_init_fence();
    }
    __syncthreads();
    Tile w;
    Tracer tr;

    /* ---- the producer takes the tiles: the block's first is its index, then the grid's
       stride (static) or the next of a counter (dynamic: blocks that finish early take
       more). Per tile it loads the K/V tiles from the first to the last (key_tile: the
       diagonal one under a causal mask last) through the ring, whose position (`ring`) runs on
       across tiles, and, once both consumers are done with the next Q buffer's previous
       tile, writes the next tile's index beside that buffer and loads its Q (load_q). ---- */
    if (wg == 0) {
        regs_dec<C::REG_P>();
        tr.init(0, tid == 0);
        /* FP8: warps 1..3 transpose each V tile the copy engine lands into the stage's V^T,
           in ring order, until the position the loader marks as the end (stop_slot) */
        if (F8 && tid >= 32) {
#pragma unroll 1
            for (int pos = 0;; pos++) {
                const int s = pos % STAGES;
                mbar_wait(bar_vfull + 8 * s, (uint32_t)(pos / STAGES) & 1u);
                if (ld_shared_s32(stop_slot) == pos) break;
                transpose_v<C>(base + OFF_V + s * KV_TILE, base + C::OFF_VT + s * C::VT_TILE, tid - 32);
                fence_async_smem(); /* the generic-proxy writes, visible to the products */
                mbar_arrive(bar_vtfull + 8 * s);
            }
            return;
        }
        if (tid == 0) {
            int pos = 0, tc = 0, t = blockIdx.x; /* the ring position (key tiles so far) */
            /* the Q of the tile-th work tile (t, w: false when none is left) into buffer tc % NQ,
               once the consumers have given it back */
            auto load_q = [&](int tc, int t, const Tile &w) {
                const int qb = tc % NQ;
                mbar_wait(bar_qempty + 8 * qb, ((uint32_t)(tc / NQ) & 1u) ^ 1u); /* fresh: 1 */
                tr(TR_P_Q, tc);
                st_shared_s32(tile_slot + 4 * qb, t >= a.tiles ? -1 : w.ntiles ? t : t | NO_KEYS);
                if (t >= a.tiles) {
                    mbar_arrive(bar_q + 8 * qb);
                    return;
                }
                mbar_expect_tx(bar_q + 8 * qb, NC * Q_WG);
#pragma unroll 1
                for (int c = 0; c < NC; c++)
#pragma unroll 1
                    for (int x = 0; x < PANELS; x++)
                        tma_load4(base + (qb * NC + c) * Q_WG + x * Q_PANEL, &a.tq, bar_q + 8 * qb,
                                  x * COLS, w.h, w.q0 + w.row0 + 64 * c, w.bt);
            };
            auto find = [&](int t, Tile &x) {
                while (t < a.tiles && !tile_of<C>(a, t, x)) t = next_tile(a, t);
                return t;
            };
            /* key tile tok.. of kv head hk into ring position pos of the K (or V) ring at off,
               once the consumers have given its slot back */
            auto load_kv = [&](int pos, uint32_t off, uint32_t full, uint32_t empty,
                               const CUtensorMap *map, int hk, int tok, int bt) {
                const int s = pos % STAGES;
                mbar_wait(empty + 8 * s, ((uint32_t)(pos / STAGES) & 1u) ^ 1u);
                tr(TR_P_KV, 2 * pos + (off == OFF_V));
                mbar_expect_tx(full + 8 * s, KV_TILE);
#pragma unroll 1
                for (int x = 0; x < PANELS; x++)
                    tma_load4(base + off + s * KV_TILE + x * KV_PANEL, map, full + 8 * s, x * COLS,
                              hk, tok, bt);
            };
            t = find(t, w);
            load_q(0, t, w);
            /* The next tile's Q goes out early in this one, so that its latency hides behind
               this tile's products: with three Q buffers after the first K/V (its buffer was
               given back a tile ago), with two after the third (its buffer comes back early in
               this tile, once the tile before's O copy has read it), with one after the last.
               With one, the next tile's first K/V goes out before that Q (KV_FIRST): its slots
               come free an iteration before the Q buffer does (never after: the consumers give
               them back before the Q buffer), and after the Q it waits behind the Q-empty wait
               (perf fwd_sm90 K10). Not in d 128 x 176, whose 24-register producer would spill
               for it (and whose tiles are long). */
            constexpr bool KV_FIRST = NQ == 1 && C::REG_P >= 40;
            int first = 0; /* key tiles of this tile loaded already (KV_FIRST: 0 or 1) */
            for (; t < a.tiles; tc++) {
                const int nt = w.ntiles, hk = w.h / a.group, t_first = w.t_first;
                const int k0 = w.k0, bt = w.bt;
                const int q_at = NQ < 2 ? nt - 1 : NQ == 2 ? min(2, nt - 1) : 0;
                int tn = 0;
                if (nt == 0) {
                    tn = find(next_tile(a, t), w);
                    load_q(tc + 1, tn, w);
                }
                /* the K and V of the key tile at token tok of kv head hk, at ring position pos */
                auto load_pair = [&](int kh, int tok, int b) {
                    load_kv(pos, OFF_K, bar_kfull, bar_kempty, &a.tk, kh, tok, b);
                    load_kv(pos, OFF_V, bar_vfull, bar_vempty, &a.tv, kh, tok, b);
                    pos++;
                };
#pragma unroll 1
                for (int it = 0; it < nt; it++) {
                    if (it >= first) load_pair(hk, k0 + key_tile(t_first, nt, it) * BN, bt);
                    if (it == q_at) { /* w becomes the next tile */
                        tn = find(next_tile(a, t), w);
                        first = KV_FIRST && tn < a.tiles && w.ntiles > 0;
                        if (first)
                            load_pair(w.h / a.group, w.k0 + key_tile(w.t_first, w.ntiles, 0) * BN, w.bt);
                        load_q(tc + 1, tn, w);
                    }
                }
                t = tn;
            }
            if (F8) { /* the end for the transposers: once the slot is free, a plain arrival */
                mbar_wait(bar_vempty + 8 * (pos % STAGES), ((uint32_t)(pos / STAGES) & 1u) ^ 1u);
                st_shared_s32(stop_slot, pos);
                mbar_arrive(bar_vfull + 8 * (pos % STAGES));
            }
            tr(TR_DONE);
            tr.finish();
        }
        return;
    }
    regs_inc<C::REG_C>();

    /* ---- consumer warpgroup c: query rows row0 + 64 c .. + 63 of each tile ---- */
    const int c = wg - 1, wtid = tid - 128 * wg, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    tr.init(1 + c, wtid == 0);
    uint32_t sQ = 0; /* this consumer's Q in the tile's buffer */
    int r_lo = 0; /* this thread's rows in the tile: r_lo, r_lo + 8 */
    int ring = 0; /* the ring position of the tile's first key tile */

    /* accumulators in the m16n8 C layout of each warp's 16 rows: n8 tile j holds
       (row g, columns 8j + 2t4 + 0/1) in [4j], [4j+1] and (row g + 8, ...) in [4j+2], [4j+3] */
    constexpr int NS = BN / 8, NO = D / 8; /* n8 tiles of S and of O */
    float o[D / 2];
    float m[2], l[2];

    /* S = Q K^T into sc (the first k-step overwrites it: no zeroing by other instructions,
       which ptxas would have to keep out of a pending product): k-step kk reads 32 bytes into
       the 128-byte rows of panel kk / 4. Issued, not waited for. */
    auto issue_s = [&](float (&sc)[BN / 2], uint32_t sK) {
        wg_fence();
        const Desc dq = desc_sw128(sQ, 16, 1024), dk = desc_sw128(sK, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            const uint32_t off = (kk % 4) * 32u;
            Wgmma<T, BN>::ss(sc, desc_at(dq, (kk / 4) * Q_PANEL + off),
                             desc_at(dk, (kk / 4) * KV_PANEL + off), kk > 0);
        }
        wg_commit();
    };
    /* O += P V: k-step kk is keys 16kk.. = rows 16kk.. of every V panel (leading offset: the
       panels, KV_PANEL apart; stride: the next 8 keys). Issued, not waited for. */
    auto issue_pv = [&](const uint32_t (&pa)[KP][4], uint32_t sV) {
        wg_pin(o);
        wg_fence();
        if (F8) { /* V^T K-major as K in S: k-step kk is keys 32 kk.., bytes 32 (kk % 4) of the
                     128-key panel kk / 4 */
            const Desc dv = desc_sw128(sV, 16, 1024);
#pragma unroll
            for (int kk = 0; kk < KP; kk++)
                Wgmma<T, D>::rs(o, pa[kk], desc_at(dv, (kk / 4) * C::VT_PANEL + (kk % 4) * 32u), 1);
        } else {
            const Desc dv = desc_sw128(sV, KV_PANEL, 1024);
#pragma unroll
            for (int kk = 0; kk < KP; kk++) Wgmma<T, D>::rs(o, pa[kk], desc_at(dv, kk * 16 * 128), 1);
        }
        wg_commit();
    };
    /* Scores without softcap or ALiBi stay raw (the exponent takes scale * log2 e); with them,
       score_log2 converts them to log2 units first. Then the masks (keys outside a row's
       range, past the sequence included) and the online softmax of tile kcol0: m and l move,
       the probabilities replace the scores in sc (fp32), and alpha is what O must be
       multiplied by before this tile's P V. pack_p turns them into 16-bit A fragments (k-step
       kk covers n8 tiles 2kk, 2kk+1) once the previous P V has read pa: P needs no second set
       of registers. */
    const bool fancy = a.m.softcap > 0.f || a.m.alibi != nullptr; /* uniform per launch */
    /* Without a left window (causal, or a right window alone) a tile that crosses an edge
       crosses the right one only, and its mask compares one bound instead of two; d 256,
       where it did not pay, keeps the one general form (perf fwd_sm90 K3) */
    constexpr bool RIGHT_ONLY = D <= 128;
    /* FP8: times q_descale k_descale of the tile's (batch, kv head) (start) */
    float mul = fancy ? 1.f : a.m.scale_log2;
    float slope = 0.f;
    /* every_c: the keys every row of this consumer sees (start): a tile inside them needs no
       mask. The consumer's bounds, not the block's (w.every), with which two consumers in
       three of d 64's 192-row blocks masked a key tile more (perf fwd_sm90 K4) */
    fa_range every_c = {0, 0};
    auto prepare = [&](float (&sc)[BN / 2], int kcol0) {
        if (fancy) {
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = kcol0 + 8 * j + 2 * t4 + (e & 1), row = r_lo + 8 * (e >> 1);
                    sc[4 * j + e] = score_log2(a.m, sc[4 * j + e], slope, row + w.diag, col);
                }
        }
        if (RIGHT_ONLY && a.m.win_left < 0 && kcol0 + BN > every_c.hi) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int hi = hi_of(a, w, r_lo + 8 * hr) - kcol0 - 2 * t4;
#pragma unroll
                for (int j = 0; j < NS; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (8 * j + e >= hi) sc[4 * j + 2 * hr + e] = -INFINITY;
            }
        } else if (!fa_range_holds(every_c, kcol0, kcol0 + BN)) {
            mask_rows(sc, a, w, kcol0, r_lo, t4);
        }
    };
    auto softmax_core = [&](float (&sc)[BN / 2], float (&alpha)[2]) {
        float m_use[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NS; j++) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
            mx = __fmul_ru(quad_max(mx), mul); /* rounded up: with_row_exp (ptx.cuh) */
            /* lazy: the reference max moves only when the tile's exceeds it by more than
               LAZY (log2 units), so most tiles leave O as it is (alpha 1); probabilities
               then reach 2^LAZY, which 16 bits and the fp32 sums hold */
            const float m_new = mx > m[hr] + a.lazy ? mx : m[hr];
            m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
            alpha[hr] = fast_exp2(m[hr] - m_use[hr]);
            m[hr] = m_new;
        }
        float sum[2] = {0.f, 0.f};
        with_row_exp(m_use, [&](auto ex) {
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const float p0 = ex(hr, sc[4 * j + 2 * hr], mul, m_use[hr]);
                    const float p1 = ex(hr, sc[4 * j + 2 * hr + 1], mul, m_use[hr]);
                    sum[hr] += p0 + p1;
                    sc[4 * j + 2 * hr] = p0;
                    sc[4 * j + 2 * hr + 1] = p1;
                }
        });
#pragma unroll
        for (int hr = 0; hr < 2; hr++) l[hr] = l[hr] * alpha[hr] + sum[hr];
    };
    auto softmax = [&](float (&sc)[BN / 2], int kcol0, float (&alpha)[2]) {
        prepare(sc, kcol0);
        softmax_core(sc, alpha);
    };
    /* The key loop's softmax at the running max, for when P V has completed (pa is free):
       the probabilities against the rows' current max, straight into pa, the scores left as
       they were. A thread's partial row sum bounds each of its probabilities, so where every
       partial sum is at most 2^LAZY the max would not have moved (the lazy rule) and the tile
       is done without the row max (its 64 FMNMX and shuffles a tile at BN 128), alpha 1.
       Otherwise (false: a score grew past the max by more than LAZY, a row had no key yet,
       or NaN) the caller runs softmax_core on the unchanged scores. Decided per warp: no
       warpgroup instruction depends on it. */
    const float p_bound = exp2f(a.lazy);
    auto exp_at_max = [&](const float (&sc)[BN / 2], uint32_t (&pa)[KP][4]) {
        float sum[2] = {0.f, 0.f};
        const float m_use[2] = {m[0] == -INFINITY ? 0.f : m[0], m[1] == -INFINITY ? 0.f : m[1]};
        with_row_exp(m_use, [&](auto ex) {
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const float p0 = ex(hr, sc[4 * j + 2 * hr], mul, m_use[hr]);
                    const float p1 = ex(hr, sc[4 * j + 2 * hr + 1], mul, m_use[hr]);
                    sum[hr] += p0 + p1;
                    PutP<T>::put(pa, j, hr, p0, p1);
                }
        });
        const bool ok = sum[0] <= p_bound && sum[1] <= p_bound && m[0] != -INFINITY &&
                        m[1] != -INFINITY;
        if (!__all_sync(0xffffffffu, ok)) return false;
        l[0] += sum[0];
        l[1] += sum[1];
        return true;
    };
    auto pack_p = [&](const float (&sc)[BN / 2], uint32_t (&pa)[KP][4]) {
#pragma unroll
        for (int j = 0; j < NS; j++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++)
                PutP<T>::put(pa, j, hr, sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]);
    };
    /* Ring position pos (the producer's count of key tiles so far): its slot and phase, and the
       slot's K and V; key0(it) is the first key of the current tile's key tile it (key_tile's
       order). */
    auto slot = [&](int pos) { return pos % STAGES; };
    auto phase = [&](int pos) { return (uint32_t)(pos / STAGES) & 1u; };
    auto k_smem = [&](int pos) { return base + OFF_K + slot(pos) * KV_TILE; };
    /* the P V operand: the stage's V, or (FP8) its V^T */
    auto v_smem = [&](int pos) {
        return F8 ? base + C::OFF_VT + slot(pos) * C::VT_TILE : base + OFF_V + slot(pos) * KV_TILE;
    };
    auto key0 = [&](int it) { return key_tile(w.t_first, w.ntiles, it) * BN; };

    /* Varlen: the rows of a tile past its sequence's last key hold the next sequence's tokens
       (the copy engine zero-fills only past the whole tensor). Their probabilities are 0, but
       0 x inf is NaN: the V rows are zeroed here (whole 128-byte rows, so the swizzle does not
       matter; both consumers write the same zeros), made visible to the tensor cores, and the
       warpgroup synchronises on its named barrier (3 + c) before its products read them. */
    auto clear_tail = [&](int pos, int kcol0) {
        if constexpr (!F8) { /* FP8: no varlen (fa_sm90_fwd refuses it) */
        const int valid = w.sk - kcol0;
        if (!a.cu_q || valid >= BN) return;
        for (int i = wtid; i < PANELS * (BN - valid) * 8; i += 128) {
            const int x = i / ((BN - valid) * 8), rest = i % ((BN - valid) * 8);
            const uint32_t addr = v_smem(pos) + x * KV_PANEL + (valid + rest / 8) * 128 + (rest % 8) * 16;
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("bar.sync %0, 128;\n" ::"r"(3 + c) : "memory");
        }
    };
    /* waits for the K (or V) at ring position pos and gives the slot back once this thread's
       products have read it; V waits also zero the varlen tail of the current tile's key
       tile it */
    auto wait_k = [&](int pos) { mbar_wait(bar_kfull + 8 * slot(pos), phase(pos)); };
    auto wait_v = [&](int pos, int it) {
        mbar_wait(bar_vready + 8 * slot(pos), phase(pos));
        clear_tail(pos, key0(it));
    };
    auto free_k = [&](int pos) { mbar_arrive(bar_kempty + 8 * slot(pos)); };
    /* trace builds: whether K at ring position pk and V at pv had landed before their waits */
    auto probe = [&](int pk, int pv) {
        return mbar_done(bar_kfull + 8 * slot(pk), phase(pk)) |
               2 * mbar_done(bar_vready + 8 * slot(pv), phase(pv));
    };
    auto free_v = [&](int pos) { mbar_arrive(bar_vempty + 8 * slot(pos)); };
    /* The key tiles at the end of tile x's loop (its last keys) that none of this consumer's
       rows sees: a causal or right-window edge inside the
       block, where BM and BN do not align (d 64's 192-row blocks on 128-key tiles: two
       consumers in three skip a tile in every other block). They are given back unread
       (skip_tiles, after their loads have landed: an early arrival would count toward the
       slot's previous use), at the hand-over. At most STAGES - 2: there the skipped slots
       are awaited before this consumer gives back the last tile's V, so the ring must hold
       them beside it. Not under the ping-pong turns, which need both consumers to issue as
       many products per tile (a skip there deadlocks) (perf fwd_sm90 K11). */
    constexpr bool SKIP = NQ >= 2 && STAGES >= 3 && SCHED != PINGPONG;
    auto skip_of = [&](const Tile &x) {
        if (!SKIP || x.ntiles <= 1) return 0;
        const fa_range seen = {x.t_first * BN, hi_of(a, x, x.row0 + 64 * c + 63)};
        const fa_range kt = fa_range_tiles(seen, BN); /* the tiles this consumer's rows see */
        const int nt_c = kt.hi - kt.lo;
        return max(0, min(x.ntiles - nt_c, min(x.ntiles - 1, STAGES - 2)));
    };
    auto skip_tiles = [&](int pos, int n) {
        for (int i = 0; i < n; i++) {
            wait_k(pos + i);
            free_k(pos + i);
            mbar_wait(bar_vready + 8 * slot(pos + i), phase(pos + i));
            free_v(pos + i);
        }
    };
    /* The wait for the pending P V after a softmax. ptxas hoists a plain wait above the
       softmax (the wait reads no register), so the softmax no longer runs under P V;
       wg_wait_after keeps it below (the row sums need every exponential). That pays where
       P V is the longer product (D > BN: d 256); at d 64/128 the other consumer's products
       fill the tensor cores anyway and the hoisted wait is as fast (perf fwd_sm90 K5). */
    constexpr bool FENCED = D > BN;
    /* where the wait is not fenced it comes first anyway: there the key loop's softmax runs
       at the running max (exp_at_max), skipping the row max on most tiles (perf fwd_sm90
       K6). Not FP8: with no lazy margin (LAZY_F8) its test, every partial row sum at most 1,
       fails wherever a row's probabilities spread, and its fallback computes the
       exponentials twice */
    constexpr bool AT_MAX = !FENCED && !F8;
    auto wait_pv = [&]() {
        if (FENCED)
            wg_wait_after<0>(l[0] + l[1]);
        else
            wg_wait<0>();
    };

    /* PINGPONG: the two consumers take turns issuing their products (named barriers 1 and 2,
       256 threads: one consumer syncs, the other arrives), so one's softmax runs while the
       other's products hold the tensor cores; the turns run on across tiles */
    const int my_bar = 1 + c, other_bar = 2 - c;
    auto my_turn = [&]() {
        if (SCHED == PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(my_bar) : "memory");
    };
    auto your_turn = [&]() {
        if (SCHED == PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(other_bar) : "memory");
    };
    if (SCHED == PINGPONG && c == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory"); /* 0 first */

    /* The next tile from the producer (-1: none left), its Q and Q-empty barrier, and whether
       it sees any key. */
    int tc = 0;
    auto fetch = [&](uint32_t &q_smem, uint32_t &q_empty, bool &keys) {
        const int qb = tc % NQ;
        mbar_wait(bar_q + 8 * qb, (uint32_t)(tc / NQ) & 1u);
        const int t = ld_shared_s32(tile_slot + 4 * qb);
        tr(TR_FETCH, t);
        tc++;
        q_smem = base + (qb * NC + c) * Q_WG;
        q_empty = bar_qempty + 8 * qb;
        keys = t < 0 || !(t & NO_KEYS);
        return t < 0 ? t : t & (NO_KEYS - 1);
    };
    /* the softmax state of a new tile x */
    auto start = [&](const Tile &x) {
        r_lo = x.row0 + 64 * c + 16 * warp + g;
        slope = alibi_slope_log2(a.m, x.b, x.h);
        every_c = fa_rows_common(rows_of(a, x), x.row0 + 64 * c, min(x.row0 + 64 * c + 64, x.sq));
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        if (F8) {
            const int hk = x.h / a.group;
            mul = a.m.scale_log2 * descale_at(a.q_descale, a.ds_sb, x.b, hk) *
                  descale_at(a.k_descale, a.ds_sb, x.b, hk);
        }
    };
    /* O / l and LSE = m ln2 + log l of tile x; rows outside the sequence are not stored. With
       the copy engine (o_tma, no row before the sequence's first, and rows wholly inside it
       where varlen puts the next sequence's rows after them; otherwise the map clips at the
       tensor's end), O is written in 16 bits into this consumer's part of the tile's Q buffer
       (free: every S of the tile has completed) by stmatrix, in the 128-byte swizzle of the
       map, and one thread per warp stores the warp's 16 rows (no wait for the other warps);
       the buffer goes back to the producer (`pending`) once the copies have read it, which the
       next tile's first iteration checks, so the global writes overlap its products. Otherwise
       every thread stores its own elements, and the buffer goes back at once. */
    uint32_t pending = 0; /* the Q-empty barrier owed once this consumer's O copy has read */
    auto release = [&]() {
        if (!pending) return;
        if (lane == 0) bulk_wait_read(); /* the warp's copy (the warpgroup's: wtid 0's) */
        mbar_arrive(pending);
        pending = 0;
    };
    auto by_tma = [&](const Tile &x) {
        return !F8 && C::NQ >= 2 && a.o_tma && x.row0 + 64 * c >= 0 &&
               (!a.cu_q || x.row0 + 64 * c + 64 <= x.sq);
    };
    /* after the tile's last S: the Q buffer goes back now unless O leaves through it */
    auto q_done = [&](const Tile &x, uint32_t q_empty) {
        if (!by_tma(x)) mbar_arrive(q_empty);
    };
    auto store = [&](const Out &x, bool tma, const float (&mm)[2], const float (&ll)[2],
                     uint32_t q_smem, uint32_t q_empty) {
        float lt[2], inv[2];
        /* FP8: O = v_descale (P V8) / l */
        const float vd = F8 ? descale_at(a.v_descale, a.ds_sb, x.bo, x.h / a.group) : 1.f;
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            lt[hr] = quad_sum(ll[hr]);
            inv[hr] = lt[hr] > 0.f ? vd / lt[hr] : 0.f;
        }
        tr(TR_O_SUM);
        /* row g + 8 hr of O in 16 bits: n8 tile j, columns 2 t4, 2 t4 + 1 */
        auto pack_o = [&](uint32_t (&v)[NO], int hr) {
#pragma unroll
            for (int j = 0; j < NO; j++)
                v[j] = pack2<TO>(o[4 * j + 2 * hr] * inv[hr], o[4 * j + 2 * hr + 1] * inv[hr]);
        };
        /* LSE = m ln 2 + log l of the row (rows outside the sequence: not stored) */
        auto store_lse = [&](int hr) {
            const int row = x.row0 + 64 * c + 16 * warp + g + 8 * hr;
            if (a.lse && t4 == 0 && row >= 0 && row < x.sq)
                a.lse[(int64_t)x.bo * a.lse_sb + (int64_t)x.h * a.lse_sh +
                      (int64_t)(x.q0 + row) * a.lse_st] =
                    lt[hr] > 0.f ? mm[hr] * 0.6931471805599453f + logf(lt[hr]) : -INFINITY;
        };
        if (!tma) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int row = x.row0 + 64 * c + 16 * warp + g + 8 * hr;
                uint32_t v[NO];
                pack_o(v, hr);
                /* per 4 n8 tiles a 4 x 4 transpose across the quad: then lane t4 holds tile
                   4 jj + t4 whole (16 bytes; rows are 16-byte aligned, backend.c checks), and
                   the quad writes 64 contiguous bytes */
#pragma unroll
                for (int jj = 0; jj < NO / 4; jj++)
                    quad_transpose(v[4 * jj], v[4 * jj + 1], v[4 * jj + 2], v[4 * jj + 3], t4);
                if (row >= 0 && row < x.sq) {
                    TO *orow = (TO *)a.o + (int64_t)x.bo * a.o_sb + (int64_t)(x.q0 + row) * a.o_st +
                              (int64_t)x.h * a.o_sh;
#pragma unroll
                    for (int jj = 0; jj < NO / 4; jj++)
                        *(uint4 *)(orow + 8 * (4 * jj + t4)) =
                            make_uint4(v[4 * jj], v[4 * jj + 1], v[4 * jj + 2], v[4 * jj + 3]);
                }
                store_lse(hr);
            }
            tr(TR_O_ISSUED);
            return;
        }
        uint32_t v[2][NO];
        pack_o(v[0], 0);
        pack_o(v[1], 1);
        /* n8 tiles 2 jp, 2 jp + 1 of both row halves per instruction; lane L gives row L % 8 of
           matrix L / 8 (row half (L / 8) % 2, tile 2 jp + L / 16), whose 16 bytes sit at chunk
           (tile % 8) ^ (row % 8) of the 128-byte swizzle */
        const int hi = lane / 16, r = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
        const uint32_t row_at = q_smem + r * 128;
#pragma unroll
        for (int jp = 0; jp < NO / 2; jp++)
            stmatrix_x4(row_at + (jp / 4) * Q_PANEL + ((((2 * jp) % 8) ^ hi ^ (r % 8)) << 4),
                        v[0][2 * jp], v[1][2 * jp], v[0][2 * jp + 1], v[1][2 * jp + 1]);
        tr(TR_O_SMEM);
        fence_async_smem();
        tr(TR_O_FENCED);
        /* each warp's O_ROWS (16) rows as soon as the warp has written them */
        __syncwarp();
        if (lane == 0) {
#pragma unroll 1
            for (int p = 0; p < PANELS; p++)
                tma_store4(&a.to, q_smem + p * Q_PANEL + warp * 16 * 128, p * 64, x.h,
                           x.q0 + x.row0 + 64 * c + 16 * warp, x.bo);
            bulk_commit();
        }
        tr(TR_O_ISSUED);
        pending = q_empty;
        store_lse(0); /* after the copy is issued: the fence before it need not order these */
        store_lse(1);
    };
    auto zero_o = [&]() {
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    };

    /*
     * The pipeline: S of key tile it is in flight with P V of key tile it - 1, and the softmax
     * of tile it runs while that product finishes, so the exponentials overlap the tensor
     * cores. It runs on across work tiles: the first S of the next tile goes with the last
     * P V of this one (its Q came into the other buffer meanwhile), and this tile's output is
     * stored while the next one's first softmax is done (`primed`).
     */
    float sc[BN / 2], alpha[2];
    uint32_t pa[KP][4];
    uint32_t qempty = 0, sQn = 0, qempty_n = 0;
    bool keys = true; /* whether the tile fetched last sees any key */
    int nskip = 0;    /* the tile's key tiles this consumer skips (skip_of) */
    int t = fetch(sQ, qempty, keys);
    bool primed = false;
    if (t >= 0) tile_of<C>(a, t, w); /* true: the producer passed it */
    while (t >= 0) {
        const int nt = w.ntiles;
        if (!primed) {
            start(w);
            zero_o();
            if (nt == 0) { /* every key masked: O = 0, LSE = -inf */
                release();
                q_done(w, qempty);
                store(out_of(w), by_tma(w), m, l, sQ, qempty);
                t = fetch(sQ, qempty, keys);
                if (t >= 0) tile_of<C>(a, t, w);
                continue;
            }
            nskip = skip_of(w);
            wait_k(ring);
            my_turn();
            issue_s(sc, k_smem(ring));
            your_turn();
            wg_wait<0>();
            wg_pin(sc);
            free_k(ring);
            softmax(sc, key0(0), alpha); /* O is 0: no rescale */
            pack_p(sc, pa);
        }
        primed = false;
        /* this consumer's key tiles: 0 .. it_hi - 1 (the skipped ones are its last) */
        const int it_hi = nt - nskip;
        for (int it = 1; it < it_hi; it++) {
            const int pos = ring + it;
            tr(TR_ITER, it);
            const int there = probe(pos, pos - 1);
            wait_k(pos);
            wait_v(pos - 1, it - 1);
            tr(TR_READY, 4 * pos + there);
            my_turn();
            issue_s(sc, k_smem(pos));
            issue_pv(pa, v_smem(pos - 1));
            your_turn();
            release(); /* the previous tile's O copy: long done reading by now */
            wg_wait<1>(); /* S(it) done; P V(it - 1) may still run, reading pa */
            wg_pin(sc);
            tr(TR_S_DONE, it);
            free_k(pos);
            if (AT_MAX) { /* P V (it - 1) first, then the softmax at the running max */
                prepare(sc, key0(it));
                wg_wait<0>();
            } else {
                softmax(sc, key0(it), alpha);
                tr(TR_SOFTMAX, it);
                wait_pv(); /* P V (it - 1) done */
            }
            wg_pin(o);
            wg_pin(pa); /* pa's registers stay untouched until the product has read them */
            tr(TR_PV_DONE, it);
            free_v(pos - 1);
            if (AT_MAX && exp_at_max(sc, pa)) {
                tr(TR_SOFTMAX, it);
                continue;
            }
            if (AT_MAX) softmax_core(sc, alpha);
            if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_o(o, alpha);
            pack_p(sc, pa);
        }
        /* every S of the tile has completed */
        release();
        q_done(w, qempty);
        const bool otma = by_tma(w);
        const int last = ring + it_hi - 1;
        const int tail = nt - it_hi; /* the tile's key tiles skipped at its end */
        Tile wn;
        if (NQ == 1) {
            /* One Q buffer: the next tile's Q has only just been asked for (the buffer went
               back above), so this tile's last P V goes first and hides that load. This
               tile's O is stored while the load is awaited where O is wide against the key
               tile (D > BN: d 256), else under the next tile's first S (d 128 x 176) (perf
               fwd_sm90 K9). The next tile is worked out under that S (perf fwd_sm90 K8). */
            constexpr bool STORE_FIRST = D > BN;
            wait_v(last, it_hi - 1);
            my_turn();
            issue_pv(pa, v_smem(last));
            your_turn();
            if (STORE_FIRST) {
                wg_wait<0>();
                wg_pin(o);
                wg_pin(pa);
                tr(TR_B_PV_DONE);
                free_v(last);
                store(out_of(w), otma, m, l, sQ, qempty);
                tr(TR_B_STORED);
            }
            t = fetch(sQn, qempty_n, keys);
            if (t >= 0 && keys) { /* keys: tile_of can wait until S is issued */
                wait_k(last + 1);
                tr(TR_B_READY);
                const uint32_t sQo = sQ;
                my_turn();
                sQ = sQn;
                issue_s(sc, k_smem(last + 1));
                your_turn();
                tr(TR_B_ISSUED);
                tile_of<C>(a, t, wn); /* under the products */
                tr(TR_B_TILE);
                if (!STORE_FIRST) {
                    wg_wait<1>(); /* P V done; the S may still run */
                    wg_pin(o);
                    wg_pin(pa);
                    tr(TR_B_PV_DONE);
                    free_v(last);
                    store(out_of(w), otma, m, l, sQo, qempty);
                    tr(TR_B_STORED);
                }
                w = wn;
                qempty = qempty_n;
                ring = last + 1;
                start(w);
                wg_wait<0>();
                wg_pin(sc);
                tr(TR_B_S_DONE);
                free_k(ring);
                zero_o();
                softmax(sc, key0(0), alpha);
                tr(TR_B_SOFTMAX);
                pack_p(sc, pa);
                tr(TR_B_END);
                primed = true;
            } else {
                if (t >= 0) tile_of<C>(a, t, wn);
                if (!STORE_FIRST) {
                    wg_wait<0>();
                    wg_pin(o);
                    wg_pin(pa);
                    free_v(last);
                    store(out_of(w), otma, m, l, sQ, qempty);
                }
                ring = last + 1;
                if (t >= 0) {
                    w = wn;
                    sQ = sQn;
                    qempty = qempty_n;
                }
            }
            continue;
        }
        t = fetch(sQn, qempty_n, keys);
        /* worked out before the products here: under them (as with one Q buffer) was slower
           with two Q buffers or more (perf fwd_sm90 K8) */
        if (t >= 0) tile_of<C>(a, t, wn);
        tr(TR_B_TILE);
        if (t >= 0 && keys) {
            /* the next tile's first S with this tile's last P V */
            const int skip = skip_of(wn), first = last + 1 + tail;
            skip_tiles(last + 1, tail);
            const int there = probe(first, last);
            wait_k(first);
            wait_v(last, it_hi - 1);
            tr(TR_B_READY);
            const uint32_t sQo = sQ, qempty_o = qempty;
            my_turn();
            sQ = sQn;
            issue_s(sc, k_smem(first));
            issue_pv(pa, v_smem(last));
            your_turn();
            tr(TR_B_ISSUED, 4 * first + there);
            wg_wait<1>();
            wg_pin(sc);
            tr(TR_B_S_DONE);
            free_k(first);
            const Out wo = out_of(w);
            const float mo[2] = {m[0], m[1]}, lo[2] = {l[0], l[1]};
            w = wn;
            qempty = qempty_n;
            ring = first;
            nskip = skip;
            start(w);
            softmax(sc, key0(0), alpha);
            tr(TR_B_SOFTMAX);
            wait_pv();
            wg_pin(o);
            wg_pin(pa);
            tr(TR_B_PV_DONE);
            free_v(last);
            store(wo, otma, mo, lo, sQo, qempty_o);
            tr(TR_B_STORED);
            zero_o();
            pack_p(sc, pa);
            tr(TR_B_END);
            primed = true;
        } else {
            wait_v(last, it_hi - 1);
            my_turn();
            issue_pv(pa, v_smem(last));
            your_turn();
            wg_wait<0>();
            wg_pin(o);
            wg_pin(pa);
            free_v(last);
            store(out_of(w), otma, m, l, sQ, qempty);
            skip_tiles(last + 1, tail); /* loaded all the same: not left in flight */
            ring = last + 1 + tail;
            if (t >= 0) {
                w = wn;
                sQ = sQn;
                qempty = qempty_n;
            }
        }
    }
    release();
    tr(TR_DONE);
    tr.finish();
    if (lane == 0) bulk_wait(); /* the shared memory stays until the last copy is done */
    /* consumer 0 takes consumer 1's last turn-passing, so no barrier is left half-arrived */
    if (SCHED == PINGPONG && c == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
#endif
}

} // namespace sm90
} // namespace fa

#endif
