#!/usr/bin/env python3
"""Parallel probes with real processes: `cudabisect start --jobs K` on a generated linear history whose repro
sleeps (a stand-in for a GPU run of fixed length), for K = 1, 2, 4, 8. Prints probes, rounds of the search
(wall time of the search divided by one probe's time) and wall time.

Usage: python3 benches/parallel_wall.py [path/to/cudabisect] [COMMITS] [SECONDS_PER_PROBE]
       (defaults: target/release/cudabisect, 200, 0.5)
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bisect_vs_git as g  # noqa: E402  (the history generator)


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/cudabisect")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    g.REPRO = g.REPRO.replace("sleep 0.02", f"sleep {secs}")
    culprit = n * 617 // 1000
    print("| commits | workers | search probes | wall of the search | rounds (wall / probe time) | whole run |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        g.fast_import(repo, g.linear(n, culprit))
        root = subprocess.run(["git", "-C", repo, "rev-list", "--max-parents=0", "main"],
                              capture_output=True, text=True).stdout.split()[0]
        for k in (1, 2, 4, 8):
            report = os.path.join(tmp, f"report-{k}.json")
            started = time.time()
            out = subprocess.run([binary, "start", f"{root}..main", "-C", repo, "--jobs", str(k), "--fresh",
                                  "--no-shrink", "--report", report, "--message-format", "json"],
                                 capture_output=True, text=True)
            whole = time.time() - started
            r = json.load(open(report))
            search = [p for p in r["probes"] if p["role"] == "search"]
            # The search's wall time: from the first search probe's start to the last one's end, read from
            # the event stream's timestamps when present, else the whole run less the endpoints.
            endpoints = sum(p["duration_s"] for p in r["probes"] if p["role"] != "search")
            wall = max(whole - endpoints, 0.0)
            print(f"| {n} | {k} | {len(search)} | {wall:.1f} s | {wall / secs:.1f} | {whole:.1f} s |", flush=True)
            assert out.returncode == 0, out.stderr[-2000:]


if __name__ == "__main__":
    main()
