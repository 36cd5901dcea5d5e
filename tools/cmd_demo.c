/*
 * cmd_demo.c — `flashattn demo`: textbook attention against flash attention on growing
 * sequence lengths, side by side, with the time and the real peak memory of every run.
 *
 * The naive contender is FA_ALGO_PLAIN (the B*H*N*N score matrix materialised, fp32 math),
 * the flash contender FA_ALGO_AUTO. Each run is its own child process under an address-space
 * limit, so its peak RSS is its own and the quadratic score matrix eventually fails to
 * allocate while the flash path keeps going.
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
            "Runs textbook attention (FA_ALGO_PLAIN: the full B*H*N*N score matrix, fp32) and\n"
            "flash attention (FA_ALGO_AUTO) on growing sequence lengths, each run in its own\n"
            "child process under a memory limit, and prints time, peak memory and the error\n"
            "between the two side by side.\n"
            "\n"
            "  --seqlens LIST      comma list or A..B doubling (default 512..16384)\n"
            "  --batch B           batch size (default 1)\n"
            "  --heads H           heads (default 4; 8 with --long)\n"
            "  --head-dim D        head dimension (default 64)\n"
            "  --dtype T           f32, f16 or bf16 (default f32)\n"
            "  --causal            causal mask (default off; on with --long)\n"
            "  --threads N         worker threads (default 0: all cores)\n"
            "  --mem-limit BYTES   address space each run may add once warm, e.g. 4G (default 4G)\n"
            "  --naive-budget S    skip a naive run predicted to take more than S seconds\n"
            "                      when it would fit in memory (default 30; 0: never skip)\n"
            "  --no-naive          flash only\n"
            "  --seed N            input seed (default: fresh each run, printed)\n"
            "  --long              the long case instead: one forward at seqlen 131072, 8 heads,\n"
            "                      d 64, causal; reports time, workspace and peak RSS\n"
            "  --non-causal        with --long: without the causal mask (twice the work)\n"
            "  -h, --help          this text\n");
}

/* Width of one contender's block of four columns. */
#define CELL 42

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

/* The block of one contender: four numbers, or what happened instead. */
static void format_cell(char *cell, size_t len, const demo_outcome *oc, int naive,
                        const char *label, int64_t n, double budget, row_notes *notes) {
    char a[24], b[24], c[24], d[24];
    const demo_report *r = &oc->rep;
    uint64_t needs = naive ? r->score_bytes : r->ws_query;
    char nb[24];
    tool_fmt_bytes(nb, sizeof nb, (double)needs);
    if (oc->have_report && r->stage == DEMO_STAGE_DONE && r->skipped) {
        snprintf(cell, len, "skipped: est. %s > budget %s",
                 tool_fmt_seconds(a, sizeof a, oc->rep.seconds),
                 tool_fmt_seconds(b, sizeof b, budget));
        return;
    }
    if (oc->have_report && r->stage == DEMO_STAGE_DONE && r->status == FA_OK) {
        snprintf(cell, len, "%9s %10s %10s %10s", tool_fmt_seconds(a, sizeof a, r->seconds),
                 tool_fmt_bytes(b, sizeof b, (double)oc->iso.peak_rss_kib * 1024.0),
                 attn_extra_bytes(oc) < DEMO_RSS_NOISE ? "< 0.5 MiB"
                                                  : tool_fmt_bytes(c, sizeof c, attn_extra_bytes(oc)),
                 tool_fmt_bytes(d, sizeof d, (double)r->ws_used));
        return;
    }
    char where[64];
    snprintf(where, sizeof where, "%s at seqlen %lld", label, (long long)n);
    if (oc->have_report && r->stage == DEMO_STAGE_DONE) {
        note(notes, "%s: %s", where, r->error);
        if (r->no_inputs)
            snprintf(cell, len, "inputs alone exceed the memory limit");
        else if (r->status == FA_ERR_OUT_OF_MEMORY)
            snprintf(cell, len, "out of memory: needs %s", nb);
        else
            snprintf(cell, len, "error: %.36s", fa_status_string((fa_status)r->status));
        return;
    }
    if (oc->iso.signal)
        snprintf(cell, len, "died: signal %d%s%s", oc->iso.signal,
                 naive ? ", needs " : "", naive ? nb : "");
    else
        snprintf(cell, len, "died: exit code %d%s%s", oc->iso.exit_code,
                 naive ? ", needs " : "", naive ? nb : "");
}

/* Kernel descriptions with the lengths they served, grouped in order of appearance. */
typedef struct kernel_log {
    char desc[16][320];
    char lens[16][200];
    int n;
} kernel_log;

