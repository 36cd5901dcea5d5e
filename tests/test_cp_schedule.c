/*
 * test_cp_schedule.c — the C schedule of context parallelism (src/cp_schedule.c) on the CPU:
 *  1. known answers: the calls python/flashattn/distributed/_schedule.py's blocks() gives for
 *     a few (seqlen, world, layout, causal) cases, hard-coded from running it (both rings must
 *     make the same calls);
 *  2. coverage: for every seqlen 0..40 and world 1..5, both layouts, causal or not, every
 *     (query position, key position) pair the global mask shows is computed exactly once over
 *     all sources, and no hidden pair at all (a causal block's local mask k <= q included);
 *  3. shard lengths: the layout's remainder rule, summing to seqlen;
 *  4. the public doors on a CPU context: NULL and bad-version arguments, and the refusal of a
 *     context that is not CUDA (FA_ERR_NO_BACKEND in a build without CUDA).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_schedule.h"
#include "flashattn.h"

static int failures;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
        }                                                                                     \
    } while (0)

typedef struct known {
    int64_t s;
    int n, layout, causal, rank, source, count;
    fa_cp_block b[2];
} known;

#define Z FA_CP_ZIGZAG
#define C FA_CP_CONTIGUOUS
/* From _schedule.blocks(S, n, rank, source, causal, layout) as (q0, q1, k0, k1, causal). */
static const known k_known[] = {
    {10, 2, Z, 1, 0, 0, 1, {{0, 5, 0, 5, 1}}},
    {10, 2, Z, 1, 0, 1, 1, {{3, 5, 0, 5, 0}}},
    {10, 2, Z, 1, 1, 0, 1, {{0, 5, 0, 3, 0}}},
    {10, 2, Z, 1, 1, 1, 1, {{0, 5, 0, 5, 1}}},
    {13, 3, Z, 1, 0, 0, 1, {{0, 5, 0, 5, 1}}},
    {13, 3, Z, 1, 0, 1, 1, {{3, 5, 0, 4, 0}}},
    {13, 3, Z, 1, 0, 2, 1, {{3, 5, 0, 4, 0}}},
    {13, 3, Z, 1, 1, 0, 1, {{0, 4, 0, 3, 0}}},
    {13, 3, Z, 1, 1, 1, 1, {{0, 4, 0, 4, 1}}},
    {13, 3, Z, 1, 1, 2, 1, {{2, 4, 0, 4, 0}}},
    {13, 3, Z, 1, 2, 0, 1, {{0, 4, 0, 3, 0}}},
    {13, 3, Z, 1, 2, 1, 1, {{0, 4, 0, 2, 0}}},
    {13, 3, Z, 1, 2, 2, 1, {{0, 4, 0, 4, 1}}},
    {7, 2, C, 1, 0, 0, 1, {{0, 4, 0, 4, 1}}},
    {7, 2, C, 1, 0, 1, 0, {{0}}},
    {7, 2, C, 1, 1, 0, 1, {{0, 3, 0, 4, 0}}},
    {7, 2, C, 1, 1, 1, 1, {{0, 3, 0, 3, 1}}},
    {13, 3, C, 0, 0, 1, 1, {{0, 5, 0, 4, 0}}},
    {13, 3, C, 0, 2, 0, 1, {{0, 4, 0, 5, 0}}},
    {13, 3, C, 0, 2, 2, 1, {{0, 4, 0, 4, 0}}},
    {3, 2, Z, 1, 0, 0, 1, {{0, 1, 0, 1, 1}}},
    {3, 2, Z, 1, 0, 1, 0, {{0}}},
    {3, 2, Z, 1, 1, 0, 1, {{0, 2, 0, 1, 0}}},
    {3, 2, Z, 1, 1, 1, 1, {{0, 2, 0, 2, 1}}},
    {9, 2, Z, 0, 0, 1, 1, {{0, 5, 0, 4, 0}}},
    {9, 2, Z, 0, 1, 0, 1, {{0, 4, 0, 5, 0}}},
};

