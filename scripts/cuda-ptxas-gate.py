#!/usr/bin/env python3
"""The CUDA compile gate: reads the `ptxas -v` logs that
scripts/build-cuda-kernels.sh wrote (one per .cu and target) and checks
every kernel against kernels/cuda/budgets.txt: no spills, no stack frame,
registers and shared memory within the kernel's limits. Prints one line per
violation and a summary; exits 1 on any violation or an unreadable log.

usage: cuda-ptxas-gate.py BUDGETS LOG...
"""
import fnmatch
import re
import sys


def budgets(path):
    rules = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) != 3:
            sys.exit(f"{path}: want 'pattern registers shared_bytes', got {line}")
        rules.append((line[0], int(line[1]), int(line[2])))
    return rules


def kernels(log):
    """Yields (kernel, target, registers, shared, spill_stores, spill_loads, stack)."""
    target = name = None
    stack = spill_st = spill_ld = 0
    for line in open(log, encoding="utf-8"):
        if m := re.search(r"Compiling entry function '(\w+)' for '(\w+)'", line):
            name, target = m.group(1), m.group(2)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            stack, spill_st, spill_ld = map(int, m.groups())
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            smem = re.search(r"(\d+) bytes smem", line)
            yield name, target, int(m.group(1)), int(smem.group(1)) if smem else 0, spill_st, spill_ld, stack
            name = None
            stack = spill_st = spill_ld = 0


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rules = budgets(sys.argv[1])
    bad = checked = 0
    for log in sys.argv[2:]:
        seen = 0
        for name, target, regs, smem, st, ld, stack in kernels(log):
            seen += 1
            checked += 1
            _, max_regs, max_smem = next(r for r in rules if fnmatch.fnmatchcase(name, r[0]))
            problems = []
            if st or ld:
                problems.append(f"spills {st} B stored, {ld} B loaded")
            if stack:
                problems.append(f"{stack} B stack frame")
            if regs > max_regs:
                problems.append(f"{regs} registers > {max_regs}")
            if smem > max_smem:
                problems.append(f"{smem} B shared > {max_smem}")
            if problems:
                bad += 1
                print(f"cuda gate: {name} ({target}): {'; '.join(problems)}")
        if seen == 0:
            print(f"cuda gate: {log}: no kernel reports (ptxas -v output missing?)")
            bad += 1
    print(f"cuda gate: {checked} kernel builds checked, {bad} over budget")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
