/*
 * test_simd_exp.c — the vector exponential of the CPU softmaxes (src/cpu/simd.h), at every
 * instruction-set level this CPU has, against libm's exp in double rounded to float.
 *
 * The whole fp32 input range is swept by bit pattern (every 61st pattern from -inf to +inf,
 * both signs: results from 0 through the subnormals to +inf), plus the edges by name. The
 * bound is 1 ulp of the correctly rounded result (subnormal results: 1 ulp = 2^-149) on the
 * levels with FMA, 1.5 ulp on the scalar level (its multiply-adds round twice); exact zeros
 * below the subnormal range and exact +inf above FLT_MAX, NaN for NaN.
 *
 * The softmax's cheaper exponential (fa_vexp_softmax, for exponents x <= 0: 2^(x log2 e), the
 * product rounded once) is checked the same way over every 17th input from -150 to 0 and a few
 * just above 0, against 1 ulp (1.5 scalar) plus 2|x| ulps: rounding t = x log2 e errs by up to
 * 2^-23 |t|, a relative 2^-23 |x| in 2^t, which is 2|x| ulps where the result's mantissa is
 * near 1; it matters only where e^x is small (see simd.h). The kernels' variant
 * (fa_vexp_softmax_ftz) is held to the same bound, except that on AVX-512 it returns 0 where
 * e^x is under 2^-125 (it may, at the edge) and must under 2^-126.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/isa.h"
#include "sweep.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Distance of got from the exact exp(x), in ulps of the correctly rounded result. */
static double ulps(float got, float x) {
    const double exact = exp((double)x);
    const float want = (float)exact;
    if (isinf(want) || want == 0.0f) return got == want ? 0.0 : INFINITY;
    int e;
    frexpf(want, &e);
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    return fabs((double)got - exact) / ulp;
}

static const float named[] = {
    0.0f,     -0.0f,      1.0f,       -1.0f,     0.5f,       1e-30f,    -1e-30f,   FLT_MIN,
    -FLT_MIN, 1e-45f,     -1e-45f,    88.72283f, 88.72284f,  88.7229f,  89.0f,     100.0f,
    1e30f,    FLT_MAX,    -87.33654f, -87.3366f, -103.9720f, -103.973f, -104.0f,   -150.0f,
    -1e4f,    -1e30f,     -FLT_MAX,   0.34657f,  -0.34657f,  0.34658f,  -0.34658f, 20.0f,
    -20.0f,   -5.5e-8f,   1.2e-7f,    -69.31472f, 63.98f,    -63.98f,
};

