/*
 * check.h — `flashattn check`: testkit's correctness sweeps run from the command line.
 */
#ifndef FA_TOOL_CHECK_H
#define FA_TOOL_CHECK_H

#include <stddef.h>

#include "testkit.h"

/* Larger cases run only by --full (check_cases.c). */
const tk_case *check_large_cases(size_t *count);

#endif /* FA_TOOL_CHECK_H */
