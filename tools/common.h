/*
 * common.h — small helpers every subcommand of the `flashattn` tool shares: reporting library
 * errors, aligned input buffers filled with reproducible random numbers, parsing of sizes and
 * lists on the command line, and formatting of bytes and times.
 */
#ifndef FA_TOOL_COMMON_H
#define FA_TOOL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

/* Each subcommand: argc/argv start at the subcommand's own name (argv[0] = "demo"). */
int cmd_info(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "flashattn <what>: <status string>: <fa_last_error(ctx)>" to stderr and returns
   st, so call sites can write `return tool_fail(...)`. ctx may be NULL. */
fa_status tool_fail(const fa_context *ctx, fa_status st, const char *what);

/* Input memory: 64-byte aligned (posix_memalign), NULL on failure. Free with free(). */
void *tool_alloc(size_t bytes);

/* Reproducible random stream (splitmix64): the same seed gives the same inputs in every
   process, which lets two forked children run two algorithms on identical data. */
typedef struct tool_rng {
    uint64_t state;
} tool_rng;
tool_rng tool_rng_seed(uint64_t seed);
/* 64 random bits (to seed further streams). */
uint64_t tool_rng_u64(tool_rng *r);
/* Uniform in [-1, 1), never exactly zero so no buffer can pass for "never written". */
float tool_rng_uniform(tool_rng *r);

/* Fills n elements of dtype dt with uniform values in [-1, 1) (rounded to the dtype). */
void tool_fill_random(void *data, fa_dtype dt, size_t n, tool_rng *r);
/* Fills n elements with standard normal values (Box-Muller), rounded to the dtype: what
   benchmarks of attention conventionally feed (torch.randn). */
void tool_fill_normal(void *data, fa_dtype dt, size_t n, tool_rng *r);
/* Element i of a buffer of dtype dt, as double (f32, f16, bf16, f64). */
double tool_load(const void *data, fa_dtype dt, size_t i);

/* Stores v as element i of a buffer of dtype dt, rounded to nearest even. */
void tool_store(void *data, fa_dtype dt, size_t i, double v);
/* Parses "f32", "f16", "bf16" (and "f64"); returns 0 on success. */
int tool_parse_dtype(const char *s, fa_dtype *dt);
/* Parses a byte count with an optional K/M/G/T suffix (binary units, "4G", "512M", "1.5G"). */
int tool_parse_bytes(const char *s, size_t *bytes);
/* Parses a non-negative integer that fits an int64 ("16384", "1k" is not accepted). */
int tool_parse_i64(const char *s, int64_t *v);
/* Parses a comma separated list of positive integers, or "A..B" (doubling from A to B).
   At most max values; returns the count, or -1 on a syntax error. */
int tool_parse_list(const char *s, int64_t *out, int max);

/* "12.3 MiB" style formatting into buf (returns buf). */
const char *tool_fmt_bytes(char *buf, size_t len, double bytes);
/* "12.3 ms" / "4.56 s" style formatting into buf (returns buf). */
const char *tool_fmt_seconds(char *buf, size_t len, double seconds);

/* Monotonic clock in seconds. */
double tool_now(void);
/* Sleeps s seconds (s <= 0: returns at once). */
void tool_sleep(double s);
/* Median of n values (sorts v in place). */
double tool_median(double *v, int n);

/* CPUs this process may run on (its affinity mask), else the online count. */
int tool_online_cpus(void);
/* One-minute load average (-1 if unknown): on a shared machine, the first thing to look at
   when timings disagree. */
double tool_loadavg(void);

#endif /* FA_TOOL_COMMON_H */
