/*
 * cp_nccl.c — loads NCCL with dlopen at first use (cp_nccl.h says why it is not linked).
 * FLASHATTN_NCCL_LIBRARY names the file (a framework's own copy: torch's wheel ships
 * nvidia/nccl/lib/libnccl.so.2), else the dynamic loader finds libnccl.so.2. Loaded once per
 * process: the library stays loaded (NCCL keeps process-wide state and threads).
 */
#include "cp_nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static fa_nccl g_nccl;
static const fa_nccl *g_ok;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *path = getenv("FLASHATTN_NCCL_LIBRARY");
    const char *name = path && *path ? path : "libnccl.so.2";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_why, sizeof g_why,
                 "cannot load NCCL (%s): %s; install NCCL or point FLASHATTN_NCCL_LIBRARY at "
                 "libnccl.so.2 (torch's wheel has one under site-packages/nvidia/nccl/lib)",
                 name, e ? e : "unknown error");
        return;
    }
    /* each symbol through a void * (ISO C has no cast between object and function
       pointers; POSIX guarantees this one) */
    struct {
        const char *sym;
        void *dst;
    } want[] = {
        {"ncclSend", &g_nccl.send},
        {"ncclRecv", &g_nccl.recv},
        {"ncclGroupStart", &g_nccl.group_start},
        {"ncclGroupEnd", &g_nccl.group_end},
        {"ncclCommCount", &g_nccl.comm_count},
        {"ncclCommUserRank", &g_nccl.comm_user_rank},
        {"ncclCommCuDevice", &g_nccl.comm_cu_device},
        {"ncclGetErrorString", &g_nccl.error_string},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        void *f = dlsym(h, want[i].sym);
        if (!f) {
            snprintf(g_why, sizeof g_why, "%s has no symbol %s: NCCL 2.7 or newer is needed",
                     name, want[i].sym);
            dlclose(h);
            return;
        }
        memcpy(want[i].dst, &f, sizeof f);
    }
    g_ok = &g_nccl;
}

const fa_nccl *fa_nccl_get(const char **why) {
    pthread_once(&g_once, load);
    if (!g_ok && why) *why = g_why;
    return g_ok;
}

fa_status fa_nccl_fail(fa_context *ctx, const fa_nccl *n, const char *fn, const char *what,
                       int r) {
    return fa_fail(ctx, FA_ERR_CUDA, "%s: %s failed: NCCL error %d (%s)", fn, what, r,
                   n->error_string ? n->error_string(r) : "?");
}
