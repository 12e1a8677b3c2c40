#!/usr/bin/env python3
"""Flaky faults with real processes: a generated linear history whose repro faults on a bad commit with
probability P (a seeded coin: a hash of the seed, the commit and its run number), bisected by `git bisect
run` (one repro run per probe) and by `cudabisect start` with `[search] endpoint-runs = 5` and confidence
0.99. Prints accuracy and repro runs per tool over the seeds.

Usage: python3 benches/flaky_real.py [path/to/cudabisect] [COMMITS] [P] [SEEDS]
       (defaults: target/release/cudabisect, 200, 0.5, 10)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bisect_vs_git as g  # noqa: E402  (the history generator)

REPRO = r"""#!/bin/sh
c=${CUDABISECT_COMMIT:-$(git rev-parse HEAD)}
echo "$c" >> "$COIN_DIR/runs.log"
if [ "$(cat build.out)" = bad ]; then
  n=$(grep -c "$c" "$COIN_DIR/runs.log")
  h=$(printf '%s-%s-%s' "$COIN_SEED" "$c" "$n" | cksum | cut -d' ' -f1)
  if [ $((h % 1000)) -lt $COIN_PERMILLE ]; then
    echo 'CUDA error: an illegal memory access was encountered'; exit 42
  fi
fi
echo ok
"""


def runs(coins):
    return sum(1 for _ in open(os.path.join(coins, "runs.log"))) if os.path.exists(os.path.join(coins, "runs.log")) else 0


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/cudabisect")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    p = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    seeds = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    g.REPRO = REPRO
    results = {"git bisect run": [], "cudabisect, endpoint-runs = 5, confidence 0.99": []}
    for seed in range(seeds):
        culprit = 1 + (seed * 7919) % (n - 2)
        g.CONFIG = ('[build]\ncommand = ["./build.sh"]\n[repro]\ncommand = ["./repro.sh"]\n'
                    '[triage]\nenabled = false\n[search]\nendpoint-runs = 5\nconfidence = 0.99\nmax-runs = 600\n')
        tmp = tempfile.mkdtemp()
        try:
            repo = os.path.join(tmp, "repo")
            g.fast_import(repo, g.linear(n, culprit))
            want = subprocess.run(["git", "-C", repo, "rev-list", "--reverse", "main"], capture_output=True,
                                  text=True).stdout.split()[culprit]
            root = subprocess.run(["git", "-C", repo, "rev-list", "--max-parents=0", "main"],
                                  capture_output=True, text=True).stdout.split()[0]
            env = dict(os.environ, COIN_SEED=str(seed), COIN_PERMILLE=str(int(p * 1000)))
            # git bisect run
            coins = os.path.join(tmp, "coins-git")
            os.makedirs(coins)
            env["COIN_DIR"] = coins
            subprocess.run(["git", "-C", repo, "bisect", "start", "main", root], check=True, capture_output=True)
            out = subprocess.run(["git", "-C", repo, "bisect", "run", "sh", "-c", "./build.sh && ./repro.sh"],
                                 capture_output=True, text=True, env=env)
            first = [line.split()[0] for line in out.stdout.splitlines() if "is the first bad commit" in line]
            subprocess.run(["git", "-C", repo, "bisect", "reset"], capture_output=True)
            results["git bisect run"].append((first[0] == want if first else None, runs(coins)))
            # cudabisect
            coins = os.path.join(tmp, "coins-cb")
            os.makedirs(coins)
            env["COIN_DIR"] = coins
            report = os.path.join(tmp, "report.json")
            subprocess.run([binary, "start", f"{root}..main", "-C", repo, "--report", report, "--fresh"],
                           capture_output=True, text=True, env=env)
            r = json.load(open(report))
            got = r["first_bad"]["commit"] if r.get("first_bad") else None
            results["cudabisect, endpoint-runs = 5, confidence 0.99"].append((got == want if got else None, runs(coins)))
            if os.environ.get("DEBUG") and got != want:  # noqa: SIM102
                print(seed, r["result"], r["message"], json.dumps(r.get("flaky"))[:300], file=sys.stderr)
        finally:
            shutil.rmtree(tmp)
    print("| tool | commits | p | seeds | right | wrong | no answer | mean repro runs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        right = sum(1 for ok, _ in rs if ok is True)
        wrong = sum(1 for ok, _ in rs if ok is False)
        mean = sum(r for _, r in rs) / len(rs)
        print(f"| {name} | {n} | {p} | {len(rs)} | {right} | {wrong} | {len(rs) - right - wrong} | {mean:.1f} |")


if __name__ == "__main__":
    main()
