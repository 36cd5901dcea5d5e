/*
 * dropout_mask.c — fa_dropout_mask: dropout.h's keep mask of a small problem, on the host,
 * for tests and users who apply it to a reference of their own. The kernels never call it:
 * they generate the same bits where they need them.
 */
#include "dropout.h"
#include "internal.h"

fa_status fa_dropout_mask(fa_context *ctx, uint64_t seed, uint64_t offset, float p,
                          int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_k,
                          uint8_t *mask_out) {
    static const char fn[] = "fa_dropout_mask";
    if (!ctx) return fa_fail(NULL, FA_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    fa_status st = fa_ctx_enter(ctx, fn);
    if (st != FA_OK) return st;
    ctx->err[0] = 0;
    ctx->has_selection = 0;
    if (!mask_out)
        st = fa_fail(ctx, FA_ERR_NULL_POINTER, "%s: mask_out is NULL", fn);
    else if (!(p >= 0 && p < 1))
        st = fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: p = %g, must be in [0, 1)", fn,
                     (double)p);
    else if (batch < 0 || heads < 0 || seqlen_q < 0 || seqlen_k < 0)
        st = fa_fail(ctx, FA_ERR_SHAPE, "%s: sizes %lld x %lld x %lld x %lld: each must be >= 0",
                     fn, (long long)batch, (long long)heads, (long long)seqlen_q,
                     (long long)seqlen_k);
    if (st != FA_OK) {
        fa_ctx_leave(ctx);
        return st;
    }
    /* the counter holds b * heads + h and i in 32 bits each (dropout.h) */
    const uint64_t bh = (uint64_t)batch * (uint64_t)heads; /* both < 2^63: no wrap in 2^64 */
    const int big = (heads > 0 && batch > (int64_t)(UINT32_MAX / (uint64_t)heads)) ||
                    seqlen_q > (int64_t)UINT32_MAX || (seqlen_k >> 34) ||
                    (seqlen_q > 0 && bh > (uint64_t)INT64_MAX / (uint64_t)seqlen_q) ||
                    (seqlen_k > 0 && bh * (uint64_t)seqlen_q > (uint64_t)SIZE_MAX /
                                                                  (uint64_t)seqlen_k);
    if (big) {
        st = fa_fail(ctx, FA_ERR_OVERFLOW,
                     "%s: %lld x %lld x %lld x %lld: the mask does not fit, or batch * heads or "
                     "seqlen_q reaches 2^32, or seqlen_k 2^34",
                     fn, (long long)batch, (long long)heads, (long long)seqlen_q,
                     (long long)seqlen_k);
        fa_ctx_leave(ctx);
        return st;
    }
    const fa_drop d = fa_drop_init(seed, offset, p);
    for (uint64_t w = 0; w < bh; w++)
        for (int64_t i = 0; i < seqlen_q; i++) {
            uint8_t *row = mask_out + (w * (uint64_t)seqlen_q + (uint64_t)i) * (uint64_t)seqlen_k;
            for (int64_t j = 0; j < seqlen_k; j += 4) {
                const fa_philox4 r =
                    fa_drop_block(&d, (uint32_t)w, (uint32_t)i, (uint32_t)(j >> 2));
                for (int e = 0; e < 4 && j + e < seqlen_k; e++)
                    row[j + e] = r.v[e] >= d.threshold;
            }
        }
    fa_ctx_leave(ctx);
    return FA_OK;
}
