#!/usr/bin/env python3
"""Sets several runs of our sweep of one op (kernel variants, e.g. the Hopper schedules) beside
the peers' run in one markdown table: TFLOP/s per variant, the peers', and each variant's ratio
to cuDNN and to FlashAttention-2 (flash), row by row, with the geometric means last. For A/B comparisons inside one device
call (bench/sm90_try.sh); the committed per-issue tables come from table.py.

    python3 bench/variants.py peers.json plain=ours_plain.json pingpong=ours_pingpong.json
"""
import math
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from table import key, load  # noqa: E402


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    peers = load(argv[1])
    variants = []
    for arg in argv[2:]:
        name, _, path = arg.partition("=")
        try:
            variants.append((name, load(path)))
        except (OSError, ValueError) as e:
            print("%s: left out (%s)" % (name, e), file=sys.stderr)
    ok = lambda r: r.get("status") == "ok"
    peer = {}
    for r in peers.get("rows", []):
        if ok(r):
            peer[(key(r), r["impl"])] = r["tflops"]
    rows = {}
    for name, run in variants:
        for r in run.get("rows", []):
            if ok(r):
                rows.setdefault(key(r), {})[name] = r["tflops"]
    names = [n for n, _ in variants]
    print("| op | d | seqlen | causal | " + " | ".join(names) + " | flash | cudnn | " +
          " | ".join("%s/cudnn" % n for n in names) + " | " +
          " | ".join("%s/flash" % n for n in names) + " |")
    print("|---|---|---|---|" + "---:|" * (3 * len(names) + 2))
    logs = {n: [] for n in names}
    logs_fl = {n: [] for n in names}
    for k in sorted(rows, key=lambda k: (k[7], k[1], k[4], k[2])):
        cud, fl = peer.get((k, "cudnn")), peer.get((k, "flash"))
        cells = ["%.1f" % rows[k][n] if n in rows[k] else "–" for n in names]
        ratios = []
        for ref, lg in ((cud, logs), (fl, logs_fl)):
            for n in names:
                if n in rows[k] and ref:
                    ratios.append("%.2f" % (rows[k][n] / ref))
                    lg[n].append(math.log(rows[k][n] / ref))
                else:
                    ratios.append("–")
        print("| %s | %d | %d | %s | %s | %s | %s | %s |" % (
            k[7], k[1], k[2], "yes" if k[4] else "no", " | ".join(cells),
            "%.1f" % fl if fl else "–", "%.1f" % cud if cud else "–", " | ".join(ratios)))
    print()
    for peer_name, lg in (("cudnn", logs), ("flash", logs_fl)):
        print("Geometric mean of ours/%s: " % peer_name + ", ".join(
            "%s %.3f (%d rows)" % (n, math.exp(sum(v) / len(v)), len(v)) for n, v in lg.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
