/*
 * bench.h — pieces of `flashattn bench`: device buffers (bench_device.c), FLOP counting
 * (bench_flops.c), the measured FMA peak (fma_peak.c), the prefill sweep (bench_run.c), the
 * decode sweep against a KV cache (bench_decode.c), JSON output (bench_json.c) and the options
 * (cmd_bench.c).
 */
#ifndef FA_TOOL_BENCH_H
#define FA_TOOL_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define BENCH_MAX_LIST 32
#define BENCH_MAX_VARLEN 512

typedef struct bench_cfg {
    fa_backend backend;          /* FA_BACKEND_CPU or FA_BACKEND_CUDA */
    int64_t batch, heads, heads_kv;
    /* > 0: derive the shape per configuration instead, as the FlashAttention papers do:
       batch = tokens / seqlen_k, heads = heads_kv = model_dim / head_dim */
    int64_t tokens, model_dim;
    int64_t head_dims[BENCH_MAX_LIST];
    int n_head_dims;
    int64_t seqlens[BENCH_MAX_LIST];
    int nseq;
    int64_t seqlen_q;            /* 0: seqlen_q = seqlen_k = each entry of seqlens */
    fa_dtype dtypes[4];
    int ndtypes;
    int64_t threads[BENCH_MAX_LIST]; /* 0: the library's default */
    int nthreads;
    int masks[2];                /* causal flag of each mask in the sweep (0 none, 1 causal) */
    int nmasks;
    int64_t window_left, window_right;
    int fwd, bwd;
    int warmup;
    int reps;                    /* at least this many timed calls ... */
    double min_time;             /* ... and at least this many seconds of them (0: no floor) */
    double max_time;             /* but stop adding calls past this many seconds (0: no cap) */
    /* Seconds the device idles before each row's warm-up (--pause): every row then starts
       from the same idle clock, whatever the row before drew (bench/peers.py does the same,
       so that both sides' rows start alike). */
    double pause;
    /* Input sets rotated between calls so that no call finds its operands in a cache the
       previous one warmed: at least 2 sets and this many bytes together; 0: one set. */
    size_t rotate_bytes;
    int measure_peak;
    uint64_t seed;
    const char *json_path;       /* rewritten after every row: a sweep cut short by a
                                    timeout still leaves the rows it finished */
    double load_start;           /* load average when the run began (for the JSON) */
    /* --varlen: one packed batch (THD tensors, cu_seqlens) of these sequence lengths instead
       of the seqlens sweep; queries and keys alike */
    int64_t varlen[BENCH_MAX_VARLEN];
    int nvarlen;
    /* --decode: fa_fwd_kvcache with one query token against a full cache of each length */
    int decode;
    struct {
        int64_t batches[BENCH_MAX_LIST];
        int nbatches;
        int64_t cache_lens[BENCH_MAX_LIST];
        int nlens;
        int contiguous, paged;   /* cache layouts in the sweep */
        int checks[2];           /* fa_context_set_device_checks value of each pass */
        int nchecks;
        int64_t page_size;
        int splits;              /* num_splits passed to fa_fwd_kvcache (0: the library's) */
        size_t copy_bytes;       /* size of the device-to-device copy measured */
    } dec;
} bench_cfg;

typedef struct bench_row {
    char op[8];                  /* "fwd" or "bwd" */
    fa_dtype dtype;
    int64_t batch, heads, heads_kv, head_dim, seqlen_q, seqlen_k;
    int causal;
    int varlen;                  /* a packed batch: batch sequences, seqlen_q/k the total */
    int64_t window_left, window_right;
    int threads_asked;           /* 0: library default */
    int threads;                 /* what the library used (fa_selection) */
    int reps;                    /* timed calls actually made */
    int sets;                    /* input sets rotated through */
    double median_s, min_s, max_s;
    double span_mean_s;          /* first start to last end, over reps */
    double flops;                /* per call */
    double gflops;               /* at the median time */
    double peak_gflops;          /* measured FMA peak for `threads` threads; 0 if unknown */
    char kernel[64];
    int tile_q, tile_k, num_splits;
    size_t workspace_bytes;
    char reason[192];
    int status;                  /* fa_status; rows that failed keep their error text */
    char error[512];
} bench_row;

