/*
 * test_params.c — the ABI guard of fa_params: its struct_size and version.
 *
 * Every entry point that takes options must refuse a struct that did not come from
 * fa_params_default() (zeroed, or uninitialised bytes), one of a version the library does not
 * know, and one whose size is not its version's size: FA_ERR_INVALID_ARGUMENT, a message that
 * names the call and the fix, no selection record, and not one byte of the outputs (or of the
 * KV cache an append would write) changed. The initialiser's struct and NULL must pass, so
 * that each refusal is the guard's doing.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

enum { B = 2, SQ = 3, SK = 5, H = 2, D = 8, MAXLEN = 8, NEW = 1 };
enum { T_Q, T_K, T_V, T_O, T_LSE, T_DOUT, T_DQ, T_DK, T_DV, T_CK, T_CV, T_KN, T_VN, NT };
enum { CAP = B * MAXLEN * H * D }; /* floats per tensor: the largest is the cache */

static float arena[NT][CAP];
static float snapshot[NT][CAP];
static int32_t seqlens[B] = {2, MAXLEN - NEW};

enum { OP_FWD, OP_BWD, OP_FWD_WS, OP_BWD_WS, OP_KV, OP_KV_WS, NOPS };
static const char *const op_names[NOPS] = {"fa_fwd", "fa_bwd", "fa_fwd_workspace_size",
                                           "fa_bwd_workspace_size", "fa_fwd_kvcache",
                                           "fa_fwd_kvcache_workspace_size"};

static fa_tensor bshd(int i, int64_t s) {
    return fa_tensor_bshd(arena[i], FA_DTYPE_F32, FA_DEVICE_CPU, B, s, H, D);
}

static fa_status call(fa_context *ctx, int op, const fa_params *p) {
    fa_tensor q = bshd(T_Q, SQ), k = bshd(T_K, SK), v = bshd(T_V, SK), o = bshd(T_O, SQ);
    fa_tensor dout = bshd(T_DOUT, SQ), dq = bshd(T_DQ, SQ), dk = bshd(T_DK, SK),
              dv = bshd(T_DV, SK);
    fa_tensor lse = fa_tensor_3d(arena[T_LSE], FA_DTYPE_F32, FA_DEVICE_CPU, B, H, SQ);
    fa_kvcache cache = {bshd(T_CK, MAXLEN), bshd(T_CV, MAXLEN), seqlens, NULL, 0, 0};
    fa_tensor kn = bshd(T_KN, NEW), vn = bshd(T_VN, NEW);
    size_t bytes;
    switch (op) {
    case OP_FWD: return fa_fwd(ctx, &q, &k, &v, p, &o, &lse);
    case OP_BWD: return fa_bwd(ctx, &q, &k, &v, &o, &dout, &lse, p, &dq, &dk, &dv);
    case OP_FWD_WS: return fa_fwd_workspace_size(ctx, &q, &k, &v, p, &bytes);
    case OP_BWD_WS: return fa_bwd_workspace_size(ctx, &q, &k, &v, p, &bytes);
    case OP_KV: return fa_fwd_kvcache(ctx, &q, &cache, &kn, &vn, p, 0, &o, &lse);
    default: return fa_fwd_kvcache_workspace_size(ctx, &q, &cache, &kn, &vn, p, 0, &bytes);
    }
}

/* Fresh inputs, poisoned outputs, a cache whose rows an append would overwrite. */
static void reset(void) {
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    for (int i = 0; i < NT; i++)
        for (int j = 0; j < CAP; j++) arena[i][j] = (float)tk_rng_normal(&r);
    memset(arena[T_O], 0xff, sizeof arena[T_O]);
    for (int i = T_DQ; i <= T_DV; i++) memset(arena[i], 0xff, sizeof arena[i]);
}

/* The backward reads the forward's out and LSE: give it real ones. */
static void fill_lse(fa_context *ctx) { assert_int_equal(call(ctx, OP_FWD, NULL), FA_OK); }

/* Each op with p: refused with the status, a message holding the call's name and `hint`,
   nothing written, no selection. */
