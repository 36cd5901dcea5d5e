/*
 * cmd_check.c — `flashattn check`: the correctness sweep a user runs after an upgrade, as
 * text or (--json) as one JSON object (check_json.c).
 *
 * Every case runs the kernel under test, the float64 reference and the plain baseline on the
 * same fresh random inputs (testkit) and must keep its error within 2x the baseline's plus a
 * small slack. Each line shows the kernel's max error against that limit, so a pass that is
 * close to the edge is visible too.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: flashattn check [options]\n"
            "\n"
            "Runs the forward and backward correctness sweeps against the float64 reference.\n"
            "A case passes when the kernel's max and mean errors are within 2x those of a plain\n"
            "implementation in the same precision (plus a slack of 4 roundings). Each line shows\n"
            "kernel max error / allowed max error per output. Exit code 1 on any failure.\n"
            "\n"
            "  --quick            the standard cases with lengths under 1000 (default)\n"
            "  --full             every standard case plus longer ones (minutes)\n"
            "  --op OP            fwd, bwd or both (default both)\n"
            "  --filter TEXT      only cases whose description contains TEXT\n"
            "  --backend B        cpu (default) or cuda (which takes f16 and bf16: the f32\n"
            "                     cases run in bf16 there)\n"
            "  --threads N        worker threads of the kernel under test (default: all cores)\n"
            "  --seed N           input seed (default: FLASHATTN_TEST_SEED, else fresh)\n"
            "  -v, --verbose      also mean errors, and the full report of every case\n"
            "  --json             the results as one JSON object on stdout (every case with its\n"
            "                     status, kernels and error figures, then the summary)\n"
            "  -h, --help         this text\n");
}

static int64_t longest(const tk_case *c) {
    int64_t m = c->sq > c->sk ? c->sq : c->sk;
    if (c->varlen)
        for (int b = 0; b < c->batch && b < TK_MAX_BATCH; b++) {
            if (c->lens_q[b] > m) m = c->lens_q[b];
            if (c->lens_k[b] > m) m = c->lens_k[b];
        }
    return m;
}

typedef struct tally {
    int pass, fail, skip;
} tally;

/* "O 1.2e-07/4.5e-07": kernel max error / the most the rule allows. dQ and dK get an extra
   allowance from testkit for the fp32 noise of the backward's D_i term, which tk_report does
   not carry; their limit is printed without it and marked "+D". */
static void put_err(char *buf, size_t len, const char *name, const tk_err e[2], fa_dtype dt,
                    int has_extra, int verbose) {
    double slack;
    tk_rule(&e[0], &e[1], dt, 0.0, &slack);
    const char *mark = has_extra ? "+D" : "";
    size_t n = strlen(buf);
    if (verbose)
        snprintf(buf + n, len - n, "  %s max %.2e/%.2e%s mean %.2e/%.2e%s", name, e[0].max_abs,
                 2 * e[1].max_abs + slack, mark, e[0].mean_abs, 2 * e[1].mean_abs + slack, mark);
    else
        snprintf(buf + n, len - n, "  %s %.2e/%.2e%s", name, e[0].max_abs,
                 2 * e[1].max_abs + slack, mark);
}

/* Runs the cases; each result goes to stdout as text, or into json when it is set. */
static void run_list(const char *op, const tk_case *cases, size_t n, int full,
                     const char *filter, const tk_opts *opts, uint64_t seed, tally *t,
                     cJSON *json) {
    static tk_report r; /* 4 KiB of message plus errors: keep it off the stack */
    for (size_t i = 0; i < n; i++) {
        const tk_case cb = tk_case_on(&cases[i], opts->backend); /* f32 runs in bf16 on CUDA */
        const tk_case *c = &cb;
        char desc[512];
        tk_case_format(c, desc, sizeof desc);
        if (!full && longest(c) >= 1000) continue;
        if (filter && !strstr(desc, filter)) continue;
        /* a progress line only where it can be overwritten */
        int tty = !json && isatty(STDOUT_FILENO);
        if (tty) {
            printf("....  %s %s", op, desc);
            fflush(stdout);
        }
        double t0 = tool_now();
        int st = tk_run_case(c, opts, seed, &r);
        double secs = tool_now() - t0;
        if (st == TK_PASS) t->pass++;
        else if (st == TK_FAIL) t->fail++;
        else t->skip++;
        if (json) {
            check_json_case(json, op, c, st, secs, &r);
            continue;
        }
        const char *tag = st == TK_PASS ? "PASS" : st == TK_FAIL ? "FAIL" : "SKIP";
        char errs[512] = "";
        if (st != TK_SKIP && r.kernel_fwd[0]) {
            put_err(errs, sizeof errs, "O", r.o, c->dtype, 0, opts->verbose);
            put_err(errs, sizeof errs, "LSE", r.lse, c->dtype, 0, opts->verbose);
            if (c->bwd && r.kernel_bwd[0]) {
                put_err(errs, sizeof errs, "dQ", r.dq, c->dtype, 1, opts->verbose);
                put_err(errs, sizeof errs, "dK", r.dk, c->dtype, 1, opts->verbose);
                put_err(errs, sizeof errs, "dV", r.dv, c->dtype, 0, opts->verbose);
            }
        }
        char ts[24];
        printf("%s%s  %s %s  (%s)\n", tty ? "\r" : "", tag, op, desc, tool_fmt_seconds(ts, sizeof ts, secs));
        if (errs[0])
            printf("      %s   [%s%s%s]\n", errs + 2, r.kernel_fwd, r.kernel_bwd[0] ? ", " : "",
                   r.kernel_bwd);
        if (st != TK_PASS || opts->verbose) {
            /* the report's first line repeats the case; the rest says what went wrong */
            const char *body = strchr(r.msg, '\n');
            if (body && body[1]) printf("%s", body + 1);
        }
        fflush(stdout);
    }
}

