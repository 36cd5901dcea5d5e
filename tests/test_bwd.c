/*
 * test_bwd.c — the backward sweep (dQ, dK, dV under the rule, on CPU and, when present,
 * CUDA) plus repeatability: the CPU backend promises bit-identical gradients run to run.
 */
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

static void bwd_repeatable(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    int64_t qs[4] = {2, 45, 8, 32}, ks[4] = {2, 77, 2, 32}, ls[3] = {2, 8, 45};
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
    tk_buf *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv};
    const int64_t *shapes[] = {qs, ks, ks, qs, ls, qs, qs, ks, ks};
    for (int i = 0; i < 9; i++)
        assert_int_equal(tk_buf_alloc(all[i], FA_DTYPE_F32, i == 4 ? 3 : 4, shapes[i], 1, &r), 0);
    tk_fill_normal(&q, &r, 1);
    tk_fill_normal(&k, &r, 1);
    tk_fill_normal(&v, &r, 1);
    tk_fill_normal(&dout, &r, 1);
    fa_params p = fa_params_default();
    p.causal = 1;
    assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, &lse.t), FA_OK);
    unsigned char *first[3];
    tk_buf *grads[3] = {&dq, &dk, &dv};
    for (int run = 0; run < 2; run++) {
        for (int g = 0; g < 3; g++) tk_poison(grads[g]);
        assert_int_equal(fa_bwd(ctx, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t, &p, &dq.t, &dk.t,
                                &dv.t),
                         FA_OK);
        for (int g = 0; g < 3; g++) {
            if (run == 0) {
                first[g] = malloc(grads[g]->bytes);
                assert_non_null(first[g]);
                memcpy(first[g], grads[g]->base, grads[g]->bytes);
            } else {
                assert_memory_equal(first[g], grads[g]->base, grads[g]->bytes);
                free(first[g]);
            }
        }
    }
    for (int i = 0; i < 9; i++) tk_buf_free(all[i]);
    fa_context_destroy(ctx);
}

int main(int argc, char **argv) {
    size_t n;
    const tk_case *cases = tk_bwd_cases(&n);
    const struct CMUnitTest extra[] = {cmocka_unit_test(bwd_repeatable)};
    return sweep_main(argc, argv, "bwd", cases, n, extra, sizeof extra / sizeof *extra);
}
