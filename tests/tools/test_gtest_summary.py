#!/usr/bin/env python3
"""bench/gtest_summary.py, which reads the GPU run's test logs (bench/gpu_run.sh), on a real
GoogleTest binary's output and on the lines it must catch: a parameterised failure, a case that
started and never ended (the one a time limit stopped), a log without a case.

Usage: test_gtest_summary.py SUMMARY_PY GTEST_BINARY
"""
import os
import re
import subprocess
import sys
import tempfile


def summarize(script, *logs):
    r = subprocess.run([sys.executable, script, "label", *logs], capture_output=True, text=True)
    return r.returncode, r.stdout


def main(script, binary):
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        # The binary's own cases (parameterised ones among them, as in the GPU suite), in two shards as
        # gpu_run.sh runs them: every case counted once.
        listed = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, check=True).stdout
        cases = sum(1 for line in listed.splitlines() if line.startswith("  "))
        logs = []
        for i in range(2):
            path = os.path.join(tmp, f"shard{i}.log")
            env = dict(os.environ, GTEST_TOTAL_SHARDS="2", GTEST_SHARD_INDEX=str(i))
            with open(path, "w") as f:
                subprocess.run([binary], stdout=f, stderr=subprocess.STDOUT, env=env, check=True)
            logs.append(path)
        rc, out = summarize(script, *logs)
        check(rc == 0, f"a passing binary's shards: exit {rc}")
        check(out.startswith(f"label: {cases} passed, 0 failed, 0 skipped"), f"a passing binary's shards: {out!r}")

        # What gtest prints for a failed parameterised case (its closing list repeats it), a skip,
        # a case cut off, and a process that never reached its first case.
        bad = os.path.join(tmp, "bad.log")
        with open(bad, "w") as f:
            f.write("[ RUN      ] S/T.A/1\n[       OK ] S/T.A/1 (12 ms)\n"
                    "[ RUN      ] S/T.B/N2\nx.cc:3: Failure\n"
                    "[  FAILED  ] S/T.B/N2, where GetParam() = N2 (5 ms)\n"
                    "[ RUN      ] S/T.C/3\n[  SKIPPED ] S/T.C/3 (0 ms)\n"
                    "[  FAILED  ] 1 test, listed below:\n[  FAILED  ] S/T.B/N2, where GetParam() = N2\n")
        cut = os.path.join(tmp, "cut.log")
        with open(cut, "w") as f:
            f.write("[ RUN      ] S/T.D/4\n")
        empty = os.path.join(tmp, "empty.log")
        open(empty, "w").close()
        rc, out = summarize(script, bad, cut, empty)
        check(rc == 1, f"failures: exit {rc}")
        check(out.splitlines()[0] == "label: 1 passed, 1 failed, 1 skipped, 1 never ended, 1 logs without a case",
              f"failures: {out!r}")
        check(re.search(r"^  FAILED S/T\.B/N2$", out, re.M) is not None, "the failed case is named")
        check(re.search(r"^  NEVER ENDED S/T\.D/4 ", out, re.M) is not None, "the cut-off case is named")
        rc, out = summarize(script, bad)
        check(rc == 1 and "1 failed" in out, "a failure alone fails")
    for f in failures:
        print("FAIL:", f)
    print("gtest_summary: " + ("ok" if not failures else f"{len(failures)} checks failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
