/*
 * test_vt_layout.c — the FP8 forward's V transpose in shared memory (src/cuda/vt_layout.h,
 * transpose_v in fwd_sm90.cuh), checked on the CPU: every lane's loads and stores as the
 * kernel computes their addresses, for the tilings the kernel has (d 128 and 256, 128-key
 * tiles) and 256-key tiles.
 *
 *  - the result: every byte of V^T written once, V^T row n column c = V row
 *    (c & ~31) + fa_perm_key(c % 32), column n (the keys in the P fragment's order);
 *  - the rule of vt_layout.h: each load and each store of a warp touches 32 different banks
 *    (4-byte words, 32 banks);
 *  - and that this check can fail: the kernel's previous order (the 32 lanes of a warp along
 *    the keys, 4 x 4 blocks unrotated) has the 8-way conflicts on the loads that the GPU ran.
 *
 * Not covered here (test_fp8_cuda on an sm_90 GPU covers them): the byte permutes, emulated
 * by what they compute (word x of the output holds byte x of the four keys' words, key k in
 * byte k), and the kernel's two selects that undo the rotations (w[k] from load (k + 3) % 4
 * when r, store j of out[j ^ 2] when s), written out in transpose_v to keep register indices
 * constant; this test undoes them through fa_vt_key and fa_vt_row instead.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/vt_layout.h"
#include "sweep.h"

/* the most distinct addresses of one bank among the 32 lanes' words (1: no conflict) */
static int ways(const uint32_t at[32]) {
    int worst = 0;
    for (int bank = 0; bank < 32; bank++) {
        uint32_t seen[32];
        int n = 0;
        for (int l = 0; l < 32; l++) {
            if ((at[l] / 4) % 32 != (uint32_t)bank) continue;
            int dup = 0;
            for (int k = 0; k < n; k++) dup |= seen[k] == at[l] / 4;
            if (!dup) seen[n++] = at[l] / 4;
        }
        if (n > worst) worst = n;
    }
    return worst;
}

/* The kernel's form of the addresses (fa_vt_lane_of, the bases moved per 128 columns of V,
   the per-item XOR and offset) gives the same bytes as the reference functions, from stage
   bases with bits 4..6 clear (1024-byte aligned in the kernel; two such bases here, one of
   them not a multiple of 2048) */
static void check_fast_form(int d, int bn, int blk, int lane, fa_vt_item it) {
    const uint32_t kv_panel = (uint32_t)bn * 128u, vt_panel = (uint32_t)d * 128u;
    static const uint32_t bases[] = {0u, 0x2c00u, 0x30400u};
    const fa_vt_lane fl = fa_vt_lane_of(lane);
    /* the kernel runs one V panel's items (8 x bn / 32) and moves its bases per panel */
    const int per_panel = 8 * (bn / 32), h = blk / per_panel, hblk = blk % per_panel;
    for (size_t i = 0; i < sizeof bases / sizeof *bases; i++) {
        const uint32_t b = bases[i], bl = b + (uint32_t)h * kv_panel, bs = b + (uint32_t)h * FA_VT_PANEL_ROWS;
        for (int q = 0; q < 4; q++) {
            const uint32_t want = b + fa_sw128_at(fa_vt_key(it, q), it.n, kv_panel);
            const uint32_t got = ((bl + fl.ld[q]) ^ fa_vt_ld_xor(hblk, bn)) + fa_vt_ld_add(hblk, bn, kv_panel);
            if (got != want)
                fail_msg("d %d bn %d blk %d lane %d load %d: fast form %u, reference %u", d, bn, blk,
                         lane, q, got, want);
        }
        for (int j = 0; j < 4; j++) {
            const uint32_t want = b + fa_sw128_at(fa_vt_row(it, j), it.c, vt_panel);
            const uint32_t got = ((bs + fl.st[j]) ^ fa_vt_st_xor(hblk, bn)) + fa_vt_st_add(hblk, bn, vt_panel);
            if (got != want)
                fail_msg("d %d bn %d blk %d lane %d store %d: fast form %u, reference %u", d, bn, blk,
                         lane, j, got, want);
        }
    }
}

/* Transposes a random V tile of bn keys x d columns as the 3 transposer warps do; returns the
   worst conflict (ways) of any warp load and of any warp store; fails the test on a wrong or
   missing byte. rotate 0: the previous order (the negative control). */
