#!/usr/bin/env python3
"""bench/sass_phases.py — where a series-loop attention kernel's key iteration spends its time,
from an Nsight Compute source page (ncu --page source --csv --print-source sass; written by
bench/ncu_sm90.sh and bench/ncu_peers.sh SASS=1): the lines executed as often as the P V products (the
key loop), cut into phases at the loop's landmarks, each phase's share of the loop's
warp-stall samples and that share of a given iteration time. Samples fall on a warp evenly in
time, so a phase's share of the samples is its share of a consumer warp's time.

The landmarks are cuDNN's loop and fwd_sm90_serial.cuh's alike: S's HGMMAs (B from shared
memory), their DEPBAR; the turn's BAR.SYNC and BAR.ARV; P V's HGMMAs (.tnspB) and their DEPBAR.

usage: sass_phases.py SASS_CSV [ITERATION_CYCLES]
"""
import collections
import sys

from sass_stalls import number, read_page


def main():
    hdr, data = read_page(sys.argv[1])
    src, execs = hdr.index("Source"), hdr.index("Instructions Executed")
    samp = hdr.index("Warp Stall Sampling (All Samples)")
    lines = [(r[src].strip(), number(r[execs]), number(r[samp])) for r in data]
    # the key loop: the lines run as often as the P V products (.tnspB HGMMA), the most
    # common such count (a causal tile's first and last key tiles may have their own code)
    loop_n = collections.Counter(e for t, e, _ in lines if e and "HGMMA" in t and "tnspB" in t
                                 ).most_common(1)[0][0]
    total = sum(s for _, _, s in lines)
    acc, order, phase = {}, [], "top"
    for text, e, s in lines:
        if e != loop_n:
            continue
        pv = "HGMMA" in text and "tnspB" in text
        if "HGMMA" in text and not pv and phase == "top":
            phase = "S issue"
        elif "DEPBAR" in text and phase == "S issue":
            phase = "S wait"
        elif phase == "S wait":
            phase = "max"
        if "BAR.SYNC" in text:
            phase = "turn wait"
        elif phase == "turn wait":
            phase = "turn"
        if "BAR.ARV" in text and phase == "turn":
            phase = "post-turn"
        if pv and phase in ("post-turn", "turn"):
            phase = "PV issue"
        elif "DEPBAR" in text and phase == "PV issue":
            phase = "PV wait"
        elif phase == "PV wait":
            phase = "tail"
        if phase not in acc:
            order.append(phase)
        acc[phase] = acc.get(phase, 0) + s
    loop = sum(acc.values())
    cyc = float(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(f"key loop: lines executed {loop_n} times; {loop} of the kernel's {total} samples "
          f"({100 * loop / max(total, 1):.0f}%)")
    for k in order:
        part = acc[k] / max(loop, 1)
        extra = f"  ~{cyc * part:5.0f} of {cyc:.0f} cycles" if cyc else ""
        print(f"   {k:10s} {acc[k]:7d} {100 * part:5.1f}%{extra}")


if __name__ == "__main__":
    main()
