/*
 * cpu/drop_tile.h — dropout applied to a tile of the tiled kernels: the factors of dropout.h's
 * rule (0 dropped, 1 / (1 - p) kept) multiplied into probabilities or their gradients. The
 * factors depend on the element's (b, h, query row, key column) only, so the forward and both
 * passes of the backward, whatever their tiles, apply one mask.
 */
#ifndef FA_CPU_DROP_TILE_H
#define FA_CPU_DROP_TILE_H

#include "../dropout.h"
#include "tile_math.h"

/* One (b, h)'s dropout: generator, head word, factor of a kept element. */
typedef struct fa_dt {
    fa_drop d;
    uint32_t bh;
    float scale;
} fa_dt;

/* Whether p has dropout; *t is (b, h)'s either way (filled always: no reader of an unset
   field, even one the compiler cannot prove dead). */
static inline int fa_dt_init(fa_dt *t, const fa_problem *p, int64_t b, int64_t h) {
    t->d = fa_drop_init(p->drop_seed, p->drop_offset, p->drop_p);
    t->bh = (uint32_t)(b * p->heads_q + h);
    t->scale = fa_drop_scale(p->drop_p);
    return p->drop_p > 0;
}

/* Key-major tile x[j * ld + c] (key j0 + j, query row i0 + c): every element of the nq real
   columns and nk real keys times its factor (padding columns reach no stored row). */
static inline void fa_dt_kmajor(const fa_dt *t, float *x, int ld, int nk, int nq, int64_t i0,
                                int64_t j0) {
    float z[FA_TM_BK];
    for (int c = 0; c < nq; c++) {
        fa_drop_row(&t->d, t->bh, (uint32_t)(i0 + c), j0, nk, t->scale, z);
        for (int j = 0; j < nk; j++) x[(ptrdiff_t)j * ld + c] *= z[j];
    }
}

#endif /* FA_CPU_DROP_TILE_H */