static void run(int d, int bn, int rotate, int *load_ways, int *store_ways) {
    const uint32_t kv_panel = (uint32_t)bn * 128u, vt_panel = (uint32_t)d * 128u;
    const size_t bytes = (size_t)bn * (size_t)d;
    uint8_t *v = malloc(bytes), *vt = malloc(bytes), *hits = calloc(bytes, 1);
    tk_rng r;
    tk_rng_init(&r, 38);
    for (size_t i = 0; i < bytes; i++) v[i] = (uint8_t)(tk_rng_uniform(&r) * 256.0);
    memset(vt, 0, bytes);
    *load_ways = *store_ways = 0;
    const int blocks = (d / 16) * (bn / 32);
    for (int warp = 0; warp < 3; warp++)
        for (int blk = warp; blk < blocks; blk += 3) {
            uint32_t words[32][4], ld[4][32], st[4][32];
            fa_vt_item its[32];
            for (int lane = 0; lane < 32; lane++) {
                fa_vt_item it = fa_vt_item_of(blk, lane, bn);
                if (!rotate) { /* the previous order: 32 lanes along the keys, unrotated */
                    const int item = 32 * blk + lane;
                    it.c = 4 * (item % (bn / 4)), it.n = 4 * (item / (bn / 4)), it.r = it.s = 0;
                }
                its[lane] = it;
                for (int q = 0; q < 4; q++) {
                    ld[q][lane] = fa_sw128_at(fa_vt_key(it, q), it.n, kv_panel);
                    memcpy(&words[lane][q], v + ld[q][lane], 4);
                }
                if (rotate) check_fast_form(d, bn, blk, lane, it);
            }
            for (int q = 0; q < 4; q++) {
                const int w = ways(ld[q]);
                if (w > *load_ways) *load_ways = w;
            }
            for (int lane = 0; lane < 32; lane++) {
                const fa_vt_item it = its[lane];
                uint32_t key_word[4]; /* the word of the item's key k: load (k - r) % 4 */
                for (int q = 0; q < 4; q++) key_word[(q + it.r) & 3] = words[lane][q];
                for (int j = 0; j < 4; j++) {
                    const int row = fa_vt_row(it, j), x = row - it.n;
                    uint8_t out[4];
                    for (int k = 0; k < 4; k++) out[k] = (uint8_t)(key_word[k] >> (8 * x));
                    st[j][lane] = fa_sw128_at(row, it.c, vt_panel);
                    memcpy(vt + st[j][lane], out, 4);
                    for (int k = 0; k < 4; k++) hits[st[j][lane] + k]++;
                }
            }
            for (int j = 0; j < 4; j++) {
                const int w = ways(st[j]);
                if (w > *store_ways) *store_ways = w;
            }
        }
    for (int n = 0; n < d; n++)
        for (int c = 0; c < bn; c++) {
            const uint32_t at = fa_sw128_at(n, c, vt_panel);
            const int key = (c & ~31) + fa_perm_key(c % 32);
            const uint8_t want = v[fa_sw128_at(key, n, kv_panel)];
            if (hits[at] != 1 || vt[at] != want)
                fail_msg("d %d bn %d rotate %d: V^T row %d col %d written %d times, %u (want %u)",
                         d, bn, rotate, n, c, hits[at], vt[at], want);
        }
    free(v), free(vt), free(hits);
}

static void transpose_is_right_and_conflict_free(void **state) {
    (void)state;
    static const int shapes[][2] = {{128, 128}, {256, 128}, {128, 256}, {256, 256}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int lw, sw, lw0, sw0;
        run(shapes[i][0], shapes[i][1], 1, &lw, &sw);
        run(shapes[i][0], shapes[i][1], 0, &lw0, &sw0);
        printf("  d %d bn %d: worst warp load %d-way, store %d-way (previous order: %d-way, %d-way)\n",
               shapes[i][0], shapes[i][1], lw, sw, lw0, sw0);
        assert_int_equal(lw, 1);
        assert_int_equal(sw, 1);
        assert_true(lw0 >= 8); /* the check sees the conflicts the new order removes */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(transpose_is_right_and_conflict_free)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
