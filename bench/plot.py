#!/usr/bin/env python3
"""Draws a table of bench/table.py (the fwd / fwd-bwd tables under bench/results/) as a PNG
beside it: TFLOP/s against sequence length, one panel per head dim, forward and backward in
rows, our line and the peers' (SDPA's FlashAttention-2 and cuDNN), solid without a mask and
dashed with the causal one, as FlashAttention's own repository shows its results.

    python3 bench/plot.py bench/results/h200/fwd.md            # writes bench/results/h200/fwd.png
    python3 bench/plot.py TABLE.md --out chart.png

Only the first table of the file is drawn (the current one; older ones below it are history).
Needs matplotlib (bench/requirements.txt; `make plots` installs it into .venv and draws every
current fwd and fwd-bwd table).
"""
import argparse
import os
import re
import sys

IMPLS = (("ours", "flashattn", "#d62728"), ("flash", "SDPA flash (FA2)", "#1f77b4"),
         ("cudnn", "SDPA cuDNN", "#2ca02c"))


def read_table(path):
    """Rows of the first markdown table with columns 'd | seqlen | causal | fwd ours ...',
    as dicts of floats (None for a dash), with the file's title and commit."""
    with open(path) as f:
        lines = f.read().splitlines()
    title = next((l.lstrip("# ").strip() for l in lines if l.startswith("# ")), path)
    commit = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("- commit:")), "")
    head, rows = None, []
    for line in lines:
        if not line.startswith("|"):
            if rows:
                break  # the end of the first table
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if head is None:
            if cells[:3] == ["d", "seqlen", "causal"]:
                head = cells
            continue
        if set(cells[0]) <= set("-: "):
            continue  # the alignment row
        row = {}
        for name, val in zip(head, cells):
            if name in ("d", "seqlen"):
                row[name] = int(val)
            elif name == "causal":
                row[name] = val == "yes"
            else:
                try:
                    row[name] = float(val)
                except ValueError:
                    row[name] = None
        rows.append(row)
    if not rows:
        sys.exit(f"plot.py: no 'd | seqlen | causal' table in {path}")
    return title, commit, rows


def draw(path, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, commit, rows = read_table(path)
    dims = sorted({r["d"] for r in rows})
    ops = [op for op in ("fwd", "bwd") if any(r.get(f"{op} ours") for r in rows)]
    fig, axes = plt.subplots(len(ops), len(dims), figsize=(4.2 * len(dims), 3.4 * len(ops)),
                             squeeze=False)
    for i, op in enumerate(ops):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            for key, label, color in IMPLS:
                for causal, style in ((False, "-"), (True, "--")):
                    pts = sorted((r["seqlen"], r.get(f"{op} {key}")) for r in rows
                                 if r["d"] == d and r["causal"] == causal
                                 and r.get(f"{op} {key}"))
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color,
                                marker="o", markersize=3,
                                label=f"{label}{', causal' if causal else ''}")
            ax.set_xscale("log", base=2)
            seqlens = sorted({r["seqlen"] for r in rows if r["d"] == d})
            ax.set_xticks(seqlens)
            ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
            ax.set_ylim(bottom=0)
            ax.set_title(f"{'forward' if op == 'fwd' else 'backward'}, head dim {d}", fontsize=10)
            ax.set_xlabel("sequence length")
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(f"{title} (commit {commit})" if commit else title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"plot.py: wrote {out} ({len(rows)} rows, head dims {dims}, {', '.join(ops)})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("table", help="a table.py markdown file")
    p.add_argument("--out", help="the PNG to write (default: the table's name with .png)")
    a = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("plot.py: needs matplotlib (pip install -r bench/requirements.txt, or make plots)")
    draw(a.table, a.out or re.sub(r"\.md$", "", a.table) + ".png")


if __name__ == "__main__":
    main()
