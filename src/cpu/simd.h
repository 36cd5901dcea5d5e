/*
 * cpu/simd.h — the vector type of the CPU kernels and the operations on it, written once
 * with GNU C vector extensions: the compile flags of the level (see isa.h) decide whether a
 * vector is a zmm (AVX-512: 16 lanes), a ymm (AVX2: 8) or four lanes of baseline code
 * (scalar level: SSE2 on x86-64, plain C where the target has no vectors).
 *
 * Also the exponential every softmax uses: exp(x) = 2^n e^r with n = round(x log2 e),
 * r = x - n ln2 in [-ln2/2, ln2/2] (Cody-Waite split of ln2, so r is exact to fp32), e^r by
 * its Taylor polynomial of degree 7 (truncation < 6e-9 relative, below fp32's half ulp), and
 * 2^n applied as two factors 2^(n/2) 2^(n - n/2) so that results in the subnormal range and
 * overflow to +inf round as libm's do. -inf gives +0, NaN stays NaN. Error: within 1 ulp of the
 * correctly rounded result where the level has FMA (Horner steps round once), 1.5 ulp on the
 * scalar level (tests/test_simd_exp.c).
 */
#ifndef FA_CPU_SIMD_H
#define FA_CPU_SIMD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__AVX512F__)
#define FA_VW 16 /* lanes */
#elif defined(__AVX2__)
#define FA_VW 8
#else
#define FA_VW 4
#endif

typedef float fa_vf __attribute__((vector_size(FA_VW * 4)));
typedef int32_t fa_vi __attribute__((vector_size(FA_VW * 4)));
/* the same for memory that is only 4-byte aligned */
typedef float fa_vf_u __attribute__((vector_size(FA_VW * 4), aligned(4), may_alias));

#define FA_V_INLINE static inline __attribute__((always_inline))

typedef int32_t fa_vi_u __attribute__((vector_size(FA_VW * 4), aligned(4), may_alias));

FA_V_INLINE fa_vf fa_vload(const float *p) { return *(const fa_vf_u *)p; }
FA_V_INLINE fa_vi fa_viload(const int *p) { return *(const fa_vi_u *)p; }
FA_V_INLINE void fa_vstore(float *p, fa_vf v) { *(fa_vf_u *)p = v; }
/* x - 0 is x for every x (0 + x is not, for -0), so this folds into a plain broadcast */
FA_V_INLINE fa_vf fa_vset1(float x) { return x - (fa_vf){0}; }
/* lanes of a where m is all ones, of b where it is zero */
FA_V_INLINE fa_vf fa_vsel(fa_vi m, fa_vf a, fa_vf b) {
    return (fa_vf)((m & (fa_vi)a) | (~m & (fa_vi)b));
}
#if defined(__AVX512F__)
#include <immintrin.h>
/* one instruction each, where the generic select costs a compare and a blend */
FA_V_INLINE fa_vf fa_vmax(fa_vf a, fa_vf b) { return (fa_vf)_mm512_max_ps((__m512)a, (__m512)b); }
FA_V_INLINE fa_vf fa_vmin(fa_vf a, fa_vf b) { return (fa_vf)_mm512_min_ps((__m512)a, (__m512)b); }

/* r[t] <- column t of the 16 x 16 matrix of dwords whose rows are r[0..15]: pairs of dwords,
   then pairs of qwords inside 128-bit lanes, then the lanes themselves. */
FA_V_INLINE void fa_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + k], lane L: column 4L + k of rows 4g .. 4g + 3 */
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int k = 0; k < 4; k++) {
        const __m512i s0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
        const __m512i s1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xee);
        const __m512i s2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
        const __m512i s3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xee);
        r[k] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        r[4 + k] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
        r[8 + k] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
    }
}
#else
FA_V_INLINE fa_vf fa_vmax(fa_vf a, fa_vf b) { return fa_vsel(a > b, a, b); }
FA_V_INLINE fa_vf fa_vmin(fa_vf a, fa_vf b) { return fa_vsel(a < b, a, b); }
#endif

/* min(x, 0) lane by lane, NaN kept: the argument of a softmax exponential whose reference
   (an LSE, or a max of scores rounded differently) may lie below a score by a rounding. At
   scores near 1e10 a rounding is hundreds of units, and exp would overflow to inf; P = exp of
   score minus its reference never exceeds 1. */
FA_V_INLINE fa_vf fa_vclamp0(fa_vf x) { return fa_vsel(x > 0.0f, fa_vset1(0.0f), x); }

/* v as a rounded value the compiler may not fuse into a later add: with -ffp-contract=fast,
   s * mul - max would become one FMA, which rounds the product only after the subtraction, so
   the max's own key could get exp(+half an ulp of the max): inf at scores near 1e10 (or
   exp(-half an ulp): 0, and a row sum of 0). An empty asm on the register is free. */
FA_V_INLINE fa_vf fa_vrounded(fa_vf v) {
#if defined(__GNUC__) && defined(__AVX512F__)
    __asm__("" : "+v"(v));
#elif defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__("" : "+w"(v));
#endif
    return v;
}

