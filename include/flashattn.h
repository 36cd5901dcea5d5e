/*
 * flashattn.h — the whole public API of flashattn.
 *
 * flashattn computes exact attention
 *
 *     O   = softmax(scale * Q K^T  (+ softcap, + ALiBi bias, + mask)) V
 *     LSE = log(sum_j exp(score_ij))               one value per query row
 *
 * tile by tile with an online softmax, so the seqlen_q x seqlen_k score matrix never reaches
 * main memory, and its gradients dQ, dK, dV by recomputation from LSE.
 *
 * Conventions used on this page
 * -----------------------------
 *  - Every function returns an fa_status. FA_OK is 0; anything else is an error, and then a
 *    message naming the argument, the size and the reason is available from fa_last_error().
 *    On any error no output tensor has been written.
 *  - Tensors are views (fa_tensor): a data pointer, a dtype, a device, a shape and strides in
 *    elements. Attention tensors are BSHD, [batch, seqlen, heads, head_dim], with any strides on
 *    the first three dimensions and a contiguous last one. For variable-length batches
 *    ("varlen") they are THD, [total_tokens, heads, head_dim], with the sequences packed along
 *    the token dimension and described by cu_seqlens arrays (see fa_params).
 *  - All work goes through an fa_context, which owns the backend choice, the thread count, the
 *    CUDA stream, the workspace and the record of which kernel ran (fa_last_selection()).
 *  - No element of an output is written twice. An output tensor must not alias itself: its
 *    dimensions of size > 1, taken in increasing order of stride, must each have a stride
 *    larger than the offset of the last element of the ones before it (BSHD: head stride
 *    >= head_dim, and so on). This also refuses the rare layout whose elements interleave
 *    without sharing an address. Outputs of one call may share a buffer where the call says
 *    so (packed dq/dk/dv, an interleaved K/V cache) as long as no two share an element
 *    (checked exactly for outputs with equal strides, as views of one packed buffer have);
 *    an lse output shares nothing with another output. Violations are FA_ERR_INVALID_ARGUMENT.
 *
 * Semantics (identical on every backend; they follow the reference FlashAttention package)
 * ---------------------------------------------------------------------------------------
 *  - Masks are aligned to the bottom-right corner: with sq = seqlen_q and sk = seqlen_k of one
 *    sequence, query row i sits on key column  c(i) = i + sk - sq.  Key j is visible to row i iff
 *        (window_left  < 0 || j >= c(i) - window_left) &&
 *        (window_right < 0 || j <= c(i) + window_right).
 *    causal = 1 is the window (window_left, 0).
 *  - softcap > 0 replaces the scaled score s by softcap * tanh(s / softcap).
 *  - ALiBi adds -slope[h] * |c(i) - j| to the (scaled, capped) score.
 *  - A query row that sees no key at all gets O = 0 and LSE = -INFINITY (the logarithm of an
 *    empty sum: it carries zero weight when partial results are merged, and is never NaN). Its
 *    gradients are 0.
 *  - GQA / MQA: heads_q must be a multiple of heads_kv; query head h reads kv head
 *    h / (heads_q / heads_kv). dK and dV sum the gradients of all query heads sharing a kv head.
 *  - Accumulation is always in fp32 (the CPU reference in fp64).
 *
 * Thread safety: a context may be used by one thread at a time; distinct contexts are
 * independent. fa_status_string() and fa_version() may be called from anywhere. Every call
 * that takes a context (the calls, the workspace queries, fa_context_set_*, fa_context_check)
 * marks it in use for its duration with an atomic flag; a call that finds it marked by another
 * thread returns FA_ERR_BUSY at once and touches nothing of the context: the other call's
 * message and selection record stay as they are, and on the refused thread fa_last_error(ctx)
 * says FA_ERR_BUSY's message and fa_last_selection(ctx) is NULL until its next call on ctx.
 * This detects misuse; it is no lock: take one context per thread. fa_last_error(),
 * fa_last_selection() and fa_context_destroy() do not mark the context, so they must not run
 * beside a call on it.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FLASHATTN_BUILD_SHARED)
#define FA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

/* 0.2.5: fa_cp_fwd_workspace_size and fa_cp_bwd_workspace_size, added.
   0.2.4: context parallelism over NCCL (fa_cp_fwd, fa_cp_bwd, fa_cp_shard_len, fa_cp_args),
   added.
   0.2.3: fa_params version 3 (fused rotary embedding and cache_leftpad of fa_fwd_kvcache),
   appended.
   0.2.2: fa_allocator version 2 (own_max_bytes), appended.
   0.2.1: fa_params version 2 (dropout, FP8 descales), appended: callers built with the
   0.2 header keep working.
   0.2.0: fa_params starts with struct_size and version, and fa_params_default() moved into
   this header (an ABI change: rebuild callers; the shared library's soname is
   libflashattn.so.0.2). */
#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 2
#define FA_VERSION_PATCH 5

/* Largest head dimension any backend accepts (the CUDA backend takes 1..256 too, in every
   call). */
#define FA_MAX_HEAD_DIM 256
/* Largest fa_params.softmax_scale accepted: 2^126 (scale * log2(e) stays below FLT_MAX). */
#define FA_MAX_SOFTMAX_SCALE 8.5070592e+37f
/* Largest |ALiBi slope| accepted: 2^64 (a slope times a distance below 2^63 stays finite). */
#define FA_MAX_ALIBI_SLOPE 1.8446744e+19f

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef enum fa_status {
    FA_OK = 0,
    FA_ERR_NULL_POINTER = 1,       /* a required pointer (tensor, data, context, ...) is NULL   */
    FA_ERR_INVALID_ARGUMENT = 2,   /* a scalar option is out of range (scale, window, softcap) */
    FA_ERR_SHAPE = 3,              /* tensor shapes disagree with each other or are not > 0    */
    FA_ERR_DTYPE = 4,              /* dtype not supported here, or tensors' dtypes disagree    */
    FA_ERR_STRIDE = 5,             /* last dimension not contiguous, or negative/zero stride   */
    FA_ERR_HEAD_DIM = 6,           /* head_dim outside what the chosen backend supports        */
    FA_ERR_GQA = 7,                /* heads_q is not a multiple of heads_kv                    */
    FA_ERR_VARLEN = 8,             /* cu_seqlens arrays inconsistent with the tensors          */
    FA_ERR_OVERFLOW = 9,           /* a size or offset does not fit in 64 bits / the address space */
    FA_ERR_DEVICE = 10,            /* tensor on the wrong device, or mixed devices             */
    FA_ERR_UNSUPPORTED = 11,       /* valid request the selected backend cannot serve (and, in
                                      strict mode, any fallback away from the preferred kernel) */
    FA_ERR_NO_BACKEND = 12,        /* requested backend not compiled in or no usable device    */
    FA_ERR_OUT_OF_MEMORY = 13,     /* allocation of workspace failed                           */
    FA_ERR_WORKSPACE = 14,         /* user workspace smaller than fa_*_workspace_size() asks   */
    FA_ERR_CUDA = 15,              /* the CUDA runtime reported an error (message has it)      */
    FA_ERR_INTERNAL = 16,          /* a bug in flashattn: please report it                     */
    FA_ERR_BUSY = 17               /* another thread is inside a call on the same context      */
} fa_status;

/* A short constant English description of a status code ("null pointer", ...). Never NULL. */
FA_API const char *fa_status_string(fa_status status);

