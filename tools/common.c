#define _GNU_SOURCE /* posix_memalign, clock_gettime, sysconf, sched_getaffinity */
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

fa_status tool_fail(const fa_context *ctx, fa_status st, const char *what) {
    const char *detail = fa_last_error(ctx);
    fprintf(stderr, "flashattn %s: %s%s%s\n", what, fa_status_string(st),
            detail && *detail ? ": " : "", detail ? detail : "");
    return st;
}

void *tool_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

tool_rng tool_rng_seed(uint64_t seed) {
    tool_rng r = {seed ^ 0x6a09e667f3bcc909ull};
    return r;
}

static uint64_t rng_next(tool_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tool_rng_u64(tool_rng *r) { return rng_next(r); }

float tool_rng_uniform(tool_rng *r) {
    for (;;) {
        /* 24 random bits give every float of [-1, 1) on a 2^-23 grid */
        float u = (float)((int32_t)(rng_next(r) >> 40) - (1 << 23)) * (1.0f / (1 << 23));
        if (u != 0.0f) return u;
    }
}

/* Round-to-nearest-even conversions, written out so the tool needs no library internals. */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00u;
    if (a >= 65520.0f) return sign | 0x7c00u;
    if (a < 6.103515625e-05f) /* subnormal: a multiple of 2^-24; 1024 lands on the first normal */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    long mant = lrintf(m * 2048.0f);
    if (mant == 2048) {
        mant = 1024;
        e++;
    }
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)(mant - 1024);
}

static float f16_to_f32(uint16_t h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(1024 + mant), exp - 25);
    return (h & 0x8000u) ? -v : v;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f)) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

void tool_fill_random(void *data, fa_dtype dt, size_t n, tool_rng *r) {
    for (size_t i = 0; i < n; i++) {
        float u = tool_rng_uniform(r);
        switch (dt) {
        case FA_DTYPE_F16: ((uint16_t *)data)[i] = f32_to_f16(u); break;
        case FA_DTYPE_BF16: ((uint16_t *)data)[i] = f32_to_bf16(u); break;
        case FA_DTYPE_F64: ((double *)data)[i] = u; break;
        default: ((float *)data)[i] = u; break;
        }
    }
}

void tool_fill_normal(void *data, fa_dtype dt, size_t n, tool_rng *r) {
    for (size_t i = 0; i < n; i += 2) {
        /* Box-Muller: two independent N(0, 1) values per pair of uniforms; u1 in (0, 1] */
        float u1 = 0.5f * (tool_rng_uniform(r) + 1.0f), u2 = tool_rng_uniform(r);
        if (u1 <= 0.0f) u1 = 1.0f / (1 << 24);
        float rad = sqrtf(-2.0f * logf(u1)), ang = 3.14159265358979f * u2;
        float z[2] = {rad * cosf(ang), rad * sinf(ang)};
        for (size_t j = 0; j < 2 && i + j < n; j++) {
            float u = z[j];
            switch (dt) {
            case FA_DTYPE_F16: ((uint16_t *)data)[i + j] = f32_to_f16(u); break;
            case FA_DTYPE_BF16: ((uint16_t *)data)[i + j] = f32_to_bf16(u); break;
            case FA_DTYPE_F64: ((double *)data)[i + j] = u; break;
            default: ((float *)data)[i + j] = u; break;
            }
        }
    }
}

double tool_load(const void *data, fa_dtype dt, size_t i) {
    switch (dt) {
    case FA_DTYPE_F16: return f16_to_f32(((const uint16_t *)data)[i]);
    case FA_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)data)[i]);
    case FA_DTYPE_F64: return ((const double *)data)[i];
    default: return ((const float *)data)[i];
    }
}

void tool_store(void *data, fa_dtype dt, size_t i, double v) {
    switch (dt) {
    case FA_DTYPE_F16: ((uint16_t *)data)[i] = f32_to_f16((float)v); break;
    case FA_DTYPE_BF16: ((uint16_t *)data)[i] = f32_to_bf16((float)v); break;
    case FA_DTYPE_F64: ((double *)data)[i] = v; break;
    default: ((float *)data)[i] = (float)v; break;
    }
}

int tool_parse_dtype(const char *s, fa_dtype *dt) {
    static const struct {
        const char *name;
        fa_dtype dt;
    } names[] = {{"f32", FA_DTYPE_F32},   {"fp32", FA_DTYPE_F32}, {"f16", FA_DTYPE_F16},
                 {"fp16", FA_DTYPE_F16},  {"bf16", FA_DTYPE_BF16}, {"f64", FA_DTYPE_F64},
                 {"fp64", FA_DTYPE_F64}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *dt = names[i].dt;
            return 0;
        }
    return -1;
}

int tool_parse_bytes(const char *s, size_t *bytes) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return -1;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (toupper((unsigned char)*end) == 'I') end++; /* "GiB" */
    if (toupper((unsigned char)*end) == 'B') end++;
    if (*end) return -1;
    v *= mul;
    if (v >= 18446744073709551615.0) return -1;
    *bytes = (size_t)v;
    return 0;
}

int tool_parse_i64(const char *s, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < 0) return -1;
    *v = x;
    return 0;
}

int tool_parse_list(const char *s, int64_t *out, int max) {
    const char *dots = strstr(s, "..");
    if (dots) { /* A..B doubling */
        char a[32];
        size_t la = (size_t)(dots - s);
        if (la == 0 || la >= sizeof a) return -1;
        memcpy(a, s, la);
        a[la] = 0;
        int64_t lo, hi;
        if (tool_parse_i64(a, &lo) || tool_parse_i64(dots + 2, &hi) || lo < 1 || hi < lo)
            return -1;
        int n = 0;
        for (int64_t x = lo; x <= hi && n < max; x *= 2) out[n++] = x;
        return n;
    }
    int n = 0;
    const char *p = s;
    while (*p) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || n >= max) return -1;
        memcpy(item, p, len);
        item[len] = 0;
        if (tool_parse_i64(item, &out[n]) || out[n] < 1) return -1;
        n++;
        p += len;
        if (*p == ',') p++;
    }
    return n;
}

const char *tool_fmt_bytes(char *buf, size_t len, double bytes) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double neg = bytes < 0 ? -1 : 1;
    bytes *= neg;
    while (bytes >= 1024 && u < 5) {
        bytes /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0f %s", neg * bytes, units[u]);
    else
        snprintf(buf, len, "%.1f %s", neg * bytes, units[u]);
    return buf;
}

const char *tool_fmt_seconds(char *buf, size_t len, double s) {
    if (s < 1e-3)
        snprintf(buf, len, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, len, "%.1f ms", s * 1e3);
    else if (s < 100)
        snprintf(buf, len, "%.2f s", s);
    else
        snprintf(buf, len, "%.0f s", s);
    return buf;
}

double tool_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void tool_sleep(double s) {
    if (!(s > 0)) return;
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tool_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int tool_online_cpus(void) {
#ifdef CPU_COUNT
    cpu_set_t set; /* the CPUs this process may run on, which is what a thread pool gets */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

double tool_loadavg(void) {
    double l[1];
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}
