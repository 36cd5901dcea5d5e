/*
 * cuda/decode_sm80.cu — fa_fwd_kvcache on the GPU: the synchronous device check of seqlens /
 * block_table, the append of k_new / v_new into the cache, the split choice and the decode
 * kernel (decode_sm80.cuh), which also merges the splits' partial results.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "decode_sm80.cuh"
#include "rotary_sm80.cuh"
#include "merge_sm80.h"

namespace {

/* The first rule sequence b breaks (its length, then the block_table entries of the pages it
   touches), or FA_BAD_NONE; fills *r when given. */
__device__ int kv_rule(const int *seqlens, const int *bt, int64_t bt_stride, const int *leftpad,
                       int b, int seqlen_new, int capacity, int page_size, int num_pages,
                       fa_bad_index *r) {
    const int n = seqlens[b];
    int kind = n < 0 ? FA_BAD_SEQLEN_NEGATIVE
                     : n > capacity - seqlen_new ? FA_BAD_SEQLEN_ROOM : FA_BAD_NONE;
    int j = 0, value = n, prev = seqlen_new;
    long long limit = capacity;
    if (kind == FA_BAD_NONE && leftpad && (leftpad[b] < 0 || leftpad[b] > n))
        kind = FA_BAD_LEFTPAD, value = leftpad[b], prev = 0, limit = n;
    if (kind == FA_BAD_NONE && bt) {
        const int pages = (int)(((long long)n + seqlen_new + page_size - 1) / page_size);
        for (int p = 0; p < pages && kind == FA_BAD_NONE; p++) {
            const int pg = bt[b * bt_stride + p];
            if (pg < 0 || pg >= num_pages)
                kind = FA_BAD_PAGE, j = p, value = pg, prev = 0, limit = num_pages;
        }
    }
    if (r && kind != FA_BAD_NONE) {
        /* array 1: the capacity is what a row of the block table maps (the message names it) */
        r->array = bt != nullptr, r->i = b, r->j = j, r->value = value, r->prev = prev;
        r->limit = limit;
        r->kind = kind;
    }
    return kind;
}

/* FA_DEVICE_CHECKS_SYNC: the record of the first bad sequence into *out (kind 0: none) */
__global__ void kv_check_kernel(const int *seqlens, const int *bt, int64_t bt_stride,
                                const int *leftpad, int batch, int seqlen_new, int capacity,
                                int page_size, int num_pages, fa_bad_index *out) {
    __shared__ int first;
    if (threadIdx.x == 0) first = INT_MAX;
    __syncthreads();
    for (int b = threadIdx.x; b < batch; b += blockDim.x)
        if (kv_rule(seqlens, bt, bt_stride, leftpad, b, seqlen_new, capacity, page_size,
                    num_pages, nullptr) != FA_BAD_NONE)
            atomicMin(&first, b);
    __syncthreads();
    if (threadIdx.x == 0) {
        fa_bad_index r = {};
        if (first != INT_MAX)
            kv_rule(seqlens, bt, bt_stride, leftpad, first, seqlen_new, capacity, page_size,
                    num_pages, &r);
        *out = r;
    }
}

/* one thread per 16-byte chunk of a new row: k_new/v_new (b, t, hk) -> cache position
   seqlens[b] + t */
template <typename T>
__global__ void append_kernel(const fa::DecodeArgs a, const void *kn, const void *vn,
                              int64_t kn_sb, int64_t kn_st, int64_t kn_sh, int64_t vn_sb,
                              int64_t vn_st, int64_t vn_sh, int heads_kv, int batch) {
    const int cpr = a.d / 8;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t total = (int64_t)batch * a.seqlen_new * heads_kv * cpr;
    if (idx >= total) return;
    const int x = (int)(idx % cpr);
    int64_t r = idx / cpr;
    const int hk = (int)(r % heads_kv);
    r /= heads_kv;
    const int t = (int)(r % a.seqlen_new), b = (int)(r / a.seqlen_new);
    const int n0 = a.seqlens[b];
    if (n0 < 0 || n0 > a.capacity - a.seqlen_new) return; /* bad: the decode reports it */
    const int pos = n0 + t;
    if (a.block_table) { /* a bad page: reported, and nothing written (no clamped page) */
        const int pi = pos / a.page_size, e = a.block_table[b * a.bt_stride + pi];
        if (e < 0 || e >= a.num_pages) {
            fa::report_bad(a.bad, FA_BAD_PAGE, 0, b, pi, e, 0, a.num_pages);
            return;
        }
    }
    const T *ks = (const T *)kn + b * kn_sb + t * kn_st + hk * kn_sh + x * 8;
    const T *vs = (const T *)vn + b * vn_sb + t * vn_st + hk * vn_sh + x * 8;
    T *kd = (T *)fa::cache_row(a, a.k, a.k_sb, a.k_st, a.k_sh, b, pos, hk, sizeof(T)) + x * 8;
    T *vd = (T *)fa::cache_row(a, a.v, a.v_sb, a.v_st, a.v_sh, b, pos, hk, sizeof(T)) + x * 8;
    *(uint4 *)kd = *(const uint4 *)ks;
    *(uint4 *)vd = *(const uint4 *)vs;
}

