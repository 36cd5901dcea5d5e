/*
 * cpu/team.h — when a CPU call gets a team of threads, and the loop that runs its work items
 * with or without one.
 *
 * A call below FA_CPU_SMALL_FLOPS runs on the calling thread alone, outside any OpenMP
 * region: starting or waking a team costs tens of microseconds on an idle machine and
 * milliseconds on a loaded one (0.3 to 4.5 ms for a 1x1x1x8 forward on the shared VM, issue
 * 43), while a million FLOPs take one core about 30 us. The backend decides the thread count
 * (fa_cpu_team) before it sizes the workspace, so the record, the workspace and the kernel
 * agree on it.
 */
#ifndef FA_CPU_TEAM_H
#define FA_CPU_TEAM_H

#include <stdint.h>

/* The work below which a team costs more than it gains: 2^20 FLOPs (see above). */
#define FA_CPU_SMALL_FLOPS 1048576.0

/* The calling context's threshold (FA_CPU_SMALL_FLOPS unless FLASHATTN_CPU_SMALL_FLOPS set
   another when it was created; set per call by the backend, like the switches of isa.h):
   one knob, so that a test can run the same small call with and without a team. */
double fa_cpu_small_flops(void);

/* The threads a call of `flops` floating-point operations runs on: 1 when small, else the
   context's. */
static inline int fa_cpu_team(int threads, double flops) {
    return flops < fa_cpu_small_flops() || threads < 1 ? 1 : threads;
}

/* item(arg, w) for w in [0, n): in order on the calling thread when threads <= 1 (no OpenMP
   region, so nothing is started, woken or allocated), else over `threads` threads, handed out
   one at a time (items differ in length: masks, splits). */
static inline void fa_cpu_for(int threads, int64_t n, void (*item)(void *arg, int64_t w),
                              void *arg) {
    if (threads <= 1) {
        for (int64_t w = 0; w < n; w++) item(arg, w);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t w = 0; w < n; w++) item(arg, w);
}

#endif /* FA_CPU_TEAM_H */