#if defined(__AVX512F__)
/* The same exponential with AVX-512's own rounding (vrndscaleps) and scaling (vscalefps:
   p * 2^n rounded once, subnormal and overflowing results included, as the two-factor product
   below rounds them): about 15 instructions a vector instead of 25, which is the softmax's
   share of the forward pass. */
FA_V_INLINE fa_vf fa_vexp(fa_vf x) {
    /* clamped so that x - n ln2 stays finite; beyond, the results are 0 and inf anyway.
       max/min return their second operand for a NaN x: the last select puts NaN back. */
    fa_vf xc = fa_vmin(fa_vmax(x, fa_vset1(-104.0f)), fa_vset1(89.0f));
    const __m512 t = _mm512_mul_ps((__m512)xc, _mm512_set1_ps(1.44269504088896341f));
    const fa_vf nf = (fa_vf)_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    fa_vf r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    fa_vf p = fa_vset1(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const fa_vf e = (fa_vf)_mm512_scalef_ps((__m512)p, (__m512)nf);
    return (fa_vf)_mm512_mask_mov_ps((__m512)e, _mm512_cmp_ps_mask((__m512)x, (__m512)x,
                                                                   _CMP_UNORD_Q), (__m512)x);
}
#else
FA_V_INLINE fa_vf fa_vexp(fa_vf x) {
    const fa_vf lo = fa_vset1(-104.0f), hi = fa_vset1(89.0f); /* beyond: 0 and inf anyway */
    fa_vf xc = fa_vsel(x < lo, lo, x);
    xc = fa_vsel(xc > hi, hi, xc);
    /* round to nearest by the 1.5 * 2^23 shifter: its low mantissa bits are n */
    const fa_vf shifter = fa_vset1(12582912.0f);
    fa_vf t = xc * 1.44269504088896341f + shifter;
    fa_vi n = (fa_vi)t - (fa_vi)shifter;
    fa_vf nf = t - shifter;
    fa_vf r = xc - nf * 0.693359375f;  /* ln2 high part: 9 significant bits, exact product */
    r = r - nf * -2.12194440e-4f;      /* the rest of ln2 */
    fa_vf p = fa_vset1(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    fa_vi n1 = n >> 1, n2 = n - n1; /* each in [-75, 64]: normal powers of two */
    fa_vf s1 = (fa_vf)((n1 + 127) << 23), s2 = (fa_vf)((n2 + 127) << 23);
    fa_vf e = p * s1 * s2;
    return fa_vsel(x != x, x, e);
}
#endif

/*
 * exp(x) for softmax exponents x = mul * s - max (at most a rounding above 0), cheaper than
 * fa_vexp: t = x log2 e (one rounding: relative error u |x| in the result, which only matters
 * where e^x is small, so sum_j P_j |x_j| u <= u / e per row), t = n + f with n = round(t),
 * f in [-1/2, 1/2] exact, 2^f by a degree-6 polynomial fitted for least relative error on
 * that interval (1.9e-9 in exact arithmetic; about 0.7 ulp in fp32 Horner steps), scaled by
 * 2^n. t is clamped below at -150, where 2^t is 0 in fp32 (-inf gives +0), in the
 * NaN-preserving operand order; no upper clamp. About 12 instructions a vector where fa_vexp
 * takes 17. (Folding log2 e into the FMA that subtracts the max, as GPU kernels do, would save
 * the multiply but err by u |mul * s| where P is near 1, which fails the backward's 2x rule
 * at d 256 now and then: cpu.md.)
 */
#define FA_LOG2E 1.44269504088896341f
#define FA_EXP2_C6 1.534581097e-4f
#define FA_EXP2_C5 1.339993090e-3f
#define FA_EXP2_C4 9.618489072e-3f
#define FA_EXP2_C3 5.550328642e-2f
#define FA_EXP2_C2 2.402264625e-1f
#define FA_EXP2_C1 6.931471825e-1f
FA_V_INLINE fa_vf fa_vexp_softmax_by(fa_vf x, int flush) {
    fa_vf t = x * FA_LOG2E;
#if defined(__AVX512F__)
    /* t > -125 (or NaN) is a normal result; with flush the other lanes are never formed, so
       t needs no clamp (-inf lanes go NaN, then 0), and the 1.5 * 2^23 shifter (two adds on
       either FMA port; vrndscaleps is two uops of one) rounds every lane that is kept */
    const __mmask16 normal = _mm512_cmp_ps_mask((__m512)t, _mm512_set1_ps(-125.0f), _CMP_NLE_UQ);
    fa_vf n;
    if (flush) {
        const fa_vf shifter = fa_vset1(12582912.0f);
        n = (t + shifter) - shifter;
    } else {
        /* max returns its second operand when either is NaN: t last keeps NaN */
        t = (fa_vf)_mm512_max_ps(_mm512_set1_ps(-150.0f), (__m512)t);
        n = (fa_vf)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
#else
    t = fa_vsel(t < -150.0f, fa_vset1(-150.0f), t); /* NaN compares false: kept */
    /* round to nearest by the 1.5 * 2^23 shifter, as in fa_vexp */
    const fa_vf shifter = fa_vset1(12582912.0f), ts = t + shifter;
    const fa_vi ni = (fa_vi)ts - (fa_vi)shifter;
    const fa_vf n = ts - shifter;
#endif
    const fa_vf f = t - n;
    fa_vf p = fa_vset1(FA_EXP2_C6);
    p = p * f + FA_EXP2_C5;
    p = p * f + FA_EXP2_C4;
    p = p * f + FA_EXP2_C3;
    p = p * f + FA_EXP2_C2;
    p = p * f + FA_EXP2_C1;
    p = p * f + 1.0f;
#if defined(__AVX512F__)
    if (flush) return (fa_vf)_mm512_maskz_scalef_ps(normal, (__m512)p, (__m512)n);
    return (fa_vf)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    (void)flush;
    /* n in [-150, 0] (a little above for roundings): two normal factors, as fa_vexp */
    const fa_vi n1 = ni >> 1, n2 = ni - n1;
    const fa_vf e = p * (fa_vf)((n1 + 127) << 23) * (fa_vf)((n2 + 127) << 23);
    return fa_vsel(t != t, t, e);
#endif
}

FA_V_INLINE fa_vf fa_vexp_softmax(fa_vf x) { return fa_vexp_softmax_by(x, 0); }

/*
 * The same, but results under 2^-125 are 0 on AVX-512 (elsewhere: fa_vexp_softmax): a
 * subnormal or underflowing result costs a microcode assist of ~150 cycles per vector, and
 * every masked (-inf) score of a causal diagonal tile took one (cpu.md). Probabilities are
 * relative to a row max of about 1, so what is
 * flushed is far below any error the correctness rule sees. The kernels' exponentials use it;
 * fa_vexp_softmax keeps the subnormal range that test_simd_exp checks.
 */
FA_V_INLINE fa_vf fa_vexp_softmax_ftz(fa_vf x) { return fa_vexp_softmax_by(x, 1); }

/* dst[i] = exp(mul * src[i] - sub) for i < n, any n (the tail through a padded vector), by
   fa_vexp_softmax when softmax is 1 (a softmax row: sub is its max or LSE), by
   fa_vexp_softmax_ftz when 2, or fa_vexp; with clamp, of min(mul * src[i] - sub, 0)
   (fa_vclamp0). Returns the sum of the results. softmax and clamp are constants at each call
   site. */
FA_V_INLINE float fa_vexp_row_by(float *dst, const float *src, int n, float mul, float sub,
                                 int softmax, int clamp) {
    fa_vf acc = {0};
    const fa_vf vs = fa_vset1(sub), vm = fa_vset1(mul);
    int i = 0;
    for (; i + FA_VW <= n; i += FA_VW) {
        fa_vf x = fa_vload(src + i) * vm - vs;
        if (clamp) x = fa_vclamp0(x);
        const fa_vf e = softmax ? fa_vexp_softmax_by(x, softmax == 2) : fa_vexp(x);
        fa_vstore(dst + i, e);
        acc += e;
    }
    float sum = 0.0f;
    for (int l = 0; l < FA_VW; l++) sum += acc[l];
    if (i < n) {
        float tmp[FA_VW];
        for (int l = 0; l < FA_VW; l++) tmp[l] = i + l < n ? mul * src[i + l] - sub : -INFINITY;
        const fa_vf t = clamp ? fa_vclamp0(fa_vload(tmp)) : fa_vload(tmp);
        const fa_vf e = softmax ? fa_vexp_softmax_by(t, softmax == 2) : fa_vexp(t);
        for (int l = 0; i + l < n; l++) {
            dst[i + l] = e[l];
            sum += e[l];
        }
    }
    return sum;
}

FA_V_INLINE float fa_vexp_row(float *dst, const float *src, int n, float mul, float sub) {
    return fa_vexp_row_by(dst, src, n, mul, sub, 0, 0);
}

FA_V_INLINE float fa_vexp_softmax_row(float *dst, const float *src, int n, float mul, float sub) {
    return fa_vexp_row_by(dst, src, n, mul, sub, 1, 0);
}

FA_V_INLINE float fa_vexp_softmax_ftz_row(float *dst, const float *src, int n, float mul,
                                          float sub) {
    return fa_vexp_row_by(dst, src, n, mul, sub, 2, 0);
}

/* The backward's P = exp(mul * src[i] - lse), as fa_vexp_softmax_ftz_row with the argument
   clamped at 0: a recomputed score may exceed the forward's LSE by a rounding. */
FA_V_INLINE float fa_vexp_p_row(float *dst, const float *src, int n, float mul, float lse) {
    return fa_vexp_row_by(dst, src, n, mul, lse, 2, 1);
}

#endif /* FA_CPU_SIMD_H */
