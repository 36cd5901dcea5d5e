/*
 * check.h — `flashattn check`: testkit's correctness sweeps run from the command line.
 */
#ifndef FA_TOOL_CHECK_H
#define FA_TOOL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "testkit.h"

/* Larger cases run only by --full (check_cases.c). */
const tk_case *check_large_cases(size_t *count);

/* --json (check_json.c): the document with the run's settings and an empty "cases" list
   (ops: "fwd", "bwd" or "both"), one case appended, and the summary added, the document
   printed to stdout and freed (-1 when it could not be written). */
cJSON *check_json_begin(int full, fa_backend backend, uint64_t seed, const char *filter,
                        int threads, const char *ops);
void check_json_case(cJSON *doc, const char *op, const tk_case *c, int status, double seconds,
                     const tk_report *r);
int check_json_end(cJSON *doc, int pass, int fail, int skip, double seconds);

#endif /* FA_TOOL_CHECK_H */
