/*
 * cp_nccl.h — the few NCCL entry points context parallelism uses, loaded with dlopen at first
 * use so that the library never links NCCL (a build or a user without it loses only fa_cp_*).
 * The types are NCCL's documented ABI, declared here rather than taken from nccl.h (which a
 * build machine need not have): ncclResult_t is an int (ncclSuccess 0), ncclDataType_t an int
 * enum (ncclUint8 = 1, ncclFloat32 = 7), ncclComm_t an opaque pointer.
 */
#ifndef FA_CP_NCCL_H
#define FA_CP_NCCL_H

#include <stddef.h>

#include "../internal.h"

#define FA_NCCL_SUCCESS 0
#define FA_NCCL_UINT8 1
#define FA_NCCL_FLOAT32 7

typedef struct fa_nccl {
    int (*send)(const void *buf, size_t count, int dtype, int peer, void *comm, void *stream);
    int (*recv)(void *buf, size_t count, int dtype, int peer, void *comm, void *stream);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*comm_count)(void *comm, int *count);
    int (*comm_user_rank)(void *comm, int *rank);
    int (*comm_cu_device)(void *comm, int *device);
    const char *(*error_string)(int result);
} fa_nccl;

/* The table, loaded once (thread-safe) from FLASHATTN_NCCL_LIBRARY or libnccl.so.2; NULL with
   *why set (the dlopen/dlsym message) when NCCL cannot be loaded. */
const fa_nccl *fa_nccl_get(const char **why);

/* fa_fail with FA_ERR_CUDA and NCCL's text for result r of `what`. */
fa_status fa_nccl_fail(fa_context *ctx, const fa_nccl *n, const char *fn, const char *what,
                       int r);

#endif /* FA_CP_NCCL_H */
