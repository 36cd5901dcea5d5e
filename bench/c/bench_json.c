/*
 * bench_json.c — `flashattn bench --json`: every row plus enough about the machine and build
 * to compare two result files later (version, CPU features, threads, kernels, FMA peak, the
 * GPU). Row keys are shared with bench/peers.py, which times PyTorch on the same sweep, so
 * that bench/table.py can join the two files on (op, dtype, batch, heads, head_dim, seqlens,
 * causal). The decode sweep's file (bench_write_decode_json) shares its row keys with
 * bench/peers_decode.py in the same way and adds the copy bandwidth it is judged against.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"

static cJSON *gpu_json(void) {
    bench_gpu g;
    char err[256];
    if (bench_gpu_info(&g, err, sizeof err) != 0) return cJSON_CreateString(err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", g.name);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", g.cc_major, g.cc_minor);
    cJSON_AddStringToObject(o, "compute_capability", cc);
    cJSON_AddNumberToObject(o, "sms", g.sms);
    cJSON_AddNumberToObject(o, "l2_bytes", (double)g.l2_bytes);
    cJSON_AddNumberToObject(o, "memory_bytes", (double)g.mem_bytes);
    cJSON_AddNumberToObject(o, "driver_version", g.driver_version);
    cJSON_AddNumberToObject(o, "runtime_version", g.runtime_version);
    return o;
}

static cJSON *machine_json(const bench_cfg *cfg, const bench_peaks *pk, const double load[2]) {
    cJSON *m = cJSON_CreateObject();
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    cJSON_AddStringToObject(m, "hostname", host);
    cJSON_AddStringToObject(m, "flashattn_version", fa_version());
    cJSON_AddStringToObject(m, "cpu_features", fa_cpu_features());
    cJSON_AddBoolToObject(m, "has_cuda", fa_has_cuda());
    cJSON_AddNumberToObject(m, "cpus_available", tool_online_cpus());
    if (cfg->backend == FA_BACKEND_CUDA) {
        cJSON *g = gpu_json();
        cJSON_AddItemToObject(m, "gpu", g);
        /* the name peers.py writes too, so one key names the device in either file */
        if (cJSON_IsObject(g))
            cJSON_AddStringToObject(m, "device", cJSON_GetObjectItem(g, "name")->valuestring);
    }
    cJSON *kernels = cJSON_AddArrayToObject(m, "kernels");
    for (int i = 0; i < fa_kernel_count(); i++) {
        const char *name = fa_kernel_name(i);
        cJSON_AddItemToArray(kernels, cJSON_CreateString(name ? name : ""));
    }
    cJSON_AddNumberToObject(m, "loadavg_start", load[0]);
    cJSON_AddNumberToObject(m, "loadavg_end", load[1]);
    cJSON *peaks = cJSON_AddArrayToObject(m, "fma_peak");
    for (int i = 0; i < pk->n; i++) {
        if (pk->gflops[i] <= 0) continue;
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "isa", pk->isa);
        cJSON_AddNumberToObject(p, "threads", pk->threads[i]);
        cJSON_AddNumberToObject(p, "gflops", pk->gflops[i]);
        cJSON_AddItemToArray(peaks, p);
    }
    return m;
}

