/*
 * cuda/wgmma.cuh — the Hopper (sm_90a) instructions of the sm90 kernels as inline functions:
 * mbarrier waits and transaction counts, the bulk tensor copy (TMA), warpgroup matrix
 * multiply-accumulate (wgmma) with its shared-memory descriptors, and the register hand-off
 * between warpgroups (setmaxnreg). Only the sm_90a compilation pass may call them (their PTX
 * does not exist on earlier targets): the sm90 kernels' bodies sit under FA_SM90A_DEVICE.
 */
#ifndef FA_CUDA_WGMMA_CUH
#define FA_CUDA_WGMMA_CUH

#include <cuda.h>
#include <stdint.h>

#include <cuda_fp8.h>

#include "ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90A_DEVICE 1
#endif

namespace fa {
namespace sm90 {

/* ---- mbarrier ---- */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
/* makes the initialised barriers visible to the other threads and to the copy engine */
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* one arrival that also announces `bytes` of copies completing on this phase */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* whether the phase of the given parity has completed, without waiting (1 or 0) */
__device__ __forceinline__ int mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t r;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(r)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return (int)r;
}
#if defined(FA_SM90_WATCHDOG) && !defined(FA_BRINGUP)
#error "FA_SM90_WATCHDOG is for bring-up builds (cmake -DFLASHATTN_BRINGUP=ON)"
#endif
#ifdef FA_SM90_WATCHDOG
#include <stdio.h>
/* bring-up (-DFA_SM90_WATCHDOG in a FLASHATTN_BRINGUP build): a wait that lasts 2^22 polls prints the barrier and gives
   up, and later waits give up sooner: the results are then wrong, but the kernel ends, so
   the printout reaches the host. printf is a call, across which ptxas serialises the wgmma
   pipeline (C7510): a build for finding hangs, not for timing. */
__device__ int fa_watchdog_prints;
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    const int polls = *(volatile int *)&fa_watchdog_prints ? 1024 : 1 << 22;
    for (int n = 0; n < polls; n++)
        if (mbar_test(bar, parity)) return;
    if (threadIdx.x % 32 == 0 && atomicAdd(&fa_watchdog_prints, 1) < 64)
        printf("watchdog: block %d thread %d: barrier at shared %u, parity %u\n", (int)blockIdx.x,
               (int)threadIdx.x, bar, parity);
}
#else
/* waits until the phase of the given parity has completed (labels are local to the braces) */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_again:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_again;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
#endif

/* ---- bulk tensor copy: box (c0, c1, c2, c3) of a 4-D tensor map into shared memory ---- */