int cmd_check(int argc, char **argv) {
    int full = 0, fwd = 1, bwd = 1, json = 0;
    const char *filter = NULL;
    tk_opts opts = {FA_BACKEND_CPU, FA_ALGO_AUTO, 0, 0};
    uint64_t seed = tk_seed();
    enum { O_QUICK = 256, O_FULL, O_OP, O_FILTER, O_BACKEND, O_THR, O_SEED, O_JSON };
    static const struct option lopts[] = {
        {"quick", no_argument, 0, O_QUICK},         {"full", no_argument, 0, O_FULL},
        {"op", required_argument, 0, O_OP},         {"filter", required_argument, 0, O_FILTER},
        {"backend", required_argument, 0, O_BACKEND}, {"threads", required_argument, 0, O_THR},
        {"seed", required_argument, 0, O_SEED},     {"verbose", no_argument, 0, 'v'},
        {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "vh", lopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_QUICK: full = 0; break;
        case O_FULL: full = 1; break;
        case O_OP:
            fwd = strcmp(optarg, "fwd") == 0 || strcmp(optarg, "both") == 0;
            bwd = strcmp(optarg, "bwd") == 0 || strcmp(optarg, "both") == 0;
            bad = !fwd && !bwd;
            break;
        case O_FILTER: filter = optarg; break;
        case O_BACKEND:
            if (strcmp(optarg, "cpu") == 0) opts.backend = FA_BACKEND_CPU;
            else if (strcmp(optarg, "cuda") == 0) opts.backend = FA_BACKEND_CUDA;
            else bad = 1;
            break;
        case O_THR:
            bad = tool_parse_i64(optarg, &v) || v > 4096;
            opts.threads = (int)v;
            break;
        case O_SEED:
            bad = tool_parse_i64(optarg, &v);
            seed = (uint64_t)v;
            break;
        case 'v': opts.verbose = 1; break;
        case O_JSON: json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "flashattn check: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "flashattn check: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    cJSON *doc = NULL;
    if (json) {
        doc = check_json_begin(full, opts.backend, seed, filter, opts.threads,
                               fwd && bwd ? "both" : fwd ? "fwd" : "bwd");
        if (!doc) {
            fprintf(stderr, "flashattn check: out of memory\n");
            return 1;
        }
    } else {
        printf("flashattn check %s (%s, %s backend, seed %llu)\n", fa_version(),
               full ? "full" : "quick", opts.backend == FA_BACKEND_CUDA ? "cuda" : "cpu",
               (unsigned long long)seed);
        printf("per output: kernel max error / allowed (2x the same-precision plain baseline's "
               "+ slack), both vs float64;\n+D: testkit also allows the fp32 noise of the "
               "backward's D_i term there (not shown)\n");
    }
    double t0 = tool_now();
    tally t = {0, 0, 0};
    size_t n;
    const tk_case *cases;
    if (fwd) {
        cases = tk_fwd_cases(&n);
        run_list("fwd", cases, n, full, filter, &opts, seed, &t, doc);
    }
    if (bwd) {
        cases = tk_bwd_cases(&n);
        run_list("bwd", cases, n, full, filter, &opts, seed, &t, doc);
    }
    if (full) {
        cases = check_large_cases(&n);
        for (size_t i = 0; i < n; i++)
            if ((cases[i].bwd && bwd) || (!cases[i].bwd && fwd))
                run_list(cases[i].bwd ? "bwd" : "fwd", &cases[i], 1, 1, filter, &opts, seed, &t,
                         doc);
    }
    if (json) {
        if (check_json_end(doc, t.pass, t.fail, t.skip, tool_now() - t0) != 0) return 1;
    } else {
        char ts[24];
        printf("\n%d passed, %d failed, %d skipped in %s (seed %llu; repeat with --seed %llu)\n",
               t.pass, t.fail, t.skip, tool_fmt_seconds(ts, sizeof ts, tool_now() - t0),
               (unsigned long long)seed, (unsigned long long)seed);
    }
    if (t.pass + t.fail == 0) {
        fprintf(stderr, "flashattn check: no case ran\n");
        return 1;
    }
    return t.fail ? 1 : 0;
}
