/* bench/probes/d256_bn128_regs.cu — does a d 256 consumer on 128-key tiles (cuDNN's
   "64x128x256" forward tile) fit its registers when the key loop runs S, softmax, P V in
   series (no second S in flight while P V reads P), leaving the overlap to the other consumer
   (ping-pong turns)? The kernel's own loop keeps S(j + 1) and P(j) live together, and its
   128-key d 256 form spills 416-436 bytes around S (docs/perf/fwd_sm90.md). Here one warpgroup runs
   the series form: O (64 x 256 fp32: 128 registers), S (64 x 128: 64), P (16-bit A fragments:
   32), the online softmax with its row max and sums, under setmaxnreg 240 as two consumers
   beside a 24-register producer would get. A compile-time question: read ptxas's spill line
   (the kernel is launched too, so that it can be run, but its timing is not the forward's).
   Build: nvcc -O3 -arch=sm_90a -Xptxas -v -Isrc/cuda -o /tmp/bn128 bench/probes/d256_bn128_regs.cu
   ORDER 1 (default): series; ORDER 0: S(j + 1) issued before P V(j) as the kernel does. */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include "wgmma.cuh"

#ifndef ORDER
#define ORDER 1
#endif

using namespace fa::sm90;
using T = __nv_bfloat16;

__device__ __forceinline__ uint32_t pack(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&v);
}

__global__ void __launch_bounds__(384, 1) probe(float *out, int iters) {
#ifdef FA_SM90A_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (fa::smem_addr(smem_raw) + 1023) & ~1023u;
    if (threadIdx.x < 128) { /* the producer's share */
        regs_dec<24>();
        return;
    }
    regs_inc<240>();
    constexpr int BN = 128, D = 256, NS = BN / 8, NO = D / 8; /* keys, head dim, their n8 tiles */
    if (threadIdx.x >= 256) return; /* the second consumer: idle here */
    const Desc dq = desc_sw128(base, 16, 1024), dk = desc_sw128(base + 32768, 16, 1024);
    const Desc dv = desc_sw128(base + 65536, BN * 128, 1024);
    float o[D / 2], sc[BN / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    uint32_t pa[BN / 16][4];
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    auto issue_s = [&]() {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            Wgmma<T, BN>::ss(sc, desc_at(dq, (kk / 4) * 8192 + (kk % 4) * 32),
                             desc_at(dk, (kk / 4) * BN * 128 + (kk % 4) * 32), kk > 0);
        wg_commit();
    };
    auto issue_pv = [&]() {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) Wgmma<T, D>::rs(o, pa[kk], desc_at(dv, kk * 2048), 1);
        wg_commit();
    };
    auto softmax = [&]() {
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = m[hr];
#pragma unroll
            for (int j = 0; j < NS; j++) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            alpha[hr] = exp2f(m[hr] - mx);
            m[hr] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NS; j++) {
                const float p0 = exp2f(sc[4 * j + 2 * hr] - mx), p1 = exp2f(sc[4 * j + 2 * hr + 1] - mx);
                sum += p0 + p1;
                pa[j / 2][hr + 2 * (j % 2)] = pack(p0, p1);
            }
            l[hr] = l[hr] * alpha[hr] + sum;
        }
#pragma unroll
        for (int j = 0; j < NO; j++) {
            o[4 * j] *= alpha[0];
            o[4 * j + 1] *= alpha[0];
            o[4 * j + 2] *= alpha[1];
            o[4 * j + 3] *= alpha[1];
        }
    };
    if (ORDER == 1) {
        for (int it = 0; it < iters; it++) {
            issue_s();
            wg_wait<0>();
            wg_pin(sc);
            softmax();
            issue_pv();
            wg_wait<0>();
            wg_pin(o);
        }
    } else {
        issue_s();
        wg_wait<0>();
        wg_pin(sc);
        softmax();
        for (int it = 1; it < iters; it++) {
            issue_s();
            issue_pv();
            wg_wait<1>();
            wg_pin(sc);
            wg_wait<0>();
            wg_pin(o);
            wg_pin(pa);
            softmax();
        }
        issue_pv();
        wg_wait<0>();
        wg_pin(o);
    }
    float s = l[0] + l[1];
    for (int i = 0; i < D / 2; i++) s += o[i];
    out[threadIdx.x] = s;
#endif
}

int main() {
    float *out;
    cudaMalloc(&out, 384 * sizeof(float));
    const int smem = 200 * 1024;
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    probe<<<1, 384, smem>>>(out, 8);
    const cudaError_t e = cudaDeviceSynchronize();
    printf("probe (ORDER %d): %s\n", ORDER, cudaGetErrorString(e));
    return e != cudaSuccess;
}
