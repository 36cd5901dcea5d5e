/* bench/probes/mufu_rate.cu — what the softmax's instructions cost on one SM sub-partition.
   1) exponentials per clock and SM for each PTX ex2 form (f32, f16x2, bf16x2): whether a
      packed form does two exponentials in one slot of the special-function unit;
   2) cvt.rn.bf16x2.f32 (the P pack) per clock, alone and beside ex2: whether the pack shares
      that unit;
   3) the forward's exp_at_max block (64 scores a thread: FFMA, ex2, FADD, pack) run by one
      warp per sub-partition, as one consumer warpgroup does, and by two (both consumers):
      its cycles against the 512 that 64 exponentials take on a sub-partition's unit.
   Build and run: nvcc -O3 -arch=sm_90a -o /tmp/mufu bench/probes/mufu_rate.cu && /tmp/mufu */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int CHAINS = 8, ITERS = 4096;

template <int FORM>
__global__ void probe(uint32_t *out, long long *cycles, uint32_t seed) {
    uint32_t v[CHAINS];
    for (int i = 0; i < CHAINS; i++) v[i] = (seed * (threadIdx.x + 1) + i * 0x9e3779b9u) & 0xbc00bc00u;
    __syncthreads();
    const long long t0 = clock64();
#pragma unroll 4
    for (int it = 0; it < ITERS; it++) {
#pragma unroll
        for (int i = 0; i < CHAINS; i++) {
            if (FORM == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(v[i]));
            if (FORM == 1) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(v[i]));
            if (FORM == 2) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(v[i]));
            if (FORM == 3) asm volatile("cvt.rn.bf16x2.f32 %0, %0, %0;" : "+r"(v[i]));
            if (FORM == 4) { /* two exponentials and one pack, as the softmax has them */
                asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(v[i]));
                if (i % 2) asm volatile("cvt.rn.bf16x2.f32 %0, %0, %1;" : "+r"(v[i]) : "r"(v[i - 1]));
            }
        }
    }
    __syncthreads();
    const long long t1 = clock64();
    uint32_t acc = 0;
    for (int i = 0; i < CHAINS; i++) acc ^= v[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

/* exp_at_max's body over 64 scores a thread (two rows of 32), repeated REPS times; the scores
   change each time so nothing is hoisted */
constexpr int REPS = 256;
__global__ void softmax_block(uint32_t *out, long long *cycles, float seed) {
    float sc[64];
    for (int i = 0; i < 64; i++) sc[i] = -0.01f * (float)((threadIdx.x * 7 + i * 13) % 97) * seed;
    uint32_t pa[32];
    float sum[2] = {0.f, 0.f};
    const float mul = 1.4427f, m_use = 0.25f;
    __syncthreads();
    const long long t0 = clock64();
    for (int r = 0; r < REPS; r++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                float p0, p1;
                asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p0) : "f"(fmaf(sc[4 * j + 2 * hr], mul, -m_use)));
                asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p1) : "f"(fmaf(sc[4 * j + 2 * hr + 1], mul, -m_use)));
                sum[hr] += p0 + p1;
                asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pa[j / 2 * 4 + hr + 2 * (j % 2)]) : "f"(p1), "f"(p0));
            }
#pragma unroll
        for (int i = 0; i < 64; i++) sc[i] = __uint_as_float(__float_as_uint(sc[i]) ^ (pa[i / 2] & 1u));
    }
    __syncthreads();
    const long long t1 = clock64();
    uint32_t acc = __float_as_uint(sum[0] + sum[1]);
    for (int i = 0; i < 32; i++) acc ^= pa[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

static int sms() {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
    return n;
}

template <int FORM>
static void run(const char *name, int results_per_op) {
    const int threads = 512, blocks = sms();
    uint32_t *out;
    long long *cyc, h[1024], mx = 0;
    cudaMalloc(&out, sizeof(uint32_t) * threads * blocks);
    cudaMalloc(&cyc, sizeof(long long) * blocks);
    probe<FORM><<<blocks, threads>>>(out, cyc, 1u); /* warm-up */
    probe<FORM><<<blocks, threads>>>(out, cyc, 7u);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(h, cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
    for (int b = 0; b < blocks; b++) mx = h[b] > mx ? h[b] : mx;
    const double ops = (double)threads * CHAINS * ITERS;
    printf("%-10s %s: %.2f instructions/clk/SM, %.2f results/clk/SM\n", name, cudaGetErrorString(e),
           ops / mx, ops * results_per_op / mx);
    cudaFree(out);
    cudaFree(cyc);
}

static void run_softmax(int warps_per_subpartition) {
    const int threads = 128 * warps_per_subpartition, blocks = sms();
    uint32_t *out;
    long long *cyc, h[1024], mx = 0;
    cudaMalloc(&out, sizeof(uint32_t) * threads * blocks);
    cudaMalloc(&cyc, sizeof(long long) * blocks);
    softmax_block<<<blocks, threads>>>(out, cyc, 1.f);
    softmax_block<<<blocks, threads>>>(out, cyc, 1.5f);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(h, cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
    for (int b = 0; b < blocks; b++) mx = h[b] > mx ? h[b] : mx;
    printf("exp_at_max block, %d warp(s) a sub-partition, %s: %.0f cycles a block of 64 scores "
           "(%.0f for each warp's share of the exponential unit)\n",
           warps_per_subpartition, cudaGetErrorString(e), (double)mx / REPS, 512.0 * warps_per_subpartition);
    cudaFree(out);
    cudaFree(cyc);
}

int main() {
    run<0>("ex2 f32", 1);
    run<1>("ex2 f16x2", 2);
    run<2>("ex2 bf16x2", 2);
    run<3>("cvt bf16x2", 1);
    run<4>("2 ex2+cvt", 1);
    run_softmax(1);
    run_softmax(2);
    return 0;
}
