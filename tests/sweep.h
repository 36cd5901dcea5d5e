/*
 * sweep.h — cmocka glue shared by the tests. For test_fwd and test_bwd: a testkit case list
 * as one cmocka test per case on one backend, chosen by the first argument ("cpu", the default,
 * or "cuda"; CTest registers both, and the CUDA run exits with SWEEP_SKIPPED without a GPU).
 * For the bad-input suites: the contract of a failed call.
 */
#ifndef FA_TESTS_SWEEP_H
#define FA_TESTS_SWEEP_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "testkit.h"

/* The exit status CTest counts as "skipped" (SKIP_RETURN_CODE). */
#define SWEEP_SKIPPED 77

/* Runs cases on the backend named by argv[1], then (CPU only) the extra tests; returns 0 when
   all pass, 1 on any failure, 2 on bad arguments, SWEEP_SKIPPED for "cuda" without a GPU.
   "cuda --sm90 SPEC" forces the Hopper forward's choices first (SPEC: grid=N,
   schedule=overlap|pingpong, tiles=short|long, serial=on|off, pairs; src/cuda/fwd_sm90_force.h).
   FLASHATTN_TEST_VERBOSE=1 prints the error table of every case. */
int sweep_main(int argc, char **argv, const char *group, const tk_case *cases, size_t n,
               const struct CMUnitTest *extra, size_t nextra);

/* 1 when a CUDA context can be created (the GPU variants run), else 0. */
int sweep_have_cuda(void);

/* The contract of a call that must fail (bad-input suites): status `want`, a message, not a
   byte of the arena changed (compared with its copy `before`), and no selection record unless
   allow_selection. Fails the current cmocka test otherwise. */
void sweep_expect_failure(fa_context *ctx, fa_status st, fa_status want, const char *what,
                          const char *op, const void *before, const void *arena, size_t bytes,
                          int allow_selection);

#endif
