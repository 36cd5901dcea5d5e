/*
 * cuda/fwd_sm90_force.h — the Hopper forward's testing hook: choices the tests force on it
 * (tests/sweep.c, `test_fwd cuda --sm90 ...`), so that every tiling, schedule and kernel meets
 * every case, and a small grid makes each block take several tiles. Internal: not part of the
 * public API, and no environment variable reaches it.
 */
#ifndef FA_CUDA_FWD_SM90_FORCE_H
#define FA_CUDA_FWD_SM90_FORCE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Zero fields keep tune_sm90.h's choice. */
typedef struct fa_sm90_fwd_force {
    int blocks;   /* > 0: at most this many blocks in the persistent grid */
    int schedule; /* 1 the free overlap, 2 the ping-pong turns (then the overlapped kernel) */
    int tiles;    /* 1 the short tiling, 2 the long one (then the overlapped kernel) */
    int serial;   /* 1 the series kernel wherever it serves, 2 never */
    int pairs;    /* 1: one (batch, head) pair per tile group, masked or not */
} fa_sm90_fwd_force;

/* Forces f on every later fa_sm90_fwd call of the process (NULL: none). Set it before the
   calls it is for; it is not synchronised with calls running on other threads. */
void fa_sm90_fwd_force_set(const fa_sm90_fwd_force *f);

#ifdef __cplusplus
}
#endif
#endif