template <typename T>
cudaError_t run_dim(int D, const fa::DecodeArgs &a, int rb, int hkv, int batch, cudaStream_t st) {
    switch (D) {
    case 32: return fa::decode_sm80_run<T, 32>(a, rb, hkv, batch, st);
    case 64: return fa::decode_sm80_run<T, 64>(a, rb, hkv, batch, st);
    case 96: return fa::decode_sm80_run<T, 96>(a, rb, hkv, batch, st);
    case 128: return fa::decode_sm80_run<T, 128>(a, rb, hkv, batch, st);
    case 192: return fa::decode_sm80_run<T, 192>(a, rb, hkv, batch, st);
    default: return fa::decode_sm80_run<T, 256>(a, rb, hkv, batch, st);
    }
}

size_t decode_smem(int D) {
    switch (D) {
    case 32: return fa::DecodeCfg<32>::SMEM;
    case 64: return fa::DecodeCfg<64>::SMEM;
    case 96: return fa::DecodeCfg<96>::SMEM;
    case 128: return fa::DecodeCfg<128>::SMEM;
    case 192: return fa::DecodeCfg<192>::SMEM;
    default: return fa::DecodeCfg<256>::SMEM;
    }
}

int key_step(int D) {
    switch (D) {
    case 32: return 4 * fa::DecodeCfg<32>::BNW;
    case 64: return 4 * fa::DecodeCfg<64>::BNW;
    case 96: return 4 * fa::DecodeCfg<96>::BNW;
    case 128: return 4 * fa::DecodeCfg<128>::BNW;
    case 192: return 4 * fa::DecodeCfg<192>::BNW;
    default: return 4 * fa::DecodeCfg<256>::BNW;
    }
}

/* The fused rotary embedding: q into q_rot, k_new rotated into the cache as it is appended
   (v_new copied), both before the decode on the same stream. */
template <typename T>
cudaError_t rotate_t(const fa_problem *p, const fa::DecodeArgs &a, void *q_rot, cudaStream_t st) {
    fa::RotaryArgs r;
    r.cos = p->rot_cos, r.sin = p->rot_sin;
    r.cos_st = p->rot_cos_st, r.sin_st = p->rot_sin_st;
    r.rot_dim = (int)p->rot_dim;
    r.interleaved = p->rot_interleaved;
    r.cos_f32 = p->rot_dtype == FA_DTYPE_F32;
    r.q_per_token = p->rot_q_per_token;
    const int64_t nq = p->batch * p->seqlen_q * p->heads_q * p->d;
    fa::rotary_q_kernel<T><<<(unsigned)((nq + 255) / 256), 256, 0, st>>>(
        a, r, p->q.data, p->q.sb, p->q.st, p->q.sh, (T *)q_rot, (int)p->batch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int64_t nk = p->batch * p->seqlen_new * p->heads_kv * p->d;
    fa::rotary_append_kernel<T><<<(unsigned)((nk + 255) / 256), 256, 0, st>>>(
        a, r, p->k_new.data, p->v_new.data, p->k_new.sb, p->k_new.st, p->k_new.sh, p->v_new.sb,
        p->v_new.st, p->v_new.sh, (int)p->heads_kv, (int)p->batch);
    return cudaGetLastError();
}

cudaError_t rotate(const fa_problem *p, const fa::DecodeArgs &a, void *q_rot, cudaStream_t st,
                   bool bf) {
    return bf ? rotate_t<__nv_bfloat16>(p, a, q_rot, st) : rotate_t<__half>(p, a, q_rot, st);
}

struct Plan {
    int splits, chunk, row_blocks;
};

/* Splits: as many as fit one block on each multiprocessor beside the other blocks of the grid
   (batch x kv heads x row blocks), at least one, each split at least two key steps of the
   capacity and at most FA_CUDA_MERGE_MAX_PARTS; or what the caller forced. One block per
   multiprocessor beats uneven counts (two on some, one on the rest), and a second wave of a
   few blocks costs a whole wave (decode_sm80.md, v4 and v8). */
Plan plan_of(const fa_problem *p, int num_sms) {
    Plan pl;
    const int D = fa_cuda_kernel_dim(p->d), step = key_step(D);
    const int64_t rows = p->group * p->seqlen_q;
    pl.row_blocks = (int)((rows + 15) / 16);
    const int64_t base = (int64_t)pl.row_blocks * p->heads_kv * p->batch;
    const int64_t cap = p->seqlen_k > 0 ? p->seqlen_k : 1;
    int64_t s = p->num_splits;
    if (s <= 0) {
        int64_t by_len = (cap + 2 * step - 1) / (2 * step);
        if (by_len > FA_CUDA_MERGE_MAX_PARTS) by_len = FA_CUDA_MERGE_MAX_PARTS;
        s = num_sms / base;
        if (s > by_len) s = by_len;
        if (s < 1) s = 1;
    }
    pl.splits = (int)s;
    int64_t chunk = (cap + s - 1) / s;
    chunk = (chunk + step - 1) / step * step;
    pl.chunk = (int)chunk;
    return pl;
}

} // namespace