/* "MAJOR.MINOR.PATCH" of the library actually loaded. */
FA_API const char *fa_version(void);

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,
    FA_DTYPE_F16 = 1,     /* IEEE binary16 */
    FA_DTYPE_BF16 = 2,    /* bfloat16 */
    FA_DTYPE_F8_E4M3 = 3, /* OCP FP8 e4m3fn: bias 7, max 448, no infinities, 0x7f/0xff NaN */
    FA_DTYPE_F64 = 4,     /* accepted by FA_ALGO_NAIVE only: the float64 reference */
    FA_DTYPE_F8_E5M2 = 5  /* OCP FP8 e5m2: bias 15, max 57344, +-inf, NaNs as IEEE */
} fa_dtype;
/*
 * FP8 (FA_DTYPE_F8_E4M3, FA_DTYPE_F8_E5M2) is an input dtype of the forward only (fa_fwd,
 * fa_fwd_kvcache) on the CPU backend's default algorithm (docs/fp8.md): Q, K and V share it,
 * each element is converted exactly to fp32 as its tile loads and every product accumulates in
 * fp32. The output O is then f32, f16 or bf16 (FA_ERR_DTYPE otherwise), LSE fp32. fa_bwd and
 * the naive/plain reference algorithms refuse FP8 with FA_ERR_DTYPE. The CUDA backend runs
 * fa_fwd on e4m3 inputs in its Hopper kernel only (sm_90, no fallback): head dims 128 and 256,
 * BSHD (no varlen), causal, windows, GQA, the descales; out f16 or bf16; P rounded to e4m3 for
 * P V as FlashAttention-3 does; q/k/v strides multiples of 16 elements (FA_ERR_STRIDE).
 * Everything else with FP8 on CUDA (e5m2, other head dims, varlen, softcap, ALiBi, dropout, an
 * f32 out, fa_fwd_kvcache, GPUs other than sm_90) is FA_ERR_DTYPE naming why. NaN encodings (e4m3 0x7f/0xff; e5m2 exponent 31 with a
 * mantissa) load as NaN and e5m2's infinities as +-inf, with the consequences listed at fa_fwd;
 * finite FP8 inputs give finite outputs. fa_quantize_fp8 (below) makes FP8 tensors.
 */

/* Name of a dtype ("f32", "f16", "bf16", "f8e4m3", "f64", "f8e5m2"), or "?" for an unknown
   value. */
FA_API const char *fa_dtype_name(fa_dtype dtype);
/* Size of one element in bytes, 0 for an unknown value. */
FA_API size_t fa_dtype_size(fa_dtype dtype);

typedef enum fa_device {
    FA_DEVICE_CPU = 0,    /* host memory */
    FA_DEVICE_CUDA = 1    /* CUDA device memory of the context's current device */
} fa_device;

/*
 * A view of a strided tensor. Nothing is owned or copied.
 *   ndim     4 for BSHD attention tensors, 3 for varlen THD tensors; LSE tensors are
 *            [batch, heads, seqlen_q] (ndim 3) or, for varlen, [heads, total_q] (ndim 2).
 *   shape    sizes, outermost first; entries past ndim are ignored.
 *   stride   distances in elements (not bytes) between neighbours along each dimension.
 *            The last dimension must have stride 1; the others must be >= 1, in any order.
 *   data     aligned to the element size (FA_ERR_INVALID_ARGUMENT otherwise).
 */
typedef struct fa_tensor {
    void *data;
    fa_dtype dtype;
    fa_device device;
    int ndim;
    int64_t shape[4];
    int64_t stride[4];
} fa_tensor;

/* A contiguous 4-d BSHD view of data: strides {s*h*d, h*d, d, 1}. */
FA_API fa_tensor fa_tensor_bshd(void *data, fa_dtype dtype, fa_device device, int64_t batch,
                                int64_t seqlen, int64_t heads, int64_t head_dim);
/* A contiguous 3-d view (THD for varlen tensors, or [batch, heads, seqlen] for LSE). */
FA_API fa_tensor fa_tensor_3d(void *data, fa_dtype dtype, fa_device device, int64_t d0,
                              int64_t d1, int64_t d2);
/* A contiguous 2-d view ([heads, total_q] LSE of a varlen call). */
FA_API fa_tensor fa_tensor_2d(void *data, fa_dtype dtype, fa_device device, int64_t d0,
                              int64_t d1);

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Every option of an attention call. Start from fa_params_default() (below, in this header) and
 * set what you need. Later versions may add fields at the end; struct_size and version say
 * which fields a caller's struct has, so that a library and a caller built from different
 * versions of this header never read past each other's struct.
 */
