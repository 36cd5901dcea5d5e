/*
 * demo_naive.c — the demo's naive side: attention as a user writes it on a matrix library.
 *
 * For every (batch, head): S = scale * Q K^T, a softmax along each row of S (keys after the
 * query set to zero when causal, as masked_fill(-inf) does), O = P V. The scores of all
 * (batch, head) pairs are materialised at once, B*H*N*N floats, as a batched
 * `softmax(q @ k.transpose(-1, -2)) @ v` in numpy or PyTorch holds them. The arithmetic is fp32
 * whatever the demo's dtype (f16 and bf16 inputs are widened first), and the matrix products run
 * on the best one the tool was built with: cblas_sgemm of a BLAS (OpenBLAS preferred), else
 * plain C loops. The softmax and the loops use the library's thread count, as the BLAS does, so
 * the speedup compares equal hardware.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_DEMO_CBLAS
#include <cblas.h>
#endif

#include "common.h"
#include "demo.h"

static int g_threads = 1;

const char *demo_naive_label(void) {
#ifdef FA_DEMO_CBLAS
    return "BLAS (materialised)";
#else
    return "C loops (materialised)";
#endif
}

const char *demo_naive_engine(void) {
    static char name[160];
    if (name[0]) return name;
#if defined(FA_DEMO_OPENBLAS)
    /* the config string starts "OpenBLAS 0.3.21 ..."; the core name says which kernels run */
    char ver[48] = "";
    if (sscanf(openblas_get_config(), "OpenBLAS %40s", ver) != 1) ver[0] = 0;
    snprintf(name, sizeof name, "OpenBLAS%s%s cblas_sgemm (%s kernels)", *ver ? " " : "", ver,
             openblas_get_corename());
#elif defined(FA_DEMO_CBLAS)
    snprintf(name, sizeof name, "cblas_sgemm of %s", FA_DEMO_CBLAS_NAME);
#else
    snprintf(name, sizeof name, "plain C loops (no BLAS found at build time)");
#endif
    return name;
}

int demo_naive_set_threads(int threads) {
    g_threads = threads > 0 ? threads : 1;
#if defined(FA_DEMO_OPENBLAS)
    openblas_set_num_threads(g_threads);
    return openblas_get_num_threads();
#elif defined(FA_DEMO_CBLAS)
    return 0; /* an unknown BLAS keeps its own thread setting */
#else
    return g_threads;
#endif
}

uint64_t demo_naive_bytes(int64_t batch, int64_t heads, int64_t n, int64_t d, fa_dtype dt) {
    double bytes = (double)batch * (double)heads * (double)n * (double)n * 4.0;
    if (dt != FA_DTYPE_F32) bytes += 4.0 * (double)batch * (double)n * (double)heads * (double)d * 4.0;
#if !defined(FA_DEMO_CBLAS)
    bytes += (double)n * (double)d * 4.0; /* the loops' transposed K of one head */
#endif
    return bytes >= 1.8e19 ? UINT64_MAX : (uint64_t)bytes;
}

#if !defined(FA_DEMO_CBLAS)
/* C[m x n] = alpha * A[m x k] B[k x n] (row-major, leading dimensions lda, ldb, ldc), in the
   i-k-j order: the inner loop runs along contiguous rows of B and C, which compilers
   vectorise, and rows of C are split over the threads. */
static void gemm_loops(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float *c, int64_t ldc) {
#pragma omp parallel for num_threads(g_threads) schedule(static)
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < n; j++) ci[j] = 0.0f;
        for (int64_t p = 0; p < k; p++) {
            const float aip = alpha * a[i * lda + p], *bp = b + p * ldb;
            for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
        }
    }
}
#endif

/* S = scale * Q K^T for one (batch, head); q and k rows are ld floats apart. kt: n*d floats of
   scratch for the loops' transposed K. */
static void scores(const float *q, const float *k, int64_t ld, int64_t n, int64_t d, float scale,
                   float *s, float *kt) {
#ifdef FA_DEMO_CBLAS
    (void)kt;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)d, scale, q, (int)ld,
                k, (int)ld, 0.0f, s, (int)n);
#else
    for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < d; p++) kt[p * n + j] = k[j * ld + p];
    gemm_loops(n, n, d, scale, q, ld, kt, n, s, n);
#endif
}

/* O = P V for one (batch, head); v and o rows are ld floats apart. */
static void apply(const float *p, const float *v, int64_t ld, int64_t n, int64_t d, float *o) {
#ifdef FA_DEMO_CBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)n, 1.0f, p, (int)n,
                v, (int)ld, 0.0f, o, (int)ld);
#else
    gemm_loops(n, d, n, 1.0f, p, n, v, ld, o, ld);
#endif
}

