/*
 * test_unit_strides.c — a dimension of size 1 may have any stride >= 1 (flashattn.h: it
 * addresses nothing), INT64_MAX included: the forward and the backward then give
 * what the contiguous call gives, bit for bit. Under UBSan (make test-asan) this also holds
 * the kernels to never forming index * stride * element size from such a stride (a signed
 * overflow fuzz/fuzz_api found in the tiles' prefetch).
 */
#include <stdint.h>
#include <string.h>

#include "sweep.h"

enum { SK = 19, H = 2, D = 24, NQ = H * D, NK = SK * H * D };

static float q[NQ], k[NK], v[NK], dout[NQ];

/* batch 1, one query row: the batch and the query's sequence dimension have size 1 */
static fa_tensor view(float *x, int64_t s, int huge) {
    fa_tensor t = fa_tensor_bshd(x, FA_DTYPE_F32, FA_DEVICE_CPU, 1, s, H, D);
    if (huge) {
        t.stride[0] = INT64_MAX;
        if (s == 1) t.stride[1] = INT64_MAX;
    }
    return t;
}

static void run(fa_context *ctx, int huge, float *o, float *lse, float *dq, float *dk, float *dv) {
    fa_tensor tq = view(q, 1, huge), tk = view(k, SK, huge), tv = view(v, SK, huge);
    fa_tensor to = view(o, 1, huge), tdo = view(dout, 1, huge);
    fa_tensor tdq = view(dq, 1, huge), tdk = view(dk, SK, huge), tdv = view(dv, SK, huge);
    fa_tensor tl = fa_tensor_3d(lse, FA_DTYPE_F32, FA_DEVICE_CPU, 1, H, 1);
    if (huge) tl.stride[0] = tl.stride[2] = INT64_MAX;
    fa_params p = fa_params_default();
    assert_int_equal(fa_fwd(ctx, &tq, &tk, &tv, &p, &to, &tl), FA_OK);
    assert_int_equal(fa_bwd(ctx, &tq, &tk, &tv, &to, &tdo, &tl, &p, &tdq, &tdk, &tdv), FA_OK);
}

static void test_unit_strides(void **state) {
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    static float o[2][NQ], lse[2][H], dq[2][NQ], dk[2][NK], dv[2][NK];
    for (int huge = 0; huge < 2; huge++) run(ctx, huge, o[huge], lse[huge], dq[huge], dk[huge], dv[huge]);
    assert_memory_equal(o[0], o[1], sizeof o[0]);
    assert_memory_equal(lse[0], lse[1], sizeof lse[0]);
    assert_memory_equal(dq[0], dq[1], sizeof dq[0]);
    assert_memory_equal(dk[0], dk[1], sizeof dk[0]);
    assert_memory_equal(dv[0], dv[1], sizeof dv[0]);
    fa_context_destroy(ctx);
}

int main(void) {
    for (int i = 0; i < NQ; i++) q[i] = (float)(i % 7) * 0.25f - 0.5f, dout[i] = (float)(i % 5) * 0.2f - 0.4f;
    for (int i = 0; i < NK; i++) k[i] = (float)(i % 11) * 0.1f - 0.5f, v[i] = (float)(i % 13) * 0.15f - 1.0f;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_unit_strides)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
