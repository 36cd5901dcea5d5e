#!/usr/bin/env python3
"""bench/trace_sm90.py — reads a Hopper forward timeline (src/cuda/trace_sm90.cuh; written by a
-DFA_SM90_TRACE build to FLASHATTN_SM90_TRACE_FILE) and prints, in SM clock cycles (medians over
the traced blocks' consumers):

  - the steady key-loop iteration (TR_ITER to TR_ITER inside a tile) and its parts: waiting for
    K/V, S's wait, the softmax, P V's wait, the rest;
  - a tile boundary: from the top of a tile's last loop iteration to the top of the next tile's
    second one (two products' worth of work if nothing else happened), split at its events;
  - the per-tile overhead: the boundary minus two steady iterations, and what it costs against
    the whole run (the block's cycles between its first and last events);
  - the producer: how long its slot waits hold it;
  - how much of a consumer's key-loop softmax runs while another consumer of its block is in
    its own (consumers in step: near 100%; taking turns around the products: near 0);
  - the next tile's Q: how long after the tile's last loop event the producer issued it, and
    how long it took to land where a consumer was waiting for it.

Plain Python (no numpy): usage  trace_sm90.py FILE [BLOCK T0 T1]; with BLOCK, that block's
events from cycle T0 to T1 (after its first), merged over its roles, instead
"""
import statistics
import struct
import sys

NAMES = {1: "FETCH", 2: "ITER", 3: "READY", 4: "S_DONE", 5: "SOFTMAX", 6: "PV_DONE",
         7: "B_ISSUED", 8: "B_S_DONE", 9: "B_SOFTMAX", 10: "B_PV_DONE", 11: "B_STORED",
         12: "B_END", 13: "B_TILE", 14: "B_READY", 15: "O_SUM", 16: "O_SMEM", 17: "O_FENCED",
         18: "O_ISSUED", 19: "TURN", 20: "P_KV", 21: "P_Q", 22: "V_READY", 30: "DONE"}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    blocks, roles, events = struct.unpack_from("3i", data, 0)
    off = 12
    lens = struct.unpack_from(f"{blocks * roles}i", data, off)
    off += 4 * blocks * roles
    runs = {}
    for b in range(blocks):
        r0 = None  # the block's reference clock: times are signed offsets from it, so that
        for r in range(roles):  # its roles compare (a kernel runs far less than 2^31 cycles)
            n = lens[b * roles + r]
            if n <= 0:
                continue
            base = off + 8 * (b * roles + r) * events
            raw = struct.unpack_from(f"{2 * n}I", data, base)
            if r0 is None:
                r0 = raw[1]
            evs = []
            for i in range(n):
                word, clk = raw[2 * i], raw[2 * i + 1]
                t = ((clk - r0 + (1 << 31)) & 0xffffffff) - (1 << 31)  # the 32-bit clock wraps
                evs.append((word >> 24, word & 0xffffff, t))
            runs[(b, r)] = (evs, n >= events)
    return runs


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def softmax_windows(evs):
    """The key loop's softmax of each iteration as (start, end): from the wait it follows
    (P V done where the softmax runs at the running max, S done where it runs under P V, the
    turn in the series kernel) to TR_SOFTMAX."""
    return [(x[2], y[2]) for x, y in zip(evs, evs[1:]) if y[0] == 5 and x[0] in (4, 6, 19)]


def print_softmax_overlap(runs):
    inside = total = 0
    for (b, r), (evs, _) in runs.items():
        if r == 0:
            continue
        mine = softmax_windows(evs)
        others = []  # the union of the block's other consumers' windows, sorted
        for w in sorted(w for (b2, r2), (e2, _) in runs.items() if b2 == b and r2 not in (0, r)
                        for w in softmax_windows(e2)):
            if others and w[0] <= others[-1][1]:
                others[-1] = (others[-1][0], max(others[-1][1], w[1]))
            else:
                others.append(w)
        j = 0
        for a, z in mine:
            total += z - a
            while j < len(others) and others[j][1] <= a:
                j += 1
            k = j
            while k < len(others) and others[k][0] < z:
                inside += max(0, min(z, others[k][1]) - max(a, others[k][0]))
                k += 1
    if total:
        print(f"softmax overlap: {100 * inside / total:.0f}% of the consumers' key-loop softmax "
              f"time runs while another consumer of the block is in its own")