/* e^x for x <= 0 (a score minus its row's maximum), to about 2 ulp: x = n ln2 + r with |r| <=
   ln2/2, e^r by its Taylor polynomial to degree 7, 2^n put into the exponent bits. It is plain
   arithmetic, so the loops below vectorise it; libm's expf is a call per element, and the
   softmax a user calls (numpy's, PyTorch's) is vectorised, so the naive side's must be too. */
static inline float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x;                     /* e^-87 is still a normal float */
    const float magic = 12582912.0f;                 /* 1.5 * 2^23: adding it rounds to integer */
    float n = (x * 1.44269504f + magic) - magic;     /* round(x / ln2) */
    float r = (x - n * 0.693145752f) - n * 1.42860677e-06f; /* ln2 split in two for accuracy */
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* On x86-64 with GCC or clang the row's loops are compiled for AVX-512, AVX2 and the baseline,
   and the loader picks the widest the CPU has, as numpy and PyTorch dispatch theirs. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__)
#define DEMO_WIDEST __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DEMO_WIDEST
#endif

/* One row of scores becomes its softmax over its first `keys` entries; the rest (keys after
   the query, under a causal mask) get weight 0. */
DEMO_WIDEST static void softmax_row(float *row, int64_t n, int64_t keys) {
    /* the maximum in 16 lanes, which both GCC and clang vectorise (clang does not vectorise a
       float max reduction without fast-math) */
    float lane[16], m = -INFINITY, sum = 0.0f;
    for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
    int64_t j0 = 0;
    for (; j0 + 16 <= keys; j0 += 16)
        for (int l = 0; l < 16; l++) lane[l] = row[j0 + l] > lane[l] ? row[j0 + l] : lane[l];
    for (int64_t j = j0; j < keys; j++) m = row[j] > m ? row[j] : m;
    for (int l = 0; l < 16; l++) m = lane[l] > m ? lane[l] : m;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < keys; j++) {
        row[j] = exp_nonpos(row[j] - m);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < keys; j++) row[j] *= inv;
    for (int64_t j = keys; j < n; j++) row[j] = 0.0f;
}

/* Row r of the (batch, head) planes of n x n scores: the threads split the rows. */
static void softmax_rows(float *s, int64_t rows, int64_t n, int causal) {
#pragma omp parallel for num_threads(g_threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) softmax_row(s + r * n, n, causal ? r % n + 1 : n);
}

/* An fp32 view of a BSHD tensor: the tensor itself for f32, else a widened copy (owned). */
static float *as_f32(const void *x, fa_dtype dt, size_t elems, int *owned) {
    *owned = dt != FA_DTYPE_F32;
    if (!*owned) return (float *)x;
    float *w = tool_alloc(elems * sizeof(float));
    if (w)
        for (size_t i = 0; i < elems; i++) w[i] = (float)tool_load(x, dt, i);
    return w;
}

fa_status demo_naive_fwd(const void *q, const void *k, const void *v, void *o, fa_dtype dt,
                         int64_t batch, int64_t n, int64_t heads, int64_t d, int causal) {
    size_t elems = (size_t)(batch * n * heads * d);
    int own_q, own_k, own_v, own_o;
    float *q32 = as_f32(q, dt, elems, &own_q), *k32 = as_f32(k, dt, elems, &own_k);
    float *v32 = as_f32(v, dt, elems, &own_v);
    float *o32 = dt == FA_DTYPE_F32 ? (float *)o : tool_alloc(elems * sizeof(float));
    own_o = dt != FA_DTYPE_F32;
    size_t pairs = (size_t)(batch * heads), plane = (size_t)(n * n);
    float *s = tool_alloc(pairs * plane * sizeof(float));
#ifdef FA_DEMO_CBLAS
    float *kt = NULL;
    int kt_ok = 1;
#else
    float *kt = tool_alloc((size_t)(n * d) * sizeof(float));
    int kt_ok = kt != NULL;
#endif
    fa_status st = FA_ERR_OUT_OF_MEMORY;
    if (q32 && k32 && v32 && o32 && s && kt_ok) {
        const int64_t ld = heads * d; /* BSHD: consecutive tokens of one head are H*d apart */
        const float scale = 1.0f / sqrtf((float)d);
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < heads; h++) {
                size_t off = (size_t)((b * n * heads + h) * d);
                scores(q32 + off, k32 + off, ld, n, d, scale, s + (size_t)(b * heads + h) * plane,
                       kt);
            }
        softmax_rows(s, (int64_t)pairs * n, n, causal);
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < heads; h++) {
                size_t off = (size_t)((b * n * heads + h) * d);
                apply(s + (size_t)(b * heads + h) * plane, v32 + off, ld, n, d, o32 + off);
            }
        if (own_o)
            for (size_t i = 0; i < elems; i++) tool_store(o, dt, i, o32[i]);
        st = FA_OK;
    }
    free(s);
    free(kt);
    if (own_q) free(q32);
    if (own_k) free(k32);
    if (own_v) free(v32);
    if (own_o) free(o32);
    return st;
}
