#!/usr/bin/env python3
"""Joins `flashattn bench --decode --json` (ours) with bench/peers_decode.py --json (PyTorch
SDPA: flash, cuDNN, efficient) into the markdown table that bench/record.py files under
bench/results/: per batch, cache length and cache layout, our microseconds per call with the
device checks on and off, the peers' microseconds, our K/V bytes read per second and their
fraction of the copy bandwidth measured in the same run, and the speedup over the best peer;
then the two done-when criteria of issue 4, evaluated row by row.

    python3 bench/table_decode.py decode.json --commit abc1234 --command "..." --out t.md
    python3 bench/table_decode.py ours.json peers.json

decode.json holds both sides ({"ours": ..., "peers": ...}, as bench/gpu.sh writes it); each
side is one run or a list of rounds, merged by keeping each row's fastest successful round
(the same rule for every implementation). The copy bandwidth of reference is the highest our
runs measured: the stricter choice for our fraction of it.
"""
import argparse
import json
import os
import subprocess
import sys

PEERS = ("flash", "cudnn", "efficient")
HOST_BOUND = 1.10
# issue 4, "Done when"
MIN_COPY_FRACTION = 0.80
LONG_CACHE = 32768
MIN_SPEEDUP = 1.5
SPEEDUP_ROW = (1, 8192)


def merge_rounds(data, keyfn):
    """One run, or a list of rounds merged: per row key the ok row with the lowest median."""
    if isinstance(data, dict):
        runs = [data]
    else:
        runs = [d for d in data if isinstance(d, dict)]
    if not runs:
        raise ValueError("no runs")
    merged = dict(runs[-1], rounds=len(runs))
    best = {}
    for run in runs:
        for r in run.get("rows", []):
            k = keyfn(r)
            old = best.get(k)
            ok = r.get("status") == "ok"
            if old is None or (ok and (old.get("status") != "ok" or r["median_s"] < old["median_s"])):
                best[k] = r
    merged["rows"] = list(best.values())
    errors = [d.get("error") for d in runs if d.get("error")]
    merged.pop("error", None)
    if errors and len(errors) == len(runs):
        merged["error"] = errors[0]
    copies = [d.get("copy", {}) for d in runs]
    bps = [c.get("bytes_per_s", 0) for c in copies if c.get("bytes_per_s")]
    merged["copy"] = dict(copies[-1], bytes_per_s=max(bps) if bps else 0,
                          all_bytes_per_s=[x for c in copies for x in
                                           (c.get("start_bytes_per_s"), c.get("end_bytes_per_s"))
                                           if x])
    return merged


def shape_key(r):
    return (r["dtype"], int(r["batch"]), int(r["heads_q"]), int(r["heads_kv"]),
            int(r["head_dim"]), int(r["seqlen_k"]))


def ours_key(r):
    return shape_key(r) + (r.get("cache", "contiguous"), int(r.get("page_size") or 0),
                           bool(r.get("device_checks")))


def peer_key(r):
    return shape_key(r) + (r["impl"],)


def load(paths):
    """(ours, peers) from one combined file or two files; a side that cannot be read becomes
    {"error": ...}."""
    sides = {}
    if len(paths) == 1:
        try:
            with open(paths[0]) as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or "ours" not in doc or "peers" not in doc:
                raise ValueError("expected {\"ours\": ..., \"peers\": ...}")
            sides = {"ours": doc["ours"], "peers": doc["peers"]}
        except (OSError, ValueError) as e:
            err = {"error": "cannot read %s: %s" % (paths[0], e)}
            return dict(err), dict(err)
    else:
        for side, path in zip(("ours", "peers"), paths):
            try:
                with open(path) as f:
                    sides[side] = json.load(f)
            except (OSError, ValueError) as e:
                sides[side] = {"error": "cannot read %s: %s" % (path, e)}
    out = []
    for side, keyfn in (("ours", ours_key), ("peers", peer_key)):
        try:
            out.append(merge_rounds(sides[side], keyfn))
        except (ValueError, KeyError, TypeError) as e:
            out.append({"error": "%s: %s" % (side, e), "rows": []})
    return out[0], out[1]