/* ---- device buffers: the only place that knows where tensors live ---- */

typedef struct bench_buf {
    void *ptr;                   /* what goes into fa_tensor.data */
    size_t bytes;
    fa_device device;
} bench_buf;

/* 0 on success; on failure prints why and returns -1. */
int bench_buf_alloc(bench_buf *b, fa_device dev, size_t bytes);
/* Fills n elements with standard normal values wherever the buffer lives; the values depend
   only on the seed drawn from r (the work is split over threads in fixed chunks). */
int bench_buf_fill(bench_buf *b, fa_dtype dt, size_t n, tool_rng *r);
void bench_buf_free(bench_buf *b);
/* Copies host bytes into the buffer at byte offset off (host memory or device memory). */
int bench_buf_upload(bench_buf *b, size_t off, const void *host, size_t bytes);
/* Copies bytes within the device (or host) memory of the buffers, queued on the stream the
   timer's events go on (a device-to-device cudaMemcpyAsync on CUDA); 0 or -1 (printed). */
int bench_buf_copy(bench_buf *dst, size_t dst_off, const bench_buf *src, size_t src_off,
                   size_t bytes);
/* Fills n elements with normal values like bench_buf_fill, but draws only the first
   min(n, 32 Mi) of them and fills the rest with copies of windows of that start at varying
   offsets, made where the buffer lives: tens of gigabytes of cache would otherwise take
   minutes to draw and upload. The values stay random (never zero) and not periodic. */
int bench_buf_fill_large(bench_buf *b, fa_dtype dt, size_t n, tool_rng *r);
/* Waits until queued device work is done, so wall-clock timing is honest. */
int bench_device_sync(fa_device dev);

/* The GPU the CUDA backend runs on (device 0 of this process). */
typedef struct bench_gpu {
    char name[256];
    int cc_major, cc_minor, sms;
    size_t l2_bytes, mem_bytes;
    int driver_version, runtime_version; /* 1000 * major + 10 * minor */
} bench_gpu;
/* 0 and *g filled, or -1 (no CUDA support in this tool, or no device) with why in err. */
int bench_gpu_info(bench_gpu *g, char *err, size_t len);

/* Per-call timing: on the CPU a wall clock around each call (calls return when done); on
   CUDA a pair of events around each call, read once all calls are queued, so the host never
   waits between calls and launch gaps stay out of the numbers. */
typedef struct bench_timer bench_timer;
/* NULL when events cannot be created (the error is printed). */
bench_timer *bench_timer_create(fa_device dev, int max_calls);
void bench_timer_start(bench_timer *t, int i);
void bench_timer_stop(bench_timer *t, int i);
/* Waits for calls 0..n-1 and stores their durations in seconds, and in *span the time from
   the start of the first to the end of the last over n (which exceeds the median when the
   host cannot queue calls as fast as the device runs them); 0, or -1 with the device's error
   text in err (a failed kernel surfaces here). */
int bench_timer_read(bench_timer *t, int n, double *seconds, double *span, char *err,
                     size_t len);
void bench_timer_destroy(bench_timer *t);

/* ---- FLOPs ---- */

/* Query/key pairs a mask leaves visible for one (batch, head): the exact area, computed with
   the library's bottom-right rule. */
double bench_visible_pairs(int64_t sq, int64_t sk, int causal, int64_t wl, int64_t wr);
/* Forward FLOPs: 4*B*H*d per visible pair; a plain causal square counts as half the matrix
   (the usual convention), windows and non-square causal count exactly. */
double bench_fwd_flops(int64_t b, int64_t h, int64_t d, int64_t sq, int64_t sk, int causal,
                       int64_t wl, int64_t wr);

/* ---- measured FMA peak (GFLOP/s) of `threads` threads; 0 when it cannot be measured ---- */
double bench_fma_peak(int threads, const char **isa);

/* ---- the sweep (bench_run.c) ---- */

/* Measured FMA peaks, one per thread count the sweep used. */
typedef struct bench_peaks {
    int threads[64];
    double gflops[64];
    int n;
    const char *isa;
} bench_peaks;

#define BENCH_MAX_REPS 1000

