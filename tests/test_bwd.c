/*
 * test_bwd.c — the backward sweep (dQ, dK, dV under the rule, on CPU and, when present,
 * CUDA) plus repeatability: the CPU backend promises bit-identical gradients run to run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

static void bwd_repeatable(void **state) {
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    int64_t qs[4] = {2, 45, 8, 32}, ks[4] = {2, 77, 2, 32}, ls[3] = {2, 8, 45};
    tk_buf q, k, v, o, lse, dout, dq, dk, dv;
    tk_buf *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv};
    const int64_t *shapes[] = {qs, ks, ks, qs, ls, qs, qs, ks, ks};
    for (int i = 0; i < 9; i++)
        assert_int_equal(tk_buf_alloc(all[i], FA_DTYPE_F32, i == 4 ? 3 : 4, shapes[i], 1, &r), 0);
    tk_fill_normal(&q, &r, 1);
    tk_fill_normal(&k, &r, 1);
    tk_fill_normal(&v, &r, 1);
    tk_fill_normal(&dout, &r, 1);
    fa_params p = fa_params_default();
    p.causal = 1;
    assert_int_equal(fa_fwd(ctx, &q.t, &k.t, &v.t, &p, &o.t, &lse.t), FA_OK);
    unsigned char *first[3];
    tk_buf *grads[3] = {&dq, &dk, &dv};
    for (int run = 0; run < 2; run++) {
        for (int g = 0; g < 3; g++) tk_poison(grads[g]);
        assert_int_equal(fa_bwd(ctx, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t, &p, &dq.t, &dk.t,
                                &dv.t),
                         FA_OK);
        for (int g = 0; g < 3; g++) {
            if (run == 0) {
                first[g] = malloc(grads[g]->bytes);
                assert_non_null(first[g]);
                memcpy(first[g], grads[g]->base, grads[g]->bytes);
            } else {
                assert_memory_equal(first[g], grads[g]->base, grads[g]->bytes);
                free(first[g]);
            }
        }
    }
    for (int i = 0; i < 9; i++) tk_buf_free(all[i]);
    fa_context_destroy(ctx);
}

/*
 * fp32 dO and V scaled by powers of two, under the 2x rule: the amx level splits each fp32
 * operand into three bf16 parts (src/cpu/amx_split.h), whose parts under 2^-126 AMX reads as
 * zero, so dO or V * 2^-120 would lose their lo and mid parts (the kernel scales both up before
 * the split and the gradients back as it stores them: split_muls_fp32 in amx_split.h; a kernel
 * reading dO and V as the unscaled split does, emulated on the avx512 level, erred dQ 3.6e-3
 * against plain's 6.7e-7 at dO * 2^-120). dO or V alone * 2^+-120 put the gradients near the
 * ends of the fp32 range, both * 2^-60 make dP the product of two scaled operands; causal
 * masks give -inf scores. Every level runs it: the FMA kernels must hold it too. Each run
 * differentiates its own forward, as tk_run_case does.
 * As test_fwd's f32_scaled_inputs judges O, the gradients are judged at the data's scale:
 * dO * 2^a and V * 2^c scale dV by 2^a and dP, dS, dQ, dK by 2^(a + c) (exactly, but for what
 * falls subnormal), so they are multiplied back by 2^-a and 2^-(a + c) (exact) first, and
 * the gradients get the sweep's extra slack (tk_grad_extra) at that scale too.
 */
