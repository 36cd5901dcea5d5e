/*
 * isolate.h — runs one measurement in a forked child process under an address-space limit.
 *
 * Why a child: its peak resident memory (wait4's ru_maxrss) belongs to that one run alone, a
 * run that exhausts memory cannot take the tool down with it, and RLIMIT_AS turns "would need
 * 8 GiB" into an allocation failure the library reports instead of the OOM killer's SIGKILL.
 * The child writes a report of any shape to a pipe; the parent collects it.
 *
 * The parent must not have started OpenMP threads before forking (libgomp's pool does not
 * survive fork), so callers keep all library compute inside children.
 */
#ifndef FA_TOOL_ISOLATE_H
#define FA_TOOL_ISOLATE_H

#include <stddef.h>

typedef struct iso_result {
    int exited;         /* the child exited normally ...                         */
    int exit_code;      /* ... with this code                                    */
    int signal;         /* or was killed by this signal (0 if it exited)        */
    long peak_rss_kib;  /* child's peak resident set, KiB (ru_maxrss)            */
    double wall_s;      /* from fork to reaping                                  */
    void *report;       /* every byte the child wrote (malloc'd; free it)        */
    size_t report_bytes;
} iso_result;

/* Runs fn(arg, fd) in a child; fn writes its report to fd with iso_write and returns the
   child's exit code. Returns 0 when the child ran (whatever became of it), -1 if it could not
   be started. */
typedef int (*iso_fn)(void *arg, int fd);
int iso_run(iso_fn fn, void *arg, iso_result *res);
/* The same, calling tick(tick_arg, seconds since the fork) about every 250 ms while the child
   runs, from the parent: a long run can show that it is alive. */
typedef void (*iso_tick)(void *tick_arg, double elapsed_s);
int iso_run_watched(iso_fn fn, void *arg, iso_tick tick, void *tick_arg, iso_result *res);

/* In a child: limits further address space to `extra` bytes beyond what is mapped now (0: no
   limit). Call it once the runtime is warm (worker threads and their stacks exist), so the
   limit measures the attention's memory and not the machine's core count. */
void iso_limit_memory(size_t extra);

/* Writes all n bytes to fd (retrying short writes); 0 on success. */
int iso_write(int fd, const void *buf, size_t n);

/* Peak resident set of the calling process so far, KiB. */
long iso_self_peak_kib(void);
/* Current resident set of the calling process, KiB (0 if unknown). */
long iso_self_rss_kib(void);

#endif /* FA_TOOL_ISOLATE_H */
