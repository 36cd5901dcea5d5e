/*
 * kvtest.h — runs fa_fwd_kvcache cases under the correctness rule (tests/test_kvcache.c).
 *
 * A case is one set of logical data (queries, each sequence's cached keys/values and the
 * rows appended by the call) and a list of variants that lay the same data out differently:
 * contiguous or paged caches (pages in shuffled pool order), forced or automatic split
 * counts, thread counts. The float64 reference and the precision-P baseline are plain
 * fa_fwd calls (FA_ALGO_NAIVE on f64 copies, FA_ALGO_PLAIN) on the same keys gathered into
 * varlen K/V, so the cache code under test is not part of the reference.
 */
#ifndef FA_TESTS_KVTEST_H
#define FA_TESTS_KVTEST_H

#include "testkit.h"

#define KV_MAX_VARIANTS 8

typedef struct kv_variant {
    int page;    /* 0: contiguous cache; else the page size of a paged one */
    int splits;  /* num_splits argument (0: the library chooses) */
    int threads; /* context threads (0: default) */
} kv_variant;

typedef struct kv_case {
    const char *name;
    int batch, sq, hq, hkv, d;
    fa_dtype dtype;
    int32_t lens[TK_MAX_BATCH]; /* tokens already cached per sequence */
    int snew;                   /* rows appended by the call (0: no k_new/v_new) */
    int room;                   /* capacity beyond the longest total (0: the call fills it) */
    float scale;
    int causal, window;
    int64_t wl, wr;
    float softcap;
    int alibi;                  /* TK_ALIBI_* */
    int strided;                /* non-contiguous q, out, lse, cache, k_new, v_new */
    int one_context;            /* every variant on one context, each meeting the workspace
                                   the ones before left (the CUDA decode's split counters) */
    int rot_dim;                /* fused rotary over this many columns (0: off; needs snew) */
    int rot_interleaved;        /* GPT-J pairs (2c, 2c + 1), else GPT-NeoX halves */
    int rot_f32;                /* cos/sin tables in f32, else in the data's dtype */
    int leftpad;                /* cache_leftpad given: lpad[] */
    int32_t lpad[TK_MAX_BATCH]; /* first cache row each sequence attends to */
    int nvar;
    kv_variant var[KV_MAX_VARIANTS];
} kv_case;

/* One line describing a case. */
void kv_case_format(const kv_case *c, char *buf, size_t len);

/* Runs every variant of c on the backend (f32 becomes bf16 on CUDA, whose kernels take
   16-bit types) and checks each against the reference: O and LSE under the 2x rule, outputs
   fully written, rows without keys exactly 0 / -inf, the cache changed exactly in the
   appended rows, the selection record (kernel name, split count); on the CPU, variants that
   differ only in the cache layout must agree bit for bit. Returns TK_PASS, TK_FAIL or
   TK_SKIP (no device, or a head dim the CUDA backend does not take), with r->msg. */
int kv_run_case(const kv_case *c, fa_backend backend, uint64_t seed, int verbose,
                tk_report *r);

#endif
