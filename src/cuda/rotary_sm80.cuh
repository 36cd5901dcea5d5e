/*
 * cuda/rotary_sm80.cuh — the fused rotary embedding of fa_fwd_kvcache on the GPU (rule:
 * src/rotary.h and fa_params.rotary_cos): two small kernels that run before the decode, in
 * the decode's translation unit (decode_sm80.cu):
 *   rotary_q_kernel       q rotated into a contiguous [batch, seqlen_q, heads_q, d] buffer of
 *                         the workspace, which the decode then reads instead of q (q itself
 *                         is not written);
 *   rotary_append_kernel  the append of k_new / v_new with k_new rotated on its way into the
 *                         cache (v_new copied).
 * A separate pass instead of rotating inside the decode's loads: decoding reads a few query
 * rows and appends a few keys, so the extra pass touches little memory, and the decode's
 * register-tight main loop stays as it is. One thread per element; the pair partner of a
 * rotated column is read from global memory (L1 serves it). Arithmetic in fp32, rounded once
 * to the cache's dtype.
 */
#ifndef FA_CUDA_ROTARY_SM80_CUH
#define FA_CUDA_ROTARY_SM80_CUH

#include "decode_sm80.cuh"

namespace fa {

struct RotaryArgs {
    const void *cos, *sin;      /* [seqlen_ro, rot_dim / 2], rows cos_st / sin_st apart */
    int64_t cos_st, sin_st;
    int rot_dim, interleaved, cos_f32; /* cos_f32: tables are fp32, else the data's dtype */
    int q_per_token;            /* query token t at seqlens[b] + t, else at seqlens[b] */
};

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

template <typename T> __device__ __forceinline__ float rot_ld(const void *p, int64_t i, bool f32) {
    return f32 ? ((const float *)p)[i] : to_float(((const T *)p)[i]);
}

/* Column x of a row after the rotation at position pos: row(i) reads column i of the source. */
template <typename T, typename Row>
__device__ __forceinline__ float rotated(const RotaryArgs &r, int pos, int x, Row row) {
    const float v = row(x);
    if (x >= r.rot_dim) return v;
    const int half = r.rot_dim / 2;
    const int c = r.interleaved ? x / 2 : (x < half ? x : x - half);
    const bool first = r.interleaved ? (x % 2 == 0) : x < half;
    const int partner = r.interleaved ? (first ? x + 1 : x - 1) : (first ? x + half : x - half);
    const float co = rot_ld<T>(r.cos, (int64_t)pos * r.cos_st + c, r.cos_f32);
    const float si = rot_ld<T>(r.sin, (int64_t)pos * r.sin_st + c, r.cos_f32);
    const float w = row(partner);
    /* (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos): v is x1 when first, else x2 */
    return first ? fmaf(v, co, -w * si) : fmaf(w, si, v * co);
}

/* The sequence's length before the append, clamped so that every position stays inside the
   tables (seqlen_ro >= the capacity, checked by the dispatcher); bad lengths are reported
   by the decode. */
__device__ __forceinline__ int rot_base(const DecodeArgs &a, int b) {
    return min(max(a.seqlens[b], 0), max(a.capacity - a.seqlen_new, 0));
}

template <typename T>
__global__ void rotary_q_kernel(const DecodeArgs a, const RotaryArgs r, const void *q,
                                int64_t q_sb, int64_t q_st, int64_t q_sh, T *out, int batch) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t total = (int64_t)batch * a.seqlen_q * a.heads_q * a.d;
    if (idx >= total) return;
    const int x = (int)(idx % a.d);
    int64_t rest = idx / a.d;
    const int h = (int)(rest % a.heads_q);
    rest /= a.heads_q;
    const int t = (int)(rest % a.seqlen_q), b = (int)(rest / a.seqlen_q);
    const T *src = (const T *)q + b * q_sb + t * q_st + h * q_sh;
    const int pos = rot_base(a, b) + (r.q_per_token ? t : 0);
    out[idx] = from_float<T>(rotated<T>(r, pos, x, [&](int i) { return to_float(src[i]); }));
}

template <typename T>
__global__ void rotary_append_kernel(const DecodeArgs a, const RotaryArgs r, const void *kn,
                                     const void *vn, int64_t kn_sb, int64_t kn_st, int64_t kn_sh,
                                     int64_t vn_sb, int64_t vn_st, int64_t vn_sh, int heads_kv,
                                     int batch) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t total = (int64_t)batch * a.seqlen_new * heads_kv * a.d;
    if (idx >= total) return;
    const int x = (int)(idx % a.d);
    int64_t rest = idx / a.d;
    const int hk = (int)(rest % heads_kv);
    rest /= heads_kv;
    const int t = (int)(rest % a.seqlen_new), b = (int)(rest / a.seqlen_new);
    const int n0 = a.seqlens[b];
    if (n0 < 0 || n0 > a.capacity - a.seqlen_new) return; /* bad: the decode reports it */
    const int pos = n0 + t;
    if (a.block_table) { /* a bad page: reported, and nothing written (no clamped page) */
        const int pi = pos / a.page_size, e = a.block_table[b * a.bt_stride + pi];
        if (e < 0 || e >= a.num_pages) {
            report_bad(a.bad, FA_BAD_PAGE, 0, b, pi, e, 0, a.num_pages);
            return;
        }
    }
    const T *ks = (const T *)kn + b * kn_sb + t * kn_st + hk * kn_sh;
    const T *vs = (const T *)vn + b * vn_sb + t * vn_st + hk * vn_sh;
    T *kd = (T *)cache_row(a, a.k, a.k_sb, a.k_st, a.k_sh, b, pos, hk, sizeof(T));
    T *vd = (T *)cache_row(a, a.v, a.v_sb, a.v_st, a.v_sh, b, pos, hk, sizeof(T));
    kd[x] = from_float<T>(rotated<T>(r, pos, x, [&](int i) { return to_float(ks[i]); }));
    vd[x] = vs[x];
}

} // namespace fa

#endif
