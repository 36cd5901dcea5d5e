/*
 * cuda/trace_sm90.cuh — a bring-up timeline of the Hopper forward, compiled in only with
 * -DFA_SM90_TRACE in a bring-up build (cmake -DFLASHATTN_BRINGUP=ON; bench/trace_sm90.sh
 * builds it so). One thread per role (the producer's
 * issuing thread, each consumer's first thread) of each of the first TRACE_BLOCKS blocks
 * writes (tag, SM clock) pairs; the host writes the last call's buffer to the file named by
 * FLASHATTN_SM90_TRACE_FILE, and bench/trace_sm90.py turns it into per-iteration and
 * per-tile-boundary times. It answers where the cycles between a tile's last product and the
 * next tile's first go, which ncu's per-line samples spread too thinly to show.
 * Without the macro every hook is empty and the kernel is unchanged.
 */
#ifndef FA_CUDA_TRACE_SM90_CUH
#define FA_CUDA_TRACE_SM90_CUH

#include <stdint.h>

#include "wgmma.cuh"

namespace fa {
namespace sm90 {

/* tags; the low 24 bits carry a value (the key tile's index, the ring position) */
enum TraceTag {
    TR_FETCH = 1,     /* a consumer has its next tile (value: the tile's key tiles) */
    TR_ITER,          /* top of key-loop iteration (value: it) */
    TR_READY,         /* its K and V waits are over (value: 4 ring position + 1 if K was
                         there before the wait + 2 if V was) */
    TR_S_DONE,        /* S has completed */
    TR_SOFTMAX,       /* the softmax is done */
    TR_PV_DONE,       /* P V has completed */
    TR_B_ISSUED,      /* tile boundary: the next first S (and the last P V) issued (value
                         as TR_READY's, for the next tile's first K and this one's last V) */
    TR_B_S_DONE,      /* boundary: that S has completed */
    TR_B_SOFTMAX,     /* boundary: its softmax is done */
    TR_B_PV_DONE,     /* boundary: the last P V has completed */
    TR_B_STORED,      /* boundary: O handed to the store */
    TR_B_END,         /* boundary: P packed, the next loop may start */
    TR_B_TILE,        /* boundary: the next tile's parameters are worked out (tile_of) */
    TR_B_READY,       /* boundary: the waits for the next tile's first K (and the last V) over */
    TR_O_SUM,         /* O store: the rows' sums reduced */
    TR_O_SMEM,        /* O store: O in shared memory (stmatrix) */
    TR_O_FENCED,      /* O store: the proxy fence passed */
    TR_O_ISSUED,      /* O store: the copy issued (by the threads: O and LSE written) */
    TR_TURN,          /* series kernel: the consumer's turn for its exponentials has come */
    TR_P_KV = 20,     /* producer: the slot came free, K/V issued (value: ring position) */
    TR_P_Q,           /* producer: a Q buffer came free, Q issued */
    TR_V_READY,       /* series kernel: the wait for V is over */
    TR_DONE = 30      /* the role is out of tiles */
};

#if defined(FA_SM90_TRACE) && !defined(FA_BRINGUP)
#error "FA_SM90_TRACE is for bring-up builds (cmake -DFLASHATTN_BRINGUP=ON)"
#endif
#ifdef FA_SM90_TRACE
constexpr int TRACE_BLOCKS = 132, TRACE_ROLES = 4, TRACE_EVENTS = 6144;
__device__ uint2 trace_buf[TRACE_BLOCKS * TRACE_ROLES * TRACE_EVENTS];
__device__ int trace_len[TRACE_BLOCKS * TRACE_ROLES];

/* whether the mbarrier's phase `parity` has completed, without waiting (the probe of a wait) */
__device__ __forceinline__ int mbar_done(uint32_t bar, uint32_t parity) { return mbar_test(bar, parity); }

struct Tracer {
    int slot = -1, n = 0;
    __device__ void init(int role, bool writer) {
        slot = writer && blockIdx.x < TRACE_BLOCKS ? (int)blockIdx.x * TRACE_ROLES + role : -1;
    }
    __device__ __forceinline__ void operator()(int tag, int value = 0) {
        if (slot < 0 || n >= TRACE_EVENTS) return;
        uint32_t clk;
        asm volatile("mov.u32 %0, %%clock;\n" : "=r"(clk)::"memory");
        trace_buf[(size_t)slot * TRACE_EVENTS + n++] = make_uint2(((uint32_t)tag << 24) | (value & 0xffffff), clk);
    }
    __device__ void finish() {
        if (slot >= 0) trace_len[slot] = n;
    }
};
#else
__device__ __forceinline__ int mbar_done(uint32_t, uint32_t) { return 0; }
struct Tracer {
    __device__ __forceinline__ void init(int, bool) {}
    __device__ __forceinline__ void operator()(int, int = 0) {}
    __device__ __forceinline__ void finish() {}
};
#endif

} // namespace sm90
} // namespace fa

#endif
