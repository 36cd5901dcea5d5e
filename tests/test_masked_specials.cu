/*
 * test_masked_specials — host-side checks of src/cuda/masked_specials.cuh that need no GPU
 * (so CI runs them): nf_chunk, the bit test the sm80 kernels' scans take for "this 16-byte
 * chunk holds an Inf or NaN", against the exponent field of every 16-bit pattern at every
 * position of a chunk, for fp16 and bf16; and on random chunks of mixed halves.
 */
#include <stdio.h>
#include <stdlib.h>

#include "masked_specials.cuh"

template <typename T> static int check(const char *name) {
    const uint32_t E = fa::NfExp<T>::E;
    int bad = 0;
    /* one pattern h at position p, the other halves finite (1.0 of each format) */
    const uint32_t one = E == 0x7C00u ? 0x3C00u : 0x3F80u;
    for (uint32_t h = 0; h < 0x10000u; h++)
        for (int p = 0; p < 8; p++) {
            uint32_t v[4];
            for (int k = 0; k < 4; k++) v[k] = one | (one << 16);
            v[p / 2] = (v[p / 2] & (p % 2 ? 0x0000FFFFu : 0xFFFF0000u)) | (h << (16 * (p % 2)));
            const bool want = (h & E) == E;
            if (fa::nf_chunk<T>(v) != want && bad++ < 5)
                fprintf(stderr, "%s: pattern 0x%04x at half %d: nf_chunk %d, want %d\n", name, h,
                        p, !want, want);
        }
    /* random chunks: the answer is whether any half has an all-ones exponent */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int n = 0; n < 1000000; n++) {
        uint32_t v[4];
        bool want = false;
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            /* bias the exponents towards all ones: about one half in four */
            v[k] = (uint32_t)x | ((x >> 32) & 3 ? 0u : E) | ((x >> 34) & 3 ? 0u : E << 16);
            want |= (v[k] & E) == E || ((v[k] >> 16) & E) == E;
        }
        if (fa::nf_chunk<T>(v) != want && bad++ < 10)
            fprintf(stderr, "%s: chunk %08x %08x %08x %08x: nf_chunk %d, want %d\n", name, v[0],
                    v[1], v[2], v[3], !want, want);
    }
    printf("%s: %s\n", name, bad ? "FAILED" : "ok");
    return bad;
}

int main() {
    const int bad = check<__half>("f16") + check<__nv_bfloat16>("bf16");
    return bad ? 1 : 0;
}
