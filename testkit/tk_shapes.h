/*
 * testkit/tk_shapes.h — shorthand for tables of attention cases (tk_case initialisers): the
 * sweep's (tk_sweep.c) and any test's that lists cases the same way.
 */
#ifndef TK_SHAPES_H
#define TK_SHAPES_H

#define F32 FA_DTYPE_F32
#define F16 FA_DTYPE_F16
#define BF16 FA_DTYPE_BF16

/* name, batch, sq, sk, heads q/kv, d, dtype */
#define SHAPE(nm, b, q, k, hq_, hkv_, d_, dt)                                                  \
    .name = nm, .batch = b, .sq = q, .sk = k, .hq = hq_, .hkv = hkv_, .d = d_, .dtype = dt
/* name, batch, heads q/kv, d, dtype; the sequence lengths go in .lens_q / .lens_k */
#define VARLEN(nm, b, hq_, hkv_, d_, dt)                                                      \
    .name = nm, .batch = b, .varlen = 1, .hq = hq_, .hkv = hkv_, .d = d_, .dtype = dt
#define WIN(l, r) .window = 1, .wl = l, .wr = r

#endif