def print_q_latency(runs):
    """The next tile's Q: when the producer issued it (P_Q, after its Q-empty wait) against the
    consumers' last key-loop event before they gave the buffer back (an upper bound on the
    release with one Q buffer, which goes back right after the loop), and when it landed where
    a consumer was already waiting for it (FETCH after a wait of more than 200 cycles)."""
    rel_issue, issue_land, waits = [], [], []
    for (b, r), (pev, _) in runs.items():
        if r != 0:
            continue
        issued = {e[1]: e[2] for e in pev if e[0] == 21}
        cons = [evs for (b2, r2), (evs, _) in runs.items() if b2 == b and r2 != 0]
        last_loop = {}  # tile count k -> the latest loop event of tile k - 1 over the consumers
        for evs in cons:
            k = -1
            prev = None
            for x in evs:
                if x[0] == 1:  # FETCH: tile k + 1 begins
                    k += 1
                    if k >= 1 and prev is not None:
                        last_loop[k] = max(last_loop.get(k, prev), prev)
                    if k >= 1 and k in issued:
                        w = x[2] - before[2]
                        waits.append(w)
                        if w > 200:
                            issue_land.append(x[2] - issued[k])
                    prev = None
                elif x[0] in (5, 6):
                    prev = x[2]
                before = x
        rel_issue += [issued[k] - t for k, t in last_loop.items() if k in issued]
    if rel_issue and med(rel_issue) < 0:
        print("next Q: issued before the tile's last loop event (two or more Q buffers: the "
              "next Q is asked for early in the tile), so its load time is not read here")
    elif waits:
        print(f"next Q: issued {med(rel_issue):.0f} cycles after the tile's last loop event "
              f"(n {len(rel_issue)}); landed {med(issue_land):.0f} cycles after its issue where a "
              f"consumer waited for it (n {len(issue_land)} of {len(waits)}); the consumers' wait "
              f"before FETCH: median {med(waits):.0f}")


def print_block(runs, b, t0, t1):
    """Every role's events of block b between cycles t0 and t1 (from the block's first event),
    merged in time order, one column per role: how the consumers' steps interleave."""
    evs = sorted((e[2], r, e[0], e[1]) for (b2, r), (ev, _) in runs.items() if b2 == b for e in ev)
    if not evs:
        return
    start = evs[0][0]
    print(f"block {b}, cycles {t0}..{t1} after its first event (role: producer, consumer 0, 1)")
    prev = None
    for t, r, tag, val in evs:
        if t0 <= t - start <= t1:
            gap = "" if prev is None else f"+{t - prev}"
            print(f"   {t - start:8d} {gap:>7s} {'':{12 * r}s}{NAMES.get(tag, tag)}:{val}")
            prev = t


