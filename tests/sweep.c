/*
 * sweep.c — see sweep.h.
 */
#include "sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_TEST_CUDA
#include "cuda/fwd_sm90_force.h"
#endif

typedef struct item {
    const tk_case *c;
    fa_backend backend;
} item;

int sweep_have_cuda(void) {
    static int known = -1;
    if (known < 0) {
        fa_context *ctx = NULL;
        known = fa_context_create(&ctx, FA_BACKEND_CUDA) == FA_OK;
        fa_context_destroy(ctx);
    }
    return known;
}

void sweep_expect_failure(fa_context *ctx, fa_status st, fa_status want, const char *what,
                          const char *op, const void *before, const void *arena, size_t bytes,
                          int allow_selection) {
    if (st != want)
        fail_msg("%s: %s returned %d (%s), expected %d (%s); message: %s", what, op, (int)st,
                 fa_status_string(st), (int)want, fa_status_string(want), fa_last_error(ctx));
    const char *msg = fa_last_error(ctx);
    if (!msg || !*msg) fail_msg("%s: %s failed without a message", what, op);
    if (memcmp(before, arena, bytes) != 0) fail_msg("%s: %s wrote memory although it failed", what, op);
    if (!allow_selection && fa_last_selection(ctx) != NULL)
        fail_msg("%s: %s failed but reports a kernel selection", what, op);
}

static int verbose(void) {
    const char *v = getenv("FLASHATTN_TEST_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

static void run_item(void **state) {
    const item *it = *state;
    tk_opts o = {it->backend, FA_ALGO_AUTO, 0, verbose()};
    static tk_report r; /* large: keep it off the stack */
    int st = tk_run_case(it->c, &o, tk_seed(), &r);
    if (st == TK_SKIP) {
        print_message("%s", r.msg);
        skip();
    }
    if (st == TK_FAIL) fail_msg("%s", r.msg);
    if (o.verbose) print_message("%s", r.msg);
}

/* The Hopper forward's forced choices from "key=value,..." (grid=<blocks>,
   schedule=overlap|pingpong, tiles=short|long, serial=on|off, pairs); 0 on a malformed spec. */
static int sm90_spec(const char *spec, int f[5]) {
    static const char *const keys[] = {"grid=", "schedule=", "tiles=", "serial=", "pairs"};
    static const char *const vals[][2] = {{"", ""}, {"overlap", "pingpong"}, {"short", "long"},
                                          {"on", "off"}, {"", ""}};
    char buf[128];
    if (strlen(spec) >= sizeof buf) return 0;
    strcpy(buf, spec);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int k = 0;
        while (k < 5 && strncmp(tok, keys[k], strlen(keys[k])) != 0) k++;
        if (k == 5) return 0;
        const char *v = tok + strlen(keys[k]);
        if (k == 0) {
            char *end;
            long b = strtol(v, &end, 10);
            if (*end || b <= 0 || b > 1 << 20) return 0;
            f[0] = (int)b;
        } else if (k == 4) {
            if (*v) return 0;
            f[4] = 1;
        } else {
            f[k] = strcmp(v, vals[k][0]) == 0 ? 1 : strcmp(v, vals[k][1]) == 0 ? 2 : 0;
            if (!f[k]) return 0;
        }
    }
    return 1;
}

int sweep_main(int argc, char **argv, const char *group, const tk_case *cases, size_t n,
               const struct CMUnitTest *extra, size_t nextra) {
    fa_backend backend = FA_BACKEND_CPU;
    int force[5] = {0, 0, 0, 0, 0}, ok = argc <= 2;
    if (argc > 1 && strcmp(argv[1], "cuda") == 0)
        backend = FA_BACKEND_CUDA;
    else if (argc > 1 && strcmp(argv[1], "cpu") != 0)
        ok = 0;
    if (argc == 4 && backend == FA_BACKEND_CUDA && strcmp(argv[2], "--sm90") == 0)
        ok = sm90_spec(argv[3], force);
    if (!ok) {
        fprintf(stderr,
                "usage: %s [cpu|cuda [--sm90 grid=N,schedule=overlap|pingpong,"
                "tiles=short|long,serial=on|off,pairs]]\n",
                argv[0]);
        return 2;
    }
#ifdef FA_TEST_CUDA
    if (argc == 4) { /* the Hopper forward's choices (a CUDA build's) */
        const fa_sm90_fwd_force f = {force[0], force[1], force[2], force[3], force[4]};
        fa_sm90_fwd_force_set(&f);
    }
#endif
    if (backend == FA_BACKEND_CUDA) {
        if (!sweep_have_cuda()) {
            printf("no CUDA backend or device here: the GPU sweep is skipped\n");
            return SWEEP_SKIPPED;
        }
        nextra = 0; /* the extra tests exercise the CPU backend */
    }
    const char *bname = backend == FA_BACKEND_CUDA ? "cuda" : "cpu";
    tk_case *mine = calloc(n ? n : 1, sizeof *mine);
    if (!mine) return 1;
    for (size_t i = 0; i < n; i++) mine[i] = tk_case_on(&cases[i], backend);
    size_t total = n + nextra;
    struct CMUnitTest *tests = calloc(total ? total : 1, sizeof *tests);
    item *items = calloc(n ? n : 1, sizeof *items);
    char *names = calloc(n ? n : 1, 256);
    if (!tests || !items || !names) return 1;
    for (size_t i = 0; i < n; i++) {
        items[i].c = &mine[i];
        items[i].backend = backend;
        char line[224];
        tk_case_format(items[i].c, line, sizeof line);
        snprintf(names + i * 256, 256, "%s %s", bname, line);
        tests[i].name = names + i * 256;
        tests[i].test_func = run_item;
        tests[i].initial_state = &items[i];
    }
    for (size_t i = 0; i < nextra; i++) tests[n + i] = extra[i];
    printf("[ SEED     ] %llu (set FLASHATTN_TEST_SEED to repeat)\n",
           (unsigned long long)tk_seed());
    int failed = _cmocka_run_group_tests(group, tests, total, NULL, NULL);
    free(tests);
    free(items);
    free(names);
    free(mine);
    return failed != 0;
}
