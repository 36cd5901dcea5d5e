/*
 * cpu/backend.c — the CPU backend's table: picks the kernel for a validated problem, records
 * the choice, sizes the workspace, runs. Also the CPU facts `flashattn info` shows.
 */
#define _DEFAULT_SOURCE /* syscall(), for the AMX permission request */
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "isa.h"
#include "team.h"

int fa_cpu_threads(const fa_context *ctx) {
    if (ctx->threads > 0) return ctx->threads;
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
#endif
}

/* The FLOPs of a call, for fa_cpu_team: 4 B H sq sk d for the forward (every key counted,
   masked or not: an upper bound is enough to tell small from large; varlen: the longest
   sequences), 2.5 times that for the backward; a KV-cache call counts each sequence's keys. */
static double fwd_flops(const fa_problem *p) {
    return 4.0 * (double)p->batch * (double)p->heads_q * (double)p->seqlen_q *
           (double)p->seqlen_k * (double)p->d;
}

static double kv_flops(const fa_problem *p) {
    double keys = 0;
    for (int64_t b = 0; b < p->batch; b++) keys += (double)fa_kv_len(p, b);
    return 4.0 * (double)p->heads_q * (double)p->seqlen_q * keys * (double)p->d;
}

/* The threads of a forward or backward call (bwd: 1): the context's, or 1 when it is small. */
static int call_threads(const fa_context *ctx, const fa_problem *p, int bwd) {
    return fa_cpu_team(fa_cpu_threads(ctx), fwd_flops(p) * (bwd ? 2.5 : 1.0));
}

/* The naive references exist in two precisions (see fa_algo). */
static const char *naive_name(char *buf, size_t len, const char *op, const fa_problem *p,
                              int plain) {
    const char *drop = p->drop_p > 0 ? "_dropout" : "";
    if (plain)
        snprintf(buf, len, "cpu_%s_plain_%s%s", op, fa_dtype_name(p->dtype), drop);
    else
        snprintf(buf, len, "cpu_%s_naive_f64%s", op, drop);
    return buf;
}

static void record(fa_context *ctx, const char *op, const char *kernel, fa_cpu_tiles t,
                   int threads, size_t ws) {
    fa_select(ctx, "cpu", op, kernel);
    ctx->sel.tile_q = t.tile_q;
    ctx->sel.tile_k = t.tile_k;
    ctx->sel.threads = threads;
    ctx->sel.workspace_bytes = ws;
}

static fa_status naive_failed(fa_context *ctx, const char *op, const fa_problem *p) {
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                   "fa_%s: the naive reference cannot allocate its %lld x %lld x %lld x %lld "
                   "score matrix",
                   op, (long long)p->batch, (long long)p->heads_q, (long long)p->seqlen_q,
                   (long long)p->seqlen_k);
}

/* ---- instruction-set levels (isa.h) ---- */

extern const fa_cpu_isa_ops fa_cpu_isa_ops_scalar;
#ifdef FA_CPU_X86_ISAS
extern const fa_cpu_isa_ops fa_cpu_isa_ops_avx2, fa_cpu_isa_ops_avx512;
#endif
#ifdef FA_CPU_AMX
extern const fa_cpu_isa_ops fa_cpu_isa_ops_amx;
#endif

/* The FLASHATTN_CPU_ISA values, by level. */
static const char *const isa_names[] = {"scalar", "avx2", "avx512", "amx"};
_Static_assert(sizeof isa_names / sizeof isa_names[0] == FA_CPU_ISA_COUNT, "a name per level");

const fa_cpu_isa_ops *fa_cpu_isa_table(fa_cpu_isa isa) {
    switch (isa) {
    case FA_CPU_ISA_SCALAR: return &fa_cpu_isa_ops_scalar;
#ifdef FA_CPU_X86_ISAS
    case FA_CPU_ISA_AVX2: return &fa_cpu_isa_ops_avx2;
    case FA_CPU_ISA_AVX512: return &fa_cpu_isa_ops_avx512;
#endif
#ifdef FA_CPU_AMX
    case FA_CPU_ISA_AMX: return &fa_cpu_isa_ops_amx;
#endif
    default: return NULL;
    }
}

