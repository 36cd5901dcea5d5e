/*
 * bench_flops.c — how much work an attention call does, so GFLOP/s mean the same thing for
 * every mask.
 */
#include "bench.h"

double bench_visible_pairs(int64_t sq, int64_t sk, int causal, int64_t wl, int64_t wr) {
    if (causal) wr = 0;
    double pairs = 0;
    /* row i sits on key column c = i + sk - sq and sees [c - wl, c + wr] clipped to [0, sk) */
    for (int64_t i = 0; i < sq; i++) {
        int64_t c = i + sk - sq;
        int64_t lo = wl < 0 ? 0 : c - wl, hi = wr < 0 ? sk : c + wr + 1;
        if (lo < 0) lo = 0;
        if (hi > sk) hi = sk;
        if (hi > lo) pairs += (double)(hi - lo);
    }
    return pairs;
}

double bench_fwd_flops(int64_t b, int64_t h, int64_t d, int64_t sq, int64_t sk, int causal,
                       int64_t wl, int64_t wr) {
    double per_pair = 4.0 * (double)b * (double)h * (double)d;
    if (causal && wl < 0 && sq == sk) return per_pair * 0.5 * (double)sq * (double)sk;
    return per_pair * bench_visible_pairs(sq, sk, causal, wl, wr);
}
