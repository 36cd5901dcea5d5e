#!/usr/bin/env python3
"""Joins `flashattn bench --json` (ours) with bench/peers.py --json (PyTorch's FlashAttention-2
and cuDNN backends) into the markdown table that bench/record.py files under bench/results/:
TFLOP/s of each implementation and the ratios ours/flash and ours/cudnn, forward and backward,
per head dim, sequence length and mask.

    python3 bench/table.py ours.json peers.json --commit abc1234 \\
        --command "bash bench/gpu.sh" --out table.md
    python3 bench/record.py h100 fwd table.md --commit abc1234   # into bench/results/

Rows are joined on (op, dtype, batch, heads, head dim, seqlens, causal); a side that failed
shows its error as a footnote, a side that is absent shows a dash.
"""
import argparse
import json
import math
import os
import subprocess
import sys

PEERS = ("flash", "cudnn")
HOST_BOUND = 1.10


def load(path):
    """One run (a dict), or several rounds of the same sweep (a list of dicts) merged into one
    run that keeps, per row and implementation, the fastest successful round: the GPU's speed
    drifts during a call, and best-of-rounds applies the same rule to every implementation."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        return data
    runs = [d for d in data if isinstance(d, dict)]
    if not runs:
        raise ValueError("no runs in %s" % path)
    merged = dict(runs[0], rounds=len(runs))
    best = {}
    for run in runs:
        for r in run.get("rows", []):
            k = (key(r), r.get("impl", "ours"), r.get("mask", "none"))
            old = best.get(k)
            ok = r.get("status") == "ok"
            if old is None or (ok and (old.get("status") != "ok" or r["tflops"] > old["tflops"])):
                best[k] = r
    merged["rows"] = list(best.values())
    errors = [d.get("error") for d in runs if d.get("error")]
    if errors and len(errors) == len(runs):
        merged["error"] = errors[0]
    return merged


def key(r):
    return (r["dtype"], int(r["head_dim"]), int(r["seqlen_q"]), int(r["seqlen_k"]),
            bool(r["causal"]), int(r["batch"]), int(r["heads_q"]), r["op"])


def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cuda_version(v):
    """cudaDriverGetVersion's 13000 as '13.0'."""
    return "%d.%d" % (v // 1000, v % 1000 // 10) if isinstance(v, int) else str(v)


class Notes:
    """Numbered footnotes for error messages, each message once."""

    def __init__(self):
        self.items = []

    def ref(self, text):
        if text not in self.items:
            self.items.append(text)
        return "err%d" % (self.items.index(text) + 1)


def cell(r, notes):
    if r is None:
        return "–"
    if r.get("status") != "ok":
        return notes.ref("%s %s: %s" % (r.get("impl", "ours"), r["op"], r.get("error", r.get("status"))))
    text = "%.1f" % r["tflops"]
    # Per-call events measure device time only while the host keeps the queue full; a mean
    # span over all calls well above the median says it did not (launch-bound rows).
    if r.get("span_mean_s", 0) > HOST_BOUND * r.get("median_s", float("inf")):
        text += "†"
    return text


def ratio(a, b):
    if a is None or b is None or a.get("status") != "ok" or b.get("status") != "ok":
        return None
    return a["tflops"] / b["tflops"]


def fmt_ratio(x):
    return "–" if x is None else "%.3f" % x  # 3 places: 0.996 is under a 1.0 bar


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def build(ours, peers, commit, commands):
    rows = {}
    for r in ours.get("rows", []):
        if r.get("mask", "none") == "window":
            continue
        rows.setdefault(key(r)[:-1], {}).setdefault(r["op"], {})["ours"] = dict(r, impl="ours")
    for r in peers.get("rows", []):
        rows.setdefault(key(r)[:-1], {}).setdefault(r["op"], {})[r["impl"]] = r

    om, pm = ours.get("machine", {}), peers.get("machine", {})
    gpu = om.get("gpu") if isinstance(om.get("gpu"), dict) else {}
    device = gpu.get("name") or om.get("device") or pm.get("device") or "unknown device"
    dtypes = sorted({k[0] for k in rows})
    shape = ", ".join(dtypes)
    cfg = ours.get("config", {}) or {}
    pcfg = peers.get("config", {}) or {}
    tokens = cfg.get("tokens") or pcfg.get("tokens")
    mdim = cfg.get("model_dim") or pcfg.get("model_dim")
    if tokens:
        shape += ", %d tokens (batch = %d / seqlen)" % (tokens, tokens)
    if mdim:
        shape += ", model dim %d (heads = %d / d)" % (mdim, mdim)

    out = []
    out.append("# flashattn vs PyTorch SDPA on %s: TFLOP/s, forward and backward" % device)
    out.append("")
    out.append("- date: %s (ours), %s (peers)" % (ours.get("date", "?"), peers.get("date", "?")))
    if ours.get("rounds") or peers.get("rounds"):
        out.append("- rounds: %s of ours, %s of the peers, alternating; each cell is the best "
                   "round of its implementation" % (ours.get("rounds", 1), peers.get("rounds", 1)))
    out.append("- commit: %s" % commit)
    peer_sw = []
    if pm:
        peer_sw.append("torch %s, CUDA %s, cuDNN %s" % (pm.get("torch"), pm.get("cuda"),
                                                     pm.get("cudnn")))
    if gpu:
        peer_sw.append("%d SMs, L2 %.0f MiB, driver for CUDA %s, flashattn on CUDA runtime %s" % (
            gpu.get("sms", 0), gpu.get("l2_bytes", 0) / 2**20,
            cuda_version(gpu.get("driver_version")), cuda_version(gpu.get("runtime_version"))))
    out.append("- device: %s%s" % (device, " (" + "; ".join(peer_sw) + ")" if peer_sw else ""))
    out.append("- shape: %s; FLOPs: forward 4·B·H·N²·d (half for causal), backward 2.5× "
               "forward" % shape)
    rot = cfg.get("rotate_bytes") or 0
    out.append("- timing (ours): %s; >= %s calls and >= %s s per row, at most %s s; %s s idle "
               "before each row; input sets of >= %s together" % (
                   cfg.get("time_rule", "?"), cfg.get("reps", "?"), cfg.get("min_time_s", "?"),
                   cfg.get("max_time_s", "?"), cfg.get("pause_s", 0),
                   "%.0f MiB" % (rot / 2**20) if rot > 0 else
                   "one set (no rotation)" if rot == 0 else "4x the L2"))
    if pcfg:
        out.append("- timing (peers): %s; %s s idle before each row" % (
            pcfg.get("time_rule", "?"), pcfg.get("pause_s", 0)))
    for c in commands:
        out.append("- command: `%s`" % c)
    if ours.get("error"):
        out.append("- **ours did not run**: %s" % ours["error"])
    if peers.get("error"):
        out.append("- **peers did not run**: %s" % peers["error"])
    out.append("")

    notes = Notes()
    multi = len(dtypes) > 1
    head = (["dtype"] if multi else []) + ["d", "seqlen", "causal"]
    for op in ("fwd", "bwd"):
        head += ["%s ours" % op, "%s flash" % op, "%s cudnn" % op, "ours/flash", "ours/cudnn"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" if i < len(head) - 10 else "---:" for i in range(len(head)))
               + "|")
    ratios = {(op, p): [] for op in ("fwd", "bwd") for p in PEERS}
    kernels = {}
    for k in sorted(rows, key=lambda k: (k[0], k[1], k[4], k[3], k[2], k[5], k[6])):
        dt, d, sq, sk, causal = k[:5]
        line = ([dt] if multi else []) + [str(d), str(sk) if sq == sk else "%d/%d" % (sq, sk),
                                           "yes" if causal else "no"]
        for op in ("fwd", "bwd"):
            impl = rows[k].get(op, {})
            o = impl.get("ours")
            line += [cell(o, notes), cell(impl.get("flash"), notes), cell(impl.get("cudnn"), notes)]
            for p in PEERS:
                x = ratio(o, impl.get(p))
                ratios[(op, p)].append(x)
                line.append(fmt_ratio(x))
            if o and o.get("status") == "ok" and o.get("kernel"):
                kernels.setdefault((op, d), set()).add(o["kernel"])
        out.append("| " + " | ".join(line) + " |")
    out.append("")
    summary = []
    for (op, p), xs in ratios.items():
        g = geomean(xs)
        n = sum(1 for x in xs if x is not None)
        if g is not None:
            summary.append("%s ours/%s %.2f (%d rows)" % (op, p, g, n))
    if summary:
        out.append("Geometric means: " + ", ".join(summary) + ".")
        out.append("")
    if kernels:
        out.append("Our kernels: " + "; ".join(
            "%s d%d: %s" % (op, d, ", ".join(sorted(v))) for (op, d), v in sorted(kernels.items()))
            + ".")
        out.append("")
    if "†" in "\n".join(out):
        out.append("† the mean time per call from the first start to the last end exceeds the "
                   "median by more than %d%%: the host did not keep the GPU busy, so this number "
                   "includes launch gaps." % round((HOST_BOUND - 1) * 100))
        out.append("")
    for i, text in enumerate(notes.items):
        out.append("- err%d: %s" % (i + 1, text))
    return "\n".join(out).rstrip() + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ours", help="JSON of `flashattn bench --backend cuda --sweep --json`")
    ap.add_argument("peers", help="JSON of bench/peers.py --json")
    ap.add_argument("--commit", help="git commit of the code measured (default: git describe)")
    ap.add_argument("--command", action="append", default=[],
                    help="the exact command that produced the files (repeatable)")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    try:
        ours = load(args.ours)
    except (OSError, ValueError) as e:
        ours = {"error": "cannot read %s: %s" % (args.ours, e)}
    try:
        peers = load(args.peers)
    except (OSError, ValueError) as e:
        peers = {"error": "cannot read %s: %s" % (args.peers, e)}
    text = build(ours, peers, args.commit or git_commit(), args.command)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
