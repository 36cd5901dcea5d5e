/*
 * test_rows.c — the mask rule of src/rows.h against a brute-force reading of DESIGN.md's
 * definition: row i of a sequence of sq queries and sk keys sees key j (0 <= j < sk) when,
 * with c = i + sk - sq, j >= c - window_left (unless -1) and j <= c + window_right (unless -1);
 * causal means window_right = 0.
 *
 * Every small shape (sq, sk up to 9, empty sequences included, sq above and below sk), windows
 * 0, 1, 2, 5, wider than the sequences and unbounded, causal or not; windows go through
 * fa_window_norm with the sequence's own lengths and with longer bounds (a varlen batch's
 * maxima). Checked: each row's range (rows a few past both ends of the sequence too, as tiles
 * ask), the union and the intersection of every block of rows, the rows that see every run of
 * keys, the tiles that cover a range. Built twice: with 64-bit rows (the CPU's) and with
 * FA_ROWS_32, the width of the CUDA kernels, where a last test takes lengths and windows near
 * the CUDA backend's 2^30 limit and compares with 64-bit arithmetic.
 */
#include <stdio.h>

#include "sweep.h"
#ifndef FA_ROWS_32
#include "internal.h" /* fa_row_keys, the CPU kernels' form */
#else
#include "rows.h"
#endif

#define PAD 3 /* rows checked before and after the sequence */

/* The definition, for a window pair as the caller gave it (-1 or any width). */
static int sees(int64_t i, int64_t j, int64_t sq, int64_t sk, int64_t wl, int64_t wr) {
    const int64_t c = i + sk - sq;
    if (j < 0 || j >= sk) return 0;
    if (wl >= 0 && j < c - wl) return 0;
    if (wr >= 0 && j > c + wr) return 0;
    return 1;
}

/* Whether [lo, hi) (empty when lo >= hi) is exactly the set of j in [0, sk) with want(j). */
typedef struct {
    int64_t sq, sk, wl, wr;
} shape;

static int row_matches(const shape *s, int64_t i, int64_t lo, int64_t hi) {
    for (int64_t j = -1; j <= s->sk; j++) {
        const int in = j >= lo && j < hi;
        if (in != sees(i, j, s->sq, s->sk, s->wl, s->wr)) return 0;
    }
    return 1;
}

static const int64_t widths[] = {-1, 0, 1, 2, 5, 9, 100, (int64_t)1 << 40};
#define NW (int)(sizeof widths / sizeof widths[0])

/* Calls fn for every shape with normalised windows, after checking that normalising changed
   nothing any row of the sequence sees. */
static void each_shape(void (*fn)(const shape *)) {
    for (int64_t sq = 0; sq <= 9; sq++)
        for (int64_t sk = 0; sk <= 9; sk++)
            for (int a = 0; a < NW; a++)
                for (int b = 0; b < NW; b++)
                    for (int causal = 0; causal <= 1; causal++)
                        for (int64_t extra = 0; extra <= 4; extra += 4) {
                            if (causal && widths[b] > 0) continue; /* the dispatcher refuses it */
                            /* the bounds of every sequence's lengths: >= 1, as in dispatch.c */
                            const int64_t len_q = (sq > 0 ? sq : 1) + extra;
                            const int64_t len_k = (sk > 0 ? sk : 1) + extra;
                            const int64_t raw_l = widths[a], raw_r = causal ? 0 : widths[b];
                            shape s = {sq, sk, fa_window_norm(raw_l, len_k),
                                       fa_window_norm(raw_r, len_q)};
                            assert_true(s.wl >= -1 && s.wl < len_k);
                            assert_true(s.wr >= -1 && s.wr < len_q);
                            if (causal) assert_int_equal(s.wr, 0); /* len_q >= 1 */
                            for (int64_t i = 0; i < sq; i++)
                                for (int64_t j = 0; j < sk; j++)
                                    if (sees(i, j, sq, sk, raw_l, raw_r) !=
                                        sees(i, j, sq, sk, s.wl, s.wr)) {
                                        print_error("norm: sq %lld sk %lld window (%lld, %lld) "
                                                    "-> (%lld, %lld): row %lld key %lld\n",
                                                    (long long)sq, (long long)sk,
                                                    (long long)raw_l, (long long)raw_r,
                                                    (long long)s.wl, (long long)s.wr,
                                                    (long long)i, (long long)j);
                                        fail();
                                    }
                            fn(&s);
                        }
}

