/*
 * fp8.h — the two OCP FP8 formats as fp32: exact decoding by table, and the rounding encoder
 * the quantiser uses (src/fp8.c).
 *
 * e4m3 ("e4m3fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, S.1111.111
 * is NaN, the largest finite value 448. e5m2: sign, 5 exponent bits (bias 15), 2 mantissa
 * bits, IEEE-like (+-inf, NaNs), largest finite 57344. Every FP8 value is an fp32 value, so the
 * decode is exact: a 256-entry table, one load per element, no branches in the tile loads.
 */
#ifndef FA_FP8_H
#define FA_FP8_H

#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FA_FP8_E4M3_MAX 448.0f
#define FA_FP8_E5M2_MAX 57344.0f

extern const float fa_fp8_e4m3_table[256];
extern const float fa_fp8_e5m2_table[256];

/* The decode table of an FP8 dtype (NULL for any other dtype). */
static inline const float *fa_fp8_table(fa_dtype dt) {
    return dt == FA_DTYPE_F8_E4M3 ? fa_fp8_e4m3_table
           : dt == FA_DTYPE_F8_E5M2 ? fa_fp8_e5m2_table
                                    : (const float *)0;
}

/* Largest finite value of an FP8 dtype. */
static inline float fa_fp8_max(fa_dtype dt) {
    return dt == FA_DTYPE_F8_E5M2 ? FA_FP8_E5M2_MAX : FA_FP8_E4M3_MAX;
}

/* x rounded to the nearest FP8 value of dt (ties to even mantissa), saturating finite values
   at +-max (a scaled value just past max is rounding noise, not overflow); NaN gives a NaN
   encoding, +-inf the saturated max for e4m3 (it has no inf) and +-inf for e5m2. */
uint8_t fa_fp8_encode(fa_dtype dt, double x);

#ifdef __cplusplus
}
#endif
#endif /* FA_FP8_H */