#define FA_PARAMS_VERSION 3
typedef struct fa_params {
    /* sizeof(fa_params) and FA_PARAMS_VERSION of the caller's header, set by
       fa_params_default(); never set them by hand. Every call checks them first and refuses
       (FA_ERR_INVALID_ARGUMENT, nothing written) a struct that did not come from the
       initialiser (zeroed: version 0), one from a newer header than the library's (a version
       it does not know), and one whose size is not its version's size. A struct of an older
       version that the library still knows is read up to its size, the fields it lacks taken
       at their defaults. */
    uint32_t struct_size;
    uint32_t version;
    /* Multiplier of Q K^T. 0 (the default) means 1/sqrt(head_dim). Must be finite, >= 0 and
       <= FA_MAX_SOFTMAX_SCALE (FA_ERR_INVALID_ARGUMENT otherwise): the kernels fold
       scale * log2(e) into one fp32 constant, which must stay finite. */
    float softmax_scale;
    /* Bottom-right aligned causal mask: window_right becomes 0 (a causal call with
       window_right > 0 is FA_ERR_INVALID_ARGUMENT; window_left still applies). */
    int causal;
    /* Sliding window around the diagonal c(i) (see the top of this file); -1 is unbounded. */
    int64_t window_left;
    int64_t window_right;
    /* Tanh soft-capping of the scaled scores; 0 disables. Must be finite and >= 0. */
    float softcap;
    /* ALiBi slopes, fp32, on the same device as the tensors: heads_q values, or batch rows of
       heads_q values each alibi_batch_stride apart. NULL disables. Each slope must be finite
       with |slope| <= FA_MAX_ALIBI_SLOPE, so that a bias -slope * distance stays finite at
       every distance a 64-bit length allows. On the CPU every slope the call reads is checked
       (FA_ERR_INVALID_ARGUMENT naming it, nothing written); on CUDA the slopes live in device
       memory and are not checked: a bad one makes its head's results unspecified (NaN). */
    const float *alibi_slopes;
    int64_t alibi_batch_stride;  /* 0: one slope per head shared by every batch entry;
                                    else >= heads_q (FA_ERR_INVALID_ARGUMENT otherwise) */
    /* Varlen: int32 prefix sums of the sequence lengths, batch+1 values starting at 0, on the
       same device as the tensors. Both NULL for BSHD tensors, both set for THD tensors.
       max_seqlen_q/k must bound every length (they size the launch; 0 means "compute it",
       which on the CUDA backend costs a device-to-host copy). */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int64_t batch;  /* varlen only: number of sequences (cu_seqlens hold batch+1 values) */
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    /* Backward: 1 asks for bit-identical gradients run to run (no atomics). The CPU backend is
       always deterministic. */
    int deterministic;

    /* ---- version 2 (0.2.1) ---- */

    /* Dropout on the attention probabilities (fa_fwd and fa_bwd; fa_fwd_kvcache refuses it):
       each probability is kept with probability 1 - dropout_p and then scaled by
       1 / (1 - dropout_p), dropped ones are 0. The keep mask comes from a counter-based
       generator keyed by dropout_seed and started at dropout_offset, so the backward given the
       same three values regenerates the forward's mask instead of storing it. 0 (the default)
       disables; must be in [0, 1) (FA_ERR_INVALID_ARGUMENT otherwise). LSE stays that of the
       softmax without dropout. The mask rule is fa_dropout_mask's (below), bit for bit on
       both backends; on the CUDA backend dropout runs the sm80 kernels on every GPU (sm_90
       included: the record's kernel name ends in "_dropout" and its reason says so). */
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    float dropout_p;
    /* FP8 descale factors, applied to FP8 inputs only (FA_DTYPE_F8_E4M3 / _E5M2;
       FA_ERR_INVALID_ARGUMENT with any other dtype): the real value of an element of Q is
       q_descale[...] * its stored value, likewise K and V. fp32 on the same device as the
       tensors, one value per (batch, kv head): value [b * descale_batch_stride + h / (heads_q /
       heads_k)] for query head h (Q's descale also indexed by kv head, as FlashAttention-3
       does). NULL is 1.0. Where they apply: q_descale * k_descale multiplies the softmax scale
       (the scores are scale * qd * kd * (q8 . k8), one fp32 product of three factors), and
       v_descale multiplies the normalised output row, O = vd * (P V8) / l. Each value read must
       be finite and > 0 (a zero or negative descale is no dequantisation); on the CPU every
       value the call reads is checked (FA_ERR_INVALID_ARGUMENT naming it, nothing written).
       Finer scales (per block of rows, as fa_quantize_fp8 can make) are not taken here. */
    const float *q_descale;
    const float *k_descale;
    const float *v_descale;
    int64_t descale_batch_stride; /* 0: one row of heads_k values for every batch entry;
                                     else >= heads_k */

    /* ---- version 3 (0.2.3): fa_fwd_kvcache only (fa_fwd / fa_bwd: FA_ERR_INVALID_ARGUMENT
       when any is set) ---- */

    /* Rotary embedding fused into the cache call, as FlashAttention-2's
       flash_attn_with_kvcache applies it: NULL (both) is off. Else 2-d tensors [seqlen_ro,
       rotary_dim / 2] on the device of q, one dtype for both: q's dtype or f32 (last stride
       1, the other >= 1). rotary_dim = 2 * shape[1] must be <= head_dim (it may be any even
       number: FlashAttention-2 asks for a multiple of 16). Requires k_new (the rotation is
       applied as the new keys are appended; FA_ERR_NULL_POINTER without them) and a cache of
       f16, bf16 or f32 (not FP8: FA_ERR_DTYPE). seqlen_ro must be >= the cache's capacity
       (max_len, or max_pages * page_size), FlashAttention-2's rule, which bounds every
       position a call can use without reading seqlens (device memory on the GPU), plus
       seqlen_q - seqlen_new when a causal or windowed call has more query tokens than new
       keys (their positions run past the keys'); else FA_ERR_SHAPE. Positions are cache rows counted from 0 (cache_leftpad does not shift
       them): new key j of sequence b sits at seqlens[b] + j; query token i at seqlens[b] + i
       when causal or a window is set (window_left or window_right >= 0), else every query
       token of b at seqlens[b]. The first rotary_dim columns of q and of the new k rotate by
       the angle of their position, (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) with cos
       and sin of row pos, column c, over the pairs (x[2c], x[2c + 1]) when
       rotary_interleaved (GPT-J) or (x[c], x[c + rotary_dim / 2]) when not (GPT-NeoX); the
       other columns pass unchanged. In fp32; the rotated key is stored in the cache's
       dtype (that is what the cache holds afterwards); the rotated query is used in fp32 on
       the CPU and rounded once to q's dtype on the GPU. q and k_new themselves are not
       written. */
    const fa_tensor *rotary_cos;
    const fa_tensor *rotary_sin;
    int rotary_interleaved;
    /* Left-padded caches: int32 [batch] on the device of the tensors, NULL for none.
       Sequence b's keys are cache rows cache_leftpad[b] .. seqlens[b] + seqlen_new - 1: rows
       before cache_leftpad[b] are not attended (the CPU does not read them; on the GPU
       fa_fwd's note on NaN in masked keys of a shared tile applies), and the masks align bottom-right
       as before (query i of sq sits on row i + seqlens[b] + seqlen_new - sq); the append
       still starts at row seqlens[b]. 0 <= cache_leftpad[b] <= seqlens[b] (on the CPU
       checked first: FA_ERR_INVALID_ARGUMENT naming the element; on the GPU checked as
       seqlens are, fa_context_set_device_checks: FA_ERR_VARLEN, a bad value clamped into
       [0, seqlens[b]]). Contiguous caches only: with block_table FA_ERR_UNSUPPORTED, as
       FlashAttention-2 refuses the pair. */
    const int32_t *cache_leftpad;
} fa_params;

/* All defaults: scale 1/sqrt(d), no mask, no window, no softcap, no ALiBi, not varlen; and
   struct_size and version of this header. Inline, so that they are the caller's, not the
   library's: bindings that cannot call it (ctypes) set the same fields themselves. */