/* Bytes of the rotated q (fused rotary; 0 without), a multiple of 256: it leads the
   workspace, the splits' partials follow it. */
size_t rotated_q_bytes(const fa_problem *p) {
    if (!p->rot_dim) return 0;
    const size_t b = (size_t)p->batch * p->seqlen_q * p->heads_q * p->d * 2;
    return (b + 255) & ~(size_t)255;
}

extern "C" size_t fa_sm80_kvcache_workspace(const fa_problem *p, const fa_cuda_launch *l) {
    const Plan pl = plan_of(p, l->num_sms);
    const size_t qb = rotated_q_bytes(p);
    if (pl.splits == 1) return qb ? qb + 256 : 0;
    const size_t rows = (size_t)pl.splits * p->batch * p->seqlen_q * p->heads_q;
    const size_t counters = (size_t)pl.row_blocks * p->heads_kv * p->batch;
    return qb + rows * (size_t)p->d * 4 + rows * 4 + counters * 4 + 256;
}

extern "C" fa_status fa_sm80_kvcache_check(const fa_problem *p, void *ws, void *stream, char *msg,
                                           size_t len) {
    static_assert(sizeof(fa_bad_index) <= FA_CUDA_CHECK_BYTES, "check answer");
    cudaStream_t st = (cudaStream_t)stream;
    fa_bad_index host;
    kv_check_kernel<<<1, 256, 0, st>>>(p->kv_seqlens, p->block_table, p->bt_stride,
                                       p->kv_leftpad, (int)p->batch, (int)p->seqlen_new, (int)p->seqlen_k,
                                       (int)p->page_size, (int)p->num_pages, (fa_bad_index *)ws);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(&host, ws, sizeof host, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        snprintf(msg, len, "checking the cache's seqlens/block_table: %s", cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    if (host.kind != FA_BAD_NONE) {
        fa_bad_index_format(&host, msg, len);
        return FA_ERR_VARLEN;
    }
    return FA_OK;
}

extern "C" fa_status fa_sm80_fwd_kvcache(const fa_problem *p, fa_cuda_launch *l, int *splits_used) {
    const int D = fa_cuda_kernel_dim(p->d);
    if (decode_smem(D) > l->smem_optin) {
        snprintf(l->msg, sizeof l->msg,
                 "the decode kernel for head dim %d needs %zu bytes of shared memory per block; "
                 "this GPU allows %zu",
                 D, decode_smem(D), l->smem_optin);
        return FA_ERR_UNSUPPORTED;
    }
    const Plan pl = plan_of(p, l->num_sms);
    if (pl.splits > FA_CUDA_MERGE_MAX_PARTS) {
        snprintf(l->msg, sizeof l->msg, "num_splits = %d; the CUDA backend merges at most %d",
                 pl.splits, FA_CUDA_MERGE_MAX_PARTS);
        return FA_ERR_INVALID_ARGUMENT;
    }
    fa::DecodeArgs a = {};
    a.q = p->q.data;
    a.k = p->k.data;
    a.v = p->v.data;
    a.q_sb = p->q.sb, a.q_st = p->q.st, a.q_sh = p->q.sh;
    a.k_sb = p->k.sb, a.k_st = p->k.st, a.k_sh = p->k.sh;
    a.v_sb = p->v.sb, a.v_st = p->v.st, a.v_sh = p->v.sh;
    a.seqlens = p->kv_seqlens;
    a.block_table = p->block_table;
    a.leftpad = p->kv_leftpad;
    a.bt_stride = p->bt_stride;
    a.page_size = (int)p->page_size;
    a.page_shift = -1;
    for (int sh = 0; sh < 31; sh++)
        if (p->page_size == (int64_t)1 << sh) a.page_shift = sh;
    a.num_pages = (int)p->num_pages;
    a.capacity = (int)p->seqlen_k;
    a.seqlen_new = (int)p->seqlen_new;
    a.seqlen_q = (int)p->seqlen_q;
    a.group = (int)p->group;
    a.heads_q = (int)p->heads_q;
    a.d = (int)p->d;
    a.rows = (int)(p->group * p->seqlen_q);
    a.m = fa::score_mods_of(p);
    a.num_splits = pl.splits;
    a.chunk = pl.chunk;
    a.bad = l->err;
    a.o = p->o.data;
    a.o_sb = p->o.sb, a.o_st = p->o.st, a.o_sh = p->o.sh;
    a.lse = (float *)p->lse;
    a.lse_sb = p->lse_sb, a.lse_sh = p->lse_sh, a.lse_st = p->lse_st;
    const size_t part_rows = (size_t)pl.splits * p->batch * p->seqlen_q * p->heads_q;
    char *ws = (char *)(((uintptr_t)l->ws + 255) & ~(uintptr_t)255);
    void *q_rot = ws; /* rotated q, when the rotary embedding is on */
    ws += rotated_q_bytes(p);
    if (pl.splits > 1) {
        a.part_o = (float *)ws;
        a.part_lse = a.part_o + part_rows * p->d;
        a.counters = (int *)(a.part_lse + part_rows);
    }
    const cudaStream_t st = (cudaStream_t)l->stream;
    const bool bf = p->dtype == FA_DTYPE_BF16;
    cudaError_t e = cudaSuccess;
    if (pl.splits > 1) {
        /* the split blocks' arrival counts (decode_merge_last), which the kernel leaves zero:
           cleared only where the context does not know them to be */
        const size_t cb = (size_t)pl.row_blocks * p->heads_kv * p->batch * 4;
        if (!fa_cuda_ws_zero(l, a.counters, cb)) e = cudaMemsetAsync(a.counters, 0, cb, st);
        l->left_zero = a.counters;
        l->left_zero_bytes = cb;
    }

    if (e == cudaSuccess && p->rot_dim) {
        e = rotate(p, a, q_rot, st, bf);
        /* the decode reads the rotated copy: contiguous [batch, seqlen_q, heads_q, d] */
        a.q = q_rot;
        a.q_sh = p->d, a.q_st = p->heads_q * p->d, a.q_sb = p->seqlen_q * p->heads_q * p->d;
    } else if (e == cudaSuccess && p->k_new.data && p->seqlen_new > 0) {
        const int64_t n = p->batch * p->seqlen_new * p->heads_kv * (p->d / 8);
        const int blocks = (int)((n + 255) / 256);
        if (bf)
            append_kernel<__nv_bfloat16><<<blocks, 256, 0, st>>>(
                a, p->k_new.data, p->v_new.data, p->k_new.sb, p->k_new.st, p->k_new.sh,
                p->v_new.sb, p->v_new.st, p->v_new.sh, (int)p->heads_kv, (int)p->batch);
        else
            append_kernel<__half><<<blocks, 256, 0, st>>>(
                a, p->k_new.data, p->v_new.data, p->k_new.sb, p->k_new.st, p->k_new.sh,
                p->v_new.sb, p->v_new.st, p->v_new.sh, (int)p->heads_kv, (int)p->batch);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = bf ? run_dim<__nv_bfloat16>(D, a, pl.row_blocks, (int)p->heads_kv, (int)p->batch, st)
               : run_dim<__half>(D, a, pl.row_blocks, (int)p->heads_kv, (int)p->batch, st);
    snprintf(l->kernel, sizeof l->kernel, "sm80_fwd_kvcache_d%d_%s%s%s", D, fa_dtype_name(p->dtype),
             p->block_table ? "_paged" : "", pl.splits > 1 ? "_split" : "");
    l->tile_q = 16;
    l->tile_k = key_step(D);
    l->threads = 128;
    *splits_used = pl.splits;
    if (e != cudaSuccess) {
        snprintf(l->msg, sizeof l->msg, "%s: %s", l->kernel, cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
