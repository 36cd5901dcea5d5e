/* LD_PRELOAD shim for crash hunts on the device (bench/probes/cp_exit.sh): on SIGSEGV, SIGBUS,
   SIGILL or SIGABRT it prints the crashing thread's native frames (glibc backtrace, library and
   offset per frame) to stderr, then lets the signal kill the process as before. Python's
   faulthandler, when on, runs first and chains here, so a log gets both stacks.
   Build: cc -shared -fPIC -O1 -g -o segv_trace.so segv_trace.c */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void on_fatal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char line[160];
    /* snprintf is not async-signal-safe; acceptable in a diagnostic that ends the process */
    int n = snprintf(line, sizeof line, "\n[segv_trace] signal %d (%s) addr %p in thread %ld (pid %d)\n",
                     sig, strsignal(sig), si ? si->si_addr : NULL, (long)syscall(SYS_gettid),
                     (int)getpid());
    if (n > 0) (void)!write(2, line, (size_t)n);
    void *frames[64];
    const int k = backtrace(frames, 64);
    backtrace_symbols_fd(frames, k, 2);
    (void)!write(2, "[segv_trace] end\n", 17);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void segv_trace_install(void) {
    void *warm[2];
    backtrace(warm, 2); /* loads libgcc_s now, not inside the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGABRT};
    for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