static char g_amx_why[96]; /* why the amx level is unusable on this machine */

#if defined(FA_CPU_X86_ISAS) && (defined(__x86_64__) || defined(__i386__))
/* CPUID leaf 7: AMX-TILE (EDX bit 24), AMX-BF16 (EDX bit 22), AVX512BW (EBX bit 30); subleaf
   1: AVX512-BF16 (EAX bit 5). The amx level's file is compiled with -mavx512bf16, which
   implies AVX512BW, so that is required too. */
static int amx_cpuid(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1, bw = (b >> 30) & 1;
    if (a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return tile && bf16 && bw && ((a >> 5) & 1);
}

static int g_amx_ok;

/* AMX tile data is off by default for Linux processes: the kernel enables it on request
   (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), once for the whole process. A refusal (an
   older kernel, a sandbox) makes the level unsupported. */
static void amx_probe(void) {
    if (!amx_cpuid()) {
        snprintf(g_amx_why, sizeof g_amx_why, "no AMX-TILE, AMX-BF16, AVX512-BF16 or AVX512BW");
        return;
    }
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        g_amx_ok = 1;
    else
        snprintf(g_amx_why, sizeof g_amx_why, "the OS refused AMX tile data (arch_prctl)");
#else
    snprintf(g_amx_why, sizeof g_amx_why, "AMX is enabled on Linux only");
#endif
}

static int amx_usable(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_probe);
    return g_amx_ok;
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
}
#endif

int fa_cpu_isa_supported(fa_cpu_isa isa) {
    if (isa == FA_CPU_ISA_SCALAR) return 1;
#if defined(FA_CPU_X86_ISAS) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    /* the levels' -m flags (CMakeLists.txt): AVX-512F also compiles with AVX2, FMA, F16C */
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     has_f16c();
    if (isa == FA_CPU_ISA_AVX2) return avx2;
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f");
    if (isa == FA_CPU_ISA_AVX512) return avx512;
    if (isa == FA_CPU_ISA_AMX) return avx512 && amx_usable();
#endif
    return 0;
}

static const fa_cpu_isa_ops *g_isa;
static char g_isa_why[256];

static void choose_isa(void) {
    const char *want = getenv("FLASHATTN_CPU_ISA");
    if (want && *want) {
        for (int i = 0; i < FA_CPU_ISA_COUNT; i++) {
            const fa_cpu_isa_ops *t = fa_cpu_isa_table((fa_cpu_isa)i);
            if (strcmp(want, isa_names[i]) != 0) continue;
            if (!t)
                snprintf(g_isa_why, sizeof g_isa_why,
                         "FLASHATTN_CPU_ISA=%s: this build has no %s kernels", want, want);
            else if (!fa_cpu_isa_supported((fa_cpu_isa)i) && g_amx_why[0] &&
                     i == FA_CPU_ISA_AMX)
                snprintf(g_isa_why, sizeof g_isa_why, "FLASHATTN_CPU_ISA=%s: %s (it has: %s)",
                         want, g_amx_why, fa_cpu_features());
            else if (!fa_cpu_isa_supported((fa_cpu_isa)i))
                snprintf(g_isa_why, sizeof g_isa_why,
                         "FLASHATTN_CPU_ISA=%s: this CPU lacks it (it has: %s)", want,
                         fa_cpu_features());
            else
                g_isa = t;
            return;
        }
        snprintf(g_isa_why, sizeof g_isa_why,
                 "FLASHATTN_CPU_ISA=%.60s: unknown level (scalar, avx2, avx512 or amx)", want);
        return;
    }
    for (int i = FA_CPU_ISA_COUNT - 1; i >= 0 && !g_isa; i--)
        if (fa_cpu_isa_table((fa_cpu_isa)i) && fa_cpu_isa_supported((fa_cpu_isa)i))
            g_isa = fa_cpu_isa_table((fa_cpu_isa)i);
}

const fa_cpu_isa_ops *fa_cpu_isa_active(const char **why) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, choose_isa);
    if (why) *why = g_isa ? NULL : g_isa_why;
    return g_isa;
}

const fa_cpu_isa_ops *fa_cpu_isa_fwd_level(const fa_cpu_isa_ops *isa, const fa_problem *p) {
    while (isa->base && (!isa->fwd || (isa->fwd_takes && !isa->fwd_takes(p)))) isa = isa->base;
    return isa;
}

const fa_cpu_isa_ops *fa_cpu_isa_bwd_level(const fa_cpu_isa_ops *isa, const fa_problem *p,
                                           int threads) {
    while (isa->base && (!isa->bwd || (isa->bwd_takes && !isa->bwd_takes(p, threads))))
        isa = isa->base;
    return isa;
}

const fa_cpu_isa_ops *fa_cpu_isa_kv_level(const fa_cpu_isa_ops *isa) {
    while (isa->base && !isa->kv) isa = isa->base;
    return isa;
}

static _Thread_local struct {
    int f32_amx, bwd_schedule;
    double small_flops;
} tl_switches = {1, 0, FA_CPU_SMALL_FLOPS};

/* The calling context's switches for the levels' tests and the schedule (isa.h). */
static void use_switches(const fa_context *ctx) {
    tl_switches.f32_amx = ctx->cpu_f32_amx;
    tl_switches.bwd_schedule = ctx->cpu_bwd_schedule;
    tl_switches.small_flops = ctx->cpu_small_flops;
}

int fa_cpu_f32_amx_enabled(void) { return tl_switches.f32_amx; }
int fa_cpu_bwd_schedule_forced(void) { return tl_switches.bwd_schedule; }
double fa_cpu_small_flops(void) { return tl_switches.small_flops; }

/* Reads the CPU switches once per context. */
static fa_status cpu_ctx_init(fa_context *ctx) {
    const char *amx = getenv("FLASHATTN_CPU_F32_AMX");
    ctx->cpu_f32_amx = !(amx && strcmp(amx, "0") == 0);
    const char *sched = getenv("FLASHATTN_CPU_BWD_SCHEDULE");
    ctx->cpu_bwd_schedule = !sched                         ? 0
                            : strcmp(sched, "one-pass") == 0 ? 1
                            : strcmp(sched, "two-pass") == 0 ? 2
                                                             : 0;
    /* a number >= 0 (0: every call gets the team); anything else refuses the context, so a
       mistyped value cannot silently leave the default in place */
    ctx->cpu_small_flops = FA_CPU_SMALL_FLOPS;
    const char *small = getenv("FLASHATTN_CPU_SMALL_FLOPS");
    if (small && *small) {
        char *end;
        const double v = strtod(small, &end);
        if (*end || !(v >= 0) || v > 1e30)
            return fa_fail(NULL, FA_ERR_INVALID_ARGUMENT,
                           "fa_context_create: FLASHATTN_CPU_SMALL_FLOPS=%.40s is not a number "
                           "of FLOPs >= 0",
                           small);
        ctx->cpu_small_flops = v;
    }
    return FA_OK;
}

/* The level for a call, or the failure that FLASHATTN_CPU_ISA asked for an impossible one. */
static fa_status isa_for(fa_context *ctx, const char *fn, const fa_cpu_isa_ops **isa) {
    const char *why;
    *isa = fa_cpu_isa_active(&why);
    if (*isa) return FA_OK;
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: %s", fn, why);
}

static fa_status cpu_fwd_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    use_switches(ctx);
    const fa_cpu_isa_ops *isa;
    *bytes = 0;
    if (ctx->algo != FA_ALGO_AUTO) return FA_OK;
    fa_status st = isa_for(ctx, "fa_fwd", &isa);
    if (st == FA_OK) *bytes = fa_cpu_isa_fwd_level(isa, p)->fwd_ws(p, call_threads(ctx, p, 0));
    return st;
}

static fa_status cpu_bwd_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    use_switches(ctx);
    const fa_cpu_isa_ops *isa;
    *bytes = 0;
    if (ctx->algo != FA_ALGO_AUTO) return FA_OK;
    fa_status st = isa_for(ctx, "fa_bwd", &isa);
    const int threads = call_threads(ctx, p, 1);
    if (st == FA_OK) *bytes = fa_cpu_isa_bwd_level(isa, p, threads)->bwd_ws(p, threads);
    return st;
}


/* The level's name in a kernel's, with the method where the level names one (bwd: the
   backward's). */
static const char *level_name(char *buf, size_t len, const fa_cpu_isa_ops *isa,
                              const fa_problem *p, int bwd) {
    const char *(*method)(const fa_problem *) = bwd ? isa->bwd_method : isa->fwd_method;
    const char *m = method ? method(p) : NULL;
    snprintf(buf, len, "%s%s%s", isa->name, m ? "_" : "", m ? m : "");
    return buf;
}

/* cpu_<op>_<level>[_<method>]_<dtype>[_dropout]_<tile_q>x<tile_k>, e.g.
   cpu_fwd_avx512_f32_64x64, cpu_bwd_avx512_bf16_dropout_64x64 */
static const char *tiled_name(char *buf, size_t len, const char *op, const char *level,
                              const fa_problem *p, fa_cpu_tiles t) {
    snprintf(buf, len, "cpu_%s_%s_%s%s_%dx%d", op, level, fa_dtype_name(p->dtype),
             p->drop_p > 0 ? "_dropout" : "", t.tile_q, t.tile_k);
    return buf;
}

/* The reason of a level that handed dropout down (the amx kernels have none). */
static void dropout_reason(fa_context *ctx, const fa_problem *p, const fa_cpu_isa_ops *active,
                           const fa_cpu_isa_ops *isa, const char *op) {
    if (p->drop_p > 0 && active != isa)
        snprintf(ctx->sel.reason, sizeof ctx->sel.reason,
                 "dropout: the %s %s has none, the %s one ran", active->name, op, isa->name);
}

static fa_status cpu_fwd(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes) {
    use_switches(ctx);
    int threads = call_threads(ctx, p, 0);
    char name[64];
    if (ctx->algo != FA_ALGO_AUTO) {
        int plain = ctx->algo == FA_ALGO_PLAIN;
        size_t used = 0;
        if (fa_cpu_fwd_naive(p, plain, threads, &used) != FA_OK)
            return naive_failed(ctx, "fwd", p);
        fa_cpu_tiles none = {0, 0};
        record(ctx, "fwd", naive_name(name, sizeof name, "fwd", p, plain), none, threads, used);
        return FA_OK;
    }
    (void)ws_bytes;
    const fa_cpu_isa_ops *isa;
    fa_status st = isa_for(ctx, "fa_fwd", &isa);
    if (st != FA_OK) return st;
    const fa_cpu_isa_ops *active = isa;
    isa = fa_cpu_isa_fwd_level(isa, p);
    isa->fwd(p, ws, threads);
    const fa_cpu_tiles t = isa->fwd_tiles(p);
    char level[32];
    record(ctx, "fwd",
           tiled_name(name, sizeof name, "fwd", level_name(level, sizeof level, isa, p, 0),
                      p, t),
           t, threads, isa->fwd_ws(p, threads));
    /* FP8 runs where a level's own forward does not take it (AMX: bf16/fp32 tiles only) */
    if (active != isa && fa_dtype_is_fp8(p->dtype))
        snprintf(ctx->sel.reason, sizeof ctx->sel.reason,
                 "the %s level has no %s forward: the %s tiled kernel converts FP8 to fp32 in "
                 "its tile loads", active->name, fa_dtype_name(p->dtype), isa->name);
    /* the one forward a level hands down on request, not for want of a kernel: say so */
    if (active != isa && active->fwd_method && p->dtype == FA_DTYPE_F32 &&
        !fa_cpu_f32_amx_enabled())
        snprintf(ctx->sel.reason, sizeof ctx->sel.reason,
                 "FLASHATTN_CPU_F32_AMX=0: the %s fp32 %s (FMA) instead of the %s one",
                 isa->name, "forward", active->name);
    dropout_reason(ctx, p, active, isa, "forward");
    return FA_OK;
}

static fa_status cpu_bwd(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes) {
    use_switches(ctx);
    int threads = call_threads(ctx, p, 1);
    char name[64];
    if (ctx->algo != FA_ALGO_AUTO) {
        int plain = ctx->algo == FA_ALGO_PLAIN;
        size_t used = 0;
        if (fa_cpu_bwd_naive(p, plain, threads, &used) != FA_OK)
            return naive_failed(ctx, "bwd", p);
        fa_cpu_tiles none = {0, 0};
        record(ctx, "bwd", naive_name(name, sizeof name, "bwd", p, plain), none, threads, used);
        return FA_OK;
    }
    (void)ws_bytes;
    const fa_cpu_isa_ops *isa;
    fa_status st = isa_for(ctx, "fa_bwd", &isa);
    if (st != FA_OK) return st;
    const fa_cpu_isa_ops *active = isa;
    isa = fa_cpu_isa_bwd_level(isa, p, threads);
    /* a level whose own backward covers the dtype but not this schedule falls back */
    const int fell_back =
        active != isa && active->bwd && active->bwd_takes && active->bwd_takes(p, 0);
    if (fell_back && ctx->strict)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "fa_bwd: strict mode: the %s backward serves the one-pass schedule only "
                       "and this call needs two passes (the %s backward would run)",
                       active->name, isa->name);
    isa->bwd(p, ws, threads);
    const fa_cpu_tiles t = isa->bwd_tiles(p);
    char level[32];
    record(ctx, "bwd",
           tiled_name(name, sizeof name, "bwd", level_name(level, sizeof level, isa, p, 1),
                      p, t),
           t, threads, isa->bwd_ws(p, threads));
    fa_cpu_bwd_one_pass(p, threads, ctx->sel.reason, sizeof ctx->sel.reason);
    if (isa->bwd_method && isa->bwd_method(p) && ctx->sel.reason[0]) {
        /* the split backward has one schedule (bwd_amx.c): say that it did not follow this one */
        char *r = ctx->sel.reason;
        const size_t len = sizeof ctx->sel.reason;
        char schedule[sizeof ctx->sel.reason];
        memcpy(schedule, r, len);
        const int n = snprintf(r, len,
                               "%s fp32 backward: one pass (it recomputes the forward's scores "
                               "bit for bit), not the schedule's ",
                               isa->name);
        if (n > 0 && (size_t)n < len) snprintf(r + n, len - (size_t)n, "%s", schedule);
    }
    if (active != isa && active->bwd_method && p->dtype == FA_DTYPE_F32 &&
        !fa_cpu_f32_amx_enabled())
        snprintf(ctx->sel.reason, sizeof ctx->sel.reason,
                 "FLASHATTN_CPU_F32_AMX=0: the %s fp32 %s (FMA) instead of the %s one",
                 isa->name, "backward", active->name);
    if (fell_back) {
        char *r = ctx->sel.reason;
        const size_t len = sizeof ctx->sel.reason;
        char schedule[sizeof ctx->sel.reason];
        memcpy(schedule, r, len);
        const int n = snprintf(r, len, "%s backward: one-pass only; ", active->name);
        if (n > 0 && (size_t)n < len) snprintf(r + n, len - (size_t)n, "%s", schedule);
    }
    dropout_reason(ctx, p, active, isa, "backward");
    return FA_OK;
}

/* ---- KV cache and merge (cpu/kvcache.c, cpu/merge.c) ---- */

static fa_status cpu_kv_plan(fa_context *ctx, const fa_problem *p, fa_cpu_kv_plan *plan,
                             const fa_cpu_isa_ops **isa) {
    use_switches(ctx);
    if (ctx->algo != FA_ALGO_AUTO)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                       "fa_fwd_kvcache: the naive and plain reference algorithms serve fa_fwd "
                       "only; to compare, gather the cache into contiguous K/V and call fa_fwd");
    fa_status st = isa_for(ctx, "fa_fwd_kvcache", isa);
    if (st != FA_OK) return st;
    *isa = fa_cpu_isa_kv_level(*isa);
    *plan = (*isa)->kv_plan(p, fa_cpu_team(fa_cpu_threads(ctx), kv_flops(p)));
    if (plan->overflow)
        return fa_fail(ctx, FA_ERR_OVERFLOW,
                       "fa_fwd_kvcache: the partial outputs of %d splits do not fit the address "
                       "space",
                       plan->splits);
    return FA_OK;
}

static fa_status cpu_fwd_kvcache_workspace(fa_context *ctx, const fa_problem *p, size_t *bytes) {
    fa_cpu_kv_plan plan;
    const fa_cpu_isa_ops *isa = NULL;
    fa_status st = cpu_kv_plan(ctx, p, &plan, &isa);
    if (st == FA_OK) *bytes = plan.ws_bytes;
    return st;
}

static fa_status cpu_fwd_kvcache(fa_context *ctx, const fa_problem *p, void *ws, size_t ws_bytes) {
    fa_cpu_kv_plan plan;
    const fa_cpu_isa_ops *isa = NULL;
    fa_status st = cpu_kv_plan(ctx, p, &plan, &isa);
    if (st != FA_OK) return st;
    if (ws_bytes < plan.ws_bytes)
        return fa_fail(ctx, FA_ERR_INTERNAL, "fa_fwd_kvcache: workspace of %zu bytes, needs %zu",
                       ws_bytes, plan.ws_bytes);
    isa->kv(p, &plan, ws);
    char name[64];
    const fa_cpu_tiles t = isa->kv_tiles();
    snprintf(name, sizeof name, "cpu_fwd_kvcache_%s%s_%s_%dx%d", p->block_table ? "paged_" : "",
             isa->name, fa_dtype_name(p->dtype), t.tile_q, t.tile_k);
    record(ctx, "fwd", name, t, plan.threads, plan.ws_bytes);
    ctx->sel.num_splits = plan.splits;
    return FA_OK;
}

static fa_status cpu_merge(fa_context *ctx, const fa_merge_problem *m) {
    use_switches(ctx);
    const int threads = fa_cpu_team(fa_cpu_threads(ctx), fa_cpu_merge_flops(m));
    fa_cpu_merge(m, threads);
    char name[64];
    snprintf(name, sizeof name, "cpu_merge_attn_%s", fa_dtype_name(m->dtype));
    fa_cpu_tiles none = {0, 0};
    record(ctx, "merge", name, none, threads, 0);
    ctx->sel.num_splits = m->n;
    return FA_OK;
}

static void *cpu_ws_alloc(size_t bytes) {
    void *m = NULL;
    return posix_memalign(&m, 64, bytes) == 0 ? m : NULL;
}

static void cpu_ws_free(void *p, int device) {
    (void)device;
    free(p);
}

/* Host memory and no device: no device or stream capture; per context only the switches
   cpu_ctx_init reads. */
const fa_backend_ops fa_cpu_backend = {
    .name = "cpu",
    .fwd_workspace = cpu_fwd_workspace,
    .fwd = cpu_fwd,
    .bwd_workspace = cpu_bwd_workspace,
    .bwd = cpu_bwd,
    .ws_alloc = cpu_ws_alloc,
    .ws_free = cpu_ws_free,
    .fwd_kvcache = cpu_fwd_kvcache,
    .fwd_kvcache_workspace = cpu_fwd_kvcache_workspace,
    .merge = cpu_merge,
    .ctx_init = cpu_ctx_init,
};

/* ---- what `flashattn info` lists ---- */

/* The references and the merge have one name; the tiled kernels one per level the build has,
   dtype and tile shape (64 x 64 on every complete level), each listed under the level that
   owns it (the amx level owns its bf16 and fp32 forward and its bf16 backward; the fp32
   forward is listed unless FLASHATTN_CPU_F32_AMX=0 hands it to the avx512 level). */
static const char *const cpu_fixed_kernels[] = {
    "cpu_fwd_naive_f64", "cpu_bwd_naive_f64",  "cpu_fwd_plain_f32",  "cpu_fwd_plain_f16",
    "cpu_fwd_plain_bf16", "cpu_bwd_plain_f32", "cpu_bwd_plain_f16",  "cpu_bwd_plain_bf16",
    "cpu_merge_attn_f32", "cpu_merge_attn_f16", "cpu_merge_attn_bf16",
};
#define N_FIXED ((int)(sizeof cpu_fixed_kernels / sizeof cpu_fixed_kernels[0]))
static const char *const tiled_ops[] = {"fwd", "bwd", "fwd_kvcache", "fwd_kvcache_paged"};
static const fa_dtype tiled_dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
#define N_TILED (FA_CPU_ISA_COUNT * 4 * 3)
static char g_tiled_names[N_TILED][48];
static int g_tiled_count;