static fa_rows rows_of(const shape *s) {
    return fa_rows_of((fa_row_t)s->sq, (fa_row_t)s->sk, (fa_row_t)s->wl, (fa_row_t)s->wr);
}

static void fail_shape(const char *what, const shape *s, int64_t a, int64_t b) {
    print_error("%s: sq %lld sk %lld window (%lld, %lld), at %lld %lld\n", what,
                (long long)s->sq, (long long)s->sk, (long long)s->wl, (long long)s->wr,
                (long long)a, (long long)b);
    fail();
}

static void check_rows(const shape *s) {
    const fa_rows r = rows_of(s);
    for (int64_t i = -PAD; i < s->sq + PAD; i++) {
        const int64_t lo = fa_rows_lo(r, (fa_row_t)i), hi = fa_rows_hi(r, (fa_row_t)i);
        if (!row_matches(s, i, lo, hi)) fail_shape("row", s, i, 0);
        if (lo < 0 || hi > s->sk) fail_shape("row bounds", s, lo, hi);
#ifndef FA_ROWS_32
        /* the CPU kernels' form */
        fa_problem p;
        memset(&p, 0, sizeof p);
        p.win_left = s->wl;
        p.win_right = s->wr;
        int64_t plo, phi;
        fa_row_keys(&p, i, s->sq, s->sk, &plo, &phi);
        if (plo != lo || phi != hi) fail_shape("fa_row_keys", s, i, 0);
#endif
    }
}

static void rows(void **state) {
    (void)state;
    each_shape(check_rows);
}

/* For every block [i0, i1) of rows (those past both ends included): the union is the keys
   some row sees, the intersection those every row sees, both exactly (a key tile inside the
   intersection is then one every row sees whole). */
static void check_blocks(const shape *s) {
    const fa_rows r = rows_of(s);
    for (int64_t i0 = -PAD; i0 < s->sq + PAD; i0++)
        for (int64_t i1 = i0 + 1; i1 <= s->sq + PAD; i1++) {
            const fa_range u = fa_rows_union(r, (fa_row_t)i0, (fa_row_t)i1);
            const fa_range c = fa_rows_common(r, (fa_row_t)i0, (fa_row_t)i1);
            for (int64_t j = -1; j <= s->sk; j++) {
                int any = 0, all = 1;
                for (int64_t i = i0; i < i1; i++) {
                    const int v = sees(i, j, s->sq, s->sk, s->wl, s->wr);
                    any |= v;
                    all &= v;
                }
                if (any != (j >= u.lo && j < u.hi)) fail_shape("union", s, i0, i1);
                if (all != (j >= c.lo && j < c.hi)) fail_shape("common", s, i0, i1);
            }
        }
}

static void blocks(void **state) {
    (void)state;
    each_shape(check_blocks);
}

/* For every run of keys [j0, j1): the rows of the sequence that see at least one of them,
   and those that see all of them. */
static void check_seeing(const shape *s) {
    const fa_rows r = rows_of(s);
    for (int64_t j0 = 0; j0 < s->sk; j0++)
        for (int64_t j1 = j0 + 1; j1 <= s->sk; j1++) {
            const fa_range q = fa_rows_seeing(r, (fa_row_t)j0, (fa_row_t)j1);
            const fa_range qa = fa_rows_seeing_all(r, (fa_row_t)j0, (fa_row_t)j1);
            for (int64_t i = -1; i <= s->sq; i++) {
                int any = 0, all = 1;
                for (int64_t j = j0; j < j1; j++) {
                    const int v = sees(i, j, s->sq, s->sk, s->wl, s->wr);
                    any |= v;
                    all &= v;
                }
                if (i < 0 || i >= s->sq) any = all = 0;
                if (any != (i >= q.lo && i < q.hi)) fail_shape("seeing", s, j0, j1);
                if (all != (i >= qa.lo && i < qa.hi)) fail_shape("seeing all", s, j0, j1);
            }
        }
}

static void seeing(void **state) {
    (void)state;
    each_shape(check_seeing);
}

/* The tiles of n covering [lo, hi): exactly those that hold a key of it. And fa_range_holds:
   whether a tile lies inside a range (the "no mask needed" test on fa_rows_common). */
