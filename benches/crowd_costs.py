#!/usr/bin/env python3
"""What sharing one GPU costs a probe, and what of it a worker's environment can take back: the training
step of `one_gpu_rounds.py`'s package run alone, k at once, and k at once with each process's CPU threads
capped, each run timed from inside (the imports apart from the step, as a warm probe pays only the step).

    python3 benches/crowd_costs.py [OUT_DIR]

Every run gets `CUDA_LAUNCH_BLOCKING=1`, as probes do (one case leaves it out, to see what the synchronous
launches cost in a crowd). Prints one line per case: the median and the slowest step time, and the import
time. Needs a CUDA GPU, torch and triton.
"""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import one_gpu_rounds
import warm_probes

SHIM = """import sys, time
t0 = time.time()
import torch, triton
import pkg.model
t1 = time.time()
exec(compile(open("train.py").read(), "train.py", "exec"))
t2 = time.time()
print(f"TIMES {t1 - t0:.3f} {t2 - t1:.3f}", file=sys.stderr)
"""


def crowd(repo, k, env):
    procs = [subprocess.Popen([sys.executable, "shim.py"], cwd=repo, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(k)]
    imports, steps = [], []
    for p in procs:
        _, err = p.communicate()
        line = next((l for l in err.splitlines() if l.startswith("TIMES")), None)
        if p.returncode != 0 or line is None:
            raise SystemExit(f"a run failed ({p.returncode}): {err[-400:]}")
        _, i, s = line.split()
        imports.append(float(i))
        steps.append(float(s))
    return imports, steps


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "crowd-bench").resolve()
    out.mkdir(parents=True, exist_ok=True)
    warm_probes.original_files = warm_probes.files
    warm_probes.files = one_gpu_rounds.files
    repo = out / "pkg"
    warm_probes.make_repo(repo, 4)
    warm_probes.git(repo, "checkout", "-q", "HEAD~3")
    (repo / "shim.py").write_text(SHIM)
    base = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    threads = max(1, (os.cpu_count() or 1) // 8)
    cases = [
        ("alone (warms the kernel cache)", 1, base),
        ("alone", 1, base),
        ("2 at once", 2, base),
        ("8 at once", 8, base),
        (f"8 at once, OMP_NUM_THREADS={threads}", 8, dict(base, OMP_NUM_THREADS=str(threads))),
        ("8 at once, OMP_NUM_THREADS=1", 8, dict(base, OMP_NUM_THREADS="1")),
        ("8 at once, no CUDA_LAUNCH_BLOCKING", 8, dict(os.environ)),
        ("8 at once (again)", 8, base),
    ]
    print(f"{os.cpu_count()} cores")
    for name, k, env in cases:
        t = time.time()
        imports, steps = crowd(repo, k, env)
        wall = time.time() - t
        print(f"{name}: wall {wall:.2f} s; step median {statistics.median(steps):.2f} s, max {max(steps):.2f} s; "
              f"import median {statistics.median(imports):.2f} s", flush=True)


if __name__ == "__main__":
    main()
