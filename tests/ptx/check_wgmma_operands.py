#!/usr/bin/env python3
"""Checks the PTX of the sm_90a kernels for registers touched while a wgmma owns them.

A wgmma.mma_async reads its A registers and reads and writes its accumulators asynchronously,
until the wgmma.wait_group that completes its commit group. Any other instruction that reads or
writes those registers in between is undefined behaviour on the GPU (PTX ISA, "wgmma.mma_async":
"Accessing the accumulator register or the input register containing fragments of matrix A ...
before the wgmma.wait_group ... is undefined"). ptxas keeps such code correct by serialising the
MMAs, or the compiler may have moved arithmetic across the wait; either way it does not show in
the emulator, which computes the product at the wait. This check needs no GPU: it reads the PTX
that nvcc emits for the kernels and walks each entry in program order.

Program order is the text order. The kernels keep every commit group's wait inside the loop
iteration that issued it (the emulator refuses a thread that returns with groups pending), so
the text order of a loop body is also its order on every iteration.

Usage: check_wgmma_operands.py FILE.ptx...   (exit 1 and a report when a register is touched)
       check_wgmma_operands.py --self-test   (the check finds a planted violation)
"""
import re
import sys

REGISTER = re.compile(r"%[a-z]+[0-9]+")
BRACED = re.compile(r"\{([^}]*)\}")
WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)")
ENTRY = re.compile(r"^\.(?:visible\s+)?\.entry\s+([A-Za-z0-9_$]+)", re.M)


def owned_registers(line):
    """The accumulator registers of a wgmma.mma_async, and its A registers in the register form."""
    groups = BRACED.findall(line.split("wgmma.mma_async", 1)[1])
    owned = set(REGISTER.findall(groups[0]))
    if len(groups) > 1:  # {d...}, {a0, a1, a2, a3}, desc_b, ...
        owned |= set(REGISTER.findall(groups[1]))
    return owned


def is_code(line):
    """False for what is not an instruction: blank, comments, labels, directives, braces."""
    return bool(line) and not line.startswith(("//", "$", ".", "{", "}"))


def check_entry(name, body):
    """The violations in one kernel, as report lines."""
    problems = []
    issued = []  # registers of operations issued since the last commit
    pending = []  # one register set per committed group not yet waited for, oldest first
    for number, raw in enumerate(body.splitlines(), 1):
        line = raw.strip()
        if "wgmma.mma_async" in line:
            issued.append(owned_registers(line))
            continue
        if "wgmma.commit_group" in line:
            if issued:
                pending.append(set().union(*issued))
            issued = []
            continue
        wait = WAIT.search(line)
        if wait:
            del pending[: max(0, len(pending) - int(wait.group(1)))]
            continue
        if not is_code(line) or line.startswith(("wgmma.fence", "setp.ne.b32 p,")):
            continue  # the setp is the predicate of our own wgmma asm: it reads the scale-d flag
        owned = set().union(*issued, *pending)
        touched = sorted(set(REGISTER.findall(line)) & owned)
        if touched:
            problems.append(f"{name}: line {number}: {line}  (in flight: {', '.join(touched[:4])})")
    return problems


def check_text(text):
    starts = list(ENTRY.finditer(text))
    problems = []
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        problems += check_entry(m.group(1), text[m.start() : end])
    return len(starts), problems


PLANTED = """
.visible .entry planted(
)
{
  wgmma.fence.sync.aligned;
  wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, %rd1, p, 1, 1, 1;
  wgmma.commit_group.sync.aligned;
  add.f32 %f9, %f8, %f7;
  wgmma.wait_group.sync.aligned 1;
  mov.b32 %r9, %r4;
  wgmma.wait_group.sync.aligned 0;
  add.f32 %f5, %f1, %f2;
}
"""


def self_test():
    entries, problems = check_text(PLANTED)
    # Exactly the read of A register %r4 after the wait that leaves the group pending.
    if entries != 1 or len(problems) != 1 or "%r4" not in problems[0]:
        print("self-test failed: expected one violation (%r4), got", problems)
        return 1
    print("self-test: the planted read of an in-flight A register is found")
    return 0


def main(paths):
    if paths == ["--self-test"]:
        return self_test()
    if not paths:
        print(__doc__)
        return 2
    failed = False
    for path in paths:
        with open(path) as f:
            entries, problems = check_text(f.read())
        wgmma = sum(1 for _ in open(path) if "wgmma.mma_async" in _)
        if entries == 0 or wgmma == 0:
            print(f"{path}: no kernel entry or no wgmma.mma_async: not the PTX this check is for")
            failed = True
            continue
        print(f"{path}: {entries} kernels, {wgmma} wgmma.mma_async, {len(problems)} registers touched in flight")
        for p in problems[:20]:
            print("  " + p)
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