/* How many timed calls: at least cfg->reps and cfg->min_time seconds' worth, at most
   cfg->max_time seconds' worth (never fewer than 3), judged by the fastest warm-up (est). */
int bench_rep_count(const bench_cfg *cfg, double est);
/* Creates the context of cfg->backend; on CUDA also checks the device, settles an automatic
   cfg->rotate_bytes (4x the L2) and prints the device line. 0, or -1 with why in fatal. */
int bench_open_backend(bench_cfg *cfg, fa_context **ctx, char *fatal, size_t len);

/* Runs every configuration of cfg, printing a row each; *rows (malloc'd) gets them all.
   Settles cfg->rotate_bytes when it is (size_t)-1 (auto).
   Returns the number of failed configurations, or -1 when nothing could run (why in fatal). */
int bench_run(bench_cfg *cfg, bench_row **rows, int *nrows, bench_peaks *peaks,
              char *fatal, size_t fatal_len);

/* ---- the decode sweep (bench_decode.c) ---- */

typedef struct bench_decode_row {
    fa_dtype dtype;
    int64_t batch, heads, heads_kv, head_dim, seqlen_q, cache_len;
    int causal;
    int paged;                   /* 0 contiguous cache, 1 paged (shuffled page order) */
    int64_t page_size;
    int checks;                  /* fa_context_set_device_checks */
    int reps, sets;
    double median_s, min_s, max_s; /* CUDA events around each call (CPU: wall clock) */
    double span_mean_s;          /* first start to last end of the per-call timed calls, / reps */
    double loop_s;               /* `reps` calls back to back between one pair of events, / reps */
    double host_loop_s;          /* host wall clock to issue those calls, / reps */
    double kv_bytes;             /* K and V bytes one call reads: 2 * B * len * Hkv * d * size */
    char kernel[64];
    int num_splits;
    size_t workspace_bytes;
    char reason[192];
    int status;
    char error[512];
} bench_decode_row;

/* Device copy bandwidth (read + write bytes over the median time of a device-to-device copy),
   measured before and after the sweep; the reference is the higher of the two. */
typedef struct bench_copy {
    size_t bytes;
    int reps;
    double start_s, end_s;       /* median seconds of one copy; 0 if not measured */
    double start_bps, end_bps;   /* 2 * bytes / median */
    double bps;                  /* max(start_bps, end_bps) */
    /* CPU only: bytes per second of a multithreaded read of the copy's source (host_read.c),
       before and after the sweep, and the higher of the two; 0 if not measured */
    double read_start_bps, read_end_bps, read_bps;
} bench_copy;

/* host_read.c: bytes per second of reading `bytes` of host memory at buf on `threads`
   threads (0: all), the median of reps (<= 16) timed reads after one untimed one. */
double bench_host_read_bps(const void *buf, size_t bytes, int threads, int reps,
                           double *median_s);

/* Runs the decode sweep of cfg->dec, printing a row each; *rows (malloc'd) gets them all.
   Returns the number of failed rows, or -1 when nothing could run (why in fatal). */
int bench_decode_run(bench_cfg *cfg, bench_decode_row **rows, int *nrows, bench_copy *copy,
                     char *fatal, size_t fatal_len);

/* ---- JSON (cJSON) ---- */
/* Writes cfg, the machine (version, CPU features, kernels, measured peaks, load average at
   the start and the end, the GPU on the CUDA backend) and every row; 0 on success, else
   prints why and returns -1;
   fatal, when not NULL, says why nothing ran (the rows are then empty). */
int bench_write_json(const char *path, const bench_cfg *cfg, const bench_row *rows, int nrows,
                     const bench_peaks *peaks, const double load[2], const char *fatal);

/* The decode sweep's file: like bench_write_json, with the copy bandwidth and decode rows. */
int bench_write_decode_json(const char *path, const bench_cfg *cfg, const bench_decode_row *rows,
                            int nrows, const bench_copy *copy, const double load[2],
                            const char *fatal);

/* `--tiny` (bench_tiny.c): the median latency of tiny CPU calls (fwd, bwd, fwd_kvcache),
   each call timed alone, with the threads the library recorded; 0, or 1 if a call failed. */
int bench_tiny_run(const bench_cfg *cfg);

#endif /* FA_TOOL_BENCH_H */