static cJSON *config_json(const bench_cfg *cfg) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "backend", cfg->backend == FA_BACKEND_CUDA ? "cuda" : "cpu");
    cJSON_AddNumberToObject(c, "warmup", cfg->warmup);
    cJSON_AddNumberToObject(c, "reps", cfg->reps);
    cJSON_AddNumberToObject(c, "min_time_s", cfg->min_time);
    cJSON_AddNumberToObject(c, "max_time_s", cfg->max_time);
    cJSON_AddNumberToObject(c, "pause_s", cfg->pause);
    cJSON_AddNumberToObject(c, "rotate_bytes",
                            cfg->rotate_bytes == (size_t)-1 ? -1 : (double)cfg->rotate_bytes);
    cJSON_AddNumberToObject(c, "tokens", (double)cfg->tokens);
    cJSON_AddNumberToObject(c, "model_dim", (double)cfg->model_dim);
    if (cfg->nvarlen) {
        cJSON *lens = cJSON_AddArrayToObject(c, "varlen_lens");
        for (int i = 0; lens && i < cfg->nvarlen; i++)
            cJSON_AddItemToArray(lens, cJSON_CreateNumber((double)cfg->varlen[i]));
    }
    char seed[32]; /* a string: JSON numbers are doubles and a seed may need 64 bits */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)cfg->seed);
    cJSON_AddStringToObject(c, "seed", seed);
    cJSON_AddStringToObject(c, "flops_rule",
                            "fwd 4*B*H*d per visible (query, key) pair, causal square = half; "
                            "bwd 2.5x fwd");
    cJSON_AddStringToObject(c, "time_rule",
                            cfg->backend == FA_BACKEND_CUDA
                                ? "median over calls of CUDA event pairs around each call, "
                                  "after warm-up calls, inputs rotated over sets"
                                : "median over calls of the wall clock around each call, after "
                                  "warm-up calls");
    cJSON_AddStringToObject(c, "inputs", "standard normal");
    return c;
}

static const char *mask_name(const bench_row *r) {
    if (r->window_left >= 0 || (r->window_right >= 0 && !r->causal)) return "window";
    return r->causal ? "causal" : "none";
}

static cJSON *row_json(const bench_row *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "impl", "ours");
    cJSON_AddStringToObject(o, "op", r->op);
    cJSON_AddStringToObject(o, "dtype", fa_dtype_name(r->dtype));
    cJSON_AddNumberToObject(o, "batch", (double)r->batch);
    cJSON_AddNumberToObject(o, "heads_q", (double)r->heads);
    cJSON_AddNumberToObject(o, "heads_kv", (double)r->heads_kv);
    cJSON_AddNumberToObject(o, "head_dim", (double)r->head_dim);
    cJSON_AddNumberToObject(o, "seqlen_q", (double)r->seqlen_q);
    cJSON_AddNumberToObject(o, "seqlen_k", (double)r->seqlen_k);
    cJSON_AddBoolToObject(o, "causal", r->causal);
    cJSON_AddBoolToObject(o, "varlen", r->varlen);
    cJSON_AddStringToObject(o, "mask", mask_name(r));
    cJSON_AddNumberToObject(o, "window_left", (double)r->window_left);
    cJSON_AddNumberToObject(o, "window_right", (double)r->window_right);
    cJSON_AddNumberToObject(o, "threads_requested", r->threads_asked);
    cJSON_AddStringToObject(o, "status", fa_status_string((fa_status)r->status));
    if (r->status != FA_OK) {
        cJSON_AddStringToObject(o, "error", r->error);
        return o;
    }
    cJSON_AddNumberToObject(o, "threads", r->threads);
    cJSON_AddNumberToObject(o, "reps", r->reps);
    cJSON_AddNumberToObject(o, "sets", r->sets);
    cJSON_AddNumberToObject(o, "median_s", r->median_s);
    cJSON_AddNumberToObject(o, "min_s", r->min_s);
    cJSON_AddNumberToObject(o, "max_s", r->max_s);
    cJSON_AddNumberToObject(o, "span_mean_s", r->span_mean_s);
    cJSON_AddNumberToObject(o, "flops", r->flops);
    cJSON_AddNumberToObject(o, "gflops", r->gflops);
    cJSON_AddNumberToObject(o, "tflops", r->gflops * 1e-3);
    if (r->peak_gflops > 0) {
        cJSON_AddNumberToObject(o, "peak_gflops", r->peak_gflops);
        cJSON_AddNumberToObject(o, "fraction_of_peak", r->gflops / r->peak_gflops);
    }
    cJSON_AddStringToObject(o, "kernel", r->kernel);
    cJSON_AddNumberToObject(o, "tile_q", r->tile_q);
    cJSON_AddNumberToObject(o, "tile_k", r->tile_k);
    cJSON_AddNumberToObject(o, "num_splits", r->num_splits);
    cJSON_AddNumberToObject(o, "workspace_bytes", (double)r->workspace_bytes);
    cJSON_AddStringToObject(o, "reason", r->reason);
    return o;
}

