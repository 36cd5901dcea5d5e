#!/usr/bin/env python3
"""bench/sass_stalls.py — where a kernel's warps wait, from Nsight Compute's per-instruction page.

    ncu --import p.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/sass_stalls.py sass.csv [--lines N]

Prints the stall samples by reason, by opcode (with executed instruction counts), and the
hottest SASS lines with their addresses, so that a wait on one mbarrier or one wgmma can be told
from another (docs/perf/fwd_sm90.md reads these for the Hopper forward).
"""
import argparse
import collections
import csv


def read_page(path):
    """The page's header and its full rows (it opens with a line naming the kernel)."""
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    return rows[head], [r for r in rows[head + 1:] if len(r) >= len(rows[head])]


def number(text):
    """A count as the page writes it (maybe empty, maybe with thousands separators)."""
    return int((text or "0").replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--lines", type=int, default=25)
    args = ap.parse_args()
    hdr, data = read_page(args.csv)
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, h):
        return number(r[ix[h]]) if h in ix else 0

    total, by_op, executed, lines = collections.Counter(), {}, collections.Counter(), []
    for r in data:
        src = r[ix["Source"]].strip()
        words = src.split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else
              words[0] if words else "?").split(".")[0]
        executed[op] += num(r, "Instructions Executed")
        c = by_op.setdefault(op, collections.Counter())
        for h in stalls:
            v = num(r, h)
            total[h] += v
            c[h] += v
        lines.append((num(r, "# Samples"), r[ix["Address"]], src[:90], num(r, "Instructions Executed")))
    n = sum(total.values()) or 1
    print("stall samples: %d" % n)
    for h, v in total.most_common(12):
        print("  %-28s %8d %5.1f%%" % (h, v, 100.0 * v / n))
    print("by opcode (samples, share, executed, top reasons):")
    for op, c in sorted(by_op.items(), key=lambda x: -sum(x[1].values()))[:18]:
        v = sum(c.values())
        print("  %-12s %8d %5.1f%%  exec %10d  %s" % (op, v, 100.0 * v / n, executed[op],
                                                    c.most_common(2)))
    print("hottest lines:")
    for s, a, src, ex in sorted(lines, reverse=True)[:args.lines]:
        print("  %7d %s %s exec=%d" % (s, a, src, ex))


if __name__ == "__main__":
    main()
