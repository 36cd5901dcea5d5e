/*
 * cmd_bench.c — `flashattn bench`: options, then the sweep (bench_run.c), the measured FMA
 * peak every CPU GFLOP/s figure is set against (absolute numbers on shared machines drift), and
 * the JSON file. Tensors are reached only through bench_buf and timed only through
 * bench_timer, so `--backend cuda` changes where they live and how calls are timed, nothing
 * else. `--sweep` is the shape sweep of the FlashAttention papers, which bench/peers.py runs
 * through PyTorch with the same JSON keys so that bench/table.py can join the two. `--decode`
 * is the decoding sweep of fa_fwd_kvcache (bench_decode.c), whose peer is
 * bench/peers_decode.py and whose table is bench/table_decode.py.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: flashattn bench [options]\n"
            "\n"
            "Times attention forward and backward over a sweep of shapes and prints GFLOP/s\n"
            "(TFLOP/s on CUDA) with forward 4*B*H*Nq*Nk*d, half for causal, the exact visible\n"
            "area for windows, backward 2.5x forward; on the CPU against the fp32 FMA peak\n"
            "measured in the same run. Inputs are normal random values; each configuration\n"
            "gets warm-up calls, then the median of its timed calls (CUDA: events per call).\n"
            "\n"
            "  --backend B        cpu (default) or cuda\n"
            "  --sweep            the FlashAttention benchmark: bf16, --tokens 16384,\n"
            "                     --model-dim 2048, --head-dim 64,128,256, --seqlens\n"
            "                     512..16384, --masks none,causal, --op both (options after\n"
            "                     it override)\n"
            "  --cpu              the CPU benchmark (issue 6; bench/cpu_vs_torch.py runs\n"
            "                     the same shapes through PyTorch): backend cpu, --batch 1\n"
            "                     --heads 8, --head-dim 64,128, --seqlens 512,2048,8192,\n"
            "                     --masks none,causal, --dtype f32,bf16, --op both (options\n"
            "                     after it override; FLASHATTN_CPU_ISA forces a level)\n"
            "  --batch B          batch size (default 1)\n"
            "  --heads H          query heads (default 8)\n"
            "  --heads-kv H       key/value heads (default: --heads; fewer is GQA/MQA)\n"
            "  --tokens T         batch = T / seqlen for each seqlen (overrides --batch)\n"
            "  --model-dim M      heads = M / head dim for each head dim (overrides --heads;\n"
            "                     --heads alone overrides --sweep's model dim)\n"
            "  --head-dim LIST    head dimensions (default 64)\n"
            "  --seqlens LIST     key lengths, comma list or A..B doubling (default 512..4096)\n"
            "  --seqlen-q N       fix the query length (default: equal to the key length)\n"
            "  --varlen LIST      one packed batch (THD tensors, cu_seqlens) of these sequence\n"
            "                     lengths instead of --seqlens (bench/varlen_lengths.py draws a\n"
            "                     long-tailed list); FLOPs summed per sequence\n"
            "  --dtype LIST       f32, f16, bf16 (default f32)\n"
            "  --causal           causal mask (same as --masks causal)\n"
            "  --masks LIST       none, causal or both: none,causal (default none)\n"
            "  --window L,R       sliding window (-1 unbounded)\n"
            "  --threads LIST     CPU worker threads (default 0: all cores)\n"
            "  --op OP            fwd, bwd or both (default both)\n"
            "  --warmup N         untimed calls first (default 1; cuda 3)\n"
            "  --reps N           at least N timed calls (default 5; cuda 20)\n"
            "  --min-time S       and at least S seconds of them (default 0; cuda 0.2)\n"
            "  --max-time S       but no more calls than fit in S seconds, at least 3\n"
            "                     (default 0: no cap; cuda 2)\n"
            "  --pause S          the device idles S seconds before each row (default 0)\n"
            "  --rotate BYTES     rotate between input sets of at least BYTES together, at\n"
            "                     least 2 sets; 0 uses one set (default 0; cuda 4x the L2)\n"
            "  --no-peak          skip the FMA peak measurement\n"
            "  --tiny             only the latency of tiny CPU calls: a 1x1x1x8 fwd, bwd and\n"
            "                     fwd_kvcache, and a small model's decode step, the median\n"
            "                     of 2000 calls each timed alone (--threads N: the context's)\n"
            "  --seed N           input seed (default: fresh each run)\n"
            "  --json FILE        write every row and the machine description as JSON\n"
            "  -h, --help         this text\n"
            "\n"
            "Decoding (fa_fwd_kvcache, one query token per sequence against a full cache):\n"
            "  --decode           the decode sweep: backend cuda, bf16, --heads 32 --heads-kv 8\n"
            "                     --head-dim 128, causal, --batches 1,8,64, --cache-lens\n"
            "                     8192,32768,131072, contiguous and paged caches, device checks\n"
            "                     on and off (the other options above override it, wherever\n"
            "                     they stand; the prefill-only ones are refused). Prints the\n"
            "                     median time per call (events), the time per call of as many\n"
            "                     calls back to back, the K/V bytes read per second\n"
            "                     (2*B*len*Hkv*d*size / median) and their fraction of the\n"
            "                     device copy bandwidth measured before and after the sweep\n"
            "  --batches LIST     batch sizes (default 1,8,64)\n"
            "  --cache-lens LIST  tokens in each sequence's cache (default 8192,32768,131072)\n"
            "  --contiguous       only the contiguous cache [B, len, Hkv, d]\n"
            "  --paged            only the paged cache: pages of the pool in random order\n"
            "  --page-size N      tokens per page (default 256)\n"
            "  --checks WHICH     device checks of seqlens/block_table: on (synchronous, before\n"
            "                     the call), off (in the kernels: the library default) or both\n"
            "                     (default both)\n"
            "  --splits N         num_splits for fa_fwd_kvcache (default 0: the library's)\n"
            "  --copy-bytes B     size of the device-to-device copy measured (default 1G)\n");
}

static const char *opt_name(const struct option *opts, int val) {
    for (; opts->name; opts++)
        if (opts->val == val) return opts->name;
    return "?";
}

static int parse_list_opt(const char *s, int64_t *out, int *n) {
    *n = tool_parse_list(s, out, BENCH_MAX_LIST);
    return *n <= 0;
}

static int parse_seconds(const char *s, double *v) {
    char *end;
    *v = strtod(s, &end);
    return end == s || *end || !(*v >= 0) || *v > 3600;
}

static int parse_masks(const char *s, bench_cfg *cfg) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    cfg->nmasks = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int causal = strcmp(tok, "causal") == 0;
        if ((!causal && strcmp(tok, "none") != 0) || cfg->nmasks == 2) return 1;
        cfg->masks[cfg->nmasks++] = causal;
    }
    return cfg->nmasks == 0;
}

static void preset_decode(bench_cfg *cfg) {
    cfg->decode = 1;
    cfg->backend = FA_BACKEND_CUDA;
    cfg->dtypes[0] = FA_DTYPE_BF16;
    cfg->ndtypes = 1;
    cfg->heads = 32;
    cfg->heads_kv = 8;
    cfg->head_dims[0] = 128;
    cfg->n_head_dims = 1;
    cfg->dec.nbatches = tool_parse_list("1,8,64", cfg->dec.batches, BENCH_MAX_LIST);
    cfg->dec.nlens = tool_parse_list("8192,32768,131072", cfg->dec.cache_lens, BENCH_MAX_LIST);
    cfg->dec.contiguous = cfg->dec.paged = 1;
    cfg->dec.checks[0] = 1;
    cfg->dec.checks[1] = 0;
    cfg->dec.nchecks = 2;
    cfg->dec.page_size = 256;
    cfg->dec.splits = 0;
    cfg->dec.copy_bytes = (size_t)1 << 30;
}

static int parse_checks(const char *s, bench_cfg *cfg) {
    cfg->dec.checks[0] = strcmp(s, "off") != 0;
    cfg->dec.checks[1] = 0;
    cfg->dec.nchecks = strcmp(s, "both") == 0 ? 2 : 1;
    return strcmp(s, "on") != 0 && strcmp(s, "off") != 0 && strcmp(s, "both") != 0;
}

/* `flashattn bench --decode ...`: the sweep of bench_decode.c and its JSON. */
static int run_decode(bench_cfg *cfg) {
    int gpu = cfg->backend == FA_BACKEND_CUDA;
    double load0 = tool_loadavg();
    cfg->load_start = load0;
    printf("flashattn bench %s --decode: backend %s, warm-up %d, median of >= %d calls",
           fa_version(), gpu ? "cuda" : "cpu", cfg->warmup, cfg->reps);
    if (cfg->min_time > 0) printf(" and >= %g s", cfg->min_time);
    if (cfg->max_time > 0) printf(" (at most %g s)", cfg->max_time);
    printf(", seed %llu, load average %.2f on %d CPUs\n", (unsigned long long)cfg->seed, load0,
           tool_online_cpus());
    bench_decode_row *rows = NULL;
    int nrows = 0;
    bench_copy copy;
    char fatal[768] = "";
    int failed = bench_decode_run(cfg, &rows, &nrows, &copy, fatal, sizeof fatal);
    double load[2] = {load0, 0};
    if (failed < 0) {
        fflush(stdout);
        fprintf(stderr, "flashattn bench: %s; nothing was timed\n", fatal);
        load[1] = tool_loadavg();
        if (cfg->json_path &&
            bench_write_decode_json(cfg->json_path, cfg, NULL, 0, &copy, load, fatal) == 0)
            printf("wrote %s (no rows: %s)\n", cfg->json_path, fatal);
        return 1;
    }
    if (copy.bps > 0)
        printf("# reference copy bandwidth: %.3f %s (the higher of the two measurements)\n",
               copy.bps * (gpu ? 1e-12 : 1e-9), gpu ? "TB/s" : "GB/s");
    load[1] = tool_loadavg();
    if (cfg->json_path) {
        if (bench_write_decode_json(cfg->json_path, cfg, rows, nrows, &copy, load, NULL) != 0)
            failed++;
        else
            printf("wrote %s\n", cfg->json_path);
    }
    free(rows);
    return failed ? 1 : 0;
}

