/*
 * dropout.h — the dropout keep mask: Philox4x32-10 and the rule that maps an attention
 * element to one of its outputs. Plain C, static inline, stdint only, so that the CPU kernels,
 * the float64 reference, fa_dropout_mask and (later) the CUDA kernels share one definition:
 * every one of them must produce the same mask bit for bit, because the backward regenerates
 * the forward's mask instead of storing it.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011): a counter of four 32-bit words and a key of two. One round:
 *     (hi0, lo0) = 0xD2511F53 * c0,   (hi1, lo1) = 0xCD9E8D57 * c2   (64-bit products)
 *     c = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
 * and between rounds the key grows by the Weyl constants: k0 += 0x9E3779B9, k1 += 0xBB67AE85.
 * Ten rounds (nine key bumps). Counter 0 and key 0 give 6627e8d5 e169c58d bc57ac4c 9b00dbd8
 * (the published known-answer vector; tests/test_dropout.c holds this code to it).
 *
 * The mask rule. Element (b, h, i, j): batch entry b, query head h (of heads_q), query row i
 * and key column j, both counted from 0 within sequence b (varlen: positions in the
 * sequence, not global tokens). With seed s and offset o (fa_params):
 *     key     = ( lo32(s),  hi32(s) ^ hi32(o) )
 *     counter = ( j / 4,  i,  b * heads_q + h,  lo32(o) )
 *     r       = Philox4x32-10(counter, key)[j % 4]
 *     keep    = r >= threshold,  threshold = floor(p * 2^32)   (p the fp32 dropout_p, the
 *                                                               product taken in double)
 * so four consecutive key columns 4m .. 4m+3 of a row take the four outputs of one call, in
 * order. The keep probability is 1 - threshold / 2^32, within 2^-32 of 1 - p. A kept
 * probability is multiplied by 1 / (1 - p) (fa_drop_scale), a dropped one is 0. The rule is
 * a pure function of (s, o, b, h, i, j): no tile, thread or instruction set enters it.
 * Callers keep i, j / 4 and b * heads_q + h below 2^32 (the dispatcher refuses larger).
 */
#ifndef FA_DROPOUT_H
#define FA_DROPOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define FA_DROP_FN static inline __host__ __device__
#else
#define FA_DROP_FN static inline
#endif

typedef struct fa_philox4 {
    uint32_t v[4];
} fa_philox4;

FA_DROP_FN fa_philox4 fa_philox4x32_10(fa_philox4 c, uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c.v[0];
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * c.v[2];
        fa_philox4 n;
        n.v[0] = (uint32_t)(p1 >> 32) ^ c.v[1] ^ k0;
        n.v[1] = (uint32_t)p1;
        n.v[2] = (uint32_t)(p0 >> 32) ^ c.v[3] ^ k1;
        n.v[3] = (uint32_t)p0;
        c = n;
    }
    return c;
}

/* The generator's key and the per-(b, h) part of the counter of one call's dropout. */
typedef struct fa_drop {
    uint32_t k0, k1;     /* key */
    uint32_t off;        /* counter word 3 */
    uint32_t threshold;  /* keep when r >= threshold */
} fa_drop;

FA_DROP_FN uint32_t fa_drop_threshold(float p) {
    /* p < 1, so p * 2^32 < 2^32: exact in double, and the conversion truncates (floor) */
    return (uint32_t)((double)p * 4294967296.0);
}

FA_DROP_FN fa_drop fa_drop_init(uint64_t seed, uint64_t offset, float p) {
    fa_drop d;
    d.k0 = (uint32_t)seed;
    d.k1 = (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32);
    d.off = (uint32_t)offset;
    d.threshold = fa_drop_threshold(p);
    return d;
}

/* The factor of a kept probability: 1 / (1 - p) rounded to fp32 once. */
FA_DROP_FN float fa_drop_scale(float p) { return (float)(1.0 / (1.0 - (double)p)); }

/* The four outputs of key columns 4 * j4 .. 4 * j4 + 3 of row i of head bh = b * heads_q + h. */
FA_DROP_FN fa_philox4 fa_drop_block(const fa_drop *d, uint32_t bh, uint32_t i, uint32_t j4) {
    fa_philox4 c;
    c.v[0] = j4;
    c.v[1] = i;
    c.v[2] = bh;
    c.v[3] = d->off;
    return fa_philox4x32_10(c, d->k0, d->k1);
}

/* Whether element (bh, i, j) is kept. */
FA_DROP_FN int fa_drop_keep(const fa_drop *d, uint32_t bh, uint32_t i, uint64_t j) {
    const fa_philox4 r = fa_drop_block(d, bh, i, (uint32_t)(j >> 2));
    return r.v[j & 3] >= d->threshold;
}

#ifndef __CUDACC__
/* z[0 .. n) = the factors of key columns j0 .. j0 + n - 1 of row i: scale where kept, 0 where
   dropped (one generator call per four columns, however j0 is aligned). */
static inline void fa_drop_row(const fa_drop *d, uint32_t bh, uint32_t i, int64_t j0, int n,
                               float scale, float *z) {
    int k = 0;
    while (k < n) {
        const int64_t j = j0 + k;
        const fa_philox4 r = fa_drop_block(d, bh, i, (uint32_t)(j >> 2));
        for (int e = (int)(j & 3); e < 4 && k < n; e++, k++)
            z[k] = r.v[e] >= d->threshold ? scale : 0.0f;
    }
}
#endif

#endif /* FA_DROPOUT_H */