static void test_known(void) {
    for (size_t i = 0; i < sizeof k_known / sizeof *k_known; i++) {
        const known *k = &k_known[i];
        fa_cp_block got[FA_CP_MAX_BLOCKS];
        const int n = fa_cp_blocks(k->s, k->n, k->rank, k->source, k->causal, k->layout, got);
        CHECK(n == k->count, "case %zu: %d calls, expected %d", i, n, k->count);
        for (int j = 0; j < n && j < k->count; j++)
            /* field by field: memcmp would read the struct's padding, which is not set */
            CHECK(got[j].q0 == k->b[j].q0 && got[j].q1 == k->b[j].q1 && got[j].k0 == k->b[j].k0 &&
                      got[j].k1 == k->b[j].k1 && got[j].causal == k->b[j].causal,
                  "case %zu call %d: (%lld %lld %lld %lld %d)", i, j, (long long)got[j].q0,
                  (long long)got[j].q1, (long long)got[j].k0, (long long)got[j].k1,
                  got[j].causal);
    }
}

/* Global position of local row t of a rank's shard. */
static int64_t global_pos(const fa_cp_span *sp, int nsp, int64_t t) {
    for (int i = 0; i < nsp; i++)
        if (t >= sp[i].local && t < sp[i].local + sp[i].len) return sp[i].start + t - sp[i].local;
    return -1;
}

static void test_coverage(void) {
    unsigned char *seen = malloc(41 * 41);
    for (int layout = 0; layout <= 1; layout++)
        for (int causal = 0; causal <= 1; causal++)
            for (int world = 1; world <= 5; world++)
                for (int64_t s = 0; s <= 40; s++) {
                    memset(seen, 0, 41 * 41);
                    int64_t total = 0, lo = s, hi = 0;
                    for (int r = 0; r < world; r++) {
                        fa_cp_span qs[2];
                        const int nq = fa_cp_spans(s, world, r, layout, qs);
                        const int64_t len = fa_cp_shard_len(s, world, r, layout);
                        total += len;
                        lo = len < lo ? len : lo;
                        hi = len > hi ? len : hi;
                        for (int src = 0; src < world; src++) {
                            fa_cp_span ks[2];
                            const int nk = fa_cp_spans(s, world, src, layout, ks);
                            fa_cp_block b[FA_CP_MAX_BLOCKS];
                            const int n = fa_cp_blocks(s, world, r, src, causal, layout, b);
                            CHECK(n >= 0 && n <= FA_CP_MAX_BLOCKS, "block count %d", n);
                            for (int i = 0; i < n; i++)
                                for (int64_t t = b[i].q0; t < b[i].q1; t++)
                                    for (int64_t u = b[i].k0; u < b[i].k1; u++) {
                                        if (b[i].causal && u > t) continue; /* local mask */
                                        const int64_t pq = global_pos(qs, nq, t);
                                        const int64_t pk = global_pos(ks, nk, u);
                                        CHECK(pq >= 0 && pk >= 0, "row outside the shard");
                                        if (pq < 0 || pk < 0) continue;
                                        CHECK(!causal || pk <= pq,
                                              "S %lld n %d rank %d src %d: hidden pair q %lld k "
                                              "%lld computed",
                                              (long long)s, world, r, src, (long long)pq,
                                              (long long)pk);
                                        seen[pq * 41 + pk]++;
                                    }
                        }
                    }
                    CHECK(total == s, "shards sum to %lld, not %lld", (long long)total,
                          (long long)s);
                    CHECK(hi - lo <= (layout == FA_CP_ZIGZAG ? 2 : 1), "shards %lld..%lld",
                          (long long)lo, (long long)hi);
                    for (int64_t pq = 0; pq < s; pq++)
                        for (int64_t pk = 0; pk < s; pk++) {
                            const int want = !causal || pk <= pq;
                            if (seen[pq * 41 + pk] != want) {
                                CHECK(0, "S %lld n %d layout %d causal %d: pair (%lld, %lld) "
                                         "computed %d times",
                                      (long long)s, world, layout, causal, (long long)pq,
                                      (long long)pk, seen[pq * 41 + pk]);
                                pq = s; /* one message per configuration */
                                break;
                            }
                        }
                }
    free(seen);
}

