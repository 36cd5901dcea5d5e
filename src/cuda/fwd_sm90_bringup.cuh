/*
 * cuda/fwd_sm90_bringup.cuh — the Hopper forward's bring-up hooks, part of fwd_sm90.cu in a
 * FLASHATTN_BRINGUP build only (the default build reads no FLASHATTN_SM90_* variable):
 *   - A/B switches, read at the first call, fill what the testing hook left zero:
 *     FLASHATTN_SM90_SCHEDULE=overlap|pingpong, FLASHATTN_SM90_TILES=short|long,
 *     FLASHATTN_SM90_SERIAL=1|0, FLASHATTN_SM90_GRID=<blocks>, FLASHATTN_SM90_L2MB=0 (one
 *     (batch, head) pair a tile group);
 *   - with -DFA_SM90_TRACE, the call's timeline (trace_sm90.cuh) to FLASHATTN_SM90_TRACE_FILE.
 */
#ifndef FA_BRINGUP
#error "fwd_sm90_bringup.cuh is for bring-up builds (cmake -DFLASHATTN_BRINGUP=ON)"
#endif

/* the bring-up variable `name` (NULL: unset) */
const char *bringup_env(const char *name) { return getenv(name); }

/* 1 when variable name is a, 2 when it is b, else 0 */
int env_pick(const char *name, const char *a, const char *b) {
    const char *e = bringup_env(name);
    return !e ? 0 : strcmp(e, a) == 0 ? 1 : strcmp(e, b) == 0 ? 2 : 0;
}

fa_sm90_fwd_force forced() {
    static const fa_sm90_fwd_force env = [] {
        fa_sm90_fwd_force f = {};
        const char *g = bringup_env("FLASHATTN_SM90_GRID");
        const char *l2 = bringup_env("FLASHATTN_SM90_L2MB");
        f.blocks = g && atoi(g) > 0 ? atoi(g) : 0;
        f.schedule = env_pick("FLASHATTN_SM90_SCHEDULE", "overlap", "pingpong");
        f.tiles = env_pick("FLASHATTN_SM90_TILES", "short", "long");
        f.serial = env_pick("FLASHATTN_SM90_SERIAL", "1", "0");
        f.pairs = l2 && strcmp(l2, "0") == 0;
        return f;
    }();
    fa_sm90_fwd_force f = g_force;
    if (!f.blocks) f.blocks = env.blocks;
    if (!f.schedule) f.schedule = env.schedule;
    if (!f.tiles) f.tiles = env.tiles;
    if (!f.serial) f.serial = env.serial;
    if (!f.pairs) f.pairs = env.pairs;
    return f;
}

#ifdef FA_SM90_TRACE
/* the call's timeline to FLASHATTN_SM90_TRACE_FILE: per block and role the event count
   (int32), then TRACE_EVENTS (tag, clock) pairs; every call overwrites it */
void trace_dump(cudaStream_t st) {
    const char *path = bringup_env("FLASHATTN_SM90_TRACE_FILE");
    if (!path || cudaStreamSynchronize(st) != cudaSuccess) return;
    static int len[TRACE_BLOCKS * TRACE_ROLES];
    static uint2 buf[TRACE_BLOCKS * TRACE_ROLES * TRACE_EVENTS];
    if (cudaMemcpyFromSymbol(len, trace_len, sizeof len) != cudaSuccess ||
        cudaMemcpyFromSymbol(buf, trace_buf, sizeof buf) != cudaSuccess)
        return;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    const int hdr[3] = {TRACE_BLOCKS, TRACE_ROLES, TRACE_EVENTS};
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(len, sizeof len, 1, f);
    fwrite(buf, sizeof buf, 1, f);
    fclose(f);
    static const int zero[TRACE_BLOCKS * TRACE_ROLES] = {0};
    cudaMemcpyToSymbol(trace_len, zero, sizeof zero);
}
#endif
