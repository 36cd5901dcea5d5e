#!/usr/bin/env python3
"""Files a new table into bench/results/: it becomes the current table of its card and
workload, results/<card>/<workload>.md (.log for a sanitizer log), and its row goes on top of
that workload's list in results/INDEX.md. The table it replaces stays in git: its row's
"current" becomes the last commit that wrote it, where `git show <commit>:bench/results/<file>`
reads it.

    python3 bench/record.py h100 fwd table.md --commit abc1234
    python3 bench/record.py h200 decode decode.md --commit abc1234 --card "H200 (NVL)"
    python3 bench/record.py h100 fwd-sm90-tryouts notes.md --commit several --note "what it tried"
    python3 bench/record.py h200 ncu-bwd launches.md --commit abc1234 \\
        --what "Nsight Compute on the backward's kernels (ncu_bwd.sh)"     # a new workload

Then commit the table and INDEX.md together. The current table must be committed first (its
commit is what the index records), so that no measurement is lost between two records.
"""
import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys

HEADER = ("| date | commit measured | card | file | in git at | note |\n"
          "|---|---|---|---|---|---|\n")


def git(root, *args):
    return subprocess.run(["git", "-C", root] + list(args), capture_output=True, text=True)


def fail(msg):
    print("record.py: " + msg, file=sys.stderr)
    sys.exit(1)


def cell(text):
    """A markdown table cell: one line, no column bar."""
    return " ".join(text.replace("|", "/").split())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("card", help="h100, h200, cpu, ...: the folder under results/")
    ap.add_argument("workload", help="fwd, fwd-bwd, decode, door, sanitize, ab, ...")
    ap.add_argument("table", help="the new table (gpu.sh's table.md, decode.md, door.md, ...)")
    ap.add_argument("--commit", required=True, help="the commit measured (or 'several')")
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc)
                    .strftime("%Y-%m-%d"), help="date measured (default: today, UTC)")
    ap.add_argument("--card-name", help="the card column (default: the card in capitals)")
    ap.add_argument("--note", default="", help="the note column (e.g. what an experiment tried)")
    ap.add_argument("--what", help="for a new workload: one sentence on what it measures")
    ap.add_argument("--results", help="the results folder (default: bench/results beside this "
                    "script)")
    args = ap.parse_args()

    for name, value in (("card", args.card), ("workload", args.workload)):
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", value):
            fail(f"{name} '{value}': lower case letters, digits, '-' and '.' only")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", args.date):
        fail(f"--date '{args.date}': YYYY-MM-DD")
    if not os.path.isfile(args.table):
        fail(f"{args.table}: no such file")

    results = os.path.abspath(args.results or os.path.join(os.path.dirname(__file__),
                                                           "results"))
    index_path = os.path.join(results, "INDEX.md")
    if not os.path.isfile(index_path):
        fail(f"{index_path}: no such file")
    ext = ".log" if args.table.endswith(".log") else ".md"
    rel = f"{args.card}/{args.workload}{ext}"
    dest = os.path.join(results, rel)

    with open(index_path) as f:
        index = f.read()
    heading = re.search(r"^## " + re.escape(rel) + r"[ \t]*$", index, re.M)

    # The row of the table being replaced gets the commit that holds it.
    last = None
    if os.path.exists(dest):
        if heading is None:
            fail(f"{rel} exists but INDEX.md has no '## {rel}' section")
        if git(results, "status", "--porcelain", "--", dest).stdout.strip():
            fail(f"{rel} has changes that are not committed: commit it first")
        last = git(results, "log", "-1", "--format=%h", "--", dest).stdout.strip()
        if not last:
            fail(f"{rel} is not in git yet: commit it first")
        if os.path.samefile(dest, args.table):
            fail(f"{args.table} is the current table itself")

    row = (f"| {args.date} | {cell(args.commit)} | {cell(args.card_name or args.card.upper())} "
           f"| `{rel}` | current | {cell(args.note)} |\n")
    if heading is None:
        if not args.what:
            fail(f"'{rel}' is a new workload: say what it measures with --what")
        index = (index.rstrip("\n") + f"\n\n## {rel}\n\n{cell(args.what)}\n\n" + HEADER + row)
    else:
        start = heading.end()
        nxt = re.search(r"^## ", index[start:], re.M)
        end = start + nxt.start() if nxt else len(index)
        section = index[start:end]
        sep = section.find("|---|")
        if sep < 0:
            fail(f"INDEX.md's section '{rel}' has no table")
        after_sep = section.index("\n", sep) + 1
        if last:
            current = f"| `{rel}` | current |"
            if section.count(current) != 1:
                fail(f"INDEX.md's section '{rel}' should have one row marked current")
            section = section.replace(current, f"| `{rel}` | {last} |")
        section = section[:after_sep] + row + section[after_sep:]
        index = index[:start] + section + index[end:]

    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(args.table, dest)
    with open(index_path, "w") as f:
        f.write(index if index.endswith("\n") else index + "\n")
    was = f" (the one it replaces: git show {last}:bench/results/{rel})" if last else ""
    print(f"bench/results/{rel} is now the {args.date} table of {args.commit}{was}; "
          f"commit it with bench/results/INDEX.md")
    chart(dest)


def chart(dest):
    """A table.py table gets its PNG beside it (bench/plot.py), where matplotlib is here."""
    with open(dest) as f:
        if "| d | seqlen | causal | fwd ours" not in f.read():
            return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import plot
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("record.py: no matplotlib here: draw the chart with `make plots`")
        return
    plot.draw(dest, dest[:-3] + ".png")
    print("record.py: commit the .png with it")


if __name__ == "__main__":
    main()
