/*
 * cpu/amx_common.h — what the AMX-BF16 kernels (fwd_amx.c, bwd_amx.c) share: the tile
 * configuration (all eight tiles 16 rows x 64 bytes), the tile register roles of a 2 x 2
 * blocked product, and the shuffles that put bf16 rows into the layouts tdpbf16ps reads.
 *
 * tdpbf16ps C += A B: A is 16 rows x 32 bf16 (row-major), B is 16 rows of 16 dwords, each
 * dword a VNNI pair (B[2r][n], B[2r+1][n]) of the two K-dim rows it joins, C 16 x 16 fp32.
 */
#ifndef FA_CPU_AMX_COMMON_H
#define FA_CPU_AMX_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "tile_math.h"

#define KS 32 /* bf16 elements per tile row: the K step of tdpbf16ps */
#define TR 16 /* rows per tile */

/* Tile register roles: C in tmm0-3, A in tmm4-5, B in tmm6-7. Macros, since the intrinsics
   paste the register number into their assembly. */
#define TC00 0
#define TC01 1
#define TC10 2
#define TC11 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

/* The tile intrinsics tell the compiler that tilestored writes memory but not that tileloadd
   reads it: this barrier keeps vector stores ahead of the tile loads that consume them. */
#define AMX_FENCE() __asm__ volatile("" ::: "memory")

FA_TM_INLINE int64_t pad32l(int64_t n) { return (n + 31) & ~(int64_t)31; }
FA_TM_INLINE int pad32(int n) { return (n + 31) & ~31; }

/* The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes. */
typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

FA_TM_INLINE void amx_config_init(amx_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->colsb[t] = 64;
        cfg->rows[t] = TR;
    }
}

/* Word indices that interleave the low 16 words of two vectors: a0 b0 a1 b1 ... a15 b15
   (b's words are 32..63 for vpermt2w, 16..31 after vcvtne2ps2bf16 put b in the high half). */
FA_TM_INLINE __m512i interleave_idx(int bofs) {
    uint16_t idx[32];
    for (int t = 0; t < 16; t++) {
        idx[2 * t] = (uint16_t)t;
        idx[2 * t + 1] = (uint16_t)(bofs + t);
    }
    return _mm512_loadu_si512(idx);
}

/* dst[0..dp) = bf16 row src[0..d), zeros after (padding feeds the products: keep it 0).
   Masked loads: nothing past the row is read, and no library call for these short rows. */
FA_TM_INLINE void copy_row(uint16_t *restrict dst, const void *restrict src, int d, int dp) {
    const uint16_t *s = (const uint16_t *)src;
    for (int x = 0; x < dp; x += 32) {
        const int n = d - x;
        const __mmask32 m = n >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (n > 0 ? n : 0)) - 1;
        _mm512_storeu_si512(dst + x, _mm512_maskz_loadu_epi16(m, s + x));
    }
}

/* ---- Inf and NaN in an operand of a tile with a mask edge ---- */

/* A masked term is a zero weight times the other operand, and 0 * Inf or NaN is NaN: where a
   tile's operand holds such a value, the kernels copy it with those values set to +0 (the
   product then gives every element the bits it would have had with a finite value there, since
   the term was 0 * finite = 0), and add the zeroed values' terms back only where they are
   visible. */

/* Whether bf16 value w is Inf or NaN (exponent field all ones). */
FA_TM_INLINE int bf16_special(uint16_t w) { return (w & 0x7f80) == 0x7f80; }

/* 32 bf16 values with each Inf and NaN set to +0. */
FA_TM_INLINE __m512i bf16_zero_specials(__m512i w) {
    const __m512i e = _mm512_set1_epi16(0x7f80);
    return _mm512_maskz_mov_epi16(~_mm512_cmpeq_epi16_mask(_mm512_and_si512(w, e), e), w);
}

/* Whether the n bf16 values at v (n a multiple of 32) are all finite. */
FA_TM_INLINE int bf16_all_finite(const uint16_t *v, size_t n) {
    const __m512i e = _mm512_set1_epi16(0x7f80);
    __mmask32 bad = 0;
    for (size_t x = 0; x < n; x += 32)
        bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(v + x), e), e);
    return bad == 0;
}

/* 32 bf16 rows of src (row stride sld elements, dp columns) -> dst[x * ld + 0..32): their
   transpose, a row per column. Pairs of rows are interleaved into dwords first, so a dword
   transpose finishes the job. */
FA_TM_INLINE void transpose_rows32(uint16_t *restrict dst, size_t ld,
                                   const uint16_t *restrict src, size_t sld, int dp) {
    const __m512i idx = interleave_idx(32);
    for (int x = 0; x < dp; x += 16) {
        __m512i w[16];
        for (int r = 0; r < 16; r++) {
            const __m512i a = _mm512_castsi256_si512(
                _mm256_loadu_si256((const __m256i *)(src + (2 * r) * sld + x)));
            const __m512i b = _mm512_castsi256_si512(
                _mm256_loadu_si256((const __m256i *)(src + (2 * r + 1) * sld + x)));
            w[r] = _mm512_permutex2var_epi16(a, idx, b);
        }
        fa_transpose16(w);
        for (int t = 0; t < 16; t++) _mm512_storeu_si512(dst + (size_t)(x + t) * ld, w[t]);
    }
}

#endif /* FA_CPU_AMX_COMMON_H */