static void expect_refused(const fa_params *p, const char *what, const char *hint) {
    for (int op = 0; op < NOPS; op++) {
        fa_context *ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
        reset();
        fill_lse(ctx);
        memcpy(snapshot, arena, sizeof arena);
        fa_status st = call(ctx, op, p);
        const char *msg = fa_last_error(ctx);
        if (st != FA_ERR_INVALID_ARGUMENT)
            fail_msg("%s: %s returned %s, expected invalid argument (%s)", what, op_names[op],
                     fa_status_string(st), msg);
        if (!strstr(msg, op_names[op]) || !strstr(msg, hint))
            fail_msg("%s: %s's message lacks its name or \"%s\": %s", what, op_names[op], hint,
                     msg);
        if (memcmp(snapshot, arena, sizeof arena) != 0)
            fail_msg("%s: %s wrote memory although it failed", what, op_names[op]);
        if (fa_last_selection(ctx) != NULL)
            fail_msg("%s: %s failed but reports a kernel selection", what, op_names[op]);
        fa_context_destroy(ctx);
    }
}

static void initialiser_sets_the_guard(void **state) {
    (void)state;
    fa_params p = fa_params_default();
    assert_int_equal(p.struct_size, sizeof(fa_params));
    assert_int_equal(p.version, FA_PARAMS_VERSION);
    assert_int_equal(p.window_left, -1);
    assert_int_equal(p.window_right, -1);
}

/* The initialiser's struct (with an option set) and NULL pass on every entry point. */
static void initialised_and_null_pass(void **state) {
    (void)state;
    fa_params p = fa_params_default();
    p.causal = 1;
    const fa_params *ps[2] = {&p, NULL};
    for (int i = 0; i < 2; i++)
        for (int op = 0; op < NOPS; op++) {
            fa_context *ctx;
            assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
            reset();
            fill_lse(ctx);
            fa_status st = call(ctx, op, ps[i]);
            if (st != FA_OK)
                fail_msg("%s with %s: %s: %s", op_names[op], i ? "NULL" : "fa_params_default()",
                         fa_status_string(st), fa_last_error(ctx));
            fa_context_destroy(ctx);
        }
}

static void zeroed_struct_refused(void **state) {
    (void)state;
    fa_params p;
    memset(&p, 0, sizeof p);
    p.window_left = p.window_right = -1; /* every option valid: only the guard is missing */
    expect_refused(&p, "zeroed struct", "fa_params_default()");
}

static void uninitialised_bytes_refused(void **state) {
    (void)state;
    fa_params p;
    memset(&p, 0xab, sizeof p);
    expect_refused(&p, "uninitialised bytes", "fa_params_default()");
}

static void newer_version_refused(void **state) {
    (void)state;
    fa_params p = fa_params_default();
    p.version = FA_PARAMS_VERSION + 1;
    expect_refused(&p, "a version the library does not know", "newer flashattn.h");
}

static void wrong_size_refused(void **state) {
    (void)state;
    fa_params p = fa_params_default();
    p.struct_size = (uint32_t)sizeof p - 8;
    expect_refused(&p, "struct_size short of its version's", "fa_params_default()");
    p.struct_size = (uint32_t)sizeof p + 8;
    expect_refused(&p, "struct_size beyond its version's", "fa_params_default()");
}

/* A struct of an older version: the first `size` bytes of a default one (causal), the rest
   0xff garbage that must not be read; every op must take it. */
static void older_struct_passes(size_t size, uint32_t version) {
    union {
        fa_params p;
        unsigned char bytes[sizeof(fa_params)];
    } u;
    memset(u.bytes, 0xff, sizeof u.bytes);
    fa_params d = fa_params_default();
    d.causal = 1;
    memcpy(u.bytes, &d, size);
    u.p.struct_size = (uint32_t)size;
    u.p.version = version;
    for (int op = 0; op < NOPS; op++) {
        fa_context *ctx;
        assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
        reset();
        fill_lse(ctx);
        fa_status st = call(ctx, op, &u.p);
        if (st != FA_OK)
            fail_msg("%s with a version-%u struct: %s: %s", op_names[op], version,
                     fa_status_string(st), fa_last_error(ctx));
        fa_context_destroy(ctx);
    }
}