static void tiles(void **state) {
    (void)state;
    const fa_range k = {2, 6};
    assert_true(fa_range_holds(k, 2, 6) && fa_range_holds(k, 3, 4));
    assert_false(fa_range_holds(k, 1, 4) || fa_range_holds(k, 5, 7));
    const fa_range none = {5, 5};
    assert_false(fa_range_holds(none, 5, 6) || fa_range_holds(none, 4, 5));
    for (int64_t n = 1; n <= 8; n++)
        for (int64_t lo = 0; lo <= 20; lo++)
            for (int64_t hi = -2; hi <= 24; hi++) {
                const fa_range k = {(fa_row_t)lo, (fa_row_t)hi};
                const fa_range t = fa_range_tiles(k, (fa_row_t)n);
                if (hi <= lo) {
                    assert_int_equal(t.lo, t.hi);
                    continue;
                }
                for (int64_t x = 0; x * n < 30; x++) {
                    const int meets = x * n < hi && x * n + n > lo;
                    if (meets != (x >= t.lo && x < t.hi)) {
                        print_error("tiles of %lld over [%lld, %lld): tile %lld\n", (long long)n,
                                    (long long)lo, (long long)hi, (long long)x);
                        fail();
                    }
                }
            }
}

/* Lengths and windows near the CUDA backend's limit (sequences below 2^30), rows a tile (256)
   and 2^29 before and past the sequence: the rule in fa_row_t against the same in int64. */
static void near_limit(void **state) {
    (void)state;
    const int64_t L = ((int64_t)1 << 30) - 1;
    const int64_t lens[] = {1, 2, 1000, L / 2, L - 1, L};
    const int nl = (int)(sizeof lens / sizeof lens[0]);
    for (int a = 0; a < nl; a++)
        for (int b = 0; b < nl; b++) {
            const int64_t sq = lens[a], sk = lens[b];
            const int64_t ws[] = {-1, 0, 1, sq - 1, sk - 1, L - 1, L};
            for (int x = 0; x < 7; x++)
                for (int y = 0; y < 7; y++) {
                    const int64_t wl = fa_window_norm(ws[x], sk), wr = fa_window_norm(ws[y], sq);
                    const fa_rows r = fa_rows_of((fa_row_t)sq, (fa_row_t)sk, (fa_row_t)wl,
                                                 (fa_row_t)wr);
                    const int64_t far = (int64_t)1 << 29;
                    const int64_t rows_[] = {-far, -256, -1,     0,        1,
                                             sq / 2, sq - 1, sq, sq + 255, sq + far};
                    for (int z = 0; z < 10; z++) {
                        const int64_t i = rows_[z], c = i + sk - sq;
                        int64_t lo = wl < 0 ? 0 : c - wl, hi = wr < 0 ? sk : c + wr + 1;
                        lo = lo < 0 ? 0 : lo;
                        hi = hi > sk ? sk : hi;
                        assert_int_equal(fa_rows_lo(r, (fa_row_t)i), lo);
                        assert_int_equal(fa_rows_hi(r, (fa_row_t)i), hi);
                    }
                    const int64_t j0s[] = {0, sk / 2, sk - 1};
                    for (int z = 0; z < 3; z++) {
                        const int64_t j0 = j0s[z], j1 = j0 + 256 < sk ? j0 + 256 : sk;
                        const fa_range q = fa_rows_seeing(r, (fa_row_t)j0, (fa_row_t)j1);
                        int64_t qa = wr < 0 ? 0 : j0 - (sk - sq) - wr;
                        int64_t qb = wl < 0 ? sq : j1 + wl - (sk - sq);
                        qa = qa < 0 ? 0 : qa;
                        qb = qb > sq ? sq : qb;
                        assert_int_equal(q.lo, qa);
                        assert_int_equal(q.hi, qb);
                        const fa_range w = fa_rows_seeing_all(r, (fa_row_t)j0, (fa_row_t)j1);
                        int64_t wa = wr < 0 ? 0 : j1 - 1 - (sk - sq) - wr;
                        int64_t wb = wl < 0 ? sq : j0 + wl - (sk - sq) + 1;
                        wa = wa < 0 ? 0 : wa;
                        wb = wb > sq ? sq : wb;
                        assert_int_equal(w.lo, wa);
                        assert_int_equal(w.hi, wb);
                    }
                }
        }
}

int main(void) {
    printf("test_rows: %d-bit rows\n", (int)(8 * sizeof(fa_row_t)));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rows),   cmocka_unit_test(blocks),     cmocka_unit_test(seeing),
        cmocka_unit_test(tiles),  cmocka_unit_test(near_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