static inline fa_params fa_params_default(void) {
    fa_params p; /* every field assigned: an initialiser list warns in C++ (-Wextra) */
    p.struct_size = (uint32_t)sizeof(fa_params);
    p.version = FA_PARAMS_VERSION;
    p.softmax_scale = 0.0f;
    p.causal = 0;
    p.window_left = -1;
    p.window_right = -1;
    p.softcap = 0.0f;
    p.alibi_slopes = NULL;
    p.alibi_batch_stride = 0;
    p.cu_seqlens_q = NULL;
    p.cu_seqlens_k = NULL;
    p.batch = 0;
    p.max_seqlen_q = 0;
    p.max_seqlen_k = 0;
    p.deterministic = 0;
    p.dropout_seed = 0;
    p.dropout_offset = 0;
    p.dropout_p = 0.0f;
    p.q_descale = NULL;
    p.k_descale = NULL;
    p.v_descale = NULL;
    p.descale_batch_stride = 0;
    p.rotary_cos = NULL;
    p.rotary_sin = NULL;
    p.rotary_interleaved = 0;
    p.cache_leftpad = NULL;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef enum fa_backend {
    FA_BACKEND_AUTO = 0,  /* follow the tensors' device */
    FA_BACKEND_CPU = 1,
    FA_BACKEND_CUDA = 2
} fa_backend;

/*
 * Which algorithm a context runs. The two naive algorithms materialise the whole score matrix,
 * batch * heads_q * seqlen_q * seqlen_k values, as textbook attention does: they exist as
 * references for tests and demonstrations, on the CPU only, and take every option.
 *   FA_ALGO_NAIVE  accumulates in float64; the only algorithm that accepts FA_DTYPE_F64
 *                  tensors, so exact inputs give a reference good to ~1e-15.
 *   FA_ALGO_PLAIN  works "in the input precision" like a plain framework implementation:
 *                  each matmul accumulates in fp32 and rounds its result to the input dtype,
 *                  the softmax is fp32. Its error against FA_ALGO_NAIVE is the yardstick of
 *                  the correctness rule (a kernel may err at most about twice as much).
 */
typedef enum fa_algo {
    FA_ALGO_AUTO = 0,   /* the fastest kernel that serves the call (tiled, online softmax) */
    FA_ALGO_NAIVE = 1,
    FA_ALGO_PLAIN = 2
} fa_algo;

typedef struct fa_context fa_context;

/*
 * Creates a context for a backend. FA_BACKEND_CPU is always available; FA_BACKEND_CUDA returns
 * FA_ERR_NO_BACKEND when the library was built without CUDA or no device is usable.
 * Environment: FLASHATTN_LOG=1 prints every kernel choice to stderr; FLASHATTN_STRICT=1 makes
 * the context strict (see fa_context_set_strict); FLASHATTN_NUM_THREADS sets the thread count.
 * CPU backend: FLASHATTN_CPU_ISA=amx|avx512|avx2|scalar forces an instruction-set level (one
 * the CPU lacks is an error); at the amx level (the default on CPUs with AMX-BF16) the fp32
 * forward and backward run on the AMX unit, each fp32 product formed from six products of
 * bf16 parts (kernels cpu_fwd_amx_bf16x6_f32_*, cpu_bwd_amx_bf16x6_f32_*, fp32 accuracy under
 * the library's 2x rule), and FLASHATTN_CPU_F32_AMX=0 returns both to the AVX-512 FMA kernels
 * (the selection's reason says so); FLASHATTN_CPU_BWD_SCHEDULE=one-pass|two-pass forces the
 * backward's schedule (the amx fp32 backward has one, and says so in the reason);
 * FLASHATTN_CPU_SMALL_FLOPS=N (default 2^20) runs calls of fewer FLOPs on the calling thread,
 * without a thread team (the record's threads is then 1). Each
 * variable is read here, once: a context keeps what it found at its creation.
 * Returns FA_OK, FA_ERR_NULL_POINTER, FA_ERR_INVALID_ARGUMENT, FA_ERR_NO_BACKEND,
 * FA_ERR_OUT_OF_MEMORY. On error *ctx is set to NULL and fa_last_error(NULL) has the message.
 */
FA_API fa_status fa_context_create(fa_context **ctx, fa_backend backend);
/* Frees the context and any workspace it owns. NULL is a no-op. A CUDA context must not be
   destroyed from a thread-exit destructor (a pthread key's or a C++ thread_local's): the CUDA
   runtime's own per-thread state may be gone by then and the runtime crashes; hand it to a
   live thread instead (the Python extension does). */
FA_API void fa_context_destroy(fa_context *ctx);

/* Worker threads for the CPU backend; 0 (the default) uses every available core. */
FA_API fa_status fa_context_set_threads(fa_context *ctx, int threads);
/* The cudaStream_t that CUDA work is queued on (NULL: the legacy default stream). */
FA_API fa_status fa_context_set_stream(fa_context *ctx, void *cuda_stream);
/* Algorithm choice (default FA_ALGO_AUTO). */
FA_API fa_status fa_context_set_algo(fa_context *ctx, fa_algo algo);
/* Strict mode: when the preferred kernel for a call cannot serve it, fail with
   FA_ERR_UNSUPPORTED instead of running a slower kernel. */
FA_API fa_status fa_context_set_strict(fa_context *ctx, int strict);
/*
 * Checks of the index arrays that live in device memory: varlen cu_seqlens_q/k, and a KV
 * cache's seqlens, block_table and cache_leftpad (fa_params). On the CPU they are always checked before anything is
 * written. On the GPU the host cannot read them without waiting for the device, so:
 *   FA_DEVICE_CHECKS_ASYNC (0, the default): no host synchronisation. The kernels check the
 *     elements they use, never read or write outside the tensors on a bad one, and record
 *     the first bad element in the context's error word (host memory the GPU writes). The
 *     next call on the context, or fa_context_check(), returns it as FA_ERR_VARLEN with the
 *     array, the element and its value. The call that met the bad element returned FA_OK and
 *     its outputs are not to be trusted: a KV-cache call computes with clamped lengths and
 *     page indices (and appends nothing to a sequence whose length is bad, nor to a page whose
 *     block_table entry is), a varlen call computes nothing (every sequence taken as empty).
 *     CUDA-graph friendly. Varlen calls also need max_seqlen_q/k > 0 here (0 asks the
 *     library to compute them, which reads the arrays back: one synchronisation), and a
 *     sequence longer than max_seqlen is a bad element.
 *   FA_DEVICE_CHECKS_SYNC (1): before the call a small kernel checks the arrays and the host
 *     waits for its answer (one stream synchronisation per call, tens of microseconds): a bad
 *     array is FA_ERR_VARLEN with nothing written. Not allowed while the stream is captured
 *     into a CUDA graph (FA_ERR_UNSUPPORTED, the capture left intact).
 * Other modes are FA_ERR_INVALID_ARGUMENT. FLASHATTN_DEVICE_CHECKS=1 in the environment makes
 * new contexts synchronous.
 */
#define FA_DEVICE_CHECKS_ASYNC 0
#define FA_DEVICE_CHECKS_SYNC 1
FA_API fa_status fa_context_set_device_checks(fa_context *ctx, int mode);
/*
 * Returns, and clears, the error that kernels of earlier calls on ctx recorded in its error
 * word (FA_ERR_VARLEN, fa_last_error() naming the array, the element and its value), or FA_OK
 * (always on a CPU context). It does not wait for the GPU: it sees what finished kernels
 * wrote, so synchronise the stream first to include all the work queued on it. Every call
 * that runs kernels (fa_fwd, fa_bwd, fa_fwd_kvcache, fa_merge_attn; not the workspace
 * queries) checks the word first and, when one is set, fails with it (and clears it) without
 * running or writing anything. The word belongs to the context: CUDA graphs captured from its
 * calls write it when replayed, so destroy the context only after their last replay.
 */
FA_API fa_status fa_context_check(fa_context *ctx);
/*
 * The CUDA device a context's calls run on: each call makes `device` current for its
 * duration and restores the caller's current device afterwards. -1 (the default): the
 * caller's current device. Tensors must live on that device (FA_ERR_DEVICE otherwise).
 * A device that does not exist or that the backend cannot use is FA_ERR_DEVICE, and device
 * < -1 FA_ERR_INVALID_ARGUMENT. The CPU backend accepts and ignores it.
 */
FA_API fa_status fa_context_set_device(fa_context *ctx, int device);
/*
 * A workspace allocator, for callers whose memory has an owner already (a framework's caching
 * allocator). Each call that needs workspace asks alloc(user, bytes, stream) for it (bytes =
 * what the fa_*_workspace_size query of the call gives; stream: the context's) and returns it
 * with release(user, ptr, bytes, stream) before the call returns, after its kernels are
 * queued (also when the call fails after the allocation): the allocator must be
 * stream-ordered (memory released this way may be handed out again only to work ordered after
 * it on that stream, as PyTorch's caching allocator and cudaMallocAsync do). alloc returns
 * NULL on failure (FA_ERR_OUT_OF_MEMORY). Host memory for the CPU backend, device memory for
 * CUDA. A workspace set with fa_context_set_workspace takes precedence. a = NULL returns to
 * the context's own buffer. struct_size must be sizeof(fa_allocator) of the caller's header
 * (FA_ERR_INVALID_ARGUMENT when it is smaller than the first version's); alloc and release
 * are required (FA_ERR_NULL_POINTER).
 * own_max_bytes (version 2): a call made outside CUDA-graph capture whose workspace needs at
 * most this many bytes uses the context's own buffer instead, which skips the allocator's
 * round trip and keeps the counters that kernels leave zero known zero (no clearing launch
 * per call: the decode's split counters); the buffer then stays allocated, up to this size,
 * until the context is destroyed. 0 (and a version-1 struct): every call asks the allocator.
 * CUDA graphs: a call captured with an allocator takes its workspace from it (cudaMallocAsync
 * and PyTorch's allocator are legal under capture). Without one, a captured call uses the
 * context's own buffer as it stands: it fails with FA_ERR_WORKSPACE when the buffer would have
 * to grow (make the same call once before the capture), and the graph keeps using the buffer,
 * so replays must not overlap other work of the context, and the buffer must not be replaced
 * (a later call that needs more, fa_context_destroy) while the graph is replayed.
 * Streams: the own buffer is safe across fa_context_set_stream: a call on another stream
 * first waits (on the GPU, not the host) for the buffer's last use outside capture.
 */
typedef struct fa_allocator {
    size_t struct_size;
    void *(*alloc)(void *user, size_t bytes, void *stream);
    void (*release)(void *user, void *ptr, size_t bytes, void *stream);
    void *user;
    size_t own_max_bytes; /* version 2 */
} fa_allocator;
FA_API fa_status fa_context_set_allocator(fa_context *ctx, const fa_allocator *a);
/*
 * Hands the context a workspace of `bytes` bytes (host memory for the CPU backend, device
 * memory for CUDA). With no workspace set (the default, or ptr NULL) the context allocates and
 * keeps what a call needs. A call whose need exceeds a user workspace fails with
 * FA_ERR_WORKSPACE. The context never frees a user workspace. ptr NULL with bytes > 0 is
 * FA_ERR_NULL_POINTER.
 */
FA_API fa_status fa_context_set_workspace(fa_context *ctx, void *ptr, size_t bytes);

/*
 * The detailed message of the last failed call on ctx (or of the last failed
 * fa_context_create on this thread when ctx is NULL); "" after a successful call.
 * Valid until the next call on the same context.
 */
FA_API const char *fa_last_error(const fa_context *ctx);

/* ------------------------------------------------------------------------------------------ */
/* Kernel selection record                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* What the dispatcher chose for a call on a context. */
typedef struct fa_selection {
    char kernel[64];       /* e.g. "cpu_fwd_avx512_f32_64x64", "cpu_fwd_naive_f64"                   */
    char backend[8];       /* "cpu" or "cuda"                                                   */
    char op[8];            /* "fwd" (fa_fwd, fa_fwd_kvcache), "bwd" or "merge" (fa_merge_attn) */
    int tile_q;            /* query rows per tile (0 for untiled kernels)                       */
    int tile_k;            /* key rows per tile                                                 */
    int threads;           /* CPU worker threads used, or CUDA threads per block                 */
    int num_splits;        /* split-KV chunks (1 when the key dimension is not split)            */
    size_t workspace_bytes;/* workspace the call used                                            */
    char reason[192];      /* why a faster path was refused, "" when the preferred kernel ran   */
} fa_selection;

/* The record of the last call on ctx if it succeeded; NULL when that call failed or there was
   none (the record is cleared at the start of every call). */
FA_API const fa_selection *fa_last_selection(const fa_context *ctx);

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Attention forward.
 *   q    [batch, seqlen_q, heads_q,  d]   (varlen: [total_q, heads_q, d])
 *   k    [batch, seqlen_k, heads_kv, d]   (varlen: [total_k, heads_kv, d])
 *   v    [batch, seqlen_k, heads_kv, d]   same shape as k
 *   p    options from fa_params_default(); NULL means the defaults
 *   out  [batch, seqlen_q, heads_q, d], same dtype as q (f32, f16 or bf16 when q is FP8),
 *        any strides (written)
 *   lse  fp32 [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]) or NULL (written);
 *        f64 when the inputs are f64 (FA_ALGO_NAIVE)
 * q, k, v, out share one dtype (f32, f16 or bf16; f64 with FA_ALGO_NAIVE) and one device;
 * or q, k, v are FP8 (one of the two formats, see fa_dtype for what CUDA takes) and out
 * f32/f16/bf16.
 * d is 1..256 (d = 0 is FA_ERR_SHAPE, d > 256 FA_ERR_HEAD_DIM). On CUDA a d that is not a
 * multiple of 8 runs on zero-padded copies in the workspace (the selection's kernel name ends
 * in "_pad<d>"); fa_fwd_kvcache too, copying the cache rows it reads into the workspace (a
 * padded cache of batch x capacity rows) and the appended rows back: correct but slow.
 * out and lse must not overlap the inputs, nor each other, nor alias themselves (see the top of
 * this file; FA_ERR_INVALID_ARGUMENT).
 * Special values (the data is not checked; this is what the CPU kernels and the reference do):
 *  - Finite inputs whose exact results are finite give finite results, however large the
 *    scores (the exponentials are of score minus row max, never above 1; huge scores make the
 *    softmax one-hot). A dot product q.k that overflows fp32 is an infinite score (below).
 *  - A key a row cannot see (masked by causal / window) does not contribute to that row, even
 *    when its K or V holds NaN or +-Inf: its weight is exactly 0 and is never multiplied.
 *  - A key a row sees: NaN in its K (or a NaN score) makes the row's O and LSE NaN; NaN in
 *    element x of its V makes column x of the row's O NaN; NaN in a row's Q makes its O and
 *    LSE NaN. An infinite score (from +-Inf in Q or K): +inf, or Inf - Inf, makes the row NaN;
 *    -inf gives that key weight 0, like a masked one. +-Inf in element x of V makes column x
 *    of O +-Inf (NaN where Infs of both signs meet, or where the key's weight underflows to 0;
 *    NaN on the amx level's fp32 forward, whose products split V into bf16 parts).
 *  Every CPU level keeps these (the amx level too: its tile products take a mask-edge tile's
 *  Inf and NaN out of the product and add their terms only where they are visible), and so
 *  do the CUDA sm80 kernels (the same way; they serve every GPU before Hopper, and on Hopper
 *  head dims other than 64, 128 and 256, dropout and the KV-cache decode). Not yet everywhere
 *  (issue 42): the Hopper kernels (head dims 64, 128, 256) keep the first point, but a NaN
 *  or Inf in a masked key that shares a key tile with keys the row sees can still reach the
 *  row there (a zero weight times NaN in the tile's product).
 * Returns FA_OK or: FA_ERR_NULL_POINTER, FA_ERR_INVALID_ARGUMENT, FA_ERR_SHAPE, FA_ERR_DTYPE,
 * FA_ERR_STRIDE, FA_ERR_HEAD_DIM, FA_ERR_GQA, FA_ERR_VARLEN, FA_ERR_OVERFLOW, FA_ERR_DEVICE,
 * FA_ERR_UNSUPPORTED, FA_ERR_NO_BACKEND, FA_ERR_OUT_OF_MEMORY, FA_ERR_WORKSPACE, FA_ERR_CUDA,
 * FA_ERR_BUSY.
 */
FA_API fa_status fa_fwd(fa_context *ctx, const fa_tensor *q, const fa_tensor *k,
                        const fa_tensor *v, const fa_params *p, fa_tensor *out, fa_tensor *lse);

/* Bytes of workspace fa_fwd would use for these arguments (validated as fa_fwd does). On the
   CPU: a few tiles per thread, whatever the sequence length; the amx level's bf16 forward also
   holds a bf16 copy of K and V (packed for its tiles). */
FA_API fa_status fa_fwd_workspace_size(fa_context *ctx, const fa_tensor *q, const fa_tensor *k,
                                       const fa_tensor *v, const fa_params *p, size_t *bytes);

/* ------------------------------------------------------------------------------------------ */
/* Backward                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * Attention backward by recomputation: from q, k, v, the forward output `out`, its gradient
 * `dout` and the forward LSE, computes
 *   dq [like q], dk [like k], dv [like v]   (written; same dtype as q, any strides)
 * with the same options p as the forward call. lse is required (fp32, as fa_fwd writes it).
 * No probability matrix is stored: the softmax is rebuilt from LSE tile by tile, with
 * D_i = sum_d dout_id * out_id precomputed per row.
 * dq, dk, dv must not overlap the inputs; they may share one buffer (packed dqkv) without
 * sharing elements (see the top of this file).
 * Special values: as fa_fwd says, and a query row does not contribute to the dK, dV of keys it
 * cannot see, nor a key to the dQ of rows that cannot see it (NaN or Inf in Q, dO, K or V
 * included; not yet in the Hopper backward at head dims 64 and 128: issue 42; its d 256
 * kernel keeps it). A NaN reaching a row (its Q, dO, LSE, or a key it sees) makes that row's
 * dQ NaN and reaches the dK, dV of every key the row sees. P = exp(score - LSE) is taken as
 * at most 1 even where the recomputed score exceeds LSE by a rounding. The CPU kernels split
 * the scale between dS and the stored sums so that no fp32 partial sum exceeds its result's
 * bound (a tiny softmax_scale with huge K, V and dO stays finite); the CUDA kernels round dS to
 * the input dtype for their products and scale the sums after them, so there dS must fit that
 * dtype and the unscaled sums dS K, dS Q fp32.
 * Returns the statuses of fa_fwd.
 */
FA_API fa_status fa_bwd(fa_context *ctx, const fa_tensor *q, const fa_tensor *k,
                        const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout,
                        const fa_tensor *lse, const fa_params *p, fa_tensor *dq, fa_tensor *dk,
                        fa_tensor *dv);

/* Bytes of workspace fa_bwd would use for these arguments. On the CPU: one float per query row
   and head (D), tiles per thread and, when the one-pass schedule runs (see the README), a dQ
   accumulator of at most 64 MiB per thread (the amx level's bf16 backward: about three times
   that, with the packed Q and dO of a kv head's query heads; its fp32 backward about seven
   times, three bf16 parts of each). */
FA_API fa_status fa_bwd_workspace_size(fa_context *ctx, const fa_tensor *q, const fa_tensor *k,
                                       const fa_tensor *v, const fa_params *p, size_t *bytes);

/* ------------------------------------------------------------------------------------------ */
/* Inference: KV cache, paged KV, split-KV decoding                                           */
/* ------------------------------------------------------------------------------------------ */

/*
 * A KV cache. Sequence b holds seqlens[b] tokens (positions 0 .. seqlens[b]-1).
 *   Contiguous: k and v are [batch, max_len, heads_kv, d] (any strides, last one 1); token t of
 *     sequence b is row (b, t).
 *   Paged: k and v are page pools [num_pages, page_size, heads_kv, d]; token t of sequence b
 *     lives in pool page block_table[b * block_table_stride + t / page_size], row
 *     t % page_size. Pages may be shared between sequences and appear in any order. Only
 *     the entries of the pages a call touches (the first ceil((seqlens[b] + seqlen_new) /
 *     page_size) of row b) are read, and they must lie in [0, num_pages). Rows appended by
 *     one sequence must not be appended to by another in the same call, nor read by another
 *     (the result would depend on the order of the work). max_pages >= 1 and
 *     block_table_stride >= max_pages. On the CPU a page index out of the pool, a row
 *     appended twice, or a bad max_pages / stride is FA_ERR_INVALID_ARGUMENT (reads of
 *     appended rows by other sequences are not detected).
 * seqlens and block_table are int32 arrays on the device of the tensors. k and v share one
 * shape and may interleave (one buffer, K and V rows alternating).
 */
typedef struct fa_kvcache {
    fa_tensor k, v;
    const int32_t *seqlens;       /* [batch] tokens already in the cache */
    const int32_t *block_table;   /* NULL: contiguous cache */
    int64_t block_table_stride;   /* int32 elements between rows of block_table (paged only) */
    int64_t max_pages;            /* usable entries per row of block_table (paged only) */
} fa_kvcache;

/*
 * Attention of a few new query tokens per sequence against a KV cache (decoding, speculative
 * or chunked prefill), with an optional append of new keys and values in the same call.
 *   q      [batch, seqlen_q, heads_q, d]
 *   cache  see fa_kvcache; its k/v tensors are written when k_new is given
 *   k_new, v_new  NULL (both; one without the other is FA_ERR_NULL_POINTER), or
 *          [batch, seqlen_new >= 1, heads_kv, d]: copied into the cache at positions
 *          seqlens[b] .. seqlens[b] + seqlen_new - 1 first; attention then covers
 *          seqlens[b] + seqlen_new keys. The seqlens array itself is not changed. The cache
 *          must have room (max_len, or max_pages * page_size) — else FA_ERR_SHAPE (CPU) /
 *          FA_ERR_VARLEN (device arrays are checked on the device); seqlens < 0 likewise.
 *          A sequence may hold 0 tokens: its rows see no key (O = 0, LSE = -inf).
 *   p      options as for fa_fwd; masks align bottom-right against the total length of each
 *          sequence (query row i of sq sits on key column i + total_b - sq). Varlen fields
 *          (cu_seqlens_q/k, batch, max_seqlen_q/k) must be 0/NULL: FA_ERR_VARLEN otherwise.
          The version-3 fields apply here: rotary_cos/rotary_sin (the rotary embedding of q
          and k_new, fused into the append) and cache_leftpad (see fa_params).
 *   num_splits  0: the library picks how many chunks of the key range run in parallel and
 *          merges them (recorded in fa_last_selection()->num_splits); n >= 1 forces n
 *          (chunks past the keys are empty and cost little); n < 0 is FA_ERR_INVALID_ARGUMENT.
 *   out, lse    as for fa_fwd.
 * q, the cache, k_new/v_new and out share one dtype (f32 on the CPU, f16, bf16), or all but
 * out are FP8 (CPU only; out f32/f16/bf16; descales as for fa_fwd, per (batch, kv head)); no
 * f64 / FA_ALGO_NAIVE or FA_ALGO_PLAIN path (FA_ERR_UNSUPPORTED on such a context: gather
 * the cache into contiguous K/V and call fa_fwd to compare). out and lse must not overlap
 * q, the cache, k_new/v_new, seqlens or block_table; when appending, the cache must not
 * overlap q, k_new/v_new, seqlens or block_table either (FA_ERR_INVALID_ARGUMENT).
 * Special values as for fa_fwd: cache rows a query row cannot see (past its causal diagonal
 * or window, or past seqlens[b] + seqlen_new) do not contribute to it, NaN or Inf included.
 * Returns the statuses of fa_fwd; on error neither the outputs nor the cache are written.
 */
FA_API fa_status fa_fwd_kvcache(fa_context *ctx, const fa_tensor *q, const fa_kvcache *cache,
                                const fa_tensor *k_new, const fa_tensor *v_new,
                                const fa_params *p, int num_splits, fa_tensor *out,
                                fa_tensor *lse);

/* Bytes of workspace fa_fwd_kvcache would use (partial outputs of the splits). */
FA_API fa_status fa_fwd_kvcache_workspace_size(fa_context *ctx, const fa_tensor *q,
                                               const fa_kvcache *cache, const fa_tensor *k_new,
                                               const fa_tensor *v_new, const fa_params *p,
                                               int num_splits, size_t *bytes);

/*
 * Merges n partial attention results computed over disjoint sets of keys (shards of a cache,
 * for example) into the result over their union, with the log-sum-exp correction:
 *   lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s.
 * out_parts[s] are BSHD (or THD) like out, lse_parts[s] like lse (fp32, required); parts
 * whose lse is -INFINITY (they saw no key) carry no weight (their out is not read), and a row
 * no part saw gets out 0, lse -inf. A part's lse must otherwise be finite: +INFINITY or NaN
 * is no log-sum-exp of attention; on the CPU every value is checked first
 * (FA_ERR_INVALID_ARGUMENT naming the part and the row, nothing written); on CUDA the LSEs
 * live in device memory and are not checked (such a row's result is unspecified). out and
 * lse (fp32, or NULL) are written; they must not overlap any part, nor each other, nor alias
 * themselves (FA_ERR_INVALID_ARGUMENT). The parts share one dtype; out may have another
 * (f32, f16 or bf16 each, e.g. fp32 parts merged into a bf16 out). n >= 1; head_dim <= 256.
 * Returns FA_OK or FA_ERR_NULL_POINTER, FA_ERR_INVALID_ARGUMENT, FA_ERR_SHAPE, FA_ERR_DTYPE,
 * FA_ERR_STRIDE, FA_ERR_HEAD_DIM, FA_ERR_OVERFLOW, FA_ERR_DEVICE, FA_ERR_UNSUPPORTED,
 * FA_ERR_OUT_OF_MEMORY, FA_ERR_CUDA, FA_ERR_BUSY.
 */
FA_API fa_status fa_merge_attn(fa_context *ctx, int n, const fa_tensor *out_parts,
                               const fa_tensor *lse_parts, fa_tensor *out, fa_tensor *lse);

/* ------------------------------------------------------------------------------------------ */
/* Dropout's mask                                                                             */
/* ------------------------------------------------------------------------------------------ */

/*
 * The keep mask that fa_fwd and fa_bwd apply with dropout_seed = seed, dropout_offset =
 * offset and dropout_p = p, for a problem of batch entries of heads query heads, seqlen_q
 * queries and seqlen_k keys: mask_out[((b * heads + h) * seqlen_q + i) * seqlen_k + j] is 1
 * where element (b, h, i, j) is kept (the kernels scale it by 1 / (1 - p)) and 0 where it is
 * dropped; whether a mask hides the element does not enter. i and j count within sequence b
 * (varlen: positions in the sequence), so a varlen call's mask of sequence b is the top-left
 * corner of its (b, h) block here. A debugging aid (a reference with the same mask, a test),
 * computed on the host whatever ctx's backend: batch * heads * seqlen_q * seqlen_k bytes.
 * The rule, exactly (Philox4x32-10; the same on every backend, tile shape, thread count and
 * instruction set):
 *   key = (lo32(seed), hi32(seed) ^ hi32(offset)),  counter = (j / 4, i, b * heads + h,
 *   lo32(offset)),  r = output (j % 4) of Philox4x32-10(counter, key),
 *   kept when r >= floor(p * 2^32)   (fp32 p, the product exact in double).
 * Returns FA_OK, FA_ERR_NULL_POINTER (ctx or mask_out), FA_ERR_INVALID_ARGUMENT (p outside
 * [0, 1)), FA_ERR_SHAPE (a size < 0), FA_ERR_OVERFLOW (the mask's size, batch * heads or
 * seqlen_q at 2^32 or more, seqlen_k at 2^34 or more); nothing is written on error.
 * fa_fwd and fa_bwd refuse dropout beyond those bounds (FA_ERR_UNSUPPORTED).
 */
FA_API fa_status fa_dropout_mask(fa_context *ctx, uint64_t seed, uint64_t offset, float p,
                                 int64_t batch, int64_t heads, int64_t seqlen_q,
                                 int64_t seqlen_k, uint8_t *mask_out);

/* ------------------------------------------------------------------------------------------ */
/* FP8 quantisation                                                                           */
/* ------------------------------------------------------------------------------------------ */

/*
 * Quantises a BSHD tensor to FP8 with one scale per block of rows (tokens) of each head, as
 * FlashAttention-3's block quantisation does (docs/fp8.md has the accuracy it buys).
 *   x           [batch, seqlen, heads, d], f32, f16 or bf16, any strides (read)
 *   x8          [batch, seqlen, heads, d], FA_DTYPE_F8_E4M3 or FA_DTYPE_F8_E5M2 (its dtype picks
 *               the format), any strides (written)
 *   scales      fp32 [batch, heads, nblocks], any strides (written): nblocks =
 *               ceil(seqlen / block_rows), block_rows 0 meaning seqlen (one block per (batch,
 *               head); then nblocks is 1). The real value of x8 element (b, t, h, i) is
 *               scales[b, h, t / block_rows] * x8[b, t, h, i].
 *   block_rows  >= 0 (FA_ERR_INVALID_ARGUMENT otherwise).
 *   hadamard    0: none. 1: x's rows are rotated first, x' = x H D / sqrt(d) with H the d x d
 *               Walsh-Hadamard matrix (d a power of two, else FA_ERR_HEAD_DIM) and D a diagonal
 *               of +-1 drawn from sign_seed (sign_seed 0: D = I). The rotation is orthogonal, so
 *               quantising Q and K with the same (hadamard, sign_seed) leaves Q K^T unchanged in
 *               exact arithmetic while spreading an outlier over the whole row ("incoherent
 *               processing"). V must not be rotated (its rows come out in O).
 * A block's scale is amax / fmax (448 for e4m3, 57344 for e5m2), its largest magnitude mapped to
 * the format's largest finite value; x / scale rounds to nearest even (saturating at fmax). An
 * all-zero block gets scale 1. The scales are the attention's descales: with block_rows 0, pass
 * scales for k_descale / v_descale (descale_batch_stride = heads, the data pointer of a
 * contiguous [batch, heads, 1] tensor); Q's descale is indexed by kv head, so under GQA quantise
 * Q with one scale per kv head yourself, or use heads_q == heads_kv. fa_fwd takes no finer
 * scales (per block of rows): dequantise such blocks yourself (docs/fp8.md).
 * x must be finite (NaN or +-Inf: FA_ERR_INVALID_ARGUMENT naming the element, nothing written).
 * CPU tensors only (FA_ERR_DEVICE on CUDA: the GPU quantiser is not built yet). x8 and scales
 * must not overlap x or each other (FA_ERR_INVALID_ARGUMENT). The selection record names
 * cpu_quantize_fp8_<dtype>.
 * Returns FA_OK or FA_ERR_NULL_POINTER, FA_ERR_INVALID_ARGUMENT, FA_ERR_SHAPE, FA_ERR_DTYPE,
 * FA_ERR_STRIDE, FA_ERR_HEAD_DIM, FA_ERR_OVERFLOW, FA_ERR_DEVICE, FA_ERR_OUT_OF_MEMORY,
 * FA_ERR_BUSY.
 */
FA_API fa_status fa_quantize_fp8(fa_context *ctx, const fa_tensor *x, fa_tensor *x8,
                                 fa_tensor *scales, int64_t block_rows, int hadamard,
                                 uint64_t sign_seed);

/* ------------------------------------------------------------------------------------------ */
/* Context parallelism: ring attention over NCCL                                              */
/* ------------------------------------------------------------------------------------------ */

/*
 * Exact attention over a sequence cut into shards across the ranks of an NCCL communicator
 * (context parallelism, "ring attention"); docs/cp.md has the algorithm and its schedule.
 * Every rank calls fa_cp_fwd (or fa_cp_bwd) at once, with the same arguments but its own shards
 * and its own communicator handle. On rank r of n:
 *  - the K/V shards travel round the ring (rank r sends to r + 1 and receives from r - 1, mod
 *    n) by ncclSend/ncclRecv on a second stream, each hop overlapped with the attention of the
 *    shard present; partial results are merged by their LSEs in fp32 (forward);
 *  - the backward runs the same ring, dK/dV partial sums (fp32) travelling behind the K/V
 *    shards until they are back on their owner after n hops.
 * Layouts (the shard a rank holds; chunks differ by at most a token): the sequence is cut
 * into c chunks, S = q * c + m, chunks 0 .. m-1 of q + 1 tokens and the rest of q;
 *   FA_CP_CONTIGUOUS  c = n, rank r holds chunk r;
 *   FA_CP_ZIGZAG      c = 2n, rank r holds chunks r and 2n-1-r, in that order (with a causal
 *                     mask every rank then does the same work).
 * (The Python package's flashattn.distributed uses the same definitions: its split/shard give
 * these shards.) The causal mask is over global positions: the token at position p sees keys
 * at positions <= p.
 *
 * NCCL is not linked: the library loads libnccl.so.2 with dlopen at the first call
 * (FLASHATTN_NCCL_LIBRARY=/path/to/libnccl.so.2 overrides the name; read at that first load).
 * Without it the calls fail with FA_ERR_NO_BACKEND and say so. nccl_comm is the rank's
 * ncclComm_t (as void *, so this header needs no nccl.h); its device must be the context's
 * call device (fa_context_set_device, or the current one), else FA_ERR_DEVICE. The call
 * queues its work on the context's stream and returns without waiting for the GPU (NCCL's
 * usual contract: the communication is ordered on the stream); it creates a stream and two
 * events per call, so it is refused while the stream is captured into a CUDA graph
 * (FA_ERR_UNSUPPORTED). Several communicators driven by one thread (ncclCommInitAll) need one
 * thread per device: a call waits for nothing, but NCCL groups one thread's calls only inside
 * ncclGroupStart/End, and this call holds its own group per hop.
 * One process driving several GPUs must also allocate nothing while a ring is in flight: CUDA's
 * allocation calls (cudaMalloc, cudaFree, cudaHostAlloc, copies from pageable memory) take a
 * lock of the whole process and may wait for a device's queued work, and a ring hop queued on
 * one device waits for the peer thread's call, which that lock holds back: a deadlock. Such a
 * caller gives each rank's context its workspace before the first call (the larger of
 * fa_cp_fwd_workspace_size and fa_cp_bwd_workspace_size, fa_context_set_workspace), makes its
 * allocations before a barrier of all rank threads, frees after the ranks synchronised, and
 * loads CUDA's kernels eagerly (CUDA_MODULE_LOADING=EAGER in the environment before the first
 * CUDA call: a kernel loaded lazily at its first launch allocates device memory too)
 * (tests/test_cp.c does all three). One process per GPU (torchrun) has no such shared lock.
 *
 * Arguments (fa_cp_args, from fa_cp_args_default()):
 *   q         [batch, shard_len, heads_q, d]  this rank's shard of Q (CUDA, f16 or bf16)
 *   k, v      [batch, shard_len, heads_kv, d] its shards of K and V (heads_q a multiple of
 *             heads_kv: GQA); shard_len must be the layout's length for this rank
 *             (FA_ERR_SHAPE otherwise, naming the expected length)
 *   seqlen    the whole sequence's length, at least the world size (every shard holds a
 *             token; FA_ERR_SHAPE otherwise)
 *   layout    FA_CP_CONTIGUOUS or FA_CP_ZIGZAG
 *   p         options; causal and softmax_scale apply. Refused with FA_ERR_UNSUPPORTED:
 *             windows (window_left/right other than -1 once causal is folded in), ALiBi,
 *             softcap, dropout, varlen, FP8 descales, and the version-3 fields (kvcache only).
 *   out, lse  fa_cp_fwd writes them: out like q, lse fp32 [batch, heads_q, shard_len]
 *             (required: the backward needs it). fa_cp_bwd reads them (the forward's).
 *   dout      fa_cp_bwd: the gradient of out, like q.
 *   dq, dk, dv  fa_cp_bwd writes them, like q, k, v: this rank's rows of the gradients of the
 *             whole sequence's attention.
 * Strides as for fa_fwd / fa_bwd (any outer strides, rows 16-byte aligned). Workspace: two
 * K/V shard buffers and the fp32 accumulators (forward: out and lse of the shard; backward:
 * dQ and two pairs of dK/dV sums), taken like any call's (fa_context_set_allocator,
 * fa_context_set_workspace or the context's own buffer).
 * Accuracy: each per-shard call is fa_fwd/fa_bwd's kernel; merges and sums are fp32, as a
 * single call's accumulators are; the results meet the library's 2x rule against a float64
 * reference (tests/test_cp.c).
 * Returns FA_OK or FA_ERR_NULL_POINTER, FA_ERR_INVALID_ARGUMENT (a bad struct_size/version,
 * layout, seqlen, or a world the communicator does not have), FA_ERR_SHAPE, FA_ERR_DTYPE,
 * FA_ERR_STRIDE, FA_ERR_HEAD_DIM, FA_ERR_GQA, FA_ERR_OVERFLOW, FA_ERR_DEVICE,
 * FA_ERR_UNSUPPORTED, FA_ERR_NO_BACKEND (no CUDA backend, or no NCCL), FA_ERR_OUT_OF_MEMORY,
 * FA_ERR_WORKSPACE, FA_ERR_CUDA (the CUDA runtime or NCCL failed: the message has its text),
 * FA_ERR_BUSY. On an error found before the first transfer nothing is written; an NCCL or
 * CUDA failure during the ring leaves the outputs unspecified and the ring out of step (every
 * rank must then give up the communicator).
 */
typedef enum fa_cp_layout {
    FA_CP_CONTIGUOUS = 0,
    FA_CP_ZIGZAG = 1
} fa_cp_layout;

#define FA_CP_ARGS_VERSION 1
typedef struct fa_cp_args {
    /* sizeof(fa_cp_args) and FA_CP_ARGS_VERSION of the caller's header, set by
       fa_cp_args_default(): checked as fa_params' are (FA_ERR_INVALID_ARGUMENT for a zeroed
       struct, a newer version, or a size that is not its version's). */
    uint32_t struct_size;
    uint32_t version;
    const fa_tensor *q, *k, *v;
    int64_t seqlen;
    int layout;                 /* fa_cp_layout */
    const fa_params *p;         /* NULL: the defaults */
    fa_tensor *out, *lse;       /* fa_cp_fwd writes; fa_cp_bwd reads */
    const fa_tensor *dout;      /* fa_cp_bwd */
    fa_tensor *dq, *dk, *dv;    /* fa_cp_bwd writes */
} fa_cp_args;

/* Everything NULL or 0, layout FA_CP_ZIGZAG, and this header's struct_size and version
   (inline: they are the caller's, not the library's). */
static inline fa_cp_args fa_cp_args_default(void) {
    fa_cp_args a;
    a.struct_size = (uint32_t)sizeof(fa_cp_args);
    a.version = FA_CP_ARGS_VERSION;
    a.q = a.k = a.v = NULL;
    a.seqlen = 0;
    a.layout = FA_CP_ZIGZAG;
    a.p = NULL;
    a.out = a.lse = NULL;
    a.dout = NULL;
    a.dq = a.dk = a.dv = NULL;
    return a;
}

/* Shard length of `rank` of `world` for a sequence of seqlen tokens under layout (the rule
   above); -1 when an argument is out of range. Pure arithmetic: no context, no NCCL. */
FA_API int64_t fa_cp_shard_len(int64_t seqlen, int world, int rank, int layout);

/* The ring attention forward: out and lse of this rank's queries over the whole sequence. */
FA_API fa_status fa_cp_fwd(fa_context *ctx, void *nccl_comm, const fa_cp_args *a);
/* The ring attention backward: dq, dk, dv of this rank's shards, from the forward's out and
   lse and dout. */
FA_API fa_status fa_cp_bwd(fa_context *ctx, void *nccl_comm, const fa_cp_args *a);

/* Bytes of workspace fa_cp_fwd / fa_cp_bwd would use for these arguments on this rank,
   validated as the call validates them (the communicator is asked for its size and rank; no
   transfer is made). The outputs the query lacks may be NULL: out, dout and dq stand in as
   q, dk and dv as k (only shapes are read); lse is required, as by the calls. */
FA_API fa_status fa_cp_fwd_workspace_size(fa_context *ctx, void *nccl_comm, const fa_cp_args *a,
                                          size_t *bytes);
FA_API fa_status fa_cp_bwd_workspace_size(fa_context *ctx, void *nccl_comm, const fa_cp_args *a,
                                          size_t *bytes);

/* ------------------------------------------------------------------------------------------ */
/* Introspection                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* A one-line description of the CPU's features seen by the library ("avx512f avx2 fma f16c"). */
FA_API const char *fa_cpu_features(void);
/* 1 if the library was built with the CUDA backend, else 0. */
FA_API int fa_has_cuda(void);
/* Number of kernels this build contains, and the name of kernel i (NULL past the end). */
FA_API int fa_kernel_count(void);
FA_API const char *fa_kernel_name(int i);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */
