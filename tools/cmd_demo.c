/*
 * cmd_demo.c — `flashattn demo`: attention as a user writes it against flash attention on
 * growing sequence lengths, side by side, with the time and the real peak memory of every run.
 *
 * The naive contender is materialised attention on the best matrix product the tool was built
 * with (demo_naive.c: cblas_sgemm of a BLAS, else C loops), with the library's thread count;
 * the flash contender is fa_fwd with FA_ALGO_AUTO. Both take the same fp32 (or f16, bf16)
 * inputs. Each run is its own child process under an address-space limit, so its peak RSS is
 * its own and the quadratic score matrix eventually fails to allocate while the flash path
 * keeps going.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "demo.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: flashattn demo [options]\n"
            "\n"
            "Runs attention as a user writes it on a matrix library and flash attention\n"
            "(FA_ALGO_AUTO) on growing sequence lengths, each run in its own child process\n"
            "under a memory limit, and prints time, peak memory and the error between the two\n"
            "side by side. A run longer than a second shows a progress line on stderr.\n"
            "The naive side, %s: the B*H*N*N scores held in fp32, a softmax\n"
            "per row, the products on\n  %s.\n"
            "\n"
            "  --seqlens LIST      comma list or A..B doubling (default 512..16384)\n"
            "  --batch B           batch size (default 1)\n"
            "  --heads H           heads (default 4; 8 with --long)\n"
            "  --head-dim D        head dimension (default 64)\n"
            "  --dtype T           f32, f16 or bf16 (default f32; the naive side computes in fp32)\n"
            "  --causal            causal mask (default off; on with --long)\n"
            "  --threads N         worker threads of both sides (default 0: all cores)\n"
            "  --mem-limit BYTES   address space each run may add once warm, e.g. 4G (default 4G)\n"
            "  --naive-budget S    skip a naive run predicted to take more than S seconds\n"
            "                      when it would fit in memory (default 30; 0: never skip)\n"
            "  --no-naive          flash only\n"
            "  --seed N            input seed (default: fresh each run, printed)\n"
            "  --long              the long case instead: one forward at seqlen 131072, 8 heads,\n"
            "                      d 64, causal; reports time, workspace and peak RSS\n"
            "  --non-causal        with --long: without the causal mask (twice the work)\n"
            "  -h, --help          this text\n",
            demo_naive_label(), demo_naive_engine());
}

/* The table fits 100 columns: seqlen and inputs (16), two contender blocks of three columns
   (time, peak RSS, attn mem: 30 each, after " |"), then " |", speedup and max|err| (17). */
#define CELL 30

typedef struct row_notes {
    char text[8][640];
    int n;
} row_notes;

static void note(row_notes *notes, const char *fmt, const char *a, const char *b) {
    if (notes->n >= 8) return;
    snprintf(notes->text[notes->n++], sizeof notes->text[0], fmt, a, b);
}

static double attn_extra_bytes(const demo_outcome *oc) {
    double extra = ((double)oc->iso.peak_rss_kib - (double)oc->rep.baseline_kib) * 1024.0;
    return extra > 0 ? extra : 0;
}

/* The block of one contender: three numbers, or what happened instead (a leading space keeps
   the text off the column rule). */
static void format_cell(char *cell, size_t len, const demo_outcome *oc, int naive,
                        const char *label, int64_t n, double budget, row_notes *notes) {
    char a[24], b[24], c[24];
    const demo_report *r = &oc->rep;
    uint64_t needs = naive ? r->score_bytes : r->ws_query;
    char nb[24];
    tool_fmt_bytes(nb, sizeof nb, (double)needs);
    if (oc->have_report && r->stage == DEMO_STAGE_DONE && r->skipped) {
        snprintf(cell, len, " skipped: est. %s > %s", tool_fmt_seconds(a, sizeof a, r->seconds),
                 tool_fmt_seconds(b, sizeof b, budget));
        return;
    }
    if (oc->have_report && r->stage == DEMO_STAGE_DONE && r->status == FA_OK) {
        snprintf(cell, len, "%9s %10s %9s", tool_fmt_seconds(a, sizeof a, r->seconds),
                 tool_fmt_bytes(b, sizeof b, (double)oc->iso.peak_rss_kib * 1024.0),
                 attn_extra_bytes(oc) < DEMO_RSS_NOISE ? "< 0.5 MiB"
                                                  : tool_fmt_bytes(c, sizeof c, attn_extra_bytes(oc)));
        return;
    }
    char where[64];
    snprintf(where, sizeof where, "%s at seqlen %lld", label, (long long)n);
    if (oc->have_report && r->stage == DEMO_STAGE_DONE) {
        note(notes, "%s: %s", where, r->error);
        if (r->no_inputs)
            snprintf(cell, len, " inputs alone exceed the limit");
        else if (r->status == FA_ERR_OUT_OF_MEMORY)
            snprintf(cell, len, " out of memory: needs %s", nb);
        else
            snprintf(cell, len, " error: %.22s", fa_status_string((fa_status)r->status));
        return;
    }
    if (oc->iso.signal)
        snprintf(cell, len, " died: signal %d%s%s", oc->iso.signal, naive ? ", needs " : "",
                 naive ? nb : "");
    else
        snprintf(cell, len, " exit code %d%s%s", oc->iso.exit_code, naive ? ", needs " : "",
                 naive ? nb : "");
}

/* Kernel descriptions with the lengths they served, grouped in order of appearance. */
typedef struct kernel_log {
    char desc[16][320];
    char lens[16][200];
    int n;
} kernel_log;

static void log_kernel(kernel_log *kl, const char *desc, int64_t n) {
    int i = 0;
    while (i < kl->n && strcmp(kl->desc[i], desc) != 0) i++;
    if (i == kl->n) {
        if (kl->n == 16) return;
        snprintf(kl->desc[i], sizeof kl->desc[i], "%s", desc);
        kl->lens[i][0] = 0;
        kl->n++;
    }
    size_t used = strlen(kl->lens[i]);
    snprintf(kl->lens[i] + used, sizeof kl->lens[i] - used, "%s%lld", used ? " " : "",
             (long long)n);
}

/* "naive: OpenBLAS 0.3.21 cblas_sgemm (Haswell kernels), 2 threads (flash: 2)": what
   computed the naive side, and whether its thread count matched the library's. */
static void naive_desc(char *desc, size_t len, const demo_report *r) {
    if (r->sel_threads > 0)
        snprintf(desc, len, "naive: %s, %d thread%s (flash: %d)", demo_naive_engine(),
                 r->sel_threads, r->sel_threads == 1 ? "" : "s", r->lib_threads);
    else
        snprintf(desc, len, "naive: %s, the BLAS's own threads, softmax on %d", demo_naive_engine(),
                 r->lib_threads);
}

/* "flash: cpu_fwd_avx512_f32_64x64 (tile 64x64, 2 threads, workspace 624.1 KiB): reason". */
static void flash_desc(char *desc, size_t len, const demo_report *r) {
    char ws[24], tile[32] = "";
    tool_fmt_bytes(ws, sizeof ws, (double)r->ws_used);
    if (r->tile_q) snprintf(tile, sizeof tile, "tile %dx%d, ", r->tile_q, r->tile_k);
    snprintf(desc, len, "flash: %s (%s%d thread%s, workspace %s)%s%s", r->kernel, tile,
             r->sel_threads, r->sel_threads == 1 ? "" : "s", ws, *r->reason ? ": " : "",
             r->reason);
}

static int done_ok(const demo_outcome *oc) {
    return oc->have_report && oc->rep.stage == DEMO_STAGE_DONE && oc->rep.status == FA_OK &&
           !oc->rep.skipped;
}

static void print_header(const demo_cfg *cfg) {
    char s1[32], s2[32];
    printf("flashattn demo: B=%lld H=%lld d=%lld %s, %s, threads %s, memory limit %s per run\n",
           (long long)cfg->batch, (long long)cfg->heads, (long long)cfg->head_dim,
           fa_dtype_name(cfg->dtype), cfg->causal ? "causal" : "non-causal",
           cfg->threads ? (snprintf(s2, sizeof s2, "%d", cfg->threads), s2) : "all",
           tool_fmt_bytes(s1, sizeof s1, (double)cfg->mem_limit));
    printf("naive = %s: softmax(Q K^T / sqrt(d)%s) V as a user writes it,\n"
           "  the B*H*N*N scores held in fp32, products on %s\n",
           demo_naive_label(), cfg->causal ? " + causal mask" : "", demo_naive_engine());
    printf("flash = FA_ALGO_AUTO; both sides get the same inputs (seed %llu), one process a run\n",
           (unsigned long long)cfg->seed);
    double load = tool_loadavg();
    if (load > 0.5 * tool_online_cpus())
        printf("note: load average %.2f on %d CPUs: other work is running, times will be "
               "slow and noisy\n", load, tool_online_cpus());
    printf("\n");
    printf("%6s %9s |%-*s |%-*s |\n", "", "", CELL, " naive", CELL, " flash");
    printf("%6s %9s |%9s %10s %9s |%9s %10s %9s |%8s %8s\n", "seqlen", "inputs", "time",
           "peak RSS", "attn mem", "time", "peak RSS", "attn mem", "speedup", "max|err|");
    char rule[64];
    memset(rule, '-', sizeof rule - 1);
    rule[sizeof rule - 1] = 0;
    printf("%.17s+%.*s+%.*s+%.17s\n", rule, CELL + 1, rule, CELL + 1, rule, rule);
}

static int run_table(const demo_cfg *cfg) {
    char s1[32], s2[32];
    print_header(cfg);
    double t_start = tool_now(), last_naive_s = 0;
    int64_t last_naive_n = 0;
    row_notes notes = {.n = 0};
    kernel_log kl = {.n = 0};
    int failures = 0;
    for (int i = 0; i < cfg->nseq; i++) {
        int64_t n = cfg->seqlens[i];
        demo_outcome naive, flash;
        memset(&naive, 0, sizeof naive);
        char ncell[128] = " -", fcell[128], speed[16] = "-", err[16] = "-", inputs[24] = "?";
        char desc[320];
        int naive_fd = -1, flash_fd = -1;
        if (cfg->run_naive) {
            naive_fd = demo_out_file();
            demo_job job = {cfg, n, cfg->heads, cfg->causal, 1, 0, naive_fd, demo_naive_label()};
            if (last_naive_n)
                job.est_seconds = last_naive_s * ((double)n / (double)last_naive_n) *
                                  ((double)n / (double)last_naive_n);
            if (demo_run(&job, &naive) != 0) return 1;
            if (naive.rep.skipped) naive.rep.seconds = job.est_seconds;
            format_cell(ncell, sizeof ncell, &naive, 1, "naive", n, cfg->naive_budget, &notes);
            if (done_ok(&naive)) {
                last_naive_s = naive.rep.seconds;
                last_naive_n = n;
                naive_desc(desc, sizeof desc, &naive.rep);
                log_kernel(&kl, desc, n);
            }
        }
        int naive_out = naive.have_report && naive.rep.out_bytes > 0;
        if (naive_out) flash_fd = demo_out_file();
        demo_job fjob = {cfg, n, cfg->heads, cfg->causal, 0, 0, flash_fd, "flash"};
        if (demo_run(&fjob, &flash) != 0) return 1;
        format_cell(fcell, sizeof fcell, &flash, 0, "flash", n, 0, &notes);
        int flash_ok = done_ok(&flash);
        if (flash_ok && flash.rep.nonfinite) {
            char cnt[64];
            snprintf(cnt, sizeof cnt, "%llu", (unsigned long long)flash.rep.nonfinite);
            note(&notes, "flash output has %s non-finite (unwritten?) elements at seqlen %s", cnt,
                 (snprintf(s2, sizeof s2, "%lld", (long long)n), s2));
            failures++;
        }
        if (done_ok(&naive) && naive.rep.nonfinite) {
            char cnt[64];
            snprintf(cnt, sizeof cnt, "%llu", (unsigned long long)naive.rep.nonfinite);
            note(&notes, "naive output has %s non-finite elements at seqlen %s", cnt,
                 (snprintf(s2, sizeof s2, "%lld", (long long)n), s2));
        }
        if (!flash_ok) failures++;
        if (flash_ok) {
            flash_desc(desc, sizeof desc, &flash.rep);
            log_kernel(&kl, desc, n);
        }
        if (flash.have_report) tool_fmt_bytes(inputs, sizeof inputs, (double)flash.rep.input_bytes);
        if (flash_ok && naive_out && flash.rep.out_bytes == naive.rep.out_bytes) {
            snprintf(speed, sizeof speed, "%.1fx", naive.rep.seconds / flash.rep.seconds);
            double e = demo_max_abs_err(naive_fd, flash_fd, cfg->dtype,
                                        (size_t)(flash.rep.out_bytes / fa_dtype_size(cfg->dtype)));
            if (e < 0)
                snprintf(err, sizeof err, "unread");
            else
                snprintf(err, sizeof err, "%.2e", e);
            if (isnan(e)) failures++;
        }
        if (naive_fd >= 0) close(naive_fd);
        if (flash_fd >= 0) close(flash_fd);
        printf("%6lld %9s |%-*s |%-*s |%8s %8s\n", (long long)n, inputs, CELL, ncell, CELL, fcell,
               speed, err);
        fflush(stdout);
        demo_outcome_free(&naive);
        demo_outcome_free(&flash);
    }
    printf("\n");
    for (int i = 0; i < kl.n; i++) printf("%s  [seqlen %s]\n", kl.desc[i], kl.lens[i]);
    for (int i = 0; i < notes.n; i++) printf("note: %s\n", notes.text[i]);
    printf("\ntime: of one call, or the median of up to %d when a call takes less than %.1f s. "
           "peak RSS:\nthe run's peak resident memory (wait4 ru_maxrss); attn mem: peak RSS minus "
           "the RSS before\nthe call (inputs, outputs, runtime), i.e. what the attention itself "
           "added, to about 0.5 MiB.\nspeedup: naive time / flash time; max|err|: the largest "
           "|naive - flash| over O.\n", DEMO_MAX_CALLS, DEMO_REPEAT_BELOW);
    printf("demo finished in %s\n", tool_fmt_seconds(s1, sizeof s1, tool_now() - t_start));
    return failures ? 1 : 0;
}

static const char *opt_name(const struct option *opts, int val) {
    for (; opts->name; opts++)
        if (opts->val == val) return opts->name;
    return "?";
}

int cmd_demo(int argc, char **argv) {
    demo_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = 1;
    cfg.heads = 4;
    cfg.head_dim = 64;
    cfg.dtype = FA_DTYPE_F32;
    cfg.mem_limit = (size_t)4 << 30;
    cfg.naive_budget = 30;
    cfg.run_naive = 1;
    cfg.seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    cfg.nseq = tool_parse_list("512..16384", cfg.seqlens, DEMO_MAX_SEQLENS);
    int long_mode = 0, non_causal = 0, heads_set = 0, causal_set = 0, seqlens_set = 0;

    enum { O_SEQ = 256, O_B, O_H, O_D, O_DT, O_CAUSAL, O_THR, O_MEM, O_BUDGET, O_NONAIVE,
           O_SEED, O_LONG, O_NONCAUSAL };
    static const struct option opts[] = {
        {"seqlens", required_argument, 0, O_SEQ},   {"batch", required_argument, 0, O_B},
        {"heads", required_argument, 0, O_H},       {"head-dim", required_argument, 0, O_D},
        {"dtype", required_argument, 0, O_DT},      {"causal", no_argument, 0, O_CAUSAL},
        {"threads", required_argument, 0, O_THR},   {"mem-limit", required_argument, 0, O_MEM},
        {"naive-budget", required_argument, 0, O_BUDGET}, {"no-naive", no_argument, 0, O_NONAIVE},
        {"seed", required_argument, 0, O_SEED},     {"long", no_argument, 0, O_LONG},
        {"non-causal", no_argument, 0, O_NONCAUSAL}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_SEQ:
            cfg.nseq = tool_parse_list(optarg, cfg.seqlens, DEMO_MAX_SEQLENS);
            bad = cfg.nseq <= 0;
            seqlens_set = 1;
            break;
        case O_B: bad = tool_parse_i64(optarg, &cfg.batch) || cfg.batch < 1; break;
        case O_H:
            bad = tool_parse_i64(optarg, &cfg.heads) || cfg.heads < 1;
            heads_set = 1;
            break;
        case O_D: bad = tool_parse_i64(optarg, &cfg.head_dim) || cfg.head_dim < 1; break;
        case O_DT: bad = tool_parse_dtype(optarg, &cfg.dtype) || cfg.dtype == FA_DTYPE_F64; break;
        case O_CAUSAL: cfg.causal = 1; causal_set = 1; break;
        case O_THR:
            bad = tool_parse_i64(optarg, &v) || v > 4096;
            cfg.threads = (int)v;
            break;
        case O_MEM: bad = tool_parse_bytes(optarg, &cfg.mem_limit); break;
        case O_BUDGET: {
            char *end;
            cfg.naive_budget = strtod(optarg, &end);
            bad = *end || !(cfg.naive_budget >= 0);
            break;
        }
        case O_NONAIVE: cfg.run_naive = 0; break;
        case O_SEED:
            bad = tool_parse_i64(optarg, &v);
            cfg.seed = (uint64_t)v;
            break;
        case O_LONG: long_mode = 1; break;
        case O_NONCAUSAL: non_causal = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "flashattn demo: bad value '%s' for --%s\n", optarg,
                    opt_name(opts, c));
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "flashattn demo: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (non_causal && !long_mode) {
        fprintf(stderr, "flashattn demo: --non-causal goes with --long (the table is "
                        "non-causal unless --causal)\n");
        return 2;
    }
    if (long_mode) {
        if (!heads_set) cfg.heads = 8;
        if (!causal_set) cfg.causal = !non_causal;
        if (causal_set && non_causal) {
            fprintf(stderr, "flashattn demo: --causal and --non-causal contradict\n");
            return 2;
        }
        if (seqlens_set && cfg.nseq != 1) {
            fprintf(stderr, "flashattn demo: --long takes one seqlen\n");
            return 2;
        }
        return demo_long(&cfg, seqlens_set ? cfg.seqlens[0] : 131072);
    }
    return run_table(&cfg);
}