static void preset_sweep(bench_cfg *cfg) {
    cfg->dtypes[0] = FA_DTYPE_BF16;
    cfg->ndtypes = 1;
    cfg->tokens = 16384;
    cfg->model_dim = 2048;
    cfg->n_head_dims = tool_parse_list("64,128,256", cfg->head_dims, BENCH_MAX_LIST);
    cfg->nseq = tool_parse_list("512..16384", cfg->seqlens, BENCH_MAX_LIST);
    cfg->masks[0] = 0;
    cfg->masks[1] = 1;
    cfg->nmasks = 2;
    cfg->fwd = cfg->bwd = 1;
}

static void preset_cpu(bench_cfg *cfg) {
    cfg->backend = FA_BACKEND_CPU;
    cfg->batch = 1;
    cfg->heads = 8;
    cfg->tokens = cfg->model_dim = 0;
    cfg->dtypes[0] = FA_DTYPE_F32;
    cfg->dtypes[1] = FA_DTYPE_BF16;
    cfg->ndtypes = 2;
    cfg->n_head_dims = tool_parse_list("64,128", cfg->head_dims, BENCH_MAX_LIST);
    cfg->nseq = tool_parse_list("512,2048,8192", cfg->seqlens, BENCH_MAX_LIST);
    cfg->masks[0] = 0;
    cfg->masks[1] = 1;
    cfg->nmasks = 2;
    cfg->fwd = cfg->bwd = 1;
}

