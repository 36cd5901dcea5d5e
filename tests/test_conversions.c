/*
 * test_conversions.c — the scalar f16/bf16 conversions of src/internal.h (every kernel's
 * loads and stores go through them or their SIMD twins).
 *
 * Two independent judges: the testkit's arithmetic conversions (frexp/nearbyint on doubles,
 * no bit tricks), and, when the CPU has F16C, the hardware's vcvtps2ph/vcvtph2ps. Ties,
 * overflow and subnormals are covered exhaustively on the f16/bf16 grids; random f32 bit
 * patterns cover the rest.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "sweep.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_PATH 1
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
/* CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c") */
static int have_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
}
#else
#define HAVE_F16C_PATH 0
static int have_f16c(void) { return 0; }
static uint16_t hw_f32_to_f16(float f) { (void)f; return 0; }
static float hw_f16_to_f32(uint16_t h) { (void)h; return 0; }
#endif

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static int f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static int bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }

/* Same value (bitwise for non-NaN, so -0 != +0), or both NaN. */
static int same_f32(float a, float b) {
    return (isnan(a) && isnan(b)) || f32_bits(a) == f32_bits(b);
}

/* f32 -> f16 of one value against both judges. */
static void check_to_f16(float f, int hw) {
    uint16_t got = fa_f32_to_f16(f);
    if (isnan(f)) {
        if (!f16_is_nan(got)) fail_msg("f32 NaN 0x%08x -> f16 0x%04x is not NaN", f32_bits(f), got);
        return;
    }
    uint16_t want = tk_f16_bits(f);
    if (got != want)
        fail_msg("f32 %a (0x%08x) -> f16 0x%04x, expected 0x%04x", (double)f, f32_bits(f), got,
                 want);
    if (hw && hw_f32_to_f16(f) != want)
        fail_msg("testkit and F16C disagree on f32 %a: 0x%04x vs 0x%04x", (double)f, want,
                 hw_f32_to_f16(f));
}

static void check_to_bf16(float f) {
    uint16_t got = fa_f32_to_bf16(f);
    if (isnan(f)) {
        if (!bf16_is_nan(got))
            fail_msg("f32 NaN 0x%08x -> bf16 0x%04x is not NaN", f32_bits(f), got);
        return;
    }
    uint16_t want = tk_bf16_bits(f);
    if (got != want)
        fail_msg("f32 %a (0x%08x) -> bf16 0x%04x, expected 0x%04x", (double)f, f32_bits(f), got,
                 want);
}

/* All 65536 f16 patterns widen exactly and come back unchanged. */
static void f16_all_patterns(void **state) {
    (void)state;
    int hw = have_f16c();
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fa_f16_to_f32((uint16_t)h);
        float ref = (float)tk_f16_value((uint16_t)h);
        if (!same_f32(f, ref))
            fail_msg("f16 0x%04x -> %a, expected %a", h, (double)f, (double)ref);
        if (hw && !same_f32(hw_f16_to_f32((uint16_t)h), f))
            fail_msg("f16 0x%04x: F16C gives %a, library %a", h,
                     (double)hw_f16_to_f32((uint16_t)h), (double)f);
        uint16_t back = fa_f32_to_f16(f);
        if (f16_is_nan((uint16_t)h) ? !f16_is_nan(back) : back != h)
            fail_msg("f16 0x%04x round-trips to 0x%04x", h, back);
    }
}

/* Every gap of the f16 grid, positive and negative: its midpoint (a tie, exact in f32), and
   the f32 neighbours on either side of it. Includes the subnormal range (ties between
   multiples of 2^-24, down to the tie between 0 and 2^-24), the normal/subnormal boundary and
   overflow (65504 + half an ulp = 65520 is a tie that rounds to even, i.e. to infinity). */