static void test_lengths(void) {
    /* 13 over 2n = 6 zigzag chunks: 3 2 2 2 2 2; rank 0 holds chunks 0 and 5 */
    CHECK(fa_cp_shard_len(13, 3, 0, FA_CP_ZIGZAG) == 5, "zigzag 13/3 rank 0");
    CHECK(fa_cp_shard_len(13, 3, 2, FA_CP_ZIGZAG) == 4, "zigzag 13/3 rank 2");
    CHECK(fa_cp_shard_len(7, 2, 1, FA_CP_CONTIGUOUS) == 3, "contiguous 7/2 rank 1");
    CHECK(fa_cp_shard_len(1, 2, 1, FA_CP_ZIGZAG) == 0, "an empty shard");
    CHECK(fa_cp_shard_len(8, 2, 2, FA_CP_ZIGZAG) == -1, "rank past the world");
    CHECK(fa_cp_shard_len(8, 2, 0, 7) == -1, "unknown layout");
    CHECK(fa_cp_shard_len(-1, 2, 0, FA_CP_ZIGZAG) == -1, "negative seqlen");
}

/* The public doors on the CPU: what they refuse before any NCCL or GPU is involved. */
static void test_doors(void) {
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, FA_BACKEND_CPU) != FA_OK) {
        CHECK(0, "cannot create a CPU context");
        return;
    }
    CHECK(fa_cp_fwd(NULL, NULL, NULL) == FA_ERR_NULL_POINTER, "ctx NULL");
    CHECK(fa_cp_fwd(ctx, NULL, NULL) == FA_ERR_NULL_POINTER, "args NULL");
    fa_cp_args a = fa_cp_args_default();
    a.version = 0;
    CHECK(fa_cp_bwd(ctx, NULL, &a) == FA_ERR_INVALID_ARGUMENT, "version 0");
    a = fa_cp_args_default();
    a.struct_size -= 8;
    CHECK(fa_cp_fwd(ctx, NULL, &a) == FA_ERR_INVALID_ARGUMENT, "short struct");
    a = fa_cp_args_default();
    /* CUDA builds: a CPU context is not served; CPU builds: no backend at all */
    const fa_status want = fa_has_cuda() ? FA_ERR_UNSUPPORTED : FA_ERR_NO_BACKEND;
    const fa_status got = fa_cp_fwd(ctx, NULL, &a);
    CHECK(got == want, "a CPU context: %s (%s), expected %s", fa_status_string(got),
          fa_last_error(ctx), fa_status_string(want));
    CHECK(strstr(fa_last_error(ctx), "fa_cp_fwd") != NULL, "message names the call: %s",
          fa_last_error(ctx));
    /* the workspace queries: the same doors, and bytes untouched on refusal */
    size_t bytes = 12345;
    CHECK(fa_cp_fwd_workspace_size(NULL, NULL, &a, &bytes) == FA_ERR_NULL_POINTER, "query ctx");
    CHECK(fa_cp_bwd_workspace_size(ctx, NULL, &a, NULL) == FA_ERR_NULL_POINTER, "bytes NULL");
    CHECK(strstr(fa_last_error(ctx), "bytes") != NULL, "names bytes: %s", fa_last_error(ctx));
    const fa_status gq = fa_cp_bwd_workspace_size(ctx, NULL, &a, &bytes);
    CHECK(gq == want && bytes == 12345, "query on a CPU context: %s (%s), bytes %zu",
          fa_status_string(gq), fa_last_error(ctx), bytes);
    CHECK(strstr(fa_last_error(ctx), "fa_cp_bwd_workspace_size") != NULL,
          "query message names the call: %s", fa_last_error(ctx));
    fa_context_destroy(ctx);
}

int main(void) {
    test_doors();
    test_known();
    test_coverage();
    test_lengths();
    if (failures) {
        fprintf(stderr, "test_cp_schedule: %d failures\n", failures);
        return 1;
    }
    printf("test_cp_schedule: all passed\n");
    return 0;
}
