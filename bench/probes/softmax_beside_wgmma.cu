/* bench/probes/softmax_beside_wgmma.cu — does a warpgroup's wgmma slow another warpgroup's
   softmax on the same SM? In the forward's timelines a consumer's key-loop softmax
   (exp_at_max: 64 scores a thread) takes ~1000-1070 cycles even while the other consumer runs
   no softmax of its own (the STRICT schedule at d 128: 4% overlap), where the same block
   alone takes ~600 (mufu_rate.cu). Here warpgroup 0 runs that block while warpgroup 1 runs
   back-to-back products of the shapes the forward issues (ss: both operands in shared memory;
   rs: A from registers, as P V takes P): the S of d 64/128 (ss n128), d 64's P V (rs n64),
   the same shape with A in shared memory (ss n64), d 128's P V (rs n128), d 256's S (ss
   n256). The softmax block comes whole (FFMA, ex2, FADD, pack), as its exponentials alone
   (ex2 and pack) and as its FMA-pipe part alone (FFMA, FADD, pack), to see which part the
   products slow.
   Build and run: nvcc -O3 -arch=sm_90a -Isrc/cuda -o /tmp/sbw bench/probes/softmax_beside_wgmma.cu && /tmp/sbw */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include "wgmma.cuh"

using namespace fa::sm90;
using T = __nv_bfloat16;
constexpr int REPS = 256;

/* OTHER: 0 idle, 1 ss n128 x4, 2 rs n64 x8, 3 ss n64 x8, 4 rs n128 x8, 5 ss n256 x4,
   6 rs n80 x8 (d 64's P V with 8-16 more columns, e.g. row sums from the tensor cores);
   SM: 0 the whole block, 1 exponentials only, 2 FMA-pipe part only, 3 the block without its
   row sums, 4 that with a packed 16-bit max over P instead (a bound for the lazy rule) */
template <int N, bool RS> __device__ void products(uint32_t base, uint32_t *out, int groups) {
    constexpr int KS = N <= 80 || RS ? 8 : 4;
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = 0.f;
    uint32_t a[8][4];
    for (int i = 0; i < 8; i++)
        for (int r = 0; r < 4; r++) a[i][r] = threadIdx.x * 0x00010001u * (i + r);
    const Desc da = desc_sw128(base, 16, 1024), db = desc_sw128(base + 8192, 16, 1024);
    for (int g = 0; g < groups; g++) {
        wg_fence();
#pragma unroll
        for (int k = 0; k < KS; k++) {
            if (RS)
                Wgmma<T, N>::rs(d, a[k], desc_at(db, 32 * (k % 4)), 1);
            else
                Wgmma<T, N>::ss(d, desc_at(da, 32 * (k % 4)), desc_at(db, 32 * (k % 4)), 1);
        }
        wg_commit();
        wg_wait<0>();
        wg_pin(d);
    }
    float s = 0.f;
    for (int i = 0; i < N / 2; i++) s += d[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = __float_as_uint(s);
}

template <int OTHER, int SM>
__global__ void __launch_bounds__(256) probe(uint32_t *out, long long *cycles, float seed, int groups) {
#ifdef FA_SM90A_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (fa::smem_addr(smem_raw) + 1023) & ~1023u;
    for (int i = threadIdx.x; i < 47 * 1024 / 16; i += blockDim.x)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(base + 16 * i), "r"(0u));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        float sc[64];
        for (int i = 0; i < 64; i++) sc[i] = -0.01f * (float)((threadIdx.x * 7 + i * 13) % 97) * seed;
        uint32_t pa[32];
        float sum[2] = {0.f, 0.f};
        const float mul = 1.4427f, m_use = 0.25f;
        const long long t0 = clock64();
        for (int r = 0; r < REPS; r++) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++)
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    float p0, p1;
                    if (SM == 0) {
                        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p0) : "f"(fmaf(sc[4 * j + 2 * hr], mul, -m_use)));
                        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p1) : "f"(fmaf(sc[4 * j + 2 * hr + 1], mul, -m_use)));
                        sum[hr] += p0 + p1;
                    } else if (SM == 1) {
                        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p0) : "f"(sc[4 * j + 2 * hr]));
                        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p1) : "f"(sc[4 * j + 2 * hr + 1]));
                    } else if (SM >= 3) { /* no row sum (3), or a packed 16-bit max instead (4) */
                        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p0) : "f"(fmaf(sc[4 * j + 2 * hr], mul, -m_use)));
                        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p1) : "f"(fmaf(sc[4 * j + 2 * hr + 1], mul, -m_use)));
                    } else {
                        p0 = fmaf(sc[4 * j + 2 * hr], mul, -m_use);
                        p1 = fmaf(sc[4 * j + 2 * hr + 1], mul, -m_use);
                        sum[hr] += p0 + p1;
                    }
                    asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pa[j / 2 * 4 + hr + 2 * (j % 2)]) : "f"(p1), "f"(p0));
                    if (SM == 4) {
                        uint32_t mx = __float_as_uint(sum[hr]);
                        asm volatile("max.u16x2 %0, %0, %1;" : "+r"(mx) : "r"(pa[j / 2 * 4 + hr + 2 * (j % 2)]));
                        sum[hr] = __uint_as_float(mx);
                    }
                }
