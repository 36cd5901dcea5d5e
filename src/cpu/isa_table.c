/*
 * cpu/isa_table.c — one instruction-set level's kernel table (compiled once per level with
 * the other kernel files; see isa.h), and its vector exponential for the tests.
 */
#include "isa.h"
#include "simd.h"

static void vexp_array(float *x, size_t n) {
    size_t i = 0;
    for (; i + FA_VW <= n; i += FA_VW) fa_vstore(x + i, fa_vexp(fa_vload(x + i)));
    if (i < n) fa_vexp_row(x + i, x + i, (int)(n - i), 1.0f, 0.0f);
}

static void vexp_softmax_array(float *x, size_t n) {
    size_t i = 0;
    for (; i + FA_VW <= n; i += FA_VW) fa_vstore(x + i, fa_vexp_softmax(fa_vload(x + i)));
    if (i < n) fa_vexp_softmax_row(x + i, x + i, (int)(n - i), 1.0f, 0.0f);
}

static void vexp_softmax_ftz_array(float *x, size_t n) {
    size_t i = 0;
    for (; i + FA_VW <= n; i += FA_VW) fa_vstore(x + i, fa_vexp_softmax_ftz(fa_vload(x + i)));
    if (i < n) fa_vexp_softmax_ftz_row(x + i, x + i, (int)(n - i), 1.0f, 0.0f);
}

const fa_cpu_isa_ops FA_ISA_FN(fa_cpu_isa_ops) = {
    .name = FA_ISA_NAME,
    .fwd_tiles = FA_ISA_FN(fa_cpu_fwd_tiled_tiles),
    .fwd_ws = FA_ISA_FN(fa_cpu_fwd_tiled_ws),
    .fwd = FA_ISA_FN(fa_cpu_fwd_tiled),
    .bwd_tiles = FA_ISA_FN(fa_cpu_bwd_tiled_tiles),
    .bwd_ws = FA_ISA_FN(fa_cpu_bwd_tiled_ws),
    .bwd = FA_ISA_FN(fa_cpu_bwd_tiled),
    .kv_plan = FA_ISA_FN(fa_cpu_kv_plan_of),
    .kv_tiles = FA_ISA_FN(fa_cpu_kv_tiles),
    .kv = FA_ISA_FN(fa_cpu_fwd_kvcache),
    .exp = vexp_array,
    .exp_softmax = vexp_softmax_array,
    .exp_softmax_ftz = vexp_softmax_ftz_array,
    /* complete: no base level, nothing refused */
};