def main():
    runs = read(sys.argv[1])
    if len(sys.argv) > 2:  # trace_sm90.py FILE BLOCK T0 T1: one block's merged timeline
        print_block(runs, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    full = sum(1 for v in runs.values() if v[1])
    print(f"traced roles: {len(runs)} ({full} hit the event cap; their later events are missing)")
    steady, parts, bound, bparts, tiles, span = [], {}, [], {}, 0, []
    by_role = {}  # consumer role -> part -> cycles (the consumers may not wait alike)
    for (b, r), (evs, capped) in sorted(runs.items()):
        if r == 0:
            continue
        span.append(evs[-1][2] - evs[0][2])
        # split into tiles at FETCH
        cur = []
        seqs = []
        for e in evs:
            if e[0] == 1 and cur:
                seqs.append(cur)
                cur = []
            cur.append(e)
        seqs.append(cur)
        tiles += len(seqs)
        # steady iterations: ITER(it) -> ITER(it + 1) in one tile, it >= 1
        for s in seqs:
            iters = [i for i, e in enumerate(s) if e[0] == 2]
            for a, z in zip(iters, iters[1:]):
                seg = s[a:z + 1]
                steady.append(seg[-1][2] - seg[0][2])
                for x, y in zip(seg, seg[1:]):
                    k = f"{NAMES.get(x[0])}->{NAMES.get(y[0])}"
                    parts.setdefault(k, []).append(y[2] - x[2])
                    by_role.setdefault(r, {}).setdefault(k, []).append(y[2] - x[2])
        # boundary: last ITER of tile k .. first ITER of tile k + 1 (its it = 1), through
        # the boundary events (B_*) and FETCH
        for s, nxt in zip(seqs, seqs[1:]):
            li = [i for i, e in enumerate(s) if e[0] == 2]
            fi = [i for i, e in enumerate(nxt) if e[0] == 2]
            if not li or not fi:
                continue
            seg = s[li[-1]:] + nxt[:fi[0] + 1]
            bound.append(seg[-1][2] - seg[0][2])
            for x, y in zip(seg, seg[1:]):
                k = f"{NAMES.get(x[0])}->{NAMES.get(y[0])}"
                bparts.setdefault(k, []).append(y[2] - x[2])
    st = med(steady)
    print(f"consumer tiles traced: {tiles}; steady iteration: median {st:.0f} cycles "
          f"(n {len(steady)}, p10 {sorted(steady)[len(steady) // 10] if steady else 0}, "
          f"p90 {sorted(steady)[9 * len(steady) // 10] if steady else 0})")
    roles = sorted(by_role)
    print(f"   {'part':24s} {'all':>8s}  " + "  ".join(f"{'consumer ' + str(r - 1):>11s}" for r in roles))
    for k, v in sorted(parts.items(), key=lambda kv: -med(kv[1])):
        print(f"   {k:24s} {med(v):8.0f}  " +
              "  ".join(f"{med(by_role[r].get(k, [])):11.0f}" for r in roles) + f"  (n {len(v)})")
    if bound:
        b = med(bound)
        print(f"tile boundary (last iteration's top .. next tile's second top): median {b:.0f} "
              f"cycles = 2 steady iterations + {b - 2 * st:.0f} (n {len(bound)})")
        for k, v in bparts.items():
            print(f"   {k:24s} {med(v):8.0f}  (n {len(v)})")
    if span and tiles:
        per_tile = med(span) / (tiles / len(span))
        print(f"role span: median {med(span):.0f} cycles, {tiles / len(span):.1f} tiles each, "
              f"{per_tile:.0f} cycles a tile")
    # data readiness: READY / B_ISSUED carry 4 pos + (K there) + 2 (V there); the producer's
    # P_KV 2 pos + (V) is the issue time of that position's K or V
    for tag, name in ((3, "loop"), (7, "boundary")):
        n = k_late = v_late = 0
        waits_late, waits_ok, age = [], [], []
        for (b, r), (evs, _) in runs.items():
            if r == 0:
                continue
            issue = {e[1]: e[2] for e in runs.get((b, 0), ([], 0))[0] if e[0] == 20}
            for x, y in zip(evs, evs[1:]):
                if y[0] != tag:
                    continue
                n += 1
                pos, there = y[1] >> 2, y[1] & 3
                k_late += not there & 1
                v_late += not there & 2
                if tag == 3:
                    (waits_ok if there == 3 else waits_late).append(y[2] - x[2])
                if 2 * pos in issue:
                    age.append(y[2] - issue[2 * pos])
        if n:
            print(f"{name} waits: {n}; K not yet there {100 * k_late / n:.1f}%, V {100 * v_late / n:.1f}%; "
                  f"K issued this long before the wait ended: median {med(age):.0f} cycles")
            if waits_late:
                print(f"   ITER->READY with data missing: median {med(waits_late):.0f} (n {len(waits_late)}), "
                      f"with both there: {med(waits_ok):.0f} (n {len(waits_ok)})")
    print_softmax_overlap(runs)
    print_q_latency(runs)
    for (b, r), (evs, _) in sorted(runs.items()):
        if r != 0:
            continue
        gaps = [y[2] - x[2] for x, y in zip(evs, evs[1:]) if y[0] == 20]
        if b == 0:
            print(f"producer block 0: {len(evs)} events, gap before a K/V issue median "
                  f"{med(gaps):.0f} cycles")


if __name__ == "__main__":
    main()
