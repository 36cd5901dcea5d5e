/*
 * testkit.h — the correctness kit shared by the C tests and `flashattn check`.
 *
 * It builds attention problems from a small case description, fills them with fresh random
 * data, poisons the outputs, runs the kernel under test, the float64 reference (FA_ALGO_NAIVE
 * on f64 copies) and the precision-P baseline (FA_ALGO_PLAIN), and applies the correctness rule
 * of docs/architecture.md to O, LSE and (optionally) dQ, dK, dV. Only the public API is used.
 */
#ifndef FLASHATTN_TESTKIT_H
#define FLASHATTN_TESTKIT_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random numbers and seeds ---------------------------------------------------------- */

typedef struct tk_rng {
    uint64_t s;
} tk_rng;

/* The run's seed: FLASHATTN_TEST_SEED when set (decimal or 0x hex), else fresh from the clock
   and the process id. Fixed for the life of the process, so every failure can quote it. */
uint64_t tk_seed(void);
void tk_rng_init(tk_rng *r, uint64_t seed);
uint64_t tk_rng_u64(tk_rng *r);
double tk_rng_uniform(tk_rng *r);              /* [0, 1) */
double tk_rng_normal(tk_rng *r);               /* N(0, 1) */
int64_t tk_rng_range(tk_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */

/* ---- NCCL, loaded at run time (tk_nccl.c) ------------------------------------------------ */

/* Loads FLASHATTN_NCCL_LIBRARY (or libnccl.so.2) and the three functions below; 0 with the
   reason in why when it cannot. The communicators are NCCL's ncclComm_t, as void *. */
int tk_nccl_load(char *why, size_t len);
extern int (*tk_nccl_init_all)(void **comms, int ndev, const int *devlist);
extern int (*tk_nccl_destroy)(void *comm);
extern const char *(*tk_nccl_error)(int r);
/* Destroys n communicators (NULL entries skipped), each from a thread of its own. */
void tk_nccl_destroy_all(void **comms, int n);
/* For a process that drives several GPUs' rings from threads, before its first CUDA call:
   CUDA_MODULE_LOADING=EAGER (flashattn.h, context parallelism: a kernel loaded lazily at its
   first launch allocates device memory, which can deadlock against a peer's ring in flight). */
void tk_nccl_one_process(void);

/* ---- scalar conversions, independent of the library's (used to fill and to cross-check) --- */

/* Round a double to the nearest value of dtype dt (ties to even, overflow to inf). */
double tk_round_to(fa_dtype dt, double x);
uint16_t tk_f16_bits(double x);   /* x rounded to binary16, as bits */
uint16_t tk_bf16_bits(double x);  /* x rounded to bfloat16, as bits */
double tk_f16_value(uint16_t h);
double tk_bf16_value(uint16_t h);
/* Unit roundoff of a dtype: 2^-24 f32, 2^-11 f16, 2^-8 bf16, 2^-53 f64. */
double tk_unit_roundoff(fa_dtype dt);

/* ---- host buffers holding one strided view ------------------------------------------------ */

/*
 * A tensor view over an allocation that may be larger than the view: with strided = 1 the
 * outer dimensions are laid out in a random order with random gaps, so the view is not
 * contiguous and the gaps let tk_check_written() catch writes outside the view.
 * dev, when set, is a device mirror of base (see the CUDA hook in tk_device.c).
 */
typedef struct tk_buf {
    fa_tensor t;   /* the view; t.data points into base */
    void *base;
    size_t bytes;  /* of base */
    void *dev;     /* device copy of base, or NULL */
} tk_buf;

/* Allocates a view of shape[0..ndim) (ndim 1..4, every size >= 0; the last dimension has
   stride 1). Returns 0 on success. The contents are poisoned. */
/* As tk_buf_alloc, with every stride and the gap before the first element a multiple of
   `align` elements (the CUDA kernels need 16-byte aligned rows: align 8 for 16-bit types). */
int tk_buf_alloc_aligned(tk_buf *b, fa_dtype dt, int ndim, const int64_t *shape, int strided,
                         int align, tk_rng *r);
int tk_buf_alloc(tk_buf *b, fa_dtype dt, int ndim, const int64_t *shape, int strided,
                 tk_rng *r);
void tk_buf_free(tk_buf *b);
int64_t tk_numel(const fa_tensor *t);
/* Element at logical (row-major) index i of the view, as double / stored from a double. */
double tk_get(const fa_tensor *t, int64_t i);
void tk_set(fa_tensor *t, int64_t i, double x);
/* Independent N(0,1)*sigma values, rounded to the view's dtype. */
void tk_fill_normal(tk_buf *b, tk_rng *r, double sigma);
/* Copies every element of src into dst (same shape, any dtypes/strides). */
void tk_copy(tk_buf *dst, const tk_buf *src);
/* Every element of the view times 2^e (exact, but where a result falls subnormal). */
void tk_scale_pow2(tk_buf *b, int e);
/* x (fp32) and x64 (its float64 twin), shape[0..ndim) unstrided, unit normals times 2^e: the
   scaled-input tests' operands. Returns 0 on success; the caller frees both. */
int tk_scaled_normal_pair(tk_buf *x, tk_buf *x64, int ndim, const int64_t *shape, int e,
                          tk_rng *r);
/* Fills the whole allocation with the poison byte 0xFF: a NaN in every dtype. */
void tk_poison(tk_buf *b);
/* 0 when every element of the view was written (is not NaN) and every byte outside the view
   still holds poison; else 1 with a message naming the first offender. */
int tk_check_written(const tk_buf *b, const char *what, char *msg, size_t msglen);

/* ---- comparisons --------------------------------------------------------------------------- */

typedef struct tk_err {
    double max_abs, mean_abs; /* over finite reference elements */
    double ref_max;           /* largest |reference| */
    int64_t argmax;           /* logical index of max_abs */
    int64_t count;
    int nonfinite;            /* elements where one side is not finite and the other differs */
    int64_t first_nonfinite;
} tk_err;

/* Error of x against ref (same shape). Elements where ref is -inf must be exactly -inf in x;
   any other non-finite value in x is counted in nonfinite. */
tk_err tk_compare(const fa_tensor *x, const fa_tensor *ref);

/*
 * The correctness rule: the kernel's max and mean error against the float64 reference must
 * each be at most 2x the baseline's plus slack. Returns 1 on pass. The slack is
 * 4 * u_P * max(1, max|ref|) + extra (see rule_slack() in tk_case.c for why; extra is the
 * fp32 noise of the backward's D_i term and of its P in the gradients, 0 elsewhere).
 */
int tk_rule(const tk_err *kernel, const tk_err *base, fa_dtype precision, double extra,
            double *slack);

/* That extra for dQ, dK and dV (the D and P terms of tk_grad_extra in tk_case.c), from the
   reference's tensors, the softmax scale and n_rows, the most query rows of one kv head (its
   group's heads included) that a key sees. */
typedef struct tk_grad_ref {
    const fa_tensor *q, *k, *o, *lse, *dout, *dq, *dk, *dv;
} tk_grad_ref;
typedef struct tk_grad_slack {
    double dq, dk, dv;
} tk_grad_slack;
tk_grad_slack tk_grad_extra(const tk_grad_ref *ref, int d, double scale, int64_t n_rows);

/* ---- cases --------------------------------------------------------------------------------- */

#define TK_MAX_BATCH 8

enum { TK_ALIBI_NONE = 0, TK_ALIBI_HEAD = 1, TK_ALIBI_BATCH = 2 };

/* One attention problem. Zero-initialise and set what matters; window fields are used only
   when window = 1 (so a zeroed struct means "no window", not window (0, 0)). */
typedef struct tk_case {
    const char *name;
    int batch;
    int64_t sq, sk;           /* BSHD lengths (ignored when varlen) */
    int hq, hkv, d;
    fa_dtype dtype;
    float scale;              /* 0: library default 1/sqrt(d) */
    int causal;
    int window;               /* 1: use wl, wr below */
    int64_t wl, wr;
    float softcap;
    int alibi;                /* TK_ALIBI_* */
    int varlen;               /* 1: THD tensors with lens_q/lens_k (batch entries) */
    int32_t lens_q[TK_MAX_BATCH], lens_k[TK_MAX_BATCH];
    int strided;              /* 1: non-contiguous q, k, v, o, lse (and grads) */
    int bwd;                  /* 1: also check dq, dk, dv */
    int deterministic;        /* fa_params.deterministic (the CUDA backward's dQ without atomics) */
    float dropout_p;          /* fa_params.dropout_p: kernel, reference and baseline all drop */
    uint64_t dropout_seed;    /* with dropout_offset, fa_params' (one mask for the three) */
    uint64_t dropout_offset;
} tk_case;

/* ALiBi slopes for a case (TK_ALIBI_HEAD or TK_ALIBI_BATCH): malloc'd, *len values, rows
   *stride apart (0: one row shared by the batch), NaN in the gaps. NULL when out of memory. */
float *tk_alibi_slopes(int kind, int64_t batch, int hq, tk_rng *r, size_t *len, int64_t *stride);

/* One line describing a case, e.g. "b2 sq17 sk113 h8/2 d64 f16 causal strided". */
void tk_case_format(const tk_case *c, char *buf, size_t len);

enum { TK_PASS = 0, TK_FAIL = 1, TK_SKIP = 2 };

typedef struct tk_opts {
    fa_backend backend;       /* backend of the kernel under test (CPU or CUDA) */
    fa_algo algo;             /* algorithm under test, normally FA_ALGO_AUTO */
    int threads;              /* 0: library default */
    int verbose;              /* 1: message carries the error table also on success */
} tk_opts;

typedef struct tk_report {
    int status;               /* TK_PASS, TK_FAIL, TK_SKIP */
    char kernel_fwd[64], kernel_bwd[64];
    tk_err o[2], lse[2], dq[2], dk[2], dv[2]; /* [0] kernel, [1] baseline, vs reference */
    /* slack the rule used for O, LSE, dQ, dK, dV (dQ/dK include the D_i allowance): the
       limit on a max error is 2 * baseline max + slack */
    double slack[5];
    char msg[4096];           /* case, seed and what failed (or why skipped) */
} tk_report;

/* Appends printf-style text to report->msg (silently truncated when full). */
void tk_report_addf(tk_report *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The case as `backend` runs it: the CUDA kernels take f16 and bf16, so there an f32 case
   runs in bf16 (every shape and option of the sweeps runs on the GPU too). */
tk_case tk_case_on(const tk_case *c, fa_backend backend);

/* Runs one case under the rule. opts NULL: CPU, FA_ALGO_AUTO. Returns report->status. */
int tk_run_case(const tk_case *c, const tk_opts *opts, uint64_t seed, tk_report *report);

/* The standard sweeps (a covering design; see tk_sweep.c). */
const tk_case *tk_fwd_cases(size_t *count);
const tk_case *tk_bwd_cases(size_t *count);

/* ---- device hook (CUDA backend; see tk_device.c) -------------------------------------------- */

/* 1 when this testkit was built with device-memory support. */
int tk_device_available(void);
/* The compute capability's major number of device 0 (9: Hopper), or 0 without one. */
int tk_device_cc_major(void);
/* Mirror b on the device (allocate + upload the whole allocation) / download it back. */
int tk_device_upload(tk_buf *b);
int tk_device_download(tk_buf *b);
void tk_device_free(tk_buf *b);
/* Device copy of a small host array (ALiBi slopes, cu_seqlens); NULL on failure. */
void *tk_device_copy_array(const void *host, size_t bytes);
void tk_device_free_array(void *p);
/* Copies `bytes` of device memory at dev into host; 0 on success. */
int tk_device_read_array(void *host, const void *dev, size_t bytes);
/* The view of b with its data pointer moved to the device mirror. */
fa_tensor tk_device_view(const tk_buf *b);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_TESTKIT_H */
