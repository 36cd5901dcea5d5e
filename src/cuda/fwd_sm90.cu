/*
 * cuda/fwd_sm90.cu — the host side of the Hopper forward (kernel: fwd_sm90.cuh): the tensor
 * maps, what the kernel refuses, the work-tile parameters, the bring-up switches and the launch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_sm90.cuh"
#include "fwd_sm90_serial.cuh"
#include "tma_map.cuh"

namespace fa {
namespace sm90 {

/* The kernel dimension for p's head dim, 0 for none. */
int kernel_dim(int64_t d) { return d == 64 || d == 128 || d == 256 ? (int)d : 0; }

/* f(C{}) for the tiling of kernel head dim D (Tiles<D>::Long when lng) */
template <typename F> auto with_cfg(int D, bool lng, F f) {
    switch (D) {
    case 64: return lng ? f(Tiles<64>::Long{}) : f(Tiles<64>::C{});
    case 128: return lng ? f(Tiles<128>::Long{}) : f(Tiles<128>::C{});
    default: return lng ? f(Tiles<256>::Long{}) : f(Tiles<256>::C{});
    }
}

/* Whether p takes the Long tiling: where the GPU runs found it faster (bench/NOTES.md, d 64
   from 2048 keys, d 128 from 8192, d 256 but for masks over at most 512 keys);
   FLASHATTN_SM90_TILES=short|long overrides. */
bool long_tiles(const fa_problem *p, int D, int choice, bool masked) {
    if (choice) return choice == 2;
    if (D == 64) return p->seqlen_k >= 2048;
    if (D == 256) return !(masked && p->seqlen_k <= 512);
    return D == 128 && p->seqlen_k >= 8192;
}

/* Whether the series kernel (fwd_sm90_serial.cuh) takes p: it serves problems without varlen,
   softcap or ALiBi, and stores O by the copy engine only (o_map: O's strides allow a map).
   By default it takes what the GPU runs found it faster on than the overlapped kernel
   (bench/NOTES.md): masked rows up to 1024 keys (d 128 causal 512 +3-6%, d 256 causal 512
   +10%), at d 256 up to 2048 (+4-6% there; d 128 causal 2048 runs 2% faster overlapped, d 64
   on the 192-row tiles with their consumers' unseen key tiles skipped +1-2%), unmasked ones
   up to 512 keys, at d 256 up to 1024 (its 128-key tiles against 80). Beyond, the
   overlapped kernel's S of the next key tile under P V (d 64/128) and d 256's 80-key tiles
   with that overlap win by 2-10%.
   Choice 1 forces it wherever it serves, 2 keeps the overlapped kernel. */
bool serial_for(const fa_problem *p, int D, int choice, bool masked, bool o_map) {
    const bool serves = !p->cu_q && !(p->softcap > 0.f) && !p->alibi && o_map;
    if (!serves || choice == 2) return false;
    return choice == 1 || p->seqlen_k <= (masked ? (D == 256 ? 2048 : 1024) : D == 256 ? 1024 : 512);
}

/* The consumer schedule of a two-consumer tiling where FLASHATTN_SM90_SCHEDULE leaves it to the
   kernel: the ping-pong turns where the GPU runs found them faster, else the free overlap.
   Unmasked rows of at most 1024 keys (d 64 512/1024 +5-6%, d 128 and d 256 at 512 +1-5%;
   level from 2048: results/2026-11-25-h100-sm90-pingpong.md), and d 128 under a mask
   (causal 2048 +2.8%, 4096 +0.9%, 8192 on the 176-key tiles +1.3%, four alternating
   rounds: results/2026-11-27-h100-sm90-nineteenth.md; at most 1024 keys the series kernel
   takes these). Not varlen, whose tiles differ in length. */
int schedule_of(const fa_problem *p, int D, bool masked) {
    if (p->cu_q) return OVERLAP;
    return masked ? (D == 128 ? PINGPONG : OVERLAP) : p->seqlen_k <= 1024 ? PINGPONG : OVERLAP;
}

/* The L2 budget in MB of a tile group's K and V (tile_of's order: the group's (batch, head)
   pairs at one query block, then at the next) where FLASHATTN_SM90_L2MB leaves it; kv_bytes
   is a pair's K and V. Unmasked: 0, one pair a group, so a pair's query blocks run together
   and its K/V comes from DRAM once; with 12 MB groups the H100 read 16-22% more DRAM than the
   tensors (ncu, d 256 x 512: 298 MB, 141.7 us against 256 MB, 133.7 us with one pair; d 128
   x 2048: 427.7 against 421.1 us; the sweep +6% and +3% there). Masked: groups, which hand
   the longest query blocks of many pairs out first (one pair a group: d 64 causal 2048 -4%,
   d 256 causal 2048 -3%): 48 MB where a pair's K/V is 2 MB or more (12 MB would hold 1-3
   pairs: d 128 causal 4096/8192 +2/+3%, d 256 causal 4096/8192 +3/+5% in two rounds, d 256
   causal 2048 +4% in one call, level in another), else 12 (d 64 causal 1024/2048 -7% with
   48, d 128 causal 2048 -2%). bench/NOTES.md, sixteenth and seventeenth sessions. */
double l2mb_for(bool masked, double kv_bytes) {
    return !masked ? 0.0 : kv_bytes >= 2.0 * 1024 * 1024 ? 48.0 : 12.0;
}

/* Whether this build holds sm_90a code for the kernel (a build without it has only the empty
   body of the other targets' pass). */
template <typename C> bool has_sm90a() {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, fwd_sm90_kernel<__half, C, OVERLAP>) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return fa.binaryVersion == 90;
}

/* Why this kernel cannot take p (NULL: it can). */
const char *refusal(const fa_problem *p, const fa_cuda_launch *l) {
    if (l->cc != 90) return "not an sm_90 GPU";
    const int D = kernel_dim(p->d);
    if (!D) return "head dims other than 64, 128, 256 (not yet)";
    if (!p->cu_q && p->batch > 1 && (p->q.sb == 0 || p->k.sb == 0 || p->v.sb == 0))
        return "a batch stride of 0";
    if (!has_sm90a<Tiles<128>::C>()) return "this build (no sm_90a code)";
    if (!encode_fn()) return "no cuTensorMapEncodeTiled in this driver";
    return NULL;
}

/* kern (a kernel of tiling C) on grid blocks */
template <typename C, typename K>
cudaError_t launch_kernel(K kern, const Args &a, int grid, cudaStream_t st) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)C::SMEM);
    if (e != cudaSuccess) return e;
    kern<<<grid, C::THREADS, C::SMEM, st>>>(a);
    return cudaGetLastError();
}
template <typename T, typename C>
cudaError_t launch(const Args &a, int sched, int grid, cudaStream_t st) {
    auto kern = sched == PINGPONG && C::NC == 2 ? fwd_sm90_kernel<T, C, PINGPONG>
                                                : fwd_sm90_kernel<T, C, OVERLAP>;
    return launch_kernel<C>(kern, a, grid, st);
}
/* f(C{}) for the series kernel's tiling of kernel head dim D */
template <typename F> auto with_serial(int D, F f) {
    switch (D) {
    case 64: return f(SerialTiles<64>::C{});
    case 128: return f(SerialTiles<128>::C{});
    default: return f(SerialTiles<256>::C{});
    }
}
/* f(C{}) for the tiling that runs p: the series kernel's or Tiles<D>'s */
template <typename F> auto with_tiling(bool serial, int D, bool lng, F f) {
    return serial ? with_serial(D, f) : with_cfg(D, lng, f);
}

/* bring-up switches until the GPU has chosen: FLASHATTN_SM90_<name>=<one of vals> (index),
   else 0 */
int env_choice(const char *name, const char *const *vals, int n) {
    const char *e = getenv(name);
    for (int i = 0; e && i < n; i++)
        if (strcmp(e, vals[i]) == 0) return i;
    return 0;
}

/*
 * Bring-up switches (the GPU runs chose the defaults; bench/NOTES.md has each A/B):
 *   FLASHATTN_SM90_SCHEDULE=auto|overlap|pingpong   consumer schedule (auto: schedule_of)
 *   FLASHATTN_SM90_CROSS=1|0|joint   the pipeline runs on across work tiles (joint: with one
 *       Q buffer too, the next tile's first S issued with this tile's last P V)
 *   FLASHATTN_SM90_OSTORE=tma|direct   O by the copy engine through the Q buffer, or by threads
 *   FLASHATTN_SM90_QEARLY=1|0     the next tile's Q early in this one (as early as the Q
 *       buffers allow: fwd_sm90.cuh), or after its last K/V
 *   FLASHATTN_SM90_KVFIRST=1|0    with one Q buffer, the next tile's first K/V before its Q
 *   FLASHATTN_SM90_ALIGN=end|start   a sequence's query blocks end at its last row, or start
 *       at its first
 *   FLASHATTN_SM90_LAZY=<0..8>    softmax rescale threshold, log2 units (0: every increase)
 *   FLASHATTN_SM90_L2MB=<MB>      L2 budget of a tile group's K/V (0: one pair; default
 *       l2mb_for's choice)
 *   FLASHATTN_SM90_TILES=auto|short|long   the tiling (Tiles; auto: long_tiles's choice)
 *   FLASHATTN_SM90_SERIAL=auto|1|0   the series kernel (fwd_sm90_serial.cuh) wherever it serves
 *       the problem (1), the overlapped one (0), or as serial_for picks (auto; the overlapped
 *       one where FLASHATTN_SM90_TILES or _SCHEDULE is set)
 *   FLASHATTN_SM90_HALF=1|0       the series kernel's half-width first key tile where a
 *       consumer's rows see only its first half (the causal diagonal's consumer 0)
 *   FLASHATTN_SM90_GRID=persistent|tiles|static|dynamic|<n>   persistent (default): one block
 *       per SM looping over the tiles, in the dynamic order where tiles differ in length
 *       (masks, varlen), are short (at most 512 keys) or have several Q buffers (it needs
 *       the workspace's counter), else static; tiles: one block per tile; static/dynamic:
 *       persistent in that order; n: at most n blocks (the tests use a small n so that
 *       every block takes several tiles)
 */
struct Switches {
    int sched, cross, o_tma, q_early, kv_first, align_end, gmode, blocks, tiles, serial, half;
    float lazy;
    double l2mb;
};
Switches switches() {
    static const char *const sched_vals[] = {"auto", "overlap", "pingpong"};
    static const char *const on_off[] = {"1", "0"};
    static const char *const cross_vals[] = {"1", "0", "joint"};
    static const char *const ostore_vals[] = {"tma", "direct"};
    static const char *const grid_vals[] = {"persistent", "tiles", "static", "dynamic"};
    Switches w;
    w.sched = env_choice("FLASHATTN_SM90_SCHEDULE", sched_vals, 3) - 1; /* -1: auto */
    static const int cross_of[] = {1, 0, 2};
    w.cross = cross_of[env_choice("FLASHATTN_SM90_CROSS", cross_vals, 3)];
    w.o_tma = env_choice("FLASHATTN_SM90_OSTORE", ostore_vals, 2) == 0;
    w.q_early = env_choice("FLASHATTN_SM90_QEARLY", on_off, 2) == 0;
    w.kv_first = env_choice("FLASHATTN_SM90_KVFIRST", on_off, 2) == 0;
    static const char *const align_vals[] = {"end", "start"};
    w.align_end = env_choice("FLASHATTN_SM90_ALIGN", align_vals, 2) == 0;
    const char *lazy = getenv("FLASHATTN_SM90_LAZY");
    w.lazy = lazy ? (float)atof(lazy) : 8.f;
    if (!(w.lazy >= 0.f && w.lazy <= 8.f)) w.lazy = 8.f; /* P stays below 2^8: what was tested */
    const char *l2 = getenv("FLASHATTN_SM90_L2MB");
    w.l2mb = l2 ? atof(l2) : -1.0; /* -1: l2mb_for's choice */
    w.gmode = env_choice("FLASHATTN_SM90_GRID", grid_vals, 4);
    static const char *const tiles_vals[] = {"auto", "short", "long"};
    w.tiles = env_choice("FLASHATTN_SM90_TILES", tiles_vals, 3);
    static const char *const serial_vals[] = {"auto", "1", "0"};
    w.serial = env_choice("FLASHATTN_SM90_SERIAL", serial_vals, 3);
    w.half = env_choice("FLASHATTN_SM90_HALF", on_off, 2) == 0;
    const char *g = getenv("FLASHATTN_SM90_GRID");
    w.blocks = g && atoi(g) > 0 ? atoi(g) : 0;
    return w;
}

#ifdef FA_SM90_TRACE
/* the call's timeline (trace_sm90.cuh) to FLASHATTN_SM90_TRACE_FILE: per block and role the
   event count (int32), then TRACE_EVENTS (tag, clock) pairs; every call overwrites it */
void trace_dump(cudaStream_t st) {
    const char *path = getenv("FLASHATTN_SM90_TRACE_FILE");
    if (!path || cudaStreamSynchronize(st) != cudaSuccess) return;
    static int len[TRACE_BLOCKS * TRACE_ROLES];
    static uint2 buf[TRACE_BLOCKS * TRACE_ROLES * TRACE_EVENTS];
    if (cudaMemcpyFromSymbol(len, trace_len, sizeof len) != cudaSuccess ||
        cudaMemcpyFromSymbol(buf, trace_buf, sizeof buf) != cudaSuccess)
        return;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    const int hdr[3] = {TRACE_BLOCKS, TRACE_ROLES, TRACE_EVENTS};
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(len, sizeof len, 1, f);
    fwrite(buf, sizeof buf, 1, f);
    fclose(f);
    static const int zero[TRACE_BLOCKS * TRACE_ROLES] = {0};
    cudaMemcpyToSymbol(trace_len, zero, sizeof zero);
}
#endif

} // namespace sm90
} // namespace fa

extern "C" int fa_sm90_fwd_covers(const fa_problem *p) { return fa::sm90::kernel_dim(p->d) != 0; }

extern "C" fa_status fa_sm90_fwd(const fa_problem *p, fa_cuda_launch *l) {
    using namespace fa::sm90;
    const char *why = refusal(p, l);
    if (why) {
        snprintf(l->msg, sizeof l->msg, "the sm90 forward does not take %s", why);
        return FA_ERR_UNSUPPORTED;
    }
    const Switches sw = switches();
    const int D = kernel_dim(p->d);
    const bool masked = p->win_left >= 0 || p->win_right >= 0;
    const bool lng = long_tiles(p, D, sw.tiles, masked);
    /* varlen: one sequence of all the tokens, batch 1 */
    const int64_t nb = p->cu_q ? 1 : p->batch;
    const int64_t tq = p->cu_q ? p->total_q : p->seqlen_q, tk = p->cu_q ? p->total_k : p->seqlen_k;
    Args a;
    memset(&a, 0, sizeof a);
    /* O through the copy engine where its strides allow a map (else the threads store it) */
    a.o_tma = sw.o_tma && make_map(&a.to, &p->o, p->dtype, D, p->heads_q, tq, nb, O_ROWS) == CUDA_SUCCESS;
    /* a forced tiling or schedule is the overlapped kernel's (the test entries that force them
       keep covering it), unless the series kernel is forced too */
    const int serial_choice = sw.serial ? sw.serial : sw.tiles || sw.sched >= 0 ? 2 : 0;
    const bool serial = serial_for(p, D, serial_choice, masked, a.o_tma);
    const int BN = with_tiling(serial, D, lng, [](auto c) { return decltype(c)::BN; });
    const int BM = with_tiling(serial, D, lng, [](auto c) { return decltype(c)::BM; });
    const size_t smem = with_tiling(serial, D, lng, [](auto c) { return decltype(c)::SMEM; });
    if (smem > (size_t)l->smem_optin) {
        snprintf(l->msg, sizeof l->msg,
                 "the sm90 forward's %dx%d tiling needs %zu bytes of shared memory per block, "
                 "the GPU gives %zu", BM, BN, smem, (size_t)l->smem_optin);
        return FA_ERR_UNSUPPORTED;
    }
    CUresult r = make_map(&a.tq, &p->q, p->dtype, D, p->heads_q, tq, nb, 64);
    if (r == CUDA_SUCCESS) r = make_map(&a.tk, &p->k, p->dtype, D, p->heads_kv, tk, nb, BN);
    if (r == CUDA_SUCCESS) r = make_map(&a.tv, &p->v, p->dtype, D, p->heads_kv, tk, nb, BN);
    if (r != CUDA_SUCCESS) {
        snprintf(l->msg, sizeof l->msg,
                 "the sm90 forward does not take these strides (tensor map error %d)", (int)r);
        return FA_ERR_UNSUPPORTED;
    }
    a.o = p->o.data;
    a.lse = (float *)p->lse;
    a.o_sb = p->o.sb, a.o_st = p->o.st, a.o_sh = p->o.sh;
    a.lse_sb = p->lse_sb, a.lse_sh = p->lse_sh, a.lse_st = p->lse_st;
    a.cu_q = p->cu_q;
    a.cu_k = p->cu_k;
    a.seqlen_q = (int)p->seqlen_q;
    a.seqlen_k = (int)p->seqlen_k;
    a.group = (int)p->group;
    a.m = fa::score_mods_of(p);

    /* the work tiles (tile_of): pairs grouped so that a group's K and V take at most
       l2mb MB of the L2 (the H100 has 50 MB) */
    a.heads = (int)p->heads_q;
    a.batch = (int)p->batch;
    a.mblocks = (int)((p->seqlen_q + BM - 1) / BM);
    const int64_t tiles = (int64_t)a.mblocks * a.heads * a.batch;
    const double kv_bytes = 4.0 * (double)p->seqlen_k * (double)D / (double)p->group;
    const double l2mb = sw.l2mb >= 0 ? sw.l2mb : l2mb_for(masked, kv_bytes);
    const double fit = l2mb * 1024 * 1024 / (kv_bytes > 1 ? kv_bytes : 1);
    a.group_hb = (int)(fit < 1 ? 1 : fit > a.heads * a.batch ? a.heads * a.batch : fit);
    if (tiles > INT32_MAX / 2) { /* tile indices run up to tiles + grid in an int */
        snprintf(l->msg, sizeof l->msg, "the sm90 forward takes at most 2^30 query blocks");
        return FA_ERR_UNSUPPORTED;
    }
    a.tiles = (int)tiles;
    const int pairs = a.heads * a.batch, groups = (pairs + a.group_hb - 1) / a.group_hb;
    a.div_group = FastDiv::of((uint32_t)(a.group_hb * a.mblocks));
    a.div_heads = FastDiv::of((uint32_t)a.heads);
    a.div_gsz = FastDiv::of((uint32_t)a.group_hb);
    a.div_gsz_last = FastDiv::of((uint32_t)(pairs - (groups - 1) * a.group_hb));

    a.cross = sw.cross;
    a.q_early = sw.q_early;
    a.kv_first = sw.kv_first;
    a.align_end = sw.align_end && !serial; /* the series kernel's O copies start at row 0 */
    a.lazy = sw.lazy;
    a.half_tiles = sw.half;
    const bool uneven = a.m.win_left >= 0 || a.m.win_right >= 0 || p->cu_q;
    /* the ping-pong turns are written for two consumers */
    const int sched = BM != 128 || serial ? (int)OVERLAP
                      : sw.sched >= 0 ? sw.sched : schedule_of(p, D, masked);
    const int gmode = sw.gmode;
    /* the dynamic order where tiles differ in length, where they are short, and in the
       tilings with two Q buffers or more (both at d 64, d 128's short): equal tiles in the
       static order keep the blocks in step, all loading their next Q at once (d 128/256 at
       512 keys +1.5/+2.5% in three rounds, results/2026-11-25-h100-sm90-short-rows.md; d 128
       2048 +8% in three rounds and +9% in another call, 4096 +1.4%, d 64 1024 +1.7%,
       2048/4096 level; the one-Q-buffer d 256 2048/4096 -1%:
       results/2026-11-25-h100-sm90-align.md) */
    const int nq = with_tiling(serial, D, lng, [](auto c) { return decltype(c)::NQ; });
    const bool dynamic = l->ws && l->ws_bytes >= 4 &&
                         (gmode == 3 || (gmode == 0 && (uneven || p->seqlen_k <= 512 || nq >= 2)));
    const int blocks = sw.blocks > 0 ? sw.blocks : l->num_sms > 0 ? l->num_sms : 1;
    const int grid = gmode != 1 && a.tiles > blocks ? blocks : a.tiles;
    static const char *const sched_name[] = {"", "_pingpong"};
    const cudaStream_t st = (cudaStream_t)l->stream;
    cudaError_t e = cudaSuccess;
    if (dynamic && grid < a.tiles) { /* the kernel leaves it zero (next_tile) */
        a.counter = (int *)l->ws;
        if (EXPT == 50 || !fa_cuda_ws_zero(l, a.counter, sizeof(int)))
            e = cudaMemsetAsync(a.counter, 0, sizeof(int), st);
        l->left_zero = a.counter;
        l->left_zero_bytes = sizeof(int);
    }
    if (e == cudaSuccess && a.tiles > 0 && serial)
        e = with_serial(D, [&](auto c) {
            using C = decltype(c);
            return p->dtype == FA_DTYPE_BF16
                       ? launch_kernel<C>(fwd_sm90_serial_kernel<__nv_bfloat16, C>, a, grid, st)
                       : launch_kernel<C>(fwd_sm90_serial_kernel<__half, C>, a, grid, st);
        });
    else if (e == cudaSuccess && a.tiles > 0)
        e = with_cfg(D, lng, [&](auto c) {
            return p->dtype == FA_DTYPE_BF16 ? launch<__nv_bfloat16, decltype(c)>(a, sched, grid, st)
                                             : launch<__half, decltype(c)>(a, sched, grid, st);
        });
#ifdef FA_SM90_TRACE
    if (e == cudaSuccess) trace_dump(st);
#endif
    snprintf(l->kernel, sizeof l->kernel, "sm90_fwd_d%d_%s%s_%dx%d%s%s", D,
             fa_dtype_name(p->dtype), fa_cuda_mask_name(p), BM, BN,
             serial ? "_serial" : sched_name[sched],
             grid == a.tiles ? "" : a.counter ? "_dynamic" : "_static");
    l->tile_q = BM;
    l->tile_k = BN;
    l->threads = with_tiling(serial, D, lng, [](auto c) { return decltype(c)::THREADS; });
    if (e != cudaSuccess) {
        snprintf(l->msg, sizeof l->msg, "%s: %s", l->kernel, cudaGetErrorString(e));
        return FA_ERR_CUDA;
    }
    return FA_OK;
}