__device__ __forceinline__ void tma_load4(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                          int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

/* ---- bulk copy of `bytes` contiguous bytes (16-byte aligned, a multiple of 16) ---- */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

/* ---- bulk tensor copy out: shared memory into box (c0, c1, c2, c3) of a 4-D tensor map,
   in the issuing thread's bulk async-group. The map clips rows past the tensor's end. The
   writers of the shared memory make it visible to the copy engine first (fence_async_smem),
   and the issuer waits for the group's reads before the buffer is written again. ---- */

__device__ __forceinline__ void tma_store4(const CUtensorMap *map, uint32_t src, int c0, int c1,
                                           int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* the shared memory of every committed group but the newest N has been read (the writes may
   be in flight) */
template <int N> __device__ __forceinline__ void bulk_wait_read_but() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_read() { bulk_wait_read_but<0>(); }
/* every committed group has completed */
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- shared-memory words by address ---- */

__device__ __forceinline__ void st_shared_s32(uint32_t addr, int v) {
    asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
/* four 8x8 matrices of 16-bit values: lanes 8i .. 8i + 7 give the row addresses of matrix i
   (16 bytes a row), and each lane's r_i holds (row lane / 4, columns 2 (lane % 4), + 1) of
   matrix i: the m16n8 accumulator layout, so a warp writes 512 bytes per instruction */
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

/* ---- registers between warpgroups ---- */

template <int N> __device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* ---- wgmma ---- */

/*
 * Shared-memory matrix descriptor for a 128-byte-swizzled tile (the layout the copy engine
 * writes with CU_TENSOR_MAP_SWIZZLE_128B, rows of 128 bytes, 8-row atoms of 1024 bytes on a
 * 1024-byte boundary): start address, leading- and stride-dimension byte offsets (16-byte
 * units), swizzle mode 1 (128 B) in bits 62-63. K-major operands: stride = 1024 (the next 8
 * rows), leading unused (1); a k16 step inside the 128-byte row moves the start by 32 bytes.
 * MN-major operands (imm-trans 1): leading = the distance to the next 64 elements of M/N,
 * stride = 1024 (the next 8 rows of K).
 *
 * The kernels step one base descriptor through a tile with compile-time byte offsets: the
 * start address (a CTA shared-memory offset, < 2^18, so its 16-byte units fit the 14-bit
 * field) sits in the low word with the leading offset, and an offset is added to that word
 * alone, so a step is one 32-bit add instead of the masks and shifts of a fresh descriptor.
 */
struct Desc {
    uint32_t lo, hi;
};
__device__ __forceinline__ Desc desc_sw128(uint32_t addr, uint32_t lead, uint32_t stride) {
    return Desc{(addr >> 4) | ((lead >> 4) << 16), (stride >> 4) | (1u << 30)};
}
/* the descriptor of the tile `byte_off` bytes past d's start */
__device__ __forceinline__ uint64_t desc_at(Desc d, uint32_t byte_off) {
    uint64_t r;
    asm("mov.b64 %0, {%1, %2};\n" : "=l"(r) : "r"(d.lo + (byte_off >> 4)), "r"(d.hi));
    return r;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* wg_wait<N> kept below the computation of `after` in the SASS too. ptxas schedules a plain
   wait as early as it may (it depends on no register), which can hoist the wait for P V above
   a softmax meant to run under that product. Here the wait sits in both arms of a warp-uniform
   branch on `after` (distinct asm texts, so neither compiler merges them back above it): it
   cannot start before `after` is known, and waits whichever arm runs. */
template <int N> __device__ __forceinline__ void wg_wait_after(float after) {
    if (__any_sync(0xffffffffu, __float_as_uint(after) & 1u))
        asm volatile("wgmma.wait_group.sync.aligned %0; // after: odd\n" ::"n"(N) : "memory");
    else
        asm volatile("wgmma.wait_group.sync.aligned %0; // after: even\n" ::"n"(N) : "memory");
}
/* Named barrier `id` of n threads (bar.sync waits, bar.arrive passes) kept below the
   computation of `after`, by a warp-uniform branch on it (as wg_wait_after): register-only
   work (a row max, the exponentials) is otherwise free to move across either, which lets two
   warpgroups' turns overlap the very work they are meant to take in turn. bar_sync_after
   also returns the float at shared address `addr`, loaded after the wait: work computed from
   it cannot start before the wait (ptxas hoists register work above a barrier and sees
   through copies, not through a load). */
__device__ __forceinline__ float bar_sync_after(int id, int n, float after, uint32_t addr) {
    float r;
    if (__any_sync(0xffffffffu, __float_as_uint(after) & 1u))
        asm volatile("bar.sync %1, %2; // after: odd\n\tld.shared.f32 %0, [%3];\n"
                     : "=f"(r) : "r"(id), "r"(n), "r"(addr) : "memory");
    else
        asm volatile("bar.sync %1, %2; // after: even\n\tld.shared.f32 %0, [%3];\n"
                     : "=f"(r) : "r"(id), "r"(n), "r"(addr) : "memory");
    return r;
}
__device__ __forceinline__ void bar_arrive_after(int id, int n, float after) {
    if (__any_sync(0xffffffffu, __float_as_uint(after) & 1u))
        asm volatile("bar.arrive %0, %1; // after: odd\n" ::"r"(id), "r"(n) : "memory");
    else
        asm volatile("bar.arrive %0, %1; // after: even\n" ::"r"(id), "r"(n) : "memory");
}
/* keeps the compiler from moving accesses of an accumulator across an asynchronous wgmma
   (and, for A fragments, from reusing their registers before the wgmma has read them) */
template <int N> __device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void wg_pin(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int r = 0; r < 4; r++) asm volatile("" : "+r"(a[i][r])::"memory");
}

/*
 * d (64 x N fp32: the warpgroup's accumulator, N / 2 registers a thread in the m16n8 C layout
 * of each warp's 16 rows) += A (64 x 16) B (16 x N):
 *   ss: A and B in shared memory, both K-major (descriptors);
 *   ss_t: A and B in shared memory, both MN-major (imm-trans-a 1, imm-trans-b 1);
 *   ss_bt: A K-major, B MN-major (imm-trans-b 1);
 *   rs: A from registers (each warp's m16k16 A fragments), B MN-major (imm-trans-b 1).
 *   ss_new: ss with d written only (scale_d must be 0): d's old values are dead before it,
 *     so the compiler may give its registers to other values until the product.
 * scale_d 0 overwrites d instead of adding to it.
 */
template <typename T, int N> struct Wgmma;

/* The accumulator's registers as asm operands (C: "+f" read and written, "=f" written only),
   and their "%0, %1, ..." list. */
#define FA_WG_D8(C, i)                                                                             \
    C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]),       \
        C(d[i + 7])
#define FA_WG_D32(C) FA_WG_D8(C, 0), FA_WG_D8(C, 8), FA_WG_D8(C, 16), FA_WG_D8(C, 24)
#define FA_WG_D40(C) FA_WG_D32(C), FA_WG_D8(C, 32)
#define FA_WG_D64(C) FA_WG_D32(C), FA_WG_D8(C, 32), FA_WG_D8(C, 40), FA_WG_D8(C, 48), FA_WG_D8(C, 56)
#define FA_WG_D88(C) FA_WG_D64(C), FA_WG_D8(C, 64), FA_WG_D8(C, 72), FA_WG_D8(C, 80)
#define FA_WG_D128(C)                                                                              \
    FA_WG_D64(C), FA_WG_D8(C, 64), FA_WG_D8(C, 72), FA_WG_D8(C, 80), FA_WG_D8(C, 88),            \
        FA_WG_D8(C, 96), FA_WG_D8(C, 104), FA_WG_D8(C, 112), FA_WG_D8(C, 120)
#define FA_WG_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FA_WG_R40 FA_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FA_WG_R64 FA_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FA_WG_R88 FA_WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87"
#define FA_WG_R128 FA_WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

/* One product from shared memory: NAME, with the transposes TRANS ("imm-trans-a, imm-trans-b")
   of the operands (the other arguments as FA_WGMMA's). */
#define FA_WG_SS(NAME, TRANS, PT, N, NR, SS_AB, SS_SC, C)                                       \
    __device__ __forceinline__ static void NAME(float (&d)[NR], uint64_t da, uint64_t db,       \
                                                int scale_d) {                                    \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_SC ", 0;\n"                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " {"              \
                     FA_WG_R##NR "}, " SS_AB ", p, 1, 1, " TRANS ";\n}\n"                            \
                     : FA_WG_D##NR(C)                                                              \
                     : "l"(da), "l"(db), "r"(scale_d));                                           \
    }