#pragma unroll
            for (int i = 0; i < 64; i++) sc[i] = __uint_as_float(__float_as_uint(sc[i]) ^ (pa[i / 2] & 1u));
        }
        const long long t1 = clock64();
        uint32_t acc = __float_as_uint(sum[0] + sum[1]);
        for (int i = 0; i < 32; i++) acc ^= pa[i];
        out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
        if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
    } else if (OTHER == 1) {
        products<128, false>(base, out, groups);
    } else if (OTHER == 2) {
        products<64, true>(base, out, groups);
    } else if (OTHER == 3) {
        products<64, false>(base, out, groups);
    } else if (OTHER == 4) {
        products<128, true>(base, out, groups);
    } else if (OTHER == 5) {
        products<256, false>(base, out, groups);
    } else if (OTHER == 6) {
        products<80, true>(base, out, groups);
    }
#endif
}

template <int OTHER, int SM>
static void run(const char *name, int groups) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int threads = OTHER ? 256 : 128, smem = 48 * 1024;
    cudaFuncSetAttribute(probe<OTHER, SM>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    uint32_t *out;
    long long *cyc, h[1024], mx = 0;
    cudaMalloc(&out, sizeof(uint32_t) * threads * sms);
    cudaMalloc(&cyc, sizeof(long long) * sms);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    probe<OTHER, SM><<<sms, threads, smem>>>(out, cyc, 1.f, groups);
    cudaEventRecord(e0);
    probe<OTHER, SM><<<sms, threads, smem>>>(out, cyc, 1.5f, groups);
    cudaEventRecord(e1);
    cudaError_t e = cudaDeviceSynchronize();
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaMemcpy(h, cyc, sizeof(long long) * sms, cudaMemcpyDeviceToHost);
    for (int b = 0; b < sms; b++) mx = h[b] > mx ? h[b] : mx;
    static const char *parts[] = {"whole block", "ex2 + pack", "FFMA/FADD + pack", "no row sum",
                                  "u16x2 max, no sum"};
    printf("%-16s beside %-10s %s: %.0f cycles a block of 64 scores (kernel %.3f ms)\n", parts[SM], name,
           cudaGetErrorString(e), (double)mx / REPS, ms);
    cudaFree(out);
    cudaFree(cyc);
}

int main() {
    /* enough groups that the products outlast the softmax loop (~256 x 600 cycles): each
       group is 256 cycles of tensor work but d 256's (512) */
#define ROW(SM)                                                                                    \
    run<0, SM>("nothing", 0);                                                                      \
    run<1, SM>("ss n128 x4", 1200);                                                                \
    run<2, SM>("rs n64 x8", 1200);                                                                 \
    run<3, SM>("ss n64 x8", 1200);                                                                 \
    run<4, SM>("rs n128 x8", 600);                                                                 \
    run<5, SM>("ss n256 x4", 600);
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4)
    run<6, 0>("rs n80 x8", 1200);
    run<6, 3>("rs n80 x8", 1200);
    run<6, 4>("rs n80 x8", 1200);
    return 0;
}