static void check_level(fa_cpu_isa level) {
    const fa_cpu_isa_ops *t = fa_cpu_isa_table(level);
    if (!t || !fa_cpu_isa_supported(level)) {
        printf("  level %d: not on this CPU/build, skipped\n", (int)level);
        return;
    }
    const size_t chunk = 1 << 16;
    float *x = malloc(chunk * sizeof *x), *y = malloc(chunk * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    const double bound = level == FA_CPU_ISA_SCALAR ? 1.5 : 1.0;
    double worst = 0;
    float worst_x = 0;
    size_t n = 0, checked = 0;
    /* named values, then the sweep; odd lengths exercise the partial-vector tail */
    for (size_t i = 0; i < sizeof named / sizeof *named; i++) x[n++] = named[i];
    x[n++] = -INFINITY;
    x[n++] = INFINITY;
    x[n++] = NAN;
    uint64_t u = 0;
    for (;;) {
        int last = u > 0xffffffffull;
        if (!last) {
            x[n++] = from_bits((uint32_t)u);
            u += 61;
        }
        if (n < chunk - 3 && !last) continue;
        memcpy(y, x, n * sizeof *y);
        t->exp(y, n);
        for (size_t i = 0; i < n; i++) {
            if (isnan(x[i])) {
                if (!isnan(y[i])) fail_msg("%s: exp(NaN) = %a", t->name, y[i]);
                continue;
            }
            double e = ulps(y[i], x[i]);
            if (e > worst) worst = e, worst_x = x[i];
            if (!(e <= bound))
                fail_msg("%s: exp(%a = %.9g) = %a, libm %a (%.3g ulp)", t->name, x[i], x[i],
                         y[i], (float)exp((double)x[i]), e);
        }
        checked += n;
        n = 0;
        if (last) break;
    }
    printf("  %s: %zu inputs, worst %.3f ulp at %.9g\n", t->name, checked, worst, worst_x);
    free(x);
    free(y);
}

/* fa_vexp_softmax_ftz flushes on AVX-512 only (elsewhere it is fa_vexp_softmax). */
static int level_flushes(const fa_cpu_isa_ops *t) { return strcmp(t->name, "avx512") == 0; }

/* One chunk of exp_softmax (ftz: exp_softmax_ftz) inputs against the bound; returns the worst
   excess over |x|. The ftz variant may also return 0 where exp(x) is under 2^-125 (with a
   margin for the rounding of x log2 e), and must where it is under 2^-126. */
static double softmax_chunk(const fa_cpu_isa_ops *t, int ftz, const float *x, float *y,
                            size_t m, double base, float *worst_x) {
    double worst = 0;
    memcpy(y, x, m * sizeof *y);
    (ftz ? t->exp_softmax_ftz : t->exp_softmax)(y, m);
    for (size_t i = 0; i < m; i++) {
        if (isnan(x[i])) {
            if (!isnan(y[i])) fail_msg("%s: exp_softmax(NaN) = %a", t->name, y[i]);
            continue;
        }
        const double t2 = (double)x[i] * 1.4426950408889634; /* log2 of the exact result */
        if (ftz && t2 <= -124.999 && y[i] == 0.0f) continue;
        if (ftz && t2 < -126.001 && level_flushes(t) && y[i] != 0.0f)
            fail_msg("%s: exp_softmax_ftz(%a = %.9g) = %a, not flushed", t->name, x[i], x[i], y[i]);
        const double e = ulps(y[i], x[i]), ax = 2 * fabs((double)x[i]);
        if (!(e <= base + ax))
            fail_msg("%s: exp_softmax(%a = %.9g) = %a, libm %a (%.3g ulp, bound %.3g)", t->name,
                     x[i], x[i], y[i], (float)exp((double)x[i]), e, base + ax);
        if (e - ax > worst) worst = e - ax, *worst_x = x[i]; /* what the 2|x| term leaves */
    }
    return worst;
}

static void check_softmax_level(fa_cpu_isa level, int ftz) {
    const fa_cpu_isa_ops *t = fa_cpu_isa_table(level);
    if (!t || !fa_cpu_isa_supported(level) || !(ftz ? t->exp_softmax_ftz : t->exp_softmax)) {
        printf("  level %d: not on this CPU/build, skipped\n", (int)level);
        return;
    }
    const size_t chunk = 1 << 16;
    float *x = malloc(chunk * sizeof *x), *y = malloc(chunk * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    const double base = level == FA_CPU_ISA_SCALAR ? 1.5 : 1.0;
    double worst = 0, w;
    float worst_x = 0, wx = 0;
    size_t m = 0, checked = 0;
    x[m++] = -INFINITY;
    x[m++] = NAN;
    x[m++] = -1e30f;
    /* -0 .. -150 by bit pattern (sign bit set), then +0 .. 1e-3 */
    const uint64_t neg_end = 0xC3160000u, pos_end = 0x3A83126Fu;
    for (int part = 0; part < 2; part++) {
        const uint64_t u0 = part ? 0 : 0x80000000u, u1 = part ? pos_end : neg_end;
        for (uint64_t u = u0; u <= u1; u += 17) {
            x[m++] = from_bits((uint32_t)u);
            if (m < chunk) continue;
            if ((w = softmax_chunk(t, ftz, x, y, m, base, &wx)) > worst) worst = w, worst_x = wx;
            checked += m;
            m = 0;
        }
    }
    if ((w = softmax_chunk(t, ftz, x, y, m, base, &wx)) > worst) worst = w, worst_x = wx;
    checked += m;
    printf("  %s softmax%s: %zu inputs, worst %.3f ulp beyond 2|x| at %.9g\n", t->name,
           ftz ? " (ftz)" : "", checked, worst, worst_x);
    free(x);
    free(y);
}

static void exp_scalar(void **state) { (void)state; check_level(FA_CPU_ISA_SCALAR); }
static void exp_avx2(void **state) { (void)state; check_level(FA_CPU_ISA_AVX2); }
static void exp_avx512(void **state) { (void)state; check_level(FA_CPU_ISA_AVX512); }
static void softmax_scalar(void **state) { (void)state; check_softmax_level(FA_CPU_ISA_SCALAR, 0); }
static void softmax_avx2(void **state) { (void)state; check_softmax_level(FA_CPU_ISA_AVX2, 0); }
static void softmax_avx512(void **state) { (void)state; check_softmax_level(FA_CPU_ISA_AVX512, 0); }
static void ftz_scalar(void **state) { (void)state; check_softmax_level(FA_CPU_ISA_SCALAR, 1); }
static void ftz_avx2(void **state) { (void)state; check_softmax_level(FA_CPU_ISA_AVX2, 1); }
static void ftz_avx512(void **state) { (void)state; check_softmax_level(FA_CPU_ISA_AVX512, 1); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exp_scalar),
        cmocka_unit_test(exp_avx2),
        cmocka_unit_test(exp_avx512),
        cmocka_unit_test(softmax_scalar),
        cmocka_unit_test(softmax_avx2),
        cmocka_unit_test(softmax_avx512),
        cmocka_unit_test(ftz_scalar),
        cmocka_unit_test(ftz_avx2),
        cmocka_unit_test(ftz_avx512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
