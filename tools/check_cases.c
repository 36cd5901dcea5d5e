/*
 * check_cases.c — what `flashattn check --full` adds to testkit's standard sweeps: the same
 * rule at the lengths users actually run, where tiling across many key blocks, long online
 * rescaling chains and multi-threaded splits get exercised. Sized so the float64 reference
 * (scalar, materialised scores) finishes in a minute or two on two cores.
 */
#include "check.h"

#define F32 FA_DTYPE_F32
#define F16 FA_DTYPE_F16
#define BF16 FA_DTYPE_BF16

static const tk_case large_cases[] = {
    {.name = "long-causal", .batch = 1, .sq = 2048, .sk = 2048, .hq = 2, .hkv = 1, .d = 64,
     .dtype = F32, .causal = 1},
    {.name = "long-d128", .batch = 1, .sq = 2048, .sk = 2048, .hq = 1, .hkv = 1, .d = 128,
     .dtype = BF16},
    {.name = "long-window", .batch = 1, .sq = 1500, .sk = 3000, .hq = 4, .hkv = 2, .d = 64,
     .dtype = F16, .window = 1, .wl = 256, .wr = 256, .strided = 1},
    {.name = "long-bwd-causal", .batch = 1, .sq = 1024, .sk = 2048, .hq = 2, .hkv = 1, .d = 64,
     .dtype = F32, .causal = 1, .bwd = 1},
    {.name = "long-bwd-bf16", .batch = 1, .sq = 1024, .sk = 1024, .hq = 2, .hkv = 1, .d = 128,
     .dtype = BF16, .softcap = 5.0f, .bwd = 1},
};

const tk_case *check_large_cases(size_t *count) {
    *count = sizeof large_cases / sizeof *large_cases;
    return large_cases;
}