static cJSON *new_root(const char *fatal) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(root, "tool", "flashattn bench");
    cJSON_AddStringToObject(root, "date", when);
    if (fatal) cJSON_AddStringToObject(root, "error", fatal);
    return root;
}

static int write_root(const char *path, cJSON *root) {
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "flashattn bench: cannot render JSON\n");
        return -1;
    }
    /* written beside and renamed over, so a run killed mid-write leaves the previous file */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        perror(path);
        remove(tmp);
        return -1;
    }
    return 0;
}

int bench_write_json(const char *path, const bench_cfg *cfg, const bench_row *rows, int nrows,
                     const bench_peaks *peaks, const double load[2], const char *fatal) {
    cJSON *root = new_root(fatal);
    if (!root) return -1;
    cJSON_AddItemToObject(root, "machine", machine_json(cfg, peaks, load));
    cJSON_AddItemToObject(root, "config", config_json(cfg));
    cJSON *arr = cJSON_AddArrayToObject(root, "rows");
    for (int i = 0; i < nrows; i++) cJSON_AddItemToArray(arr, row_json(&rows[i]));
    return write_root(path, root);
}

/* ---- the decode sweep: keys shared with bench/peers_decode.py ---- */

static cJSON *decode_config_json(const bench_cfg *cfg) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "mode", "decode");
    cJSON_AddStringToObject(c, "backend", cfg->backend == FA_BACKEND_CUDA ? "cuda" : "cpu");
    cJSON_AddNumberToObject(c, "warmup", cfg->warmup);
    cJSON_AddNumberToObject(c, "reps", cfg->reps);
    cJSON_AddNumberToObject(c, "min_time_s", cfg->min_time);
    cJSON_AddNumberToObject(c, "max_time_s", cfg->max_time);
    cJSON_AddNumberToObject(c, "rotate_bytes",
                            cfg->rotate_bytes == (size_t)-1 ? -1 : (double)cfg->rotate_bytes);
    cJSON_AddNumberToObject(c, "page_size", (double)cfg->dec.page_size);
    cJSON_AddNumberToObject(c, "num_splits_requested", cfg->dec.splits);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)cfg->seed);
    cJSON_AddStringToObject(c, "seed", seed);
    cJSON_AddStringToObject(c, "kv_bytes_rule", "2 * batch * cache_len * heads_kv * head_dim * "
                                                "element size (K and V read once per call)");
    cJSON_AddStringToObject(c, "time_rule",
                            cfg->backend == FA_BACKEND_CUDA
                                ? "median over calls of CUDA event pairs around each call, after "
                                  "warm-up calls, cache sets rotated; loop_s: the same number of "
                                  "calls back to back between one pair of events, per call"
                                : "median over calls of the wall clock around each call, after "
                                  "warm-up calls; loop_s: the same number of calls back to back");
    cJSON_AddStringToObject(c, "copy_rule", cfg->backend == FA_BACKEND_CUDA
                                                ? "cudaMemcpyAsync device to device, "
                                                  "2 * bytes / median time (read + write)"
                                                : "memmove in host memory, 2 * bytes / median "
                                                  "time (read + write)");
    cJSON_AddStringToObject(c, "inputs", "standard normal (cache, q); cache full: seqlens = "
                                         "cache_len; paged: pages of the pool in a random "
                                         "permutation");
    return c;
}

static cJSON *copy_json(const bench_copy *cp) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bytes", (double)cp->bytes);
    cJSON_AddNumberToObject(o, "reps", cp->reps);
    if (cp->start_s > 0) {
        cJSON_AddNumberToObject(o, "start_median_s", cp->start_s);
        cJSON_AddNumberToObject(o, "start_bytes_per_s", cp->start_bps);
    }
    if (cp->end_s > 0) {
        cJSON_AddNumberToObject(o, "end_median_s", cp->end_s);
        cJSON_AddNumberToObject(o, "end_bytes_per_s", cp->end_bps);
    }
    if (cp->bps > 0) {
        cJSON_AddNumberToObject(o, "bytes_per_s", cp->bps);
        cJSON_AddNumberToObject(o, "tbps", cp->bps * 1e-12);
    }
    if (cp->read_bps > 0) { /* CPU: the multithreaded read of host memory (host_read.c) */
        cJSON_AddNumberToObject(o, "read_start_bytes_per_s", cp->read_start_bps);
        cJSON_AddNumberToObject(o, "read_end_bytes_per_s", cp->read_end_bps);
        cJSON_AddNumberToObject(o, "read_bytes_per_s", cp->read_bps);
    }
    return o;
}

