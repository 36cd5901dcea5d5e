/*
 * cuda/tune_sm90.h — what the Hopper forward ships, in one place: per head dim its tilings,
 * and per problem (head dim, mask, key length) which tiling, kernel, schedule, tile order and
 * L2 grouping run it. Each rule was chosen by A/B runs on the H100; docs/perf/fwd_sm90.md
 * holds them under the ids cited here. Changing a number here changes what ships: time it
 * (bench/README.md) and record it there.
 */
#ifndef FA_CUDA_TUNE_SM90_H
#define FA_CUDA_TUNE_SM90_H

#include "kernels.h"

namespace fa {
namespace sm90 {

/* The tilings (fwd_sm90.cuh's Cfg, fwd_sm90_serial.cuh's SerialCfg): head dim, key tile
   BN, ring stages, Q buffers, consumer warpgroups, the producer's registers, bytes per input
   element (2: f16/bf16; 1: FP8 e4m3, whose V is transposed in shared memory). */
template <int D, int BN, int STAGES, int NQ, int NC, int REG_P, int E = 2> struct Cfg;
template <int D, int BN, int STAGES, int NQ> struct SerialCfg;

/* Per head dim two tilings of the overlapped kernel: C, and Long for long key rows (wider
   tiles pay off only once a row has many key tiles). */
template <int D> struct Tiles;
/* d 64 short: 128 keys, 3 stages, 3 Q buffers (144 KB). Long: three consumers (192-row
   tiles), whose third warpgroup's products hide the softmax, as long as the products at
   this head dim; 24 producer registers; four stages (176 KB), keeping the producer a key
   tile further ahead of the loads (perf fwd_sm90 T6). */
template <> struct Tiles<64> {
    using C = Cfg<64, 128, 3, 3, 2, 40>;
    using Long = Cfg<64, 128, 4, 2, 3, 24>;
};
/* d 128 short: 128 keys, 2 stages, 3 Q buffers (224 KB). Long: 176-key tiles, fewer per-tile
   reductions and waits; the ring then leaves room for one Q buffer (208 KB; O stored by the
   threads); 24 producer registers. */
template <> struct Tiles<128> {
    using C = Cfg<128, 128, 2, 3, 2, 40>;
    using Long = Cfg<128, 176, 2, 1, 2, 24>;
};
/* d 256: 1 Q buffer, 2 stages. Long: 80 keys (224 KB), S's 40 registers beside O's 128.
   Short: 64 keys (192 KB), which split powers of two and the causal diagonal of 128-row
   tiles without a partly used key tile (512 = 6 x 80 + 32) (perf fwd_sm90 T7). */
template <> struct Tiles<256> {
    using C = Cfg<256, 64, 2, 1, 2, 40>;
    using Long = Cfg<256, 80, 2, 1, 2, 40>;
};

/* The FP8 (e4m3) tilings: 128-key tiles, as the transposed V's rows are keys and its 128-byte
   swizzle needs 128 of them; one tiling per head dim (untimed: first bring-up). d 128: 2 Q
   buffers, 3 stages of K, V and V^T (176 KB); d 256: 1 Q buffer, 2 stages (225 KB). */
template <int D> struct F8Tiles;
template <> struct F8Tiles<128> { using C = Cfg<128, 128, 3, 2, 2, 40, 1>; };
template <> struct F8Tiles<256> { using C = Cfg<256, 128, 2, 1, 2, 40, 1>; };

/* The series kernel's tiling per head dim: 128-key tiles; d 256 has room for one Q buffer and
   one K and one V slot (224 KB), d 128 for two Q buffers and two slots (224 KB), d 64 for two
   and three (160 KB). */
template <int D> struct SerialTiles;
template <> struct SerialTiles<64> { using C = SerialCfg<64, 128, 3, 2>; };
template <> struct SerialTiles<128> { using C = SerialCfg<128, 128, 2, 2>; };
template <> struct SerialTiles<256> { using C = SerialCfg<256, 128, 1, 1>; };

/* The consumers' schedule (a template argument of fwd_sm90_kernel): both consumers issue
   freely, or take turns so that one's softmax runs under the other's products. */
enum Schedule { OVERLAP = 0, PINGPONG = 1 };

/* The online softmax moves a row's reference max only when a tile's max exceeds it by more
   than LAZY (log2 units), so most tiles leave O unscaled; probabilities then reach 2^LAZY,
   which 16 bits and the fp32 sums hold. */
constexpr float LAZY = 8.f;
/* FP8 (e4m3 P) moves the max whenever a tile's exceeds it (no lazy margin): P V rounds P to
   e4m3 (relative 2^-4), and a lagging reference makes the row's largest probability
   2^(max - ref), up to 2^LAZY, where at the true max it is 1 and exact; with one key
   dominating a row that rounding alone put the output 2-3x further from the float64
   attention than FlashAttention-3's always-moving max (bench/probes/fp8_lazy.py). */
constexpr float LAZY_F8 = 0.f;

/* Whether p takes the Long tiling: d 64 from 2048 keys, d 128 from 8192, d 256 but for
   masks over at most 512 keys (perf fwd_sm90 T1). */
inline bool long_tiles(const fa_problem *p, int D, bool masked) {
    if (D == 64) return p->seqlen_k >= 2048;
    if (D == 256) return !(masked && p->seqlen_k <= 512);
    return D == 128 && p->seqlen_k >= 8192;
}

/* Whether the series kernel runs p where it serves it: up to 1024 keys under a mask (2048 at
   d 256), up to 512 without (1024 at d 256); beyond, the overlapped kernel's S of the next
   key tile under P V wins (perf fwd_sm90 T2). */
inline bool serial_wins(const fa_problem *p, int D, bool masked) {
    return p->seqlen_k <= (masked ? (D == 256 ? 2048 : 1024) : D == 256 ? 1024 : 512);
}

/* The schedule of a two-consumer tiling: the ping-pong turns for unmasked rows of at most
   1024 keys and for d 128 under a mask, else the free overlap; not varlen, whose tiles differ
   in length (perf fwd_sm90 T3). */
inline int schedule_of(const fa_problem *p, int D, bool masked) {
    if (p->cu_q) return OVERLAP;
    return masked ? (D == 128 ? PINGPONG : OVERLAP) : p->seqlen_k <= 1024 ? PINGPONG : OVERLAP;
}

/* The L2 budget in MB of a tile group's K and V (tile_of's order); kv_bytes is one (batch,
   head) pair's K and V. Unmasked: 0, one pair a group, so a pair's query blocks run together
   and its K/V comes from DRAM once. Masked: groups, which hand the longest query blocks of
   many pairs out first: 48 MB where a pair's K/V is 2 MB or more, else 12 (perf fwd_sm90
   T4). */
inline double l2mb_for(bool masked, double kv_bytes) {
    return !masked ? 0.0 : kv_bytes >= 2.0 * 1024 * 1024 ? 48.0 : 12.0;
}

/* Whether the persistent grid takes tiles from a counter (dynamic) rather than in strides of
   the grid (static): where tiles differ in length (masks, varlen), where they are short (at
   most 512 keys), and in the tilings with two Q buffers or more; equal long tiles in the
   static order keep the blocks in step (perf fwd_sm90 T5). */
inline bool dynamic_order(const fa_problem *p, bool uneven, int nq) {
    return uneven || p->seqlen_k <= 512 || nq >= 2;
}

} // namespace sm90
} // namespace fa

#endif
