/*
 * test_busy.c — one context, two threads (flashattn.h, "Thread safety"): a call that finds
 * the context in use by another thread returns FA_ERR_BUSY and touches nothing, neither the
 * context (the other call's record and message) nor its outputs. Two threads hammer one
 * context with forward calls and setters until each had OKS calls accepted; at least one call
 * must be refused (the calls are long enough to overlap), every accepted call must give the
 * single-thread result bit for bit, and every refused one must leave its output as it was. Run under ASan/TSan, this is
 * also the check that the refusal path reads and writes nothing it should not.
 */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

enum { B = 1, S = 256, H = 2, D = 64, N = B * S * H * D, OKS = 40, TRIES = 1000000, ROUNDS = 20 };

static pthread_barrier_t start;

static float *q, *k, *v, *ref;
static fa_context *shared;

typedef struct worker {
    float out[N];
    int ok, busy, other, mismatch, touched, bad_msg;
    fa_status other_st;
} worker;

static void *hammer(void *arg) {
    worker *w = arg;
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    fa_tensor tk = fa_tensor_bshd(k, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    fa_tensor tv = fa_tensor_bshd(v, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    fa_tensor to = fa_tensor_bshd(w->out, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    pthread_barrier_wait(&start);
    for (int it = 0; it < TRIES && w->ok < OKS; it++) {
        memset(w->out, 0x7f, sizeof w->out);
        fa_status st = fa_fwd(shared, &tq, &tk, &tv, NULL, &to, NULL);
        if (st == FA_OK) {
            w->ok++;
            if (memcmp(w->out, ref, sizeof w->out) != 0) w->mismatch++;
        } else if (st == FA_ERR_BUSY) {
            w->busy++;
            sched_yield(); /* let the holder finish */
            for (int i = 0; i < N; i++) /* 0x7f7f7f7f: the poison, untouched */
                if (((uint32_t *)w->out)[i] != 0x7f7f7f7fu) {
                    w->touched++;
                    break;
                }
            if (!strstr(fa_last_error(shared), "in use") || fa_last_selection(shared) != NULL)
                w->bad_msg++;
        } else {
            w->other++;
            w->other_st = st;
        }
        st = fa_context_set_threads(shared, 1); /* a setter: the same rule */
        if (st == FA_ERR_BUSY) w->busy++;
        else if (st != FA_OK) w->other++, w->other_st = st;
    }
    return NULL;
}

static void two_threads_one_context(void **state) {
    (void)state;
    tk_rng r;
    tk_rng_init(&r, tk_seed() ^ 0x62757379ull);
    q = malloc(N * sizeof *q), k = malloc(N * sizeof *k), v = malloc(N * sizeof *v);
    ref = malloc(N * sizeof *ref);
    assert_true(q && k && v && ref);
    for (int i = 0; i < N; i++) {
        q[i] = (float)tk_rng_normal(&r);
        k[i] = (float)tk_rng_normal(&r);
        v[i] = (float)tk_rng_normal(&r);
    }
    assert_int_equal(fa_context_create(&shared, FA_BACKEND_CPU), FA_OK);
    assert_int_equal(fa_context_set_threads(shared, 1), FA_OK);
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    fa_tensor tk = fa_tensor_bshd(k, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    fa_tensor tv = fa_tensor_bshd(v, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    fa_tensor to = fa_tensor_bshd(ref, FA_DTYPE_F32, FA_DEVICE_CPU, B, S, H, D);
    assert_int_equal(fa_fwd(shared, &tq, &tk, &tv, NULL, &to, NULL), FA_OK);

    /* rounds until the threads overlapped once (a loaded machine may run them one after the
       other for a while); each round checks every call */
    int busy = 0;
    for (int round = 0; round < ROUNDS && busy == 0; round++) {
        worker *w = calloc(2, sizeof *w);
        assert_non_null(w);
        assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&th[i], NULL, hammer, &w[i]), 0);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < 2; i++) {
            printf("round %d, thread %d: %d ok, %d busy, %d other\n", round, i, w[i].ok,
                   w[i].busy, w[i].other);
            if (w[i].other)
                fail_msg("thread %d: %d calls failed with %s (want FA_OK or FA_ERR_BUSY)", i,
                         w[i].other, fa_status_string(w[i].other_st));
            if (w[i].mismatch) fail_msg("thread %d: %d accepted calls differ", i, w[i].mismatch);
            if (w[i].touched) fail_msg("thread %d: %d refused calls wrote out", i, w[i].touched);
            if (w[i].bad_msg)
                fail_msg("thread %d: %d refused calls without their message / with a record", i,
                         w[i].bad_msg);
            if (w[i].ok < OKS) fail_msg("thread %d: only %d of %d calls accepted", i, w[i].ok, OKS);
            busy += w[i].busy;
        }
        free(w);
    }
    if (busy == 0)
        fail_msg("no call was refused with FA_ERR_BUSY in %d rounds of two threads on one context",
                 ROUNDS);
    /* after the threads: the context serves again */
    assert_int_equal(fa_fwd(shared, &tq, &tk, &tv, NULL, &to, NULL), FA_OK);
    assert_string_equal(fa_last_error(shared), "");
    fa_context_destroy(shared);
    free(q), free(k), free(v), free(ref);
}

/* The status has its own name. */
static void status_named(void **state) {
    (void)state;
    assert_string_equal(fa_status_string(FA_ERR_BUSY), "context in use by another call");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_threads_one_context),
        cmocka_unit_test(status_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
