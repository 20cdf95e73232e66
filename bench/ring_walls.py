#!/usr/bin/env python3
"""Two sets of stria-nccl-bench ring outputs side by side: the median wall time per (layout, pass)
of each, from the last rank's entry into a call to the last rank's exit, and their ratio.

Usage: ring_walls.py DIR "A title" A_PATTERN A_RANKS "B title" B_PATTERN B_RANKS SIZE...
A pattern names one rank's output file in DIR, with {L} for the tokens per rank and {r} for the
rank (for example ring{L}.{r}); a set is read from ranks 0 .. RANKS-1.
"""
import collections
import statistics
import sys


def walls(files):
    calls = collections.defaultdict(lambda: collections.defaultdict(dict))
    for path in files:
        for line in open(path):
            f = line.split()
            if not f or f[0] != "CALL":
                continue
            calls[(f[1], f[2])][int(f[3])][int(f[4])] = (float(f[5]), float(f[6]))
    return {key: statistics.median(max(e for _, e in d.values()) - max(s for s, _ in d.values())
                                   for d in reps.values()) for key, reps in calls.items()}


def main(argv):
    out, a_title, a_pattern, a_ranks, b_title, b_pattern, b_ranks = argv[1:8]
    sizes = list(dict.fromkeys(argv[8:]))
    print(f"| tokens per rank | layout | pass | {a_title} | {b_title} | first / second |")
    print("|---|---|---|---|---|---|")
    for L in sizes:
        a = walls([f"{out}/{a_pattern.format(L=L, r=r)}" for r in range(int(a_ranks))])
        b = walls([f"{out}/{b_pattern.format(L=L, r=r)}" for r in range(int(b_ranks))])
        for key, ms in a.items():
            other = b.get(key)
            ratio = f"{ms / other:.3f}" if other else "-"
            other_ms = f"{other * 1e3:.2f}" if other else "-"
            print(f"| {L} | {key[0]} | {key[1]} | {ms * 1e3:.2f} | {other_ms} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv)
