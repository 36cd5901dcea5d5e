/*
 * demo_long.c — `flashattn demo --long`: the long-context case of the issue, one forward at a
 * sequence length whose score matrix could never be materialised, in an isolated child.
 */
#include <stdio.h>

#include "common.h"
#include "demo.h"

int demo_long(const demo_cfg *cfg, int64_t seqlen) {
    char a[32], b[32];
    double flops = demo_flops(cfg->batch, cfg->heads, seqlen, cfg->head_dim, cfg->causal);
    double scores32 = (double)cfg->batch * (double)cfg->heads * (double)seqlen * (double)seqlen * 4;
    printf("flashattn demo --long: B=%lld seqlen=%lld H=%lld d=%lld %s, %s, memory limit %s\n",
           (long long)cfg->batch, (long long)seqlen, (long long)cfg->heads,
           (long long)cfg->head_dim, fa_dtype_name(cfg->dtype),
           cfg->causal ? "causal" : "non-causal",
           tool_fmt_bytes(a, sizeof a, (double)cfg->mem_limit));
    printf("the score matrix alone would be %s in fp32, which the table's %s side\n"
           "allocates in one piece\n",
           tool_fmt_bytes(b, sizeof b, scores32), demo_naive_label());
    printf("running flash (FA_ALGO_AUTO): %.1f GFLOP ...\n", flops * 1e-9);
    fflush(stdout);

    demo_job job = {cfg, seqlen, cfg->heads, cfg->causal, 0, 0, -1, "flash"};
    demo_outcome oc;
    if (demo_run(&job, &oc) != 0) return 1;
    const demo_report *r = &oc.rep;
    int ok = oc.have_report && r->stage == DEMO_STAGE_DONE && r->status == FA_OK;
    if (!ok) {
        if (oc.have_report && r->stage == DEMO_STAGE_DONE)
            fprintf(stderr, "flashattn demo --long: %s\n", r->error);
        else if (oc.iso.signal)
            fprintf(stderr, "flashattn demo --long: the run died of signal %d (peak RSS %s)\n",
                    oc.iso.signal, tool_fmt_bytes(a, sizeof a, oc.iso.peak_rss_kib * 1024.0));
        else
            fprintf(stderr, "flashattn demo --long: the run exited with code %d\n",
                    oc.iso.exit_code);
        demo_outcome_free(&oc);
        return 1;
    }
    double extra = ((double)oc.iso.peak_rss_kib - (double)r->baseline_kib) * 1024.0;
    printf("  time        %s (%.1f GFLOP/s)\n", tool_fmt_seconds(a, sizeof a, r->seconds),
           flops / r->seconds * 1e-9);
    printf("  kernel      %s (tile %dx%d, %d threads)%s%s\n", r->kernel, r->tile_q, r->tile_k,
           r->sel_threads, *r->reason ? ": " : "", r->reason);
    printf("  workspace   %s (fa_last_selection; fa_fwd_workspace_size said %s)\n",
           tool_fmt_bytes(a, sizeof a, (double)r->ws_used),
           tool_fmt_bytes(b, sizeof b, (double)r->ws_query));
    printf("  inputs      %s (q, k, v, out, lse)\n",
           tool_fmt_bytes(a, sizeof a, (double)r->input_bytes));
    printf("  peak RSS    %s, of which the attention added %s\n",
           tool_fmt_bytes(a, sizeof a, oc.iso.peak_rss_kib * 1024.0),
           extra < DEMO_RSS_NOISE ? "less than 0.5 MiB (the resolution of RSS)"
                                  : tool_fmt_bytes(b, sizeof b, extra));
    demo_outcome_free(&oc);
    return 0;
}
