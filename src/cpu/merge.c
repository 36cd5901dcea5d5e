/*
 * cpu/merge.c — fa_merge_attn on the CPU, also the last step of split-KV decoding.
 *
 * Each output row is independent: with M the largest part LSE of the row,
 *   lse = M + log(sum_s exp(lse_s - M)),   out = sum_s exp(lse_s - M) out_s / sum_s exp(lse_s - M)
 * so no exponential overflows and the weights sum to one. Two passes over the parts per row
 * (max, then sum) keep the memory at one fp32 row whatever the number of parts.
 */
#include <math.h>
#include <string.h>

#include "kvcache.h"
#include "team.h"
#include "tile_math.h"

static void merge_row(const fa_merge_problem *m, int64_t b, int64_t t, int64_t h) {
    const int d = (int)m->d;
    const size_t pes = fa_dtype_size(m->part_dtype), oes = fa_dtype_size(m->dtype);
    float acc[FA_MAX_HEAD_DIM], row[FA_MAX_HEAD_DIM];
    float mx = -INFINITY;
    for (int s = 0; s < m->n; s++) {
        const fa_merge_part *q = &m->parts[s];
        const float l = q->lse[b * q->lse_sb + h * q->lse_sh + t * q->lse_st];
        mx = l > mx ? l : mx;
    }
    void *orow = fa_tm_row(&m->o, oes, b, t, h);
    float lse = -INFINITY;
    if (mx == -INFINITY) {
        fa_tm_store_zero(orow, m->dtype, d);
    } else {
        float sum = 0.0f;
        memset(acc, 0, (size_t)d * sizeof(float));
        for (int s = 0; s < m->n; s++) {
            const fa_merge_part *q = &m->parts[s];
            const float l = q->lse[b * q->lse_sb + h * q->lse_sh + t * q->lse_st];
            if (l == -INFINITY) continue; /* no weight; its output need not even be finite */
            const float w = expf(l - mx);
            sum += w;
            fa_tm_load_row(row, fa_tm_row(&q->o, pes, b, t, h), m->part_dtype, d, d, 1.0f);
            for (int x = 0; x < d; x++) acc[x] += w * row[x];
        }
        for (int x = 0; x < d; x++) acc[x] /= sum;
        fa_tm_store_row(orow, m->dtype, acc, d, 1.0f);
        lse = mx + logf(sum);
    }
    if (m->lse) m->lse[b * m->lse_sb + h * m->lse_sh + t * m->lse_st] = lse;
}

static void merge_item(void *arg, int64_t r) {
    const fa_merge_problem *m = arg;
    const int64_t h = r % m->heads, bt = r / m->heads;
    merge_row(m, bt / m->seqlen, bt % m->seqlen, h);
}

double fa_cpu_merge_flops(const fa_merge_problem *m) {
    return 2.0 * (double)(m->batch * m->seqlen * m->heads) * (double)m->n * (double)m->d;
}

void fa_cpu_merge(const fa_merge_problem *m, int threads) {
    fa_cpu_for(threads, m->batch * m->seqlen * m->heads, merge_item, (void *)m);
}
