#!/usr/bin/env python3
"""One summary of GoogleTest logs, for the GPU run (bench/gpu_run.sh).

Usage: gtest_summary.py LABEL LOG [LOG ...]

Each LOG is the output of one test process (a shard of a suite, say). Prints one line with the
counts of passed, failed and skipped cases, then one line per failed case, and one per case that
started and never ended: the process was killed (its time limit, a crash) inside it, which on a
GPU usually names a kernel that hung. Exits 1 when any case failed or never ended, or when a log
holds no case at all (a binary that did not start).
"""
import re
import sys

# "[  FAILED  ] Suite/Test.Case/Param, where GetParam() = ... (12 ms)", or "... (12 ms)" alone.
RESULT = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] (\S+?)(?:, where .*| \(\d+ ms\))?$")
START = re.compile(r"^\[ RUN\s+\] (\S+)$")


def scan(path):
    started, ended = [], {}
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = START.match(line)
            if m:
                started.append(m.group(1))
                continue
            m = RESULT.match(line)
            # gtest repeats failed names in its closing list, with ", where GetParam() = ...":
            # only a result line of a case that started counts.
            if m and m.group(2) in started and m.group(2) not in ended:
                ended[m.group(2)] = m.group(1)
    return started, ended


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    label, logs = argv[1], argv[2:]
    counts = {"OK": 0, "FAILED": 0, "SKIPPED": 0}
    failed, unfinished, empty = [], [], []
    for path in logs:
        started, ended = scan(path)
        if not started:
            empty.append(path)
        for name in started:
            result = ended.get(name)
            if result is None:
                unfinished.append(f"{name} (in {path})")
            else:
                counts[result] += 1
                if result == "FAILED":
                    failed.append(name)
    print(f"{label}: {counts['OK']} passed, {counts['FAILED']} failed, {counts['SKIPPED']} skipped"
          + (f", {len(unfinished)} never ended" if unfinished else "")
          + (f", {len(empty)} logs without a case" if empty else ""))
    for name in failed:
        print(f"  FAILED {name}")
    for name in unfinished:
        print(f"  NEVER ENDED {name}")
    for path in empty:
        print(f"  NO CASE in {path}")
    return 1 if failed or unfinished or empty else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
