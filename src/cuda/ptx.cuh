/*
 * cuda/ptx.cuh — the handful of PTX instructions the sm80 kernels are built from, as inline
 * functions: cp.async (global -> shared, 16 bytes, L2-only), ldmatrix (shared -> mma
 * fragments), mma.sync m16n8k16 with fp32 accumulators, and the packing of fp32 pairs into
 * fp16/bf16 pairs.
 *
 * Fragment layout of mma.m16n8k16 (PTX ISA "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 and t = lane % 4:
 *   A (16x16, row-major)  a0: (g,   2t..2t+1)  a1: (g+8, 2t..2t+1)
 *                         a2: (g,   2t+8..)    a3: (g+8, 2t+8..)
 *   B (16x8, k x n)       b0: (k = 2t..2t+1, n = g)   b1: (k = 2t+8.., n = g)
 *   C (16x8, fp32)        c0, c1: (g, 2t..2t+1)       c2, c3: (g+8, 2t..2t+1)
 * Two neighbouring C tiles (columns 0-7 and 8-15) packed to 16-bit pairs are exactly an A
 * fragment — how P = softmax(S) feeds P.V without leaving registers.
 */
#ifndef FA_CUDA_PTX_CUH
#define FA_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace fa {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte asynchronous copy; with pred false the destination is zero-filled (src-size 0), so
   rows past the end of a sequence read as zeros without touching global memory. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                            uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                  uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}

/* The element types: T is __half or __nv_bfloat16. */
template <typename T> struct mma_op;
template <> struct mma_op<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct mma_op<__half> {
    __device__ __forceinline__ static void run(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* c (16x8 fp32) += a (16x16) * b (16x8). Not volatile: a pure function of registers, so the
   compiler may interleave independent products (ldmatrix stays volatile: it reads shared
   memory and must not cross barriers). */
template <typename T>
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    mma_op<T>::run(c, a, b0, b1);
}

/* Two floats -> one 32-bit register of two 16-bit values (lo in the low half), rounded to
   nearest even. */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t v);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2 *>(&v));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* A forward probability exp2(s * mul - m), for a reference max m (log2 units) formed as
   __fmul_ru(a max score, mul), so that an argument exceeds 0 only by what the kernel's max
   rule allows (LAZY where the reference lags the max). While |m| < 2^10 one fma: its single
   rounding keeps that bound, and the max key's own term lands within an ulp of m (2^-13) of
   it. Past that the product is rounded up on its own first, as m was, so the max key's term
   is exact: one fma against a max near 1e10 is off by up to an ulp of it, 1024, which makes
   exp2 0 for every key of the row (LSE -inf) or inf (issue 42). with_row_exp branches once
   per thread for both of its rows, so the common case (both fma) stays one straight block in
   which the two rows' exponentials interleave (a branch per row cost the Hopper forward
   ~2.5%: perf fwd_sm90, current state). */
constexpr float kExpFmaBelow = 1024.f;

/* exp2(s * mul - m) by one fma, both rows (the common case) */
struct RowExpFma {
    __device__ __forceinline__ float operator()(int, float s, float mul, float m) const {
        return fast_exp2(fmaf(s, mul, -m));
    }
};
/* the form chosen per row at run time (some row past 2^10: rare, so one copy of the code
   that computes both forms and selects, not a specialised copy per combination) */
struct RowExpSel {
    bool exact[2];
    __device__ __forceinline__ float operator()(int hr, float s, float mul, float m) const {
        return fast_exp2(exact[hr] ? __fmul_ru(s, mul) - m : fmaf(s, mul, -m));
    }
};

template <class F> __device__ __forceinline__ void with_row_exp(const float (&m)[2], F &&f) {
    const bool x0 = !(fabsf(m[0]) < kExpFmaBelow), x1 = !(fabsf(m[1]) < kExpFmaBelow);
    if (!(x0 | x1)) f(RowExpFma{});
    else f(RowExpSel{{x0, x1}});
}

/* A backward probability, exp2(x * mul - l2) with l2 the row's LSE in log2 units: clamped to
   at most 1, because l2, rounded in the forward and again here, can fall below a score's
   product by a few ulps, which for scores near 1e10 is hundreds (exp2 = inf, then NaN
   gradients; issue 42). min.NaN keeps a NaN a NaN (fminf would turn it into 1). */
__device__ __forceinline__ float prob_exp2(float x, float mul, float l2) {
    float y, d = fmaf(x, mul, -l2);
    asm("min.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(d));
    return fast_exp2(y);
}

/* Reductions over the 4 lanes of a quad (the lanes that share a row of a C fragment). */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* A 4 x 4 transpose across the quad (lane t4 of it, every lane of the warp taking part): x_k of
   lane l becomes x_l of lane k. Two rounds; in each the lanes of a pair swap the two values
   whose index differs from the lane's in that round's bit. */
__device__ __forceinline__ void quad_transpose(uint32_t &x0, uint32_t &x1, uint32_t &x2,
                                               uint32_t &x3, int t4) {
    const bool b1 = t4 & 2, b0 = t4 & 1;
    uint32_t r0 = __shfl_xor_sync(0xffffffffu, b1 ? x0 : x2, 2);
    uint32_t r1 = __shfl_xor_sync(0xffffffffu, b1 ? x1 : x3, 2);
    if (b1) x0 = r0, x1 = r1;
    else x2 = r0, x3 = r1;
    r0 = __shfl_xor_sync(0xffffffffu, b0 ? x0 : x1, 1);
    r1 = __shfl_xor_sync(0xffffffffu, b0 ? x2 : x3, 1);
    if (b0) x0 = r0, x2 = r1;
    else x1 = r0, x3 = r1;
}

} // namespace fa

#endif
