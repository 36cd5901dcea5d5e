/*
 * tk_sweep.c — the standard case lists run by tests/test_fwd, tests/test_bwd and
 * `flashattn check`.
 *
 * Not a cartesian product: a covering design in which every value of every axis appears a few
 * times, each time with different partners —
 *   seqlens 1, 17, 113, 1023 and sq != sk both ways (sq > sk with causal or a right window
 *   leaves rows that see no key); head dims 8, 40, 64, 96, 128, 256; heads_q/heads_kv ratios
 *   1, 4, 8 and MQA; no mask, causal, two-sided, left-only, right-only and diagonal-only
 *   windows; softcap; ALiBi per head and per batch row; varlen with empty query and empty key
 *   sequences; non-contiguous strides; f32, f16, bf16; a few non-default scales (peaked
 *   softmax stresses the online rescaling); and a few shapes the sm90 forward takes.
 * The references materialise sq x sk scores in scalar double code, so 1023 x 1023 appears
 * only twice and d 256 only with short sequences: the whole C suite must stay within about
 * two minutes on two cores, also under ASan + UBSan.
 */
#include "testkit.h"
#include "tk_shapes.h"

static const tk_case fwd_cases[] = {
    {SHAPE("single", 1, 1, 1, 1, 1, 8, F32)},
    {SHAPE("decode-mqa", 2, 1, 113, 8, 1, 64, F16)},
    {SHAPE("decode-long", 1, 1, 1023, 4, 1, 128, BF16), .causal = 1},
    {SHAPE("causal-small", 2, 17, 17, 4, 4, 40, F32), .causal = 1},
    {SHAPE("window-both", 1, 17, 113, 8, 2, 96, BF16), WIN(32, 8)},
    {SHAPE("causal-sq>sk", 3, 113, 17, 2, 2, 64, F16), .causal = 1},
    {SHAPE("alibi-mqa8", 1, 113, 113, 8, 1, 256, F32), .alibi = TK_ALIBI_HEAD},
    {SHAPE("softcap-strided", 2, 113, 113, 4, 1, 8, BF16), .softcap = 1.5f, .strided = 1},
    {SHAPE("big-causal", 1, 1023, 1023, 2, 1, 64, F32), .causal = 1, .strided = 1},
    {SHAPE("big-alibi", 1, 1023, 1023, 1, 1, 40, F16), .alibi = TK_ALIBI_BATCH},
    {SHAPE("causal-sq<sk", 2, 17, 1023, 8, 2, 64, F16), .causal = 1, .alibi = TK_ALIBI_HEAD},
    {SHAPE("right-only-sq>sk", 1, 1023, 17, 2, 2, 128, F32), WIN(-1, 4)},
    {SHAPE("left-only", 2, 113, 113, 4, 2, 40, F32), WIN(16, -1), .strided = 1},
    {SHAPE("right-only", 1, 113, 113, 2, 2, 96, F16), WIN(-1, 5)},
    {SHAPE("peaked-gqa8", 1, 17, 17, 16, 2, 64, F32), .scale = 1.0f},
    {SHAPE("sk1", 2, 113, 1, 4, 4, 64, BF16)},
    {SHAPE("sk1-causal", 1, 17, 1, 2, 1, 8, F32), .causal = 1},
    {SHAPE("d256-softcap", 1, 17, 113, 4, 4, 256, F16), .softcap = 2.0f, .causal = 1},
    {SHAPE("d256-alibi-batch", 2, 113, 17, 2, 1, 256, BF16), .alibi = TK_ALIBI_BATCH,
     WIN(8, 8), .strided = 1},
    {SHAPE("d256-decode", 1, 1, 17, 8, 8, 256, F32)},
    {VARLEN("varlen-empty", 3, 4, 2, 64, F32), .lens_q = {17, 0, 5}, .lens_k = {23, 9, 0},
     .causal = 1},
    {VARLEN("varlen-alibi", 4, 8, 1, 40, F16), .lens_q = {1, 113, 0, 17},
     .lens_k = {113, 50, 3, 0}, .alibi = TK_ALIBI_HEAD, .strided = 1},
    {VARLEN("varlen-window", 2, 2, 2, 128, BF16), .lens_q = {33, 7}, .lens_k = {7, 33},
     WIN(4, 4), .softcap = 3.0f},
    {VARLEN("varlen-right", 3, 8, 8, 96, F32), .lens_q = {0, 64, 1}, .lens_k = {5, 64, 100},
     .alibi = TK_ALIBI_BATCH, WIN(-1, 2)},
    {SHAPE("odd-heads", 3, 17, 113, 3, 3, 96, F32), .softcap = 0.7f, .scale = 0.5f},
    {SHAPE("window-long-k", 1, 113, 1023, 2, 1, 8, F16), WIN(64, 64)},
    {SHAPE("causal-alibi", 2, 113, 113, 8, 8, 128, BF16), .causal = 1, .alibi = TK_ALIBI_HEAD},
    {SHAPE("large-scores", 1, 17, 17, 4, 1, 40, BF16), .scale = 2.0f},
    {SHAPE("diagonal", 2, 17, 17, 2, 2, 128, F16), WIN(0, 0), .strided = 1},
    {SHAPE("left-softcap-alibi", 1, 113, 17, 6, 3, 8, F32), .alibi = TK_ALIBI_HEAD,
     .softcap = 2.0f, WIN(3, -1)},
    {SHAPE("d256-single", 1, 1, 1, 8, 2, 256, BF16), .causal = 1, .strided = 1},
    {SHAPE("decode-causal", 2, 1, 17, 2, 2, 96, F32), .causal = 1},
    {SHAPE("causal-long-q", 1, 1023, 113, 1, 1, 64, BF16), .causal = 1},
    {SHAPE("alibi-batch-causal", 4, 17, 17, 4, 4, 64, F32), .alibi = TK_ALIBI_BATCH,
     .causal = 1},
    {SHAPE("sliding-causal", 1, 113, 113, 4, 1, 128, F32), .causal = 1, WIN(20, -1),
     .strided = 1},
    /* shapes the sm90 forward takes (d 64/128/256, 16-bit, not varlen), with partial query
       blocks (128 rows) and key tiles (64 or 128 keys); the cases above with those head dims
       add windows, softcap and ALiBi */
    {SHAPE("d128-gqa-tiles", 2, 200, 300, 4, 2, 128, BF16)},
    {SHAPE("d128-causal-sq<sk", 1, 130, 257, 2, 1, 128, F16), .causal = 1, .strided = 1},
    {SHAPE("d128-causal-sq>sk", 2, 257, 100, 2, 2, 128, BF16), .causal = 1},
    {SHAPE("d64-causal-tiles", 2, 150, 333, 4, 4, 64, F16), .causal = 1},
    {SHAPE("d256-gqa-tiles", 1, 129, 130, 2, 1, 256, BF16)},
    /* peaked scores over several key tiles: the running max grows by more than the sm90
       forward's lazy-rescale threshold (2^8) between tiles, so O is rescaled mid-row */
    {SHAPE("d128-peaked-tiles", 1, 130, 700, 4, 2, 128, F16), .scale = 1.0f},
    {SHAPE("d64-peaked-causal", 2, 300, 300, 2, 2, 64, BF16), .scale = 1.0f, .causal = 1},
};

