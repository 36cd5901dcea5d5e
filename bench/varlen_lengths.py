#!/usr/bin/env python3
"""Prints the sequence lengths of a packed batch for the varlen rows of the sweep (issue 37),
drawn from a long-tailed distribution: log-uniform between --min and --max (many short
sequences, a few long ones, as a pretraining or serving batch holds), until --tokens are
reached; the last length is cut to land on --tokens exactly (a remainder below --min goes to
the previous sequence). The same seed gives the same list, so `flashattn bench --varlen` and
`bench/peers.py --varlen` time the same batch.

    python3 bench/varlen_lengths.py --tokens 16384 --min 64 --max 8192 --seed 1
"""
import argparse
import math
import random


def lengths(tokens, lo, hi, seed):
    rng = random.Random(seed)
    out, left = [], tokens
    while left > 0:
        n = min(left, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
        if 0 < left - n < lo:
            n = left  # no sequence shorter than lo: the remainder joins this one
        out.append(n)
        left -= n
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--min", type=int, default=64)
    p.add_argument("--max", type=int, default=8192)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if not 1 <= a.min <= a.max or a.tokens < a.min:
        p.error("need 1 <= --min <= --max and --tokens >= --min")
    print(",".join(str(n) for n in lengths(a.tokens, a.min, a.max, a.seed)))


if __name__ == "__main__":
    main()
