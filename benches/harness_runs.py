#!/usr/bin/env python3
"""Times `cudabisect harness run` on a model, cold (empty kernel cache) and warm, and prints a Markdown
table. Usage: harness_runs.py BIN MODEL [RUNS] [BACKEND]"""
import os, re, subprocess, sys, tempfile, time

TIME = re.compile(r"harness: time ([\d.]+) s \(context ([\d.]+) s, kernels ([\d.]+) s, nodes ([\d.]+) s\)")


def run(binary, model, backend, cache):
    env = dict(os.environ, CUDABISECT_CACHE_DIR=cache, CUDA_LAUNCH_BLOCKING="1")
    t = time.perf_counter()
    out = subprocess.run([binary, "harness", "run", model, "--backend", backend], env=env,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t
    m = TIME.search(out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"run failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return (wall, *map(float, m.groups()))


def main():
    binary, model = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    backend = sys.argv[4] if len(sys.argv) > 4 else "cuda"
    rows = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            rows["cold"].append(run(binary, model, backend, os.path.join(tmp, f"cold{i}")))
        warm = os.path.join(tmp, "warm")
        run(binary, model, backend, warm)
        for _ in range(runs):
            rows["warm"].append(run(binary, model, backend, warm))
    print(f"model {os.path.basename(model)}, backend {backend}, {runs} runs each (median; min-max of wall)")
    print("| cache | wall (s) | harness total (s) | context (s) | kernels (s) | nodes (s) | context share of wall |")
    print("|---|---|---|---|---|---|---|")
    for kind, rs in rows.items():
        med = lambda k: sorted(r[k] for r in rs)[len(rs) // 2]
        walls = [r[0] for r in rs]
        print(f"| {kind} | {med(0):.3f} ({min(walls):.3f}-{max(walls):.3f}) | {med(1):.3f} | {med(2):.3f} | "
              f"{med(3):.3f} | {med(4):.3f} | {100 * med(2) / med(0):.0f}% |")


main()