static void list_tiled(void) {
    for (int i = 0; i < FA_CPU_ISA_COUNT; i++) {
        const fa_cpu_isa_ops *isa = fa_cpu_isa_table((fa_cpu_isa)i);
        if (!isa) continue;
        for (int o = 0; o < 4; o++)
            for (int d = 0; d < 3; d++) {
                fa_problem p;
                memset(&p, 0, sizeof p);
                p.dtype = tiled_dtypes[d];
                p.d = 64;
                fa_cpu_tiles t = {FA_CPU_TILE, FA_CPU_TILE};
                char level[32];
                snprintf(level, sizeof level, "%s", isa->name);
                if (o == 0) {
                    if (fa_cpu_isa_fwd_level(isa, &p) != isa) continue;
                    t = isa->fwd_tiles(&p);
                    level_name(level, sizeof level, isa, &p, 0);
                } else if (o == 1) {
                    /* threads 0: whether the level's backward covers the dtype at all */
                    if (fa_cpu_isa_bwd_level(isa, &p, 0) != isa) continue;
                    t = isa->bwd_tiles(&p);
                    level_name(level, sizeof level, isa, &p, 1);
                } else if (!isa->kv) {
                    continue;
                }
                snprintf(g_tiled_names[g_tiled_count++], sizeof g_tiled_names[0],
                         "cpu_%s_%s_%s_%dx%d", tiled_ops[o], level,
                         fa_dtype_name(tiled_dtypes[d]), t.tile_q, t.tile_k);
            }
    }
}

static int tiled_count(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, list_tiled);
    return g_tiled_count;
}

int fa_cpu_kernel_count(void) { return tiled_count() + N_FIXED; }

const char *fa_cpu_kernel_name(int i) {
    const int nt = tiled_count();
    if (i < 0 || i >= nt + N_FIXED) return NULL;
    return i < nt ? g_tiled_names[i] : cpu_fixed_kernels[i - nt];
}

/* Room for every name detect_features can append. */
static char g_features[256];

static void append(const char *name) {
    size_t n = strlen(g_features);
    snprintf(g_features + n, sizeof g_features - n, "%s%s", n ? " " : "", name);
}

/* The features the kernels use or a reader of `flashattn info` asks about (which dtype the
   hardware multiplies natively): the AVX-512 and AMX ones read from CPUID leaf 7 directly,
   because compilers name them differently or (avx512fp16, amx-fp16) not at all. Leaf 7
   subleaf 0: EDX bit 23 AVX512-FP16, 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8; subleaf 1: EAX
   bit 5 AVX512-BF16, 21 AMX-FP16. CPUID says what the core has; whether the OS lets a
   process use AMX is the amx level's own question (amx_probe). */
static void detect_features(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    /* __builtin_cpu_supports takes only literal names, hence the list */
    if (__builtin_cpu_supports("avx512f")) append("avx512f");
    if (__builtin_cpu_supports("avx512bw")) append("avx512bw");
    if (__builtin_cpu_supports("avx512vl")) append("avx512vl");
    unsigned a, b, c, d, a1 = 0, b1, c1, d1;
    const int leaf7 = __get_cpuid_count(7, 0, &a, &b, &c, &d);
    const int sub1 = leaf7 && a >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    if (!sub1) a1 = 0;
    const int avx512 = __builtin_cpu_supports("avx512f");
    if (avx512 && ((a1 >> 5) & 1)) append("avx512_bf16");
    if (avx512 && leaf7 && ((d >> 23) & 1)) append("avx512fp16");
    if (__builtin_cpu_supports("avx2")) append("avx2");
    if (__builtin_cpu_supports("fma")) append("fma");
    if (has_f16c()) append("f16c");
    if (leaf7) {
        if ((d >> 24) & 1) append("amx-tile");
        if ((d >> 22) & 1) append("amx-bf16");
        if ((a1 >> 21) & 1) append("amx-fp16");
        if ((d >> 25) & 1) append("amx-int8");
    }
#endif
    if (!g_features[0]) append("portable");
}

const char *fa_cpu_features(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, detect_features);
    return g_features;
}
