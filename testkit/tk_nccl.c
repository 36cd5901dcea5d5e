/*
 * tk_nccl.c — NCCL for the multi-GPU test and benchmark, loaded as the library loads it
 * (dlopen of FLASHATTN_NCCL_LIBRARY or libnccl.so.2): neither links NCCL, so both build
 * wherever the library does and skip where NCCL is absent.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

int (*tk_nccl_init_all)(void **comms, int ndev, const int *devlist);
int (*tk_nccl_destroy)(void *comm);
const char *(*tk_nccl_error)(int r);

int tk_nccl_load(char *why, size_t len) {
    const char *path = getenv("FLASHATTN_NCCL_LIBRARY");
    void *h = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, len, "%s", dlerror());
        return 0;
    }
    void *f[3] = {dlsym(h, "ncclCommInitAll"), dlsym(h, "ncclCommDestroy"),
                  dlsym(h, "ncclGetErrorString")};
    if (!f[0] || !f[1] || !f[2]) {
        snprintf(why, len, "NCCL lacks ncclCommInitAll/ncclCommDestroy/ncclGetErrorString");
        return 0;
    }
    /* object pointer to function pointer through memcpy: ISO C has no cast between them */
    memcpy(&tk_nccl_init_all, &f[0], sizeof f[0]);
    memcpy(&tk_nccl_destroy, &f[1], sizeof f[1]);
    memcpy(&tk_nccl_error, &f[2], sizeof f[2]);
    return 1;
}

static void *destroy_one(void *comm) {
    tk_nccl_destroy(comm);
    return NULL;
}

void tk_nccl_destroy_all(void **comms, int n) {
    /* concurrently, one thread each: NCCL's teardown of communicators that share a process
       may wait for the other ranks' teardown, which one thread doing them in turn never
       reaches */
    pthread_t th[64];
    int started[64] = {0};
    for (int i = 0; i < n && i < 64; i++)
        started[i] = comms[i] && pthread_create(&th[i], NULL, destroy_one, comms[i]) == 0;
    for (int i = 0; i < n && i < 64; i++)
        if (started[i]) pthread_join(th[i], NULL);
        else if (comms[i]) tk_nccl_destroy(comms[i]);
}

void tk_nccl_one_process(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 1); }
