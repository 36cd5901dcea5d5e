/*
 * check_json.c — `flashattn check --json`: the sweep as one JSON object, with every fact the
 * text form prints (each case's outcome, time, kernels and error figures, then the tally),
 * numbers as numbers so that a script can compare two runs without parsing text.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common.h"

cJSON *check_json_begin(int full, fa_backend backend, uint64_t seed, const char *filter,
                        int threads, const char *ops) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", fa_version());
    cJSON_AddStringToObject(o, "mode", full ? "full" : "quick");
    cJSON_AddStringToObject(o, "backend", backend == FA_BACKEND_CUDA ? "cuda" : "cpu");
    char s[32]; /* a string: JSON numbers are doubles and a seed may need 64 bits */
    snprintf(s, sizeof s, "%llu", (unsigned long long)seed);
    cJSON_AddStringToObject(o, "seed", s);
    cJSON_AddStringToObject(o, "ops", ops);
    if (filter) cJSON_AddStringToObject(o, "filter", filter);
    else cJSON_AddNullToObject(o, "filter");
    cJSON_AddNumberToObject(o, "threads", threads);
    cJSON_AddStringToObject(o, "rule",
                            "per output, the kernel's max and mean error against the float64 "
                            "reference are each at most 2x those of the plain baseline in the "
                            "same precision plus slack (4 roundings; dQ and dK also the fp32 "
                            "noise of the backward's D_i term)");
    cJSON_AddArrayToObject(o, "cases");
    return o;
}

/* One output's figures; *_allowed are the limits the rule applied (dQ and dK with the D_i
   allowance included, which the text form marks "+D" and leaves out). */
static void add_err(cJSON *errs, const char *name, const tk_err e[2], double slack) {
    cJSON *o = cJSON_AddObjectToObject(errs, name);
    cJSON_AddNumberToObject(o, "max", e[0].max_abs);
    cJSON_AddNumberToObject(o, "max_allowed", 2 * e[1].max_abs + slack);
    cJSON_AddNumberToObject(o, "mean", e[0].mean_abs);
    cJSON_AddNumberToObject(o, "mean_allowed", 2 * e[1].mean_abs + slack);
    cJSON_AddNumberToObject(o, "baseline_max", e[1].max_abs);
    cJSON_AddNumberToObject(o, "baseline_mean", e[1].mean_abs);
    cJSON_AddNumberToObject(o, "slack", slack);
    cJSON_AddNumberToObject(o, "reference_max", e[0].ref_max);
    cJSON_AddNumberToObject(o, "nonfinite", e[0].nonfinite);
}

static void add_str_or_null(cJSON *o, const char *key, const char *s) {
    if (s && *s) cJSON_AddStringToObject(o, key, s);
    else cJSON_AddNullToObject(o, key);
}

void check_json_case(cJSON *doc, const char *op, const tk_case *c, int status, double seconds,
                     const tk_report *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", op);
    add_str_or_null(o, "name", c->name);
    char desc[512];
    tk_case_format(c, desc, sizeof desc);
    cJSON_AddStringToObject(o, "case", desc);
    cJSON_AddStringToObject(o, "dtype", fa_dtype_name(c->dtype));
    cJSON_AddStringToObject(o, "status", status == TK_PASS   ? "pass"
                                         : status == TK_FAIL ? "fail"
                                                             : "skip");
    cJSON_AddNumberToObject(o, "seconds", seconds);
    add_str_or_null(o, "kernel_fwd", r->kernel_fwd);
    add_str_or_null(o, "kernel_bwd", r->kernel_bwd);
    if (status != TK_SKIP && r->kernel_fwd[0]) {
        cJSON *errs = cJSON_AddObjectToObject(o, "errors");
        add_err(errs, "O", r->o, r->slack[0]);
        add_err(errs, "LSE", r->lse, r->slack[1]);
        if (c->bwd && r->kernel_bwd[0]) {
            add_err(errs, "dQ", r->dq, r->slack[2]);
            add_err(errs, "dK", r->dk, r->slack[3]);
            add_err(errs, "dV", r->dv, r->slack[4]);
        }
    } else {
        cJSON_AddNullToObject(o, "errors");
    }
    /* the report's first line repeats the case; the rest says what went wrong or why skipped */
    const char *body = strchr(r->msg, '\n');
    add_str_or_null(o, "message", body ? body + 1 : NULL);
    cJSON_AddItemToArray(cJSON_GetObjectItem(doc, "cases"), o);
}

int check_json_end(cJSON *doc, int pass, int fail, int skip, double seconds) {
    cJSON *s = cJSON_AddObjectToObject(doc, "summary");
    cJSON_AddNumberToObject(s, "passed", pass);
    cJSON_AddNumberToObject(s, "failed", fail);
    cJSON_AddNumberToObject(s, "skipped", skip);
    cJSON_AddNumberToObject(s, "seconds", seconds);
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!text) {
        fprintf(stderr, "flashattn check: out of memory writing JSON\n");
        return -1;
    }
    printf("%s\n", text);
    cJSON_free(text);
    return 0;
}