static void f32_scaled_grads(void **state) {
    (void)state;
    static const struct {
        int g, v, causal;
    } sc[] = {{-120, 0, 0}, {120, 0, 1}, {0, -120, 1}, {0, 120, 0}, {-60, -60, 1}};
    tk_rng r;
    tk_rng_init(&r, tk_seed());
    const int64_t shape[4] = {1, 150, 2, 64}, lshape[3] = {1, 2, 150}, n = 150;
    const int d = 64;
    for (size_t c = 0; c < sizeof sc / sizeof sc[0]; c++) {
        /* inputs q, k, v, dO; per run ([0] f64 reference, [1] plain, [2] kernel): o, lse and
           the gradients dq, dk, dv */
        enum { Q, K, V, G, NIN };
        enum { O, L, DQ, DK, DV, NOUT };
        tk_buf in[NIN], in64[NIN], out[3][NOUT];
        const int ex[NIN] = {0, 0, sc[c].v, sc[c].g};
        for (int t = 0; t < NIN; t++)
            assert_int_equal(tk_scaled_normal_pair(&in[t], &in64[t], 4, shape, ex[t], &r), 0);
        for (int run = 0; run < 3; run++) {
            const fa_dtype dt = run == 0 ? FA_DTYPE_F64 : FA_DTYPE_F32;
            for (int w = 0; w < NOUT; w++) {
                assert_int_equal(tk_buf_alloc(&out[run][w], dt, w == L ? 3 : 4,
                                              w == L ? lshape : shape, 0, &r),
                                 0);
                tk_poison(&out[run][w]);
            }
            fa_context *ctx;
            assert_int_equal(fa_context_create(&ctx, FA_BACKEND_CPU), FA_OK);
            const fa_algo algo[3] = {FA_ALGO_NAIVE, FA_ALGO_PLAIN, FA_ALGO_AUTO};
            assert_int_equal(fa_context_set_algo(ctx, algo[run]), FA_OK);
            fa_params p = fa_params_default();
            p.causal = sc[c].causal;
            const tk_buf *x = run == 0 ? in64 : in;
            tk_buf *o = out[run];
            assert_int_equal(fa_fwd(ctx, &x[Q].t, &x[K].t, &x[V].t, &p, &o[O].t, &o[L].t), FA_OK);
            assert_int_equal(fa_bwd(ctx, &x[Q].t, &x[K].t, &x[V].t, &o[O].t, &x[G].t, &o[L].t,
                                    &p, &o[DQ].t, &o[DK].t, &o[DV].t),
                             FA_OK);
            if (run == 2 && getenv("FLASHATTN_TEST_VERBOSE"))
                print_message("scaled dO*2^%d V*2^%d: %s\n", ex[G], ex[V],
                              fa_last_selection(ctx)->kernel);
            fa_context_destroy(ctx);
            char msg[256];
            for (int w = DQ; w <= DV; w++)
                if (tk_check_written(&o[w], "gradient", msg, sizeof msg))
                    fail_msg("dO*2^%d V*2^%d run %d: %s", ex[G], ex[V], run, msg);
        }
        /* the extra slack at the data's scale, then both multiplied back */
        const tk_grad_ref gr = {&in64[Q].t,  &in64[K].t,     &out[0][O].t,  &out[0][L].t,
                                &in64[G].t,  &out[0][DQ].t, &out[0][DK].t, &out[0][DV].t};
        const tk_grad_slack gs = tk_grad_extra(&gr, d, 1.0 / sqrt(d), n);
        const int back[NOUT] = {0, 0, -ex[G] - ex[V], -ex[G] - ex[V], -ex[G]};
        for (int run = 0; run < 3; run++)
            for (int w = DQ; w <= DV; w++) tk_scale_pow2(&out[run][w], back[w]);
        double extra[NOUT] = {0, 0, ldexp(gs.dq, back[DQ]), ldexp(gs.dk, back[DK]),
                              ldexp(gs.dv, back[DV])};
        static const char *names[NOUT] = {"O", "LSE", "dQ", "dK", "dV"};
        for (int w = DQ; w <= DV; w++) {
            const tk_err base = tk_compare(&out[1][w].t, &out[0][w].t);
            const tk_err kern = tk_compare(&out[2][w].t, &out[0][w].t);
            if (!tk_rule(&kern, &base, FA_DTYPE_F32, extra[w], NULL))
                fail_msg("dO*2^%d V*2^%d%s: %s kernel max %.3g mean %.3g, plain max %.3g mean "
                         "%.3g (extra %.3g)",
                         ex[G], ex[V], sc[c].causal ? " causal" : "", names[w], kern.max_abs,
                         kern.mean_abs, base.max_abs, base.mean_abs, extra[w]);
        }
        for (int t = 0; t < NIN; t++) {
            tk_buf_free(&in[t]);
            tk_buf_free(&in64[t]);
        }
        for (int run = 0; run < 3; run++)
            for (int w = 0; w < NOUT; w++) tk_buf_free(&out[run][w]);
    }
}

int main(int argc, char **argv) {
    size_t n;
    const tk_case *cases = tk_bwd_cases(&n);
    const struct CMUnitTest extra[] = {cmocka_unit_test(bwd_repeatable),
                                       cmocka_unit_test(f32_scaled_grads)};
    return sweep_main(argc, argv, "bwd", cases, n, extra, sizeof extra / sizeof *extra);
}