/* A caller built with the version-1 header: its struct ends where version 2's fields begin.
   The bytes past it are garbage (an invalid dropout_p among them), so a library that read past
   struct_size would refuse the call; it must take the version-2 fields at their defaults. */
static void version_one_struct_passes(void **state) {
    (void)state;
    const size_t v1 = offsetof(fa_params, dropout_seed);
    older_struct_passes(v1, 1); /* dropout_p = NaN, descales non-NULL past it */
    fa_params p = fa_params_default();
    p.causal = 1;
    p.struct_size = (uint32_t)v1 + 8; /* version 1 with a size that is not version 1's */
    p.version = 1;
    expect_refused(&p, "version 1 with version 2's size", "fa_params_default()");
}

/* A caller built with the version-2 header (0.2.1 .. 0.2.2): its struct ends where version
   3's fields begin; the garbage past it (rotary table pointers among it) must not be read. */
static void version_two_struct_passes(void **state) {
    (void)state;
    const size_t v2 = offsetof(fa_params, rotary_cos);
    older_struct_passes(v2, 2);
}

/* The version-3 fields belong to fa_fwd_kvcache: fa_fwd and fa_bwd (and their workspace
   queries) refuse them rather than ignore them, naming the field, writing nothing. */
static void version_three_fields_refused_outside_kvcache(void **state) {
    (void)state;
    static float table[MAXLEN * 2];
    static const int32_t pad[B] = {0, 0};
    fa_tensor t = fa_tensor_2d(table, FA_DTYPE_F32, FA_DEVICE_CPU, MAXLEN, 2);
    for (int field = 0; field < 2; field++) {
        fa_params p = fa_params_default();
        if (field == 0) p.rotary_cos = p.rotary_sin = &t;
        else p.cache_leftpad = pad;
        for (int op = OP_FWD; op <= OP_BWD_WS; op++) {
            fa_context *ctx;
            assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
            reset();
            fill_lse(ctx);
            memcpy(snapshot, arena, sizeof arena);
            fa_status st = call(ctx, op, &p);
            const char *msg = fa_last_error(ctx);
            if (st != FA_ERR_INVALID_ARGUMENT || !strstr(msg, field ? "cache_leftpad" : "rotary"))
                fail_msg("%s with %s: %s: %s", op_names[op], field ? "cache_leftpad" : "rotary",
                         fa_status_string(st), msg);
            if (memcmp(snapshot, arena, sizeof arena) != 0)
                fail_msg("%s wrote memory although it failed", op_names[op]);
            fa_context_destroy(ctx);
        }
    }
}

/* The version-2 options' own checks, before anything runs. */
static void version_two_options_checked(void **state) {
    (void)state;
    const float bad_p[] = {-0.1f, 1.0f, 2.0f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_p / sizeof *bad_p; i++) {
        fa_params p = fa_params_default();
        p.dropout_p = bad_p[i];
        expect_refused(&p, "dropout_p outside [0, 1)", "dropout_p");
    }
    static const float one = 1.0f;
    fa_params p = fa_params_default();
    p.k_descale = &one; /* the inputs are not FP8 */
    expect_refused(&p, "a descale with non-FP8 inputs", "descale");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(initialiser_sets_the_guard),
        cmocka_unit_test(initialised_and_null_pass),
        cmocka_unit_test(zeroed_struct_refused),
        cmocka_unit_test(uninitialised_bytes_refused),
        cmocka_unit_test(newer_version_refused),
        cmocka_unit_test(wrong_size_refused),
        cmocka_unit_test(version_one_struct_passes),
        cmocka_unit_test(version_two_options_checked),
        cmocka_unit_test(version_two_struct_passes),
        cmocka_unit_test(version_three_fields_refused_outside_kvcache),
    };
    return cmocka_run_group_tests_name("params", tests, NULL, NULL);
}
