/*
 * cuda/vt_layout.h — where the FP8 forward's V transpose (fwd_sm90.cuh, transpose_v) reads and
 * writes shared memory: C, shared by the kernel and a CPU test (tests/test_vt_layout.c), which
 * checks that the transpose is right and that every warp access is free of bank conflicts.
 *
 * The tiles. V lands from the copy engine as BN key rows of D bytes in panels of 128 columns
 * (128-byte rows, 128-byte swizzle: the 16-byte chunk x of row r sits at chunk x ^ (r % 8));
 * V^T is D rows of BN keys in panels of 128 keys, the same swizzle, and within each 32-key step
 * its column c holds key fa_perm_key(c) (the order the e4m3 P fragment holds its keys in).
 *
 * The work. A warp of the transposers takes a block of 32 keys (one step) x 16 columns; lane
 * (a = lane % 8, b = lane / 8) the 4 x 4 bytes of V^T columns c = c0 + 4a .. + 3 and rows
 * n = n0 + 4b .. + 3: four 32-bit loads of four V rows (columns n .. n + 3), byte permutes,
 * four 32-bit stores of four V^T rows. The rule: each of the warp's loads and stores touches
 * 32 different banks. The previous order (a warp's 32 lanes along 128 keys at one 4-byte
 * column) put each load's 32 key rows in 4 swizzle chunks: 8-way conflicts, 36 wavefronts per
 * warp step (4 loads x 8 + 4 stores) instead of 8. In this block shape, unrotated, loads and
 * stores would still conflict 2-way; so lanes with a >= 4 load their keys rotated by one (r),
 * which puts the 8 keys of a load in 8 chunks, and lanes with b >= 2 store their rows rotated
 * by two (s), which puts the 8 rows of a store in 8 chunks: 8 wavefronts per warp step.
 */
#ifndef FA_CUDA_VT_LAYOUT_H
#define FA_CUDA_VT_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define FA_VT_FN __host__ __device__ __forceinline__
#define FA_VT_CFN __host__ __device__ constexpr /* the kernel's compile-time item constants */
#else
#define FA_VT_FN static inline
#define FA_VT_CFN static inline
#endif

/* The key (0..31 in a 32-key step) that column c of the e4m3 P fragment holds: the fp32
   accumulator's columns 2t, 2t + 1, 8 + 2t, 9 + 2t (t = c % 16 / 4), per 16 keys */
FA_VT_FN int fa_perm_key(int c) {
    const int h = c / 16, t = (c % 16) / 4, i = c % 4;
    return 16 * h + (i < 2 ? 2 * t + i : 8 + 2 * t + i - 2);
}

/* The byte of (row, col) in a tile of 128-byte swizzled panels of 128 columns, panel bytes
   apart */
FA_VT_FN uint32_t fa_sw128_at(int row, int col, uint32_t panel) {
    return (uint32_t)(col / 128) * panel + (uint32_t)row * 128u +
           ((uint32_t)(((col % 128) / 16) ^ (row % 8)) << 4) + (uint32_t)(col % 16);
}

/* A lane's 4 x 4 block of transpose block blk (of (D / 16) x (BN / 32)): V^T columns c .. c + 3,
   rows n .. n + 3; its loads rotated by r, its stores by s (the top of this file) */
typedef struct fa_vt_item {
    int c, n, r, s;
} fa_vt_item;
FA_VT_FN fa_vt_item fa_vt_item_of(int blk, int lane, int bn) {
    const int a = lane % 8, b = lane / 8;
    fa_vt_item it;
    it.c = 32 * (blk % (bn / 32)) + 4 * a;
    it.n = 16 * (blk / (bn / 32)) + 4 * b;
    it.r = a / 4;
    it.s = 2 * (b / 2);
    return it;
}
/* The V row (key) the lane's load q reads: the item's key (q + r) % 4 */
FA_VT_FN int fa_vt_key(fa_vt_item it, int q) {
    return (it.c & ~31) + fa_perm_key(it.c % 32 + ((q + it.r) & 3));
}
/* The V^T row the lane's store j writes: the item's row j ^ s (s is 0 or 2: (j + s) % 4) */
FA_VT_FN int fa_vt_row(fa_vt_item it, int j) {
    return it.n + (j ^ it.s);
}

/* The same addresses in the kernel's form, a few instructions each instead of the ~45 of
   fa_vt_item_of, fa_vt_key, fa_vt_row and fa_sw128_at per access (ncu: the transposers ran
   185 instructions per item, 54% of the kernel's, and the consumers waited on V^T; fp8.md T3).
   Per lane, once a tile: the offsets of its loads and stores in item 0's geometry, the
   swizzle's XOR in bits 4..6. Per item (blk a compile-time constant in the unrolled loop):
   a constant XOR into bits 4..6 and a constant offset. The XOR can stand in for the swizzle's
   because the stage bases are 1024-byte aligned and nothing else of an address touches bits
   4..6: (base + off) ^ x == base + (off ^ x). Any bn that is a multiple of 128. */
typedef struct fa_vt_lane {
    uint32_t ld[4], st[4];
} fa_vt_lane;
FA_VT_FN fa_vt_lane fa_vt_lane_of(int lane) {
    const int a = lane % 8, b = lane / 8, r = a / 4, s = 2 * (b / 2);
    fa_vt_lane l;
    for (int q = 0; q < 4; q++) { /* key (q + r) % 4 of the item, column 4 b of block 0 */
        const int key = fa_perm_key(4 * a + ((q + r) & 3));
        l.ld[q] = (uint32_t)(key * 128 + 4 * b) | ((uint32_t)(key % 8) << 4);
    }
    for (int j = 0; j < 4; j++) { /* V^T row 4 b + (j ^ s), keys 4 a.. of block 0 */
        const int row = 4 * b + (j ^ s);
        l.st[j] = (uint32_t)(row * 128 + 4 * (a % 4)) | ((uint32_t)((a / 4) ^ (row % 8)) << 4);
    }
    return l;
}
/* V^T bytes of 128 rows (V's 128 columns: one panel of V, 8 x bn / 32 items): the kernel runs
   the items of one panel and moves its bases by this and by kv_panel for the next */
#define FA_VT_PANEL_ROWS (128u * 128u)
/* item blk: its 32-key step cb = blk % (bn / 32), its 16-column block nb = blk / (bn / 32) */
FA_VT_CFN uint32_t fa_vt_ld_xor(int blk, int bn) { return (uint32_t)((blk / (bn / 32)) % 8) << 4; }
FA_VT_CFN uint32_t fa_vt_ld_add(int blk, int bn, uint32_t kv_panel) {
    const int cb = blk % (bn / 32), nb = blk / (bn / 32);
    return (uint32_t)(nb / 8) * kv_panel + 4096u * (uint32_t)cb;
}
FA_VT_CFN uint32_t fa_vt_st_xor(int blk, int bn) { return (uint32_t)(2 * (blk % (bn / 32) % 4)) << 4; }
FA_VT_CFN uint32_t fa_vt_st_add(int blk, int bn, uint32_t vt_panel) {
    const int cb = blk % (bn / 32), nb = blk / (bn / 32);
    return 2048u * (uint32_t)nb + (uint32_t)(cb / 4) * vt_panel;
}

#endif
