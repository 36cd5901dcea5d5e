#define _GNU_SOURCE /* fork, wait4, getrusage */
#include "isolate.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

int iso_write(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

long iso_self_peak_kib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return ru.ru_maxrss;
}

/* Address space already mapped (thread stacks, malloc arenas, libraries): RLIMIT_AS counts
   it, so a limit meant for the attention's own memory must be added on top of it. */
static size_t self_vm_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long size = 0;
    int n = fscanf(f, "%ld", &size);
    fclose(f);
    return n == 1 ? (size_t)size * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

void iso_limit_memory(size_t extra) {
    if (!extra) return;
    size_t lim = self_vm_bytes() + extra;
    struct rlimit rl = {(rlim_t)lim, (rlim_t)lim};
    if (setrlimit(RLIMIT_AS, &rl) != 0) perror("flashattn: setrlimit(RLIMIT_AS)");
}

long iso_self_rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long size = 0, resident = 0;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    return n == 2 ? resident * (sysconf(_SC_PAGESIZE) / 1024) : 0;
}

/* Reads fd to end of file into a growing buffer; the child may write more than a pipe holds,
   so this must run before waiting for it. While nothing arrives, tick (if set) is called about
   every 250 ms with the seconds since t0. */
static int slurp(int fd, void **out, size_t *out_bytes, iso_tick tick, void *tick_arg, double t0) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) return -1;
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        if (tick) {
            struct pollfd p = {fd, POLLIN, 0};
            int ready = poll(&p, 1, 250);
            if (ready == 0 || (ready < 0 && errno == EINTR)) {
                tick(tick_arg, tool_now() - t0);
                continue;
            }
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            free(buf);
            return -1;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    *out = buf;
    *out_bytes = len;
    return 0;
}

int iso_run(iso_fn fn, void *arg, iso_result *res) {
    return iso_run_watched(fn, arg, NULL, NULL, res);
}

int iso_run_watched(iso_fn fn, void *arg, iso_tick tick, void *tick_arg, iso_result *res) {
    memset(res, 0, sizeof *res);
    int fds[2];
    if (pipe(fds) != 0) {
        perror("flashattn: pipe");
        return -1;
    }
    fflush(NULL); /* the child must not inherit (and later repeat) buffered output */
    double t0 = tool_now();
    pid_t pid = fork();
    if (pid < 0) {
        perror("flashattn: fork");
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        int code = fn(arg, fds[1]);
        close(fds[1]);
        _exit(code);
    }
    close(fds[1]);
    int rd = slurp(fds[0], &res->report, &res->report_bytes, tick, tick_arg, t0);
    close(fds[0]);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("flashattn: wait4");
            return -1;
        }
    }
    res->wall_s = tool_now() - t0;
    res->peak_rss_kib = ru.ru_maxrss;
    if (WIFEXITED(status)) {
        res->exited = 1;
        res->exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        res->signal = WTERMSIG(status);
    }
    if (rd != 0) {
        res->report = NULL;
        res->report_bytes = 0;
    }
    return 0;
}
