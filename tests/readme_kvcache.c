/*
 * readme_kvcache.c — the README's KV-cache fragment (the C block after
 * `<!-- test: readme_kvcache -->`, extracted at build time into readme_kvcache_block.h) run as
 * written, inside the declarations it assumes: a paged fp32 cache on the CPU backend, two
 * sequences appending two tokens each. The result is checked against fa_fwd on the same keys
 * gathered contiguously, and seqlens must have advanced as the fragment says.
 */
#include <flashattn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 2, H = 4, HK = 2, D = 16, PAGE = 4, MAX_PAGES = 4, SEQLEN_NEW = 2, POOL = 8 };

static float urand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / (float)(1u << 24) - 0.5f;
}

int main(void) {
    fa_context *ctx;
    if (fa_context_create(&ctx, FA_BACKEND_CPU) != FA_OK) return 1;
    unsigned seed = 7;
    static float kp[POOL * PAGE * HK * D], vp[POOL * PAGE * HK * D];
    static float qd[B * 1 * H * D], kn[B * SEQLEN_NEW * HK * D], vn[B * SEQLEN_NEW * HK * D];
    static float od[B * 1 * H * D], ld[B * H * 1];
    for (size_t i = 0; i < sizeof kp / sizeof *kp; i++) kp[i] = urand(&seed), vp[i] = urand(&seed);
    for (size_t i = 0; i < sizeof qd / sizeof *qd; i++) qd[i] = urand(&seed);
    for (size_t i = 0; i < sizeof kn / sizeof *kn; i++) kn[i] = urand(&seed), vn[i] = urand(&seed);
    int32_t seqlens[B] = {5, 9};
    const int32_t len0[B] = {5, 9};
    /* sequence 0 on pages 6, 1; sequence 1 on pages 0, 3, 5 (any order) */
    int32_t block_table[B * MAX_PAGES] = {6, 1, 2, 7, 0, 3, 5, 4};
    fa_tensor k_pool = fa_tensor_bshd(kp, FA_DTYPE_F32, FA_DEVICE_CPU, POOL, PAGE, HK, D);
    fa_tensor v_pool = fa_tensor_bshd(vp, FA_DTYPE_F32, FA_DEVICE_CPU, POOL, PAGE, HK, D);
    fa_tensor q = fa_tensor_bshd(qd, FA_DTYPE_F32, FA_DEVICE_CPU, B, 1, H, D);
    fa_tensor k_new = fa_tensor_bshd(kn, FA_DTYPE_F32, FA_DEVICE_CPU, B, SEQLEN_NEW, HK, D);
    fa_tensor v_new = fa_tensor_bshd(vn, FA_DTYPE_F32, FA_DEVICE_CPU, B, SEQLEN_NEW, HK, D);
    fa_tensor out = fa_tensor_bshd(od, FA_DTYPE_F32, FA_DEVICE_CPU, B, 1, H, D);
    fa_tensor lse = fa_tensor_3d(ld, FA_DTYPE_F32, FA_DEVICE_CPU, B, H, 1);
    fa_params p = fa_params_default();
    p.causal = 1;

#include "readme_kvcache_block.h"

    if (st != FA_OK) {
        fprintf(stderr, "readme_kvcache: %s\n", fa_last_error(ctx));
        return 1;
    }
    int bad = 0;
    for (int b = 0; b < B; b++) {
        if (seqlens[b] != len0[b] + SEQLEN_NEW) bad = 1;
        /* the reference: this sequence's keys gathered from its pages, then fa_fwd */
        const int n = len0[b] + SEQLEN_NEW;
        float *kc = malloc(sizeof(float) * n * HK * D), *vc = malloc(sizeof(float) * n * HK * D);
        float ro[H * D];
        for (int t = 0; t < n; t++)
            for (int j = 0; j < HK * D; j++) {
                const int page = block_table[b * MAX_PAGES + t / PAGE], row = t % PAGE;
                kc[t * HK * D + j] = kp[(page * PAGE + row) * HK * D + j];
                vc[t * HK * D + j] = vp[(page * PAGE + row) * HK * D + j];
            }
        fa_tensor rq = fa_tensor_bshd(qd + b * H * D, FA_DTYPE_F32, FA_DEVICE_CPU, 1, 1, H, D);
        fa_tensor rk = fa_tensor_bshd(kc, FA_DTYPE_F32, FA_DEVICE_CPU, 1, n, HK, D);
        fa_tensor rv = fa_tensor_bshd(vc, FA_DTYPE_F32, FA_DEVICE_CPU, 1, n, HK, D);
        fa_tensor rout = fa_tensor_bshd(ro, FA_DTYPE_F32, FA_DEVICE_CPU, 1, 1, H, D);
        if (fa_fwd(ctx, &rq, &rk, &rv, &p, &rout, NULL) != FA_OK) bad = 1;
        for (int j = 0; j < H * D; j++)
            if (!(fabsf(ro[j] - od[b * H * D + j]) <= 1e-5f)) bad = 1;
        free(kc), free(vc);
    }
    fa_context_destroy(ctx);
    printf("readme_kvcache: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