static void log_kernel(kernel_log *kl, const char *who, const demo_report *r, int64_t n) {
    char desc[320];
    if (r->tile_q)
        snprintf(desc, sizeof desc, "%s %s (tile %dx%d, %d threads)%s%s", who, r->kernel,
                 r->tile_q, r->tile_k, r->sel_threads, *r->reason ? ": " : "", r->reason);
    else
        snprintf(desc, sizeof desc, "%s %s (%d threads)%s%s", who, r->kernel, r->sel_threads,
                 *r->reason ? ": " : "", r->reason);
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

static int run_table(const demo_cfg *cfg) {
    char s1[32], s2[32];
    printf("flashattn demo: B=%lld H=%lld d=%lld %s, %s, threads %s, memory limit %s per run, "
           "seed %llu\n",
           (long long)cfg->batch, (long long)cfg->heads, (long long)cfg->head_dim,
           fa_dtype_name(cfg->dtype), cfg->causal ? "causal" : "non-causal",
           cfg->threads ? (snprintf(s2, sizeof s2, "%d", cfg->threads), s2) : "all",
           tool_fmt_bytes(s1, sizeof s1, (double)cfg->mem_limit),
           (unsigned long long)cfg->seed);
    printf("naive = FA_ALGO_PLAIN (textbook: B*H*N*N score matrix), flash = FA_ALGO_AUTO; "
           "each run in its own process\n");
    double load = tool_loadavg();
    if (load > 0.5 * tool_online_cpus())
        printf("note: load average %.2f on %d CPUs: other work is running, times will be "
               "slow and noisy\n", load, tool_online_cpus());
    printf("\n");
    printf("%7s %10s | %-*s | %-*s |\n", "", "", CELL, "naive", CELL, "flash");
    printf("%7s %10s | %9s %10s %10s %10s | %9s %10s %10s %10s | %7s %9s\n", "seqlen", "inputs",
           "time", "peak RSS", "attn mem", "workspace", "time", "peak RSS", "attn mem",
           "workspace", "speedup", "max|err|");
    char rule[200];
    memset(rule, '-', sizeof rule - 1);
    rule[sizeof rule - 1] = 0;
    printf("%.19s+%.*s+%.*s+%.18s\n", rule, CELL + 2, rule, CELL + 2, rule, rule);

    double t_start = tool_now(), last_naive_s = 0;
    int64_t last_naive_n = 0;
    row_notes notes = {.n = 0};
    kernel_log kl = {.n = 0};
    int failures = 0;
    for (int i = 0; i < cfg->nseq; i++) {
        int64_t n = cfg->seqlens[i];
        demo_outcome naive, flash;
        memset(&naive, 0, sizeof naive);
        char ncell[128] = "-", fcell[128], speed[16] = "-", err[16] = "-", inputs[24] = "?";
        int naive_fd = -1, flash_fd = -1;
        if (cfg->run_naive) {
            naive_fd = demo_out_file();
            demo_job job = {cfg, n, cfg->heads, cfg->causal, FA_ALGO_PLAIN, 0, naive_fd};
            if (last_naive_n)
                job.est_seconds = last_naive_s * ((double)n / (double)last_naive_n) *
                                  ((double)n / (double)last_naive_n);
            if (demo_run(&job, &naive) != 0) return 1;
            if (naive.rep.skipped) naive.rep.seconds = job.est_seconds;
            format_cell(ncell, sizeof ncell, &naive, 1, "naive", n, cfg->naive_budget, &notes);
            if (naive.rep.stage == DEMO_STAGE_DONE && naive.rep.status == FA_OK &&
                !naive.rep.skipped) {
                last_naive_s = naive.rep.seconds;
                last_naive_n = n;
                log_kernel(&kl, "naive:", &naive.rep, n);
            }
        }
        int naive_out = naive.have_report && naive.rep.out_bytes > 0;
        if (naive_out) flash_fd = demo_out_file();
        demo_job fjob = {cfg, n, cfg->heads, cfg->causal, FA_ALGO_AUTO, 0, flash_fd};
        if (demo_run(&fjob, &flash) != 0) return 1;
        format_cell(fcell, sizeof fcell, &flash, 0, "flash", n, 0, &notes);
        int flash_ok = flash.rep.stage == DEMO_STAGE_DONE && flash.rep.status == FA_OK &&
                       !flash.rep.skipped;
        if (flash_ok && flash.rep.nonfinite) {
            char cnt[64];
            snprintf(cnt, sizeof cnt, "%llu", (unsigned long long)flash.rep.nonfinite);
            note(&notes, "flash output has %s non-finite (unwritten?) elements at seqlen %s", cnt,
                 (snprintf(s2, sizeof s2, "%lld", (long long)n), s2));
            failures++;
        }
        if (naive.rep.stage == DEMO_STAGE_DONE && naive.rep.status == FA_OK &&
            naive.rep.nonfinite) {
            char cnt[64];
            snprintf(cnt, sizeof cnt, "%llu", (unsigned long long)naive.rep.nonfinite);
            note(&notes, "naive output has %s non-finite elements at seqlen %s", cnt,
                 (snprintf(s2, sizeof s2, "%lld", (long long)n), s2));
        }
        if (!flash_ok) failures++;
        if (flash_ok) log_kernel(&kl, "flash:", &flash.rep, n);
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
        printf("%7lld %10s | %-*s | %-*s | %7s %9s\n", (long long)n, inputs, CELL, ncell, CELL,
               fcell, speed, err);
        fflush(stdout);
        demo_outcome_free(&naive);
        demo_outcome_free(&flash);
    }
    printf("\n");
    for (int i = 0; i < kl.n; i++) printf("kernel %s  [seqlen %s]\n", kl.desc[i], kl.lens[i]);
    for (int i = 0; i < notes.n; i++) printf("note: %s\n", notes.text[i]);
    printf("\npeak RSS: the run's peak resident memory (wait4 ru_maxrss); attn mem: peak RSS minus "
           "the RSS before the call\n(inputs, outputs, runtime), i.e. what the attention itself "
           "added, resolved to about 0.5 MiB;\nworkspace: fa_last_selection()->workspace_bytes. "
           "speedup: naive time / flash time; max|err|: largest |naive - flash| over O.\n");
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