static cJSON *decode_row_json(const bench_decode_row *r, const bench_copy *copy) {
    const double copy_bps = copy->bps;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "impl", "ours");
    cJSON_AddStringToObject(o, "op", "decode");
    cJSON_AddStringToObject(o, "dtype", fa_dtype_name(r->dtype));
    cJSON_AddNumberToObject(o, "batch", (double)r->batch);
    cJSON_AddNumberToObject(o, "heads_q", (double)r->heads);
    cJSON_AddNumberToObject(o, "heads_kv", (double)r->heads_kv);
    cJSON_AddNumberToObject(o, "head_dim", (double)r->head_dim);
    cJSON_AddNumberToObject(o, "seqlen_q", (double)r->seqlen_q);
    cJSON_AddNumberToObject(o, "seqlen_k", (double)r->cache_len);
    cJSON_AddBoolToObject(o, "causal", r->causal);
    cJSON_AddStringToObject(o, "cache", r->paged ? "paged" : "contiguous");
    cJSON_AddNumberToObject(o, "page_size", (double)r->page_size);
    cJSON_AddBoolToObject(o, "device_checks", r->checks);
    cJSON_AddNumberToObject(o, "kv_bytes", r->kv_bytes);
    cJSON_AddNumberToObject(o, "sets", r->sets);
    cJSON_AddStringToObject(o, "status", fa_status_string((fa_status)r->status));
    if (r->status != FA_OK) {
        cJSON_AddStringToObject(o, "error", r->error);
        return o;
    }
    cJSON_AddNumberToObject(o, "reps", r->reps);
    cJSON_AddNumberToObject(o, "median_s", r->median_s);
    cJSON_AddNumberToObject(o, "min_s", r->min_s);
    cJSON_AddNumberToObject(o, "max_s", r->max_s);
    cJSON_AddNumberToObject(o, "span_mean_s", r->span_mean_s);
    cJSON_AddNumberToObject(o, "loop_s", r->loop_s);
    cJSON_AddNumberToObject(o, "host_loop_s", r->host_loop_s);
    double bps = r->kv_bytes / r->median_s;
    cJSON_AddNumberToObject(o, "kv_bytes_per_s", bps);
    cJSON_AddNumberToObject(o, "kv_tbps", bps * 1e-12);
    if (copy_bps > 0) cJSON_AddNumberToObject(o, "fraction_of_copy", bps / copy_bps);
    if (copy->read_bps > 0) cJSON_AddNumberToObject(o, "fraction_of_read", bps / copy->read_bps);
    cJSON_AddStringToObject(o, "kernel", r->kernel);
    cJSON_AddNumberToObject(o, "num_splits", r->num_splits);
    cJSON_AddNumberToObject(o, "workspace_bytes", (double)r->workspace_bytes);
    cJSON_AddStringToObject(o, "reason", r->reason);
    return o;
}

int bench_write_decode_json(const char *path, const bench_cfg *cfg, const bench_decode_row *rows,
                            int nrows, const bench_copy *copy, const double load[2],
                            const char *fatal) {
    cJSON *root = new_root(fatal);
    if (!root) return -1;
    bench_peaks none = {.n = 0, .isa = "none"};
    cJSON_AddItemToObject(root, "machine", machine_json(cfg, &none, load));
    cJSON_AddItemToObject(root, "config", decode_config_json(cfg));
    cJSON_AddItemToObject(root, "copy", copy_json(copy));
    cJSON *arr = cJSON_AddArrayToObject(root, "rows");
    for (int i = 0; i < nrows; i++) cJSON_AddItemToArray(arr, decode_row_json(&rows[i], copy));
    return write_root(path, root);
}