static void f32_to_f16_ties(void **state) {
    (void)state;
    int hw = have_f16c();
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double a = tk_f16_value((uint16_t)h);
        double b = h == 0x7bff ? 65536.0 : tk_f16_value((uint16_t)(h + 1)); /* 65536: overflow */
        float mid = (float)((a + b) / 2);
        float probes[] = {(float)a, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 4; i++) {
            check_to_f16(probes[i], hw);
            check_to_f16(-probes[i], hw);
        }
    }
    check_to_f16(INFINITY, hw);
    check_to_f16(-INFINITY, hw);
    check_to_f16(NAN, hw);
    check_to_f16(3.4e38f, hw);
    check_to_f16(1e-30f, hw);
    check_to_f16(bits_f32(1), hw); /* smallest f32 subnormal */
    /* spot values whose answers are known by hand */
    assert_int_equal(fa_f32_to_f16(65520.0f), 0x7c00);            /* tie at the top: to inf */
    assert_int_equal(fa_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
    assert_int_equal(fa_f32_to_f16(0x1p-25f), 0x0000);            /* tie with 0: to even 0 */
    assert_int_equal(fa_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
    assert_int_equal(fa_f32_to_f16(0x1.8p-24f), 0x0002);          /* tie 1.5 steps: to 2 */
    assert_int_equal(fa_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie: to even 1.0 */
    assert_int_equal(fa_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);     /* tie: up to even */
    assert_int_equal(fa_f32_to_f16(-2.0f), 0xc000);
}

/* Random f32 bit patterns (all exponents, NaNs included), and, with F16C, a strided pass
   over the whole f32 space against the hardware. */
static void f32_to_f16_random(void **state) {
    (void)state;
    int hw = have_f16c();
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    for (int i = 0; i < 1 << 20; i++) check_to_f16(bits_f32((uint32_t)tk_rng_u64(&r)), hw);
    if (!hw) {
        print_message("no F16C on this CPU: the strided hardware pass is skipped\n");
        return;
    }
    uint32_t start = (uint32_t)tk_rng_range(&r, 0, 250);
    for (uint64_t u = start; u <= 0xffffffffu; u += 251) {
        float f = bits_f32((uint32_t)u);
        uint16_t got = fa_f32_to_f16(f), want = hw_f32_to_f16(f);
        if (isnan(f) ? !f16_is_nan(got) : got != want)
            fail_msg("f32 0x%08x -> f16 0x%04x, F16C says 0x%04x", (uint32_t)u, got, want);
    }
}

/* bf16: all patterns widen exactly; every gap's tie and neighbours round to nearest even;
   the top tie overflows; NaN stays NaN; random patterns. */
static void bf16_conversions(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fa_bf16_to_f32((uint16_t)h);
        float ref = (float)tk_bf16_value((uint16_t)h);
        if (!same_f32(f, ref))
            fail_msg("bf16 0x%04x -> %a, expected %a", h, (double)f, (double)ref);
        uint16_t back = fa_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h) ? !bf16_is_nan(back) : back != h)
            fail_msg("bf16 0x%04x round-trips to 0x%04x", h, back);
    }
    for (uint32_t h = 0; h < 0x7f80; h++) {
        double a = tk_bf16_value((uint16_t)h);
        double b = h == 0x7f7f ? 0x1p128 : tk_bf16_value((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2);
        float probes[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; i++) {
            check_to_bf16(probes[i]);
            check_to_bf16(-probes[i]);
        }
    }
    assert_int_equal(fa_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);  /* tie: to even 1.0 */
    assert_int_equal(fa_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);  /* tie: up to even */
    assert_int_equal(fa_f32_to_bf16(FLT_MAX), 0x7f80);         /* above the top tie: inf */
    assert_int_equal(fa_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(bf16_is_nan(fa_f32_to_bf16(NAN)));
    assert_true(bf16_is_nan(fa_f32_to_bf16(bits_f32(0x7f800001u)))); /* must not become inf */
    tk_rng r;
    tk_rng_init(&r, tk_seed() + 1);
    for (int i = 0; i < 1 << 20; i++) check_to_bf16(bits_f32((uint32_t)tk_rng_u64(&r)));
}

int main(void) {
    if (!HAVE_F16C_PATH || !have_f16c()) printf("note: no F16C; the testkit is the only judge\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_all_patterns),
        cmocka_unit_test(f32_to_f16_ties),
        cmocka_unit_test(f32_to_f16_random),
        cmocka_unit_test(bf16_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL) != 0;
}
