/*
 * fuzz_bytes.h — the fuzzer's input as a stream of choices. Every read past the end returns
 * 0, so that any byte string, the empty one included, decodes to one call: libFuzzer then
 * grows inputs from the shortest, and a choice's first option is its plainest.
 */
#ifndef FA_FUZZ_BYTES_H
#define FA_FUZZ_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline unsigned fz_u8(fz *f) {
    if (!f->n) return 0;
    f->n--;
    return *f->p++;
}

static inline uint32_t fz_u32(fz *f) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) x |= (uint32_t)fz_u8(f) << (8 * i);
    return x;
}

/* One of n options (n <= 256), 0 when the input has run out. */
static inline int fz_pick(fz *f, int n) { return (int)(fz_u8(f) % (unsigned)n); }

/* An integer in [lo, hi] (hi - lo < 256). */
static inline int64_t fz_range(fz *f, int64_t lo, int64_t hi) {
    return lo + (int64_t)(fz_u8(f) % (unsigned)(hi - lo + 1));
}

/* True with probability about 1/n (never once the input has run out). */
static inline int fz_one_in(fz *f, int n) { return f->n && fz_u8(f) % (unsigned)n == 0; }

/* A float from raw bits: any value, NaN and Inf included. */
static inline float fz_bits_f32(fz *f) {
    uint32_t u = fz_u32(f);
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* A small deterministic generator for tensor contents, seeded from the input. */
static inline uint64_t fz_mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif /* FA_FUZZ_BYTES_H */