/* One specialisation: T (PT its PTX type), n N, NR accumulator registers; the operand numbers
   after the accumulator (SS_*: the two descriptors and scale_d; RS_*: A's four registers, B's
   descriptor and scale_d) as text, since the asm string must spell them. */
#define FA_WGMMA(T, PT, N, NR, SS_AB, SS_SC, RS_AB, RS_SC)                                        \
    template <> struct Wgmma<T, N> {                                                              \
        FA_WG_SS(ss, "0, 0", PT, N, NR, SS_AB, SS_SC, "+f")                                       \
        FA_WG_SS(ss_new, "0, 0", PT, N, NR, SS_AB, SS_SC, "=f")                                   \
        FA_WG_SS(ss_t, "1, 1", PT, N, NR, SS_AB, SS_SC, "+f")                                     \
        FA_WG_SS(ss_bt, "0, 1", PT, N, NR, SS_AB, SS_SC, "+f")                                    \
        __device__ __forceinline__ static void rs(float (&d)[NR], const uint32_t (&a)[4],        \
                                                  uint64_t db, int scale_d) {                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " RS_SC ", 0;\n"                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " {"          \
                         FA_WG_R##NR "}, " RS_AB ", p, 1, 1, 1;\n}\n"                               \
                         : FA_WG_D##NR("+f")                                                       \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));   \
        }                                                                                         \
    };
#define FA_WGMMA_SIZES(T, PT)                                                                     \
    FA_WGMMA(T, PT, 64, 32, "%32, %33", "%34", "{%32, %33, %34, %35}, %36", "%37")               \
    FA_WGMMA(T, PT, 80, 40, "%40, %41", "%42", "{%40, %41, %42, %43}, %44", "%45")                 \
    FA_WGMMA(T, PT, 128, 64, "%64, %65", "%66", "{%64, %65, %66, %67}, %68", "%69")              \
    FA_WGMMA(T, PT, 176, 88, "%88, %89", "%90", "{%88, %89, %90, %91}, %92", "%93")              \
    FA_WGMMA(T, PT, 256, 128, "%128, %129", "%130", "{%128, %129, %130, %131}, %132", "%133")
FA_WGMMA_SIZES(__nv_bfloat16, "bf16")
FA_WGMMA_SIZES(__half, "f16")
#undef FA_WGMMA_SIZES
#undef FA_WGMMA
#undef FA_WG_SS

/* FP8 e4m3 (m64nNk32: a k-step is 32 elements = 32 bytes, as bf16's 16). Both operands
   K-major: the FP8 shapes have no transposes (no imm-trans operands), so V is transposed in
   shared memory (fwd_sm90.cuh). rs's A fragment: four registers of four e4m3 each, the m16n8k32
   A layout of each warp's 16 rows (register r: row g + 8 (r % 2), columns 16 (r / 2) + 4 t4
   .. + 3, the lowest column in the lowest byte). */
#define FA_WGMMA8(N, NR, SS_AB, SS_SC, RS_AB, RS_SC)                                               \
    template <> struct Wgmma<__nv_fp8_e4m3, N> {                                                  \
        __device__ __forceinline__ static void ss(float (&d)[NR], uint64_t da, uint64_t db,      \
                                                  int scale_d) {                                  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_SC ", 0;\n"                     \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {"            \
                         FA_WG_R##NR "}, " SS_AB ", p, 1, 1;\n}\n"                                \
                         : FA_WG_D##NR("+f")                                                       \
                         : "l"(da), "l"(db), "r"(scale_d));                                       \
        }                                                                                         \
        __device__ __forceinline__ static void rs(float (&d)[NR], const uint32_t (&a)[4],        \
                                                  uint64_t db, int scale_d) {                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " RS_SC ", 0;\n"                     \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {"            \
                         FA_WG_R##NR "}, " RS_AB ", p, 1, 1;\n}\n"                                \
                         : FA_WG_D##NR("+f")                                                       \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));   \
        }                                                                                         \
    };
FA_WGMMA8(128, 64, "%64, %65", "%66", "{%64, %65, %66, %67}, %68", "%69")
FA_WGMMA8(256, 128, "%128, %129", "%130", "{%128, %129, %130, %131}, %132", "%133")
#undef FA_WGMMA8

} // namespace sm90
} // namespace fa

#endif