int cmd_bench(int argc, char **argv) {
    bench_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = FA_BACKEND_CPU;
    cfg.batch = 1;
    cfg.heads = 8;
    cfg.heads_kv = 0;
    cfg.head_dims[0] = 64;
    cfg.n_head_dims = 1;
    cfg.nseq = tool_parse_list("512..4096", cfg.seqlens, BENCH_MAX_LIST);
    cfg.dtypes[0] = FA_DTYPE_F32;
    cfg.ndtypes = 1;
    cfg.nthreads = 1; /* threads[0] = 0: library default */
    cfg.nmasks = 1;   /* masks[0] = 0: no mask */
    cfg.window_left = cfg.window_right = -1;
    cfg.fwd = cfg.bwd = 1;
    /* negative: the backend's default, settled once the backend is known */
    cfg.warmup = -1;
    cfg.reps = -1;
    cfg.min_time = cfg.max_time = -1;
    cfg.rotate_bytes = (size_t)-1;
    cfg.measure_peak = 1;
    cfg.seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();

    enum { O_BACKEND = 256, O_B, O_H, O_HKV, O_D, O_SEQ, O_SEQQ, O_DT, O_CAUSAL, O_WIN, O_THR,
           O_OP, O_WARM, O_REPS, O_NOPEAK, O_SEED, O_JSON, O_SWEEP, O_TOK, O_MDIM, O_MASKS,
           O_MINT, O_MAXT, O_PAUSE, O_ROT, O_DECODE, O_BATCHES, O_LENS, O_CONTIG, O_PAGED, O_PSIZE,
           O_CHECKS, O_SPLITS, O_COPY, O_CPU, O_TINY, O_VARLEN, O_END };
    /* options of one sweep only: refused in the other, rather than silently ignored */
    static const int prefill_only[] = {O_B, O_SEQ, O_SEQQ, O_CAUSAL, O_WIN, O_OP, O_SWEEP,
                                       O_TOK, O_MDIM, O_MASKS, O_NOPEAK, O_CPU, O_PAUSE, O_TINY,
                                       O_VARLEN};
    static const int decode_only[] = {O_BATCHES, O_LENS, O_CONTIG, O_PAGED, O_PSIZE, O_CHECKS,
                                      O_SPLITS, O_COPY};
    char seen[O_END] = {0};
    static const struct option opts[] = {
        {"backend", required_argument, 0, O_BACKEND}, {"batch", required_argument, 0, O_B},
        {"heads", required_argument, 0, O_H},         {"heads-kv", required_argument, 0, O_HKV},
        {"head-dim", required_argument, 0, O_D},      {"seqlens", required_argument, 0, O_SEQ},
        {"seqlen-q", required_argument, 0, O_SEQQ},   {"dtype", required_argument, 0, O_DT},
        {"causal", no_argument, 0, O_CAUSAL},         {"window", required_argument, 0, O_WIN},
        {"threads", required_argument, 0, O_THR},     {"op", required_argument, 0, O_OP},
        {"warmup", required_argument, 0, O_WARM},     {"reps", required_argument, 0, O_REPS},
        {"no-peak", no_argument, 0, O_NOPEAK},        {"seed", required_argument, 0, O_SEED},
        {"json", required_argument, 0, O_JSON},       {"help", no_argument, 0, 'h'},
        {"sweep", no_argument, 0, O_SWEEP},           {"tokens", required_argument, 0, O_TOK},
        {"model-dim", required_argument, 0, O_MDIM},  {"masks", required_argument, 0, O_MASKS},
        {"min-time", required_argument, 0, O_MINT},   {"max-time", required_argument, 0, O_MAXT},
        {"pause", required_argument, 0, O_PAUSE},
        {"rotate", required_argument, 0, O_ROT},
        {"decode", no_argument, 0, O_DECODE},         {"batches", required_argument, 0, O_BATCHES},
        {"cache-lens", required_argument, 0, O_LENS}, {"contiguous", no_argument, 0, O_CONTIG},
        {"paged", no_argument, 0, O_PAGED},           {"page-size", required_argument, 0, O_PSIZE},
        {"checks", required_argument, 0, O_CHECKS},   {"splits", required_argument, 0, O_SPLITS},
        {"copy-bytes", required_argument, 0, O_COPY},   {"cpu", no_argument, 0, O_CPU},
        {"tiny", no_argument, 0, O_TINY},             {"varlen", required_argument, 0, O_VARLEN},
        {0, 0, 0, 0}};
    /* --decode changes the defaults, so it is applied first, wherever it stands */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--decode") == 0) preset_decode(&cfg);
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int bad = 0;
        if (c >= O_BACKEND && c < O_END) seen[c] = 1;
        switch (c) {
        case O_BACKEND:
            if (strcmp(optarg, "cpu") == 0)
                cfg.backend = FA_BACKEND_CPU;
            else if (strcmp(optarg, "cuda") == 0)
                cfg.backend = FA_BACKEND_CUDA;
            else
                bad = 1;
            break;
        case O_B: bad = tool_parse_i64(optarg, &cfg.batch) || cfg.batch < 1; break;
        case O_H: bad = tool_parse_i64(optarg, &cfg.heads) || cfg.heads < 1; break;
        case O_HKV: bad = tool_parse_i64(optarg, &cfg.heads_kv) || cfg.heads_kv < 1; break;
        case O_D: bad = parse_list_opt(optarg, cfg.head_dims, &cfg.n_head_dims); break;
        case O_SEQ: bad = parse_list_opt(optarg, cfg.seqlens, &cfg.nseq); break;
        case O_VARLEN: {
            int64_t total = 0;
            cfg.nvarlen = tool_parse_list(optarg, cfg.varlen, BENCH_MAX_VARLEN);
            bad = cfg.nvarlen <= 0;
            for (int i = 0; !bad && i < cfg.nvarlen; i++) {
                total += cfg.varlen[i];
                bad = cfg.varlen[i] < 1 || total > INT32_MAX; /* cu_seqlens are int32 */
            }
            break;
        }
        case O_SEQQ: bad = tool_parse_i64(optarg, &cfg.seqlen_q) || cfg.seqlen_q < 1; break;
        case O_DT: {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", optarg);
            cfg.ndtypes = 0;
            for (char *tok = strtok(buf, ","); tok && !bad; tok = strtok(NULL, ",")) {
                if (cfg.ndtypes == 4) bad = 1;
                else bad = tool_parse_dtype(tok, &cfg.dtypes[cfg.ndtypes++]) ||
                           cfg.dtypes[cfg.ndtypes - 1] == FA_DTYPE_F64;
            }
            bad = bad || cfg.ndtypes == 0;
            break;
        }
        case O_CAUSAL:
            cfg.masks[0] = 1;
            cfg.nmasks = 1;
            break;
        case O_MASKS: bad = parse_masks(optarg, &cfg); break;
        case O_SWEEP: preset_sweep(&cfg); break;
        case O_CPU: preset_cpu(&cfg); break;
        case O_TOK: bad = tool_parse_i64(optarg, &cfg.tokens) || cfg.tokens < 1; break;
        case O_MDIM: bad = tool_parse_i64(optarg, &cfg.model_dim) || cfg.model_dim < 1; break;
        case O_MINT: bad = parse_seconds(optarg, &cfg.min_time); break;
        case O_MAXT: bad = parse_seconds(optarg, &cfg.max_time); break;
        case O_PAUSE: bad = parse_seconds(optarg, &cfg.pause); break;
        case O_ROT: bad = tool_parse_bytes(optarg, &cfg.rotate_bytes); break;
        case O_WIN: {
            long long l, r;
            char tail;
            bad = sscanf(optarg, "%lld,%lld%c", &l, &r, &tail) != 2 || l < -1 || r < -1;
            cfg.window_left = l;
            cfg.window_right = r;
            break;
        }
        case O_THR: {
            /* 0 is allowed here (library default), so parse by hand rather than as sizes */
            char buf[256];
            snprintf(buf, sizeof buf, "%s", optarg);
            cfg.nthreads = 0;
            for (char *tok = strtok(buf, ","); tok && !bad; tok = strtok(NULL, ",")) {
                bad = cfg.nthreads == BENCH_MAX_LIST || tool_parse_i64(tok, &v) || v > 4096;
                if (!bad) cfg.threads[cfg.nthreads++] = v;
            }
            bad = bad || cfg.nthreads == 0;
            break;
        }
        case O_OP:
            cfg.fwd = strcmp(optarg, "fwd") == 0 || strcmp(optarg, "both") == 0;
            cfg.bwd = strcmp(optarg, "bwd") == 0 || strcmp(optarg, "both") == 0;
            bad = !cfg.fwd && !cfg.bwd;
            break;
        case O_WARM:
            bad = tool_parse_i64(optarg, &v) || v > BENCH_MAX_REPS;
            cfg.warmup = (int)v;
            break;
        case O_REPS:
            bad = tool_parse_i64(optarg, &v) || v < 1 || v > BENCH_MAX_REPS;
            cfg.reps = (int)v;
            break;
        case O_NOPEAK: cfg.measure_peak = 0; break;
        case O_SEED:
            bad = tool_parse_i64(optarg, &v);
            cfg.seed = (uint64_t)v;
            break;
        case O_JSON: cfg.json_path = optarg; break;
        case O_DECODE: break; /* applied before the loop */
        case O_TINY: break;   /* acted on after the loop */
        case O_BATCHES: bad = parse_list_opt(optarg, cfg.dec.batches, &cfg.dec.nbatches); break;
        case O_LENS:
            bad = parse_list_opt(optarg, cfg.dec.cache_lens, &cfg.dec.nlens);
            for (int i = 0; !bad && i < cfg.dec.nlens; i++)
                bad = cfg.dec.cache_lens[i] > INT32_MAX; /* seqlens are int32 */
            break;
        case O_CONTIG: break; /* settled after the loop */
        case O_PAGED: break;
        case O_PSIZE:
            bad = tool_parse_i64(optarg, &cfg.dec.page_size) || cfg.dec.page_size < 1 ||
                  cfg.dec.page_size > (1 << 20);
            break;
        case O_CHECKS: bad = parse_checks(optarg, &cfg); break;
        case O_SPLITS:
            bad = tool_parse_i64(optarg, &v) || v > 4096;
            cfg.dec.splits = (int)v;
            break;
        case O_COPY:
            bad = tool_parse_bytes(optarg, &cfg.dec.copy_bytes) || cfg.dec.copy_bytes < 4096;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "flashattn bench: bad value '%s' for --%s\n", optarg,
                    opt_name(opts, c));
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "flashattn bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    const int *other = cfg.decode ? prefill_only : decode_only;
    int nother = cfg.decode ? (int)(sizeof prefill_only / sizeof *prefill_only)
                            : (int)(sizeof decode_only / sizeof *decode_only);
    for (int i = 0; i < nother; i++)
        if (seen[other[i]]) {
            fprintf(stderr, "flashattn bench: --%s %s\n", opt_name(opts, other[i]),
                    cfg.decode ? "does not apply to --decode" : "needs --decode");
            return 2;
        }
    if (cfg.nvarlen) {
        if (seen[O_SEQ] || seen[O_SEQQ] || seen[O_B] || seen[O_TOK]) {
            fprintf(stderr, "flashattn bench: --varlen gives the lengths; it takes no --seqlens, "
                            "--seqlen-q, --batch or --tokens\n");
            return 2;
        }
        int64_t total = 0;
        for (int i = 0; i < cfg.nvarlen; i++) total += cfg.varlen[i];
        cfg.seqlens[0] = total; /* one configuration: the packed batch */
        cfg.nseq = 1;
        cfg.seqlen_q = 0;
    }
    if (cfg.decode) {
        if (seen[O_CONTIG] || seen[O_PAGED]) {
            cfg.dec.contiguous = seen[O_CONTIG];
            cfg.dec.paged = seen[O_PAGED];
        }
        if (cfg.n_head_dims != 1 || cfg.ndtypes != 1 || cfg.nthreads != 1) {
            fprintf(stderr, "flashattn bench: --decode takes one head dim, one dtype and one "
                            "thread count\n");
            return 2;
        }
    }
    int gpu = cfg.backend == FA_BACKEND_CUDA;
    if (cfg.warmup < 0) cfg.warmup = gpu ? 3 : 1;
    if (cfg.reps < 0) cfg.reps = gpu ? 20 : 5;
    if (cfg.min_time < 0) cfg.min_time = gpu ? 0.2 : 0;
    if (cfg.max_time < 0) cfg.max_time = gpu ? 2.0 : 0;
    /* --heads given without --model-dim wins over a preset's model dim (--sweep --heads 32
       --heads-kv 8 is the GQA sweep) */
    if (seen[O_H] && !seen[O_MDIM]) cfg.model_dim = 0;
    if (!cfg.heads_kv) cfg.heads_kv = cfg.heads;
    if (cfg.heads % cfg.heads_kv) {
        fprintf(stderr, "flashattn bench: --heads %lld is not a multiple of --heads-kv %lld\n",
                (long long)cfg.heads, (long long)cfg.heads_kv);
        return 2;
    }

    if (cfg.decode) return run_decode(&cfg);
    if (seen[O_TINY]) {
        if (gpu) {
            fprintf(stderr, "flashattn bench: --tiny times the CPU backend only\n");
            return 2;
        }
        return bench_tiny_run(&cfg);
    }

    double load0 = tool_loadavg();
    cfg.load_start = load0;
    printf("flashattn bench %s: backend %s, warm-up %d, median of >= %d calls", fa_version(),
           gpu ? "cuda" : "cpu", cfg.warmup, cfg.reps);
    if (cfg.min_time > 0) printf(" and >= %g s", cfg.min_time);
    if (cfg.max_time > 0) printf(" (at most %g s)", cfg.max_time);
    if (cfg.pause > 0) printf(", %g s idle before each row", cfg.pause);
    printf(", seed %llu, load average %.2f on %d CPUs\n", (unsigned long long)cfg.seed, load0,
           tool_online_cpus());
    if (!gpu && load0 > 0.5 * tool_online_cpus())
        printf("note: other work is running; timings (and the FMA peak) will be low and "
               "noisy\n");
    bench_peaks pc = {.n = 0, .isa = "none"};
    bench_row *rows = NULL;
    int nrows = 0;
    char fatal[768] = "";
    int failed = bench_run(&cfg, &rows, &nrows, &pc, fatal, sizeof fatal);
    if (failed < 0) {
        fflush(stdout);
        fprintf(stderr, "flashattn bench: %s; nothing was timed\n", fatal);
        if (cfg.json_path) {
            double load[2] = {load0, tool_loadavg()};
            if (bench_write_json(cfg.json_path, &cfg, NULL, 0, &pc, load, fatal) == 0)
                printf("wrote %s (no rows: %s)\n", cfg.json_path, fatal);
        }
        return 1;
    }
    for (int i = 0; i < pc.n; i++)
        if (pc.gflops[i] > 0)
            printf("measured fp32 FMA peak (%s): %.1f GFLOP/s with %d threads\n", pc.isa,
                   pc.gflops[i], pc.threads[i]);
    if (cfg.json_path) {
        double load[2] = {load0, tool_loadavg()};
        if (bench_write_json(cfg.json_path, &cfg, rows, nrows, &pc, load, NULL) != 0)
            failed++;
        else
            printf("wrote %s\n", cfg.json_path);
    }
    free(rows);
    return failed ? 1 : 0;
}
