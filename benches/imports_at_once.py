#!/usr/bin/env python3
"""Whether warm servers that start at once slow each other down: the time for fresh interpreters to import
the same modules, one alone and several at the same time, as the first round's warm servers do.

    python3 benches/imports_at_once.py [MODULE ...]   (default: torch torch._dynamo triton peft)

Prints, for each batch (one alone with a cold page cache, one alone again, 8 at once twice, 16 at once,
one alone again), the wall time until the last of the batch has imported everything, and how many modules
an interpreter then holds. A module that is not installed is left out, as a server's preload does. If
eight at once take about as long as one, the first round's cost is the import itself, and one importing
parent forking every worker's server would not shorten it.
"""

import subprocess
import sys
import time

BATCHES = [("1 alone, cold", 1), ("1 alone", 1), ("8 at once", 8), ("8 at once", 8), ("16 at once", 16), ("1 alone", 1)]


def code(modules):
    lines = [f"try:\n    import {m}\nexcept ImportError:\n    pass" for m in modules]
    return "\n".join(lines + ["import sys", "print(len(sys.modules))"])


def batch(n, program):
    started = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(n)
    ]
    outs = [p.communicate()[0].decode().strip() for p in procs]
    return time.monotonic() - started, outs[0].splitlines()[-1] if outs[0] else "?"


def main():
    modules = sys.argv[1:] or ["torch", "torch._dynamo", "triton", "peft"]
    program = code(modules)
    print(f"importing {', '.join(modules)}")
    print("| batch | wall | modules held |")
    print("|---|---|---|")
    for label, n in BATCHES:
        wall, held = batch(n, program)
        print(f"| {label} | {wall:.2f} s | {held} |", flush=True)


if __name__ == "__main__":
    main()
