/*
 * cpu/isa.h — runtime instruction-set dispatch of the CPU kernels.
 *
 * fwd_tiled.c, bwd_tiled.c, kvcache.c and isa_table.c are compiled once per level (CMake
 * object libraries fa_cpu_<level>, with -DFA_ISA=<level> and that level's -m flags), so each
 * kernel has one source and one copy per level; FA_ISA_FN gives every externally visible
 * function of such a file its level's suffix. backend.c, compiled once for the baseline,
 * picks a level's table at run time: the widest the CPU has, or the one FLASHATTN_CPU_ISA
 * names (an error when the CPU lacks it, never a silent downgrade).
 *
 * The amx level is the exception: it is the avx512 level plus kernels of its own (the bf16
 * and fp32 forward, fwd_amx.c, and the bf16 one-pass backward, bwd_amx.c, compiled alone with
 * the AMX flags), so its table names the avx512 table as its base and leaves NULL what it does
 * not own; fwd_takes and bwd_takes send the problems its kernels do not take to the base. The
 * backend resolves every call to the level whose kernel runs, and that level's name is the
 * one recorded.
 */
#ifndef FA_CPU_ISA_H
#define FA_CPU_ISA_H

#include "kvcache.h"

typedef enum fa_cpu_isa {
    FA_CPU_ISA_SCALAR = 0, /* portable C (GNU vector extensions, no -m flags) */
    FA_CPU_ISA_AVX2,       /* AVX2 + FMA + F16C */
    FA_CPU_ISA_AVX512,     /* AVX-512F (+ AVX2, FMA, F16C, which every AVX-512F CPU has) */
    FA_CPU_ISA_AMX,        /* avx512 plus AMX-BF16 forwards and bf16 backward (+ AVX512-BF16, BW) */
    FA_CPU_ISA_COUNT
} fa_cpu_isa;

/* One level's kernels. */
typedef struct fa_cpu_isa_ops {
    const char *name; /* "scalar", "avx2", "avx512", "amx": the FLASHATTN_CPU_ISA values */
    fa_cpu_tiles (*fwd_tiles)(const fa_problem *p);
    size_t (*fwd_ws)(const fa_problem *p, int threads);
    void (*fwd)(const fa_problem *p, void *ws, int threads);
    fa_cpu_tiles (*bwd_tiles)(const fa_problem *p);
    size_t (*bwd_ws)(const fa_problem *p, int threads);
    void (*bwd)(const fa_problem *p, void *ws, int threads);
    fa_cpu_kv_plan (*kv_plan)(const fa_problem *p, int threads);
    fa_cpu_tiles (*kv_tiles)(void);
    void (*kv)(const fa_problem *p, const fa_cpu_kv_plan *plan, void *ws);
    /* x[i] = exp(x[i]) with the kernels' vector exponential, fa_vexp; with the softmax's
       cheaper one for exponents <= 0, fa_vexp_softmax; and with the variant the kernels' softmax
       runs, fa_vexp_softmax_ftz (results under 2^-125 flushed to 0 on AVX-512)
       (tests/test_simd_exp.c) */
    void (*exp)(float *x, size_t n);
    void (*exp_softmax)(float *x, size_t n);
    void (*exp_softmax_ftz)(float *x, size_t n);
    /* NULL for a complete level. Otherwise the level below, whose kernels serve every op left
       NULL here and every forward that fwd_takes (when set) refuses. */
    const struct fa_cpu_isa_ops *base;
    int (*fwd_takes)(const fa_problem *p);
    /* The same for the backward, which also depends on the thread count (its schedule);
       threads 0 asks only whether the kernel covers problems of p's dtype and head dim. */
    int (*bwd_takes)(const fa_problem *p, int threads);
    /* How the forward computes where the level has more than one way for a dtype, a word the
       kernel's name carries after the level's (the amx level's fp32 forward: "bf16x6", six
       products of split bf16 parts each: cpu_fwd_amx_bf16x6_f32_64x256); NULL or returning
       NULL: nothing. */
    const char *(*fwd_method)(const fa_problem *p);
    const char *(*bwd_method)(const fa_problem *p); /* the same for the backward */
} fa_cpu_isa_ops;

/* The table of a level; NULL when this build lacks it (non-x86 builds have scalar only). */
const fa_cpu_isa_ops *fa_cpu_isa_table(fa_cpu_isa isa);
/* Whether this CPU can run a level. */
int fa_cpu_isa_supported(fa_cpu_isa isa);
/* The level the backend uses, chosen once per process; NULL with *why set when
   FLASHATTN_CPU_ISA names an unknown level or one this CPU or build lacks. */
const fa_cpu_isa_ops *fa_cpu_isa_active(const char **why);
/* The level of isa (itself or a base) whose kernel serves the forward of p, the backward, and
   the KV-cache forward. */
const fa_cpu_isa_ops *fa_cpu_isa_fwd_level(const fa_cpu_isa_ops *isa, const fa_problem *p);
const fa_cpu_isa_ops *fa_cpu_isa_bwd_level(const fa_cpu_isa_ops *isa, const fa_problem *p,
                                           int threads);
const fa_cpu_isa_ops *fa_cpu_isa_kv_level(const fa_cpu_isa_ops *isa);

/* fwd_amx_f32.c — the amx level's fp32 forward (fwd_amx.c's table dispatches to it). */
size_t fa_cpu_amx_f32_fwd_ws(const fa_problem *p, int threads);
void fa_cpu_amx_f32_fwd(const fa_problem *p, void *ws, int threads);

/* The switches of the context whose call runs on the calling thread (fa_context's cpu_f32_amx
   and cpu_bwd_schedule, read from the environment when it was created): every entry of the
   CPU backend sets them first, because the levels' `takes` tests see the problem, not the
   context. Whether the amx level's forward takes fp32 problems: 1 unless FLASHATTN_CPU_F32_AMX=0
   returns them to the avx512 level's FMA kernel. (The forced backward schedule: kernels.h.) */
int fa_cpu_f32_amx_enabled(void);

/* bwd_amx.c — the amx level's backward (bf16: the one-pass schedule only; fp32, by split
   products: every schedule, as one pass). */
int fa_cpu_amx_bwd_takes(const fa_problem *p, int threads);
fa_cpu_tiles fa_cpu_amx_bwd_tiles(const fa_problem *p);
size_t fa_cpu_amx_bwd_ws(const fa_problem *p, int threads);
void fa_cpu_amx_bwd(const fa_problem *p, void *ws, int threads);
const char *fa_cpu_amx_bwd_method(const fa_problem *p);

#endif /* FA_CPU_ISA_H */
