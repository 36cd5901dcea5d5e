/*
 * cuda/dropout_sm80.cuh — dropout.h's keep mask for the mma.sync C fragments of the sm80
 * kernels, with every Philox output used once.
 *
 * An m16n8 C fragment gives lane (g = lane / 4, t4 = lane % 4) rows g and g + 8 and columns
 * 2 t4, 2 t4 + 1 of the tile. One Philox call yields 4 consecutive columns of one row, so the
 * 16 x 8 tile is 4 calls (2 rows-halves x 2 column groups) per quad of lanes: lane t4 computes
 * the call of row half t4 / 2, column group t4 % 2, and the quad trades the 4-bit keep masks
 * with one shuffle per row half (for up to 8 n8 tiles at once). The rule stays dropout.h's:
 * counter (j / 4, i, b * heads_q + h, lo32(offset)), i and j in sequence coordinates.
 */
#ifndef FA_CUDA_DROPOUT_SM80_CUH
#define FA_CUDA_DROPOUT_SM80_CUH

#include <stdint.h>

#include "../dropout.h"

namespace fa {

/* One launch's dropout: generator key, offset word, threshold, factor of a kept element. */
struct DropArgs {
    fa_drop d;
    float scale;
    int heads_q; /* the counter's head word is b * heads_q + h */
};

/*
 * Keep bits of this lane's elements of NT n8 tiles side by side: rows row (hr 0) and row + 8
 * (hr 1) of the m16 tile (row = sequence row of the lane's g), columns col0 + 8 ni + 2 t4 + e
 * (col0 a multiple of 8). Bit 2 (ni % 8) + e of bits[hr][ni / 8] is element (hr, ni, e).
 */
template <int NT>
__device__ __forceinline__ void drop_bits(const fa_drop &d, uint32_t bh, uint32_t row,
                                          uint32_t col0, int lane,
                                          uint32_t (&bits)[2][(NT + 7) / 8]) {
    constexpr int W = (NT + 7) / 8;
    const int t4 = lane & 3;
    const uint32_t my_row = row + (uint32_t)(t4 >> 1) * 8u; /* the row half this lane draws */
    const uint32_t j4 = (col0 >> 2) + (uint32_t)(t4 & 1);   /* its column group in tile 0 */
    uint32_t mine[W];
#pragma unroll
    for (int w = 0; w < W; w++) mine[w] = 0;
#pragma unroll
    for (int ni = 0; ni < NT; ni++) {
        const fa_philox4 r = fa_drop_block(&d, bh, my_row, j4 + 2u * ni);
        const uint32_t nib = (uint32_t)(r.v[0] >= d.threshold) |
                             (uint32_t)(r.v[1] >= d.threshold) << 1 |
                             (uint32_t)(r.v[2] >= d.threshold) << 2 |
                             (uint32_t)(r.v[3] >= d.threshold) << 3;
        mine[ni / 8] |= nib << (4 * (ni % 8));
    }
    /* lane t4 wants columns 2 t4, 2 t4 + 1: group t4 / 2, bits 2 (t4 % 2) .. of its nibble,
       drawn by quad lane 2 hr + t4 / 2 */
    const int sh = 2 * (t4 & 1);
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int src = (lane & ~3) | (2 * hr + (t4 >> 1));
#pragma unroll
        for (int w = 0; w < W; w++) {
            const uint32_t x = __shfl_sync(0xffffffffu, mine[w], src) >> sh;
            uint32_t out = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) out |= ((x >> (4 * k)) & 3u) << (2 * k);
            bits[hr][w] = out;
        }
    }
}

/* The factor of element (hr, ni, e) of drop_bits: scale if kept, else 0. */
template <int NT>
__device__ __forceinline__ float drop_factor(const uint32_t (&bits)[2][(NT + 7) / 8], int hr,
                                             int ni, int e, float scale) {
    return (bits[hr][ni / 8] >> (2 * (ni % 8) + e)) & 1u ? scale : 0.f;
}

/* Keep bits of a warp's MT x NT fragment tiles: m16 tile mi starts at sequence row
   row + 16 mi (row: this lane's g row), all at key col0 (a multiple of 8). */
template <int MT, int NT>
__device__ __forceinline__ void drop_mask(const DropArgs &a, uint32_t bh, uint32_t row,
                                          uint32_t col0, int lane,
                                          uint32_t (&bits)[MT][2][(NT + 7) / 8]) {
#pragma unroll
    for (int mi = 0; mi < MT; mi++) drop_bits<NT>(a.d, bh, row + 16u * mi, col0, lane, bits[mi]);
}

/* x *= the factors of drop_mask's bits, in place. */
template <int MT, int NT>
__device__ __forceinline__ void drop_mul(float (&x)[MT][NT][4],
                                         const uint32_t (&bits)[MT][2][(NT + 7) / 8], float scale) {
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    x[mi][ni][2 * hr + e] *= drop_factor<NT>(bits[mi], hr, ni, e, scale);
}

} // namespace fa

#endif