def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Notes:
    """Numbered footnotes, each text once."""

    def __init__(self):
        self.items = []

    def ref(self, text):
        if text not in self.items:
            self.items.append(text)
        return "n%d" % (self.items.index(text) + 1)


def ok(r):
    return r is not None and r.get("status") == "ok"


def us(r, notes, field="median_s"):
    if r is None:
        return "–"
    if not ok(r):
        what = "refused" if r.get("status") == "refused" else "error"
        return "%s [%s]" % (what, notes.ref("%s: %s" % (r.get("impl", "ours"),
                                                        r.get("error", r.get("status")))))
    text = "%.1f" % (r[field] * 1e6)
    if field == "median_s" and r.get("span_mean_s", 0) > HOST_BOUND * r["median_s"]:
        text += "†"
    return text


def pair(a, b):
    return "%s / %s" % (a, b)


def fmt(x, spec):
    return "–" if x is None else spec % x


def build(ours, peers, commit, commands):
    om, pm = ours.get("machine", {}) or {}, peers.get("machine", {}) or {}
    gpu = om.get("gpu") if isinstance(om.get("gpu"), dict) else {}
    device = gpu.get("name") or om.get("device") or pm.get("device") or "unknown device"
    copy = ours.get("copy", {}) or {}
    copy_bps = copy.get("bytes_per_s") or 0
    pcopy = peers.get("copy", {}) or {}

    mine = {}
    for r in ours.get("rows", []):
        mine.setdefault(shape_key(r) + (r.get("cache", "contiguous"), int(r.get("page_size") or 0)),
                        {})[bool(r.get("device_checks"))] = r
    theirs = {}
    for r in peers.get("rows", []):
        theirs.setdefault(shape_key(r), {})[r["impl"]] = r
    impls = [p for p in PEERS if any(p in v for v in theirs.values())]
    shapes = sorted(set(k[:6] for k in mine) | set(theirs))
    dtypes = sorted({k[0] for k in shapes})
    heads = sorted({(k[2], k[3], k[4]) for k in shapes})

    out = ["# flashattn decode (fa_fwd_kvcache) vs PyTorch SDPA on %s" % device, ""]
    out.append("- date: %s (ours), %s (peers)" % (ours.get("date", "?"), peers.get("date", "?")))
    if ours.get("rounds", 1) > 1 or peers.get("rounds", 1) > 1:
        out.append("- rounds: %d of ours, %d of the peers, alternating; each cell is the fastest "
                   "round of its implementation" % (ours.get("rounds", 1), peers.get("rounds", 1)))
    out.append("- commit: %s" % commit)
    sw = []
    if pm:
        sw.append("torch %s, CUDA %s, cuDNN %s" % (pm.get("torch"), pm.get("cuda"), pm.get("cudnn")))
    if gpu:
        sw.append("%s SMs, L2 %.0f MiB" % (gpu.get("sms", "?"), gpu.get("l2_bytes", 0) / 2**20))
    out.append("- device: %s%s" % (device, " (" + "; ".join(sw) + ")" if sw else ""))
    shape = "%s; heads %s; one query token per sequence, causal (bottom-right: it sees every " \
            "key; the peers run unmasked, the same attention); cache full (seqlens = cache " \
            "length); K/V bytes per call 2·B·len·Hkv·d·size" % (
                ", ".join(dtypes) or "?",
                ", ".join("%d/%d, d %d" % h for h in heads) or "?")
    out.append("- shape: " + shape)
    if copy_bps:
        seen = copy.get("all_bytes_per_s") or []
        out.append("- copy bandwidth (device-to-device copy of %.0f MiB, read + write bytes / "
                   "median): %.3f TB/s, the highest of our %d measurements (%s)%s" % (
                       copy.get("bytes", 0) / 2**20, copy_bps * 1e-12, len(seen),
                       ", ".join("%.3f" % (x * 1e-12) for x in seen),
                       "; the peers' run measured %.3f TB/s" % (pcopy["bytes_per_s"] * 1e-12)
                       if pcopy.get("bytes_per_s") else ""))
    else:
        out.append("- copy bandwidth: **not measured** (no % of copy below)")
    cfg, pcfg = ours.get("config", {}) or {}, peers.get("config", {}) or {}
    if cfg:
        rot = cfg.get("rotate_bytes", -1)
        out.append("- timing (ours): %s; >= %s calls and >= %s s per row, at most %s s; cache "
                   "sets rotated: %s; paged: pages of %s tokens in a random permutation"
                   "%s" % (cfg.get("time_rule", "?"), cfg.get("reps", "?"),
                           cfg.get("min_time_s", "?"), cfg.get("max_time_s", "?"),
                           ">= %.0f MiB together" % (rot / 2**20) if rot and rot > 0
                           else "none (one set)",
                           cfg.get("page_size", "?"),
                           "; num_splits forced to %s" % cfg["num_splits_requested"]
                           if cfg.get("num_splits_requested") else ""))
    if pcfg:
        out.append("- timing (peers): %s; %s; K/V memory %s" % (
            pcfg.get("time_rule", "?"), pcfg.get("call", "?"), pcfg.get("layout", "?")))
    for c in commands:
        out.append("- command: `%s`" % c)
    if ours.get("error"):
        out.append("- **ours did not run**: %s" % ours["error"])
    if peers.get("error"):
        out.append("- **peers did not run**: %s" % peers["error"])
    out.append("")

    notes = Notes()
    head = ["batch", "cache", "layout", "ours µs (checks on / off)", "loop µs (on / off)"]
    head += ["%s µs" % p for p in impls]
    head += ["KV TB/s (on / off)", "% of copy (on / off)", "× best peer (on / off)", "splits"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|")
    crit1, crit2 = [], []
    kernels = set()
    for s in shapes:
        peer_rows = theirs.get(s, {})
        best = min((r["median_s"] for r in peer_rows.values() if ok(r)), default=None)
        best_loop = min((r["loop_s"] for r in peer_rows.values() if ok(r) and r.get("loop_s")),
                        default=None)
        layouts = sorted((k for k in mine if k[:6] == s), key=lambda k: (k[6] != "contiguous", k[7]))
        if not layouts:
            layouts = [s + ("(none of ours)", 0)]
        for k in layouts:
            mrow = mine.get(k, {})
            on, off = mrow.get(True), mrow.get(False)
            layout = k[6] if k[6] != "paged" else "paged %d" % k[7]
            line = [str(s[1]), str(s[5]), layout, pair(us(on, notes), us(off, notes)),
                    pair(us(on, notes, "loop_s"), us(off, notes, "loop_s"))]
            line += [us(peer_rows.get(p), notes) for p in impls]

            def tbps(r):
                return r["kv_bytes"] / r["median_s"] * 1e-12 if ok(r) else None

            def frac(r):
                return r["kv_bytes"] / r["median_s"] / copy_bps if ok(r) and copy_bps else None

            def speedup(r):
                return best / r["median_s"] if ok(r) and best else None

            line += [pair(fmt(tbps(on), "%.3f"), fmt(tbps(off), "%.3f")),
                     pair(fmt(frac(on) and 100 * frac(on), "%.1f%%"),
                          fmt(frac(off) and 100 * frac(off), "%.1f%%")),
                     pair(fmt(speedup(on), "%.2f"), fmt(speedup(off), "%.2f")),
                     " / ".join(sorted({str(r["num_splits"]) for r in (on, off) if ok(r)})) or "–"]
            out.append("| " + " | ".join(line) + " |")
            for r in (on, off):
                if ok(r) and r.get("kernel"):
                    kernels.add(r["kernel"])
            if s[5] >= LONG_CACHE:
                crit1.append((s, layout, on, off, frac))
            if (s[1], s[5]) == SPEEDUP_ROW:
                crit2.append((s, layout, on, off, best, best_loop, peer_rows))
    out.append("")
    if kernels:
        out.append("Our kernels: %s." % ", ".join(sorted(kernels)))
        out.append("")
    out.append("µs: median over calls of CUDA events around each call; loop: the same number of "
               "calls back to back between one pair of events, per call (launch gaps and, with "
               "checks on, the per-call synchronisation included). % of copy: K/V bytes per "
               "call / median time / copy bandwidth. × best peer: the fastest peer's median / "
               "ours (SDPA has no paged cache: paged rows are set against the contiguous peers).")
    out.append("")
    if "†" in "\n".join(out):
        out.append("† the mean time per call from the first start to the last end exceeds the "
                   "median by more than %d%%: the host did not keep the GPU busy (with checks on "
                   "every call waits for its check kernel)." % round((HOST_BOUND - 1) * 100))
        out.append("")

    out.append("## Done-when criteria of issue 4, row by row")
    out.append("")
    if "H100" not in device:
        out.append("The criteria are stated for the H100; this run is on %s." % device)
        out.append("")
    out.append("1. Every decode row with a cache of %dk or more reaches at least %.0f%% of the "
               "copy bandwidth measured in the same run:" % (LONG_CACHE // 1024,
                                                            100 * MIN_COPY_FRACTION))
    out.append("")
    out.append("| batch | cache | layout | checks off | checks on |")
    out.append("|---|---|---|---|---|")
    tally = {True: [0, 0], False: [0, 0]}

    def verdict(x, limit, checks):
        if x is None:
            return "not run"
        passed = x >= limit
        tally[checks][0] += passed
        tally[checks][1] += 1
        return "%s **%s**" % ("%.1f%%" % (100 * x) if limit < 1 else "%.2f×" % x,
                              "pass" if passed else "FAIL")

    for s, layout, on, off, frac in crit1:
        out.append("| %d | %d | %s | %s | %s |" % (
            s[1], s[5], layout, verdict(frac(off), MIN_COPY_FRACTION, False),
            verdict(frac(on), MIN_COPY_FRACTION, True)))
    if not crit1:
        out.append("| – | – | – | no row with a cache of %dk or more | |" % (LONG_CACHE // 1024))
    out.append("")
    out.append("Criterion 1: %d of %d rows pass with the checks off, %d of %d with them on." % (
        tally[False][0], tally[False][1], tally[True][0], tally[True][1]))
    out.append("")
    tally = {True: [0, 0], False: [0, 0]}
    out.append("2. Batch %d × %dk is at least %.1f× faster than the best PyTorch backend in the "
               "same run (median per call; the back-to-back rate beside it for information):"
               % (SPEEDUP_ROW[0], SPEEDUP_ROW[1] // 1024, MIN_SPEEDUP))
    out.append("")
    out.append("| layout | best peer | checks off | checks on | loop, checks off | loop, checks on |")
    out.append("|---|---|---|---|---|---|")
    for s, layout, on, off, best, best_loop, peer_rows in crit2:
        name = min((p for p in peer_rows if ok(peer_rows[p])),
                   key=lambda p: peer_rows[p]["median_s"], default=None)
        peer = "%s %.1f µs" % (name, best * 1e6) if name else "none ran"

        def sp(r, field, ref):
            return ref / r[field] if ok(r) and ref and r.get(field) else None

        out.append("| %s | %s | %s | %s | %s | %s |" % (
            layout, peer, verdict(sp(off, "median_s", best), MIN_SPEEDUP, False),
            verdict(sp(on, "median_s", best), MIN_SPEEDUP, True),
            fmt(sp(off, "loop_s", best_loop), "%.2f×"), fmt(sp(on, "loop_s", best_loop), "%.2f×")))
    if not crit2:
        out.append("| – | – | no batch %d × %d row in this run | | | |" % SPEEDUP_ROW)
    out.append("")
    out.append("Criterion 2: %d of %d rows pass with the checks off, %d of %d with them on." % (
        tally[False][0], tally[False][1], tally[True][0], tally[True][1]))
    out.append("")
    for i, text in enumerate(notes.items):
        out.append("- n%d: %s" % (i + 1, text))
    return "\n".join(out).rstrip() + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", metavar="JSON",
                    help="decode.json (both sides), or ours.json peers.json")
    ap.add_argument("--commit", help="git commit of the code measured (default: git describe)")
    ap.add_argument("--command", action="append", default=[],
                    help="the exact command that produced the files (repeatable)")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    if len(args.files) > 2:
        ap.error("one combined file, or ours.json and peers.json")
    ours, peers = load(args.files)
    text = build(ours, peers, args.commit or git_commit(), args.command)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
