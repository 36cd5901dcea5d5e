/*
 * test_fwd.c — the forward sweep (testkit's covering design, on CPU and, when present, CUDA)
 * plus direct checks of what the rule cannot express: empty rows, LSE optional, repeatability.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

typedef struct small {
    tk_buf q, k, v, o, lse;
} small;

/* BSHD f32 problem with random inputs; outputs poisoned. */
static void small_init(small *s, int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t d) {
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    int64_t qs[4] = {b, sq, h, d}, ks[4] = {b, sk, h, d}, ls[3] = {b, h, sq};
    assert_int_equal(tk_buf_alloc(&s->q, FA_DTYPE_F32, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->k, FA_DTYPE_F32, 4, ks, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->v, FA_DTYPE_F32, 4, ks, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->o, FA_DTYPE_F32, 4, qs, 0, &r), 0);
    assert_int_equal(tk_buf_alloc(&s->lse, FA_DTYPE_F32, 3, ls, 0, &r), 0);
    tk_fill_normal(&s->q, &r, 1);
    tk_fill_normal(&s->k, &r, 1);
    tk_fill_normal(&s->v, &r, 1);
}

static void small_free(small *s) {
    tk_buf_free(&s->q);
    tk_buf_free(&s->k);
    tk_buf_free(&s->v);
    tk_buf_free(&s->o);
    tk_buf_free(&s->lse);
}

/* Causal with sq > sk: bottom-right alignment puts row i on key column i + sk - sq, so the
   first sq - sk rows see nothing and must come out as O = 0, LSE = -inf (not NaN). */
static void empty_rows_exact(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    small s;
    small_init(&s, 1, 5, 2, 2, 16);
    fa_params p = fa_params_default();
    p.causal = 1;
    assert_int_equal(fa_fwd(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &s.o.t, &s.lse.t), FA_OK);
    for (int64_t i = 0; i < 5; i++)
        for (int64_t h = 0; h < 2; h++) {
            double l = tk_get(&s.lse.t, h * 5 + i);
            if (i < 3) {
                assert_true(l == -INFINITY);
                for (int64_t x = 0; x < 16; x++)
                    assert_true(tk_get(&s.o.t, (i * 2 + h) * 16 + x) == 0.0);
            } else {
                assert_true(isfinite(l));
            }
        }
    small_free(&s);
    fa_context_destroy(ctx);
}

/* LSE is optional, and asking for it must not change O; two identical calls give identical
   bits (the CPU backend is deterministic). */
static void lse_optional_and_repeatable(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    small s;
    small_init(&s, 2, 37, 70, 3, 24);
    fa_params p = fa_params_default();
    p.window_left = 20;
    assert_int_equal(fa_fwd(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &s.o.t, &s.lse.t), FA_OK);
    size_t bytes = s.o.bytes;
    unsigned char *first = malloc(bytes);
    assert_non_null(first);
    memcpy(first, s.o.base, bytes);
    tk_poison(&s.o);
    assert_int_equal(fa_fwd(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &s.o.t, NULL), FA_OK);
    assert_memory_equal(first, s.o.base, bytes);
    tk_poison(&s.o);
    assert_int_equal(fa_fwd(ctx, &s.q.t, &s.k.t, &s.v.t, &p, &s.o.t, &s.lse.t), FA_OK);
    assert_memory_equal(first, s.o.base, bytes);
    free(first);
    small_free(&s);
    fa_context_destroy(ctx);
}

int main(int argc, char **argv) {
    size_t n;
    const tk_case *cases = tk_fwd_cases(&n);
    const struct CMUnitTest extra[] = {
        cmocka_unit_test(empty_rows_exact),
        cmocka_unit_test(lse_optional_and_repeatable),
    };
    return sweep_main(argc, argv, "fwd", cases, n, extra, sizeof extra / sizeof *extra);
}