static const tk_case bwd_cases[] = {
    {SHAPE("single", 1, 1, 1, 1, 1, 8, F32), .bwd = 1},
    {SHAPE("mqa-causal", 2, 17, 17, 4, 1, 64, F32), .causal = 1, .bwd = 1},
    {SHAPE("window-both", 1, 17, 113, 8, 2, 40, F16), WIN(16, 4), .bwd = 1},
    {SHAPE("causal-sq>sk", 2, 113, 17, 2, 2, 96, BF16), .causal = 1, .bwd = 1},
    {SHAPE("softcap-strided", 1, 113, 113, 4, 4, 64, F32), .softcap = 1.5f, .strided = 1,
     .bwd = 1},
    {SHAPE("alibi-mqa8-causal", 1, 113, 113, 8, 1, 128, F16), .alibi = TK_ALIBI_HEAD,
     .causal = 1, .bwd = 1},
    {SHAPE("d256-alibi-batch", 2, 17, 17, 4, 2, 256, BF16), .alibi = TK_ALIBI_BATCH, .bwd = 1},
    {VARLEN("varlen-empty", 3, 4, 2, 64, F32), .lens_q = {17, 0, 9}, .lens_k = {20, 7, 0},
     .causal = 1, .bwd = 1},
    {VARLEN("varlen-softcap", 2, 2, 1, 96, BF16), .lens_q = {1, 40}, .lens_k = {40, 1},
     .softcap = 2.0f, .strided = 1, .bwd = 1},
    {SHAPE("decode", 1, 1, 113, 8, 8, 64, F16), .bwd = 1},
    {SHAPE("sk1", 1, 113, 1, 2, 1, 40, F32), .bwd = 1},
    {SHAPE("right-only", 1, 17, 17, 2, 2, 8, BF16), WIN(-1, 3), .strided = 1, .bwd = 1},
    {SHAPE("left-only", 1, 113, 113, 2, 2, 40, F16), WIN(8, -1), .bwd = 1},
    {SHAPE("big-causal", 1, 1023, 1023, 1, 1, 32, F32), .causal = 1, .bwd = 1},
    {SHAPE("alibi-window", 2, 113, 113, 4, 4, 96, F32), .alibi = TK_ALIBI_HEAD, WIN(32, 32),
     .bwd = 1},
    {SHAPE("causal-sq<sk", 1, 17, 1023, 4, 1, 64, BF16), .causal = 1, .bwd = 1},
    {SHAPE("softcap-scale-gqa", 3, 17, 17, 6, 2, 128, F32), .softcap = 0.8f, .scale = 0.4f,
     .strided = 1, .bwd = 1},
    {SHAPE("d256-causal-softcap", 1, 113, 17, 4, 4, 256, F16), .causal = 1, .softcap = 3.0f,
     .bwd = 1},
    {VARLEN("varlen-alibi-batch", 4, 8, 2, 40, F16), .lens_q = {5, 0, 33, 1},
     .lens_k = {0, 12, 33, 64}, .alibi = TK_ALIBI_BATCH, .bwd = 1},
    {SHAPE("d256-decode", 1, 1, 17, 4, 4, 256, F32), .strided = 1, .bwd = 1},
    {SHAPE("gqa8-diagonal", 1, 17, 17, 16, 2, 64, BF16), WIN(0, 0), .bwd = 1},
    /* shapes the sm90 backward takes (d 64/128/256, 16-bit): several key tiles (128) and query
       tiles (64 rows at d 128, 128 at d 64), partial ones, so that blocks loop over the
       Q/dO ring and the dS buffers; GQA (and a split group: MQA with few key tiles), masks,
       softcap, ALiBi, varlen */
    {SHAPE("d128-gqa-tiles", 2, 200, 300, 4, 2, 128, BF16), .bwd = 1},
    {SHAPE("d128-causal-sq<sk", 1, 130, 257, 2, 1, 128, F16), .causal = 1, .strided = 1,
     .bwd = 1},
    {SHAPE("d64-causal-sq>sk", 2, 300, 140, 2, 2, 64, BF16), .causal = 1, .bwd = 1},
    {SHAPE("d64-mqa-softcap-alibi", 1, 260, 200, 4, 1, 64, F16), .softcap = 2.0f,
     .alibi = TK_ALIBI_HEAD, .bwd = 1},
    {VARLEN("d128-varlen-window", 3, 4, 2, 128, BF16), .lens_q = {150, 0, 70},
     .lens_k = {200, 33, 130}, WIN(40, 10), .bwd = 1},
    {SHAPE("d128-peaked-causal", 1, 200, 200, 2, 2, 128, F16), .scale = 1.0f, .causal = 1,
     .bwd = 1},
    {SHAPE("d128-det-gqa", 2, 150, 200, 4, 2, 128, BF16), .causal = 1, .deterministic = 1,
     .bwd = 1},
    {SHAPE("d64-det-window", 1, 200, 300, 2, 2, 64, F16), WIN(50, 50), .deterministic = 1,
     .bwd = 1},
    /* d 256 on sm90: 64-key blocks, 64-row query tiles */
    {SHAPE("d256-gqa-causal-tiles", 2, 150, 140, 4, 2, 256, F16), .causal = 1, .bwd = 1},
    {VARLEN("d256-varlen-alibi", 2, 2, 1, 256, BF16), .lens_q = {100, 70}, .lens_k = {130, 60},
     .alibi = TK_ALIBI_HEAD, .bwd = 1},
    {SHAPE("d256-det-window", 1, 130, 200, 2, 1, 256, BF16), WIN(30, 20), .deterministic = 1,
     .strided = 1, .bwd = 1},
};

const tk_case *tk_fwd_cases(size_t *count) {
    *count = sizeof fwd_cases / sizeof *fwd_cases;
    return fwd_cases;
}

const tk_case *tk_bwd_cases(size_t *count) {
    *count = sizeof bwd_cases / sizeof *bwd_cases;
    return bwd_cases;
}
