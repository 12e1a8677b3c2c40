#!/usr/bin/env python3
"""The first round when the bad end is the slowest probe: `cudabisect start --jobs K` (each build given)
beside `git bisect run`, on a generated linear history whose repro takes GOOD seconds where it runs clean
and BAD seconds where it faults (on a GPU the bad end is often the slowest probe of the first round: it
compiles the kernels the older commits do not have). Before the bad end is settled the search holds what
the other probes give; a build that lets a clean probe's worker take the next cut at once starts its
second round GOOD seconds in, not BAD. Prints, for each run, the search's wall time (from the run's start
to its last probe before the end, read from the JSON Lines as they arrive), probes and the answer.

Usage: python3 benches/slow_bad_end.py CUDABISECT[,CUDABISECT...] [COMMITS] [GOOD] [BAD] [K]
                                      [COLD_GOOD COLD_BAD GIT_STEP]
       (defaults: 80 commits, the fault from commit 62, 2.0 s, 3.0 s, 8 workers)

With the last three, a run replays a GPU run's timings: a worker's first run (its warm interpreter's import
and Triton's first compile, crowded by the round beside it) takes COLD_GOOD or COLD_BAD seconds and its
later ones GOOD or BAD; every step of `git bisect run` (a fresh process alone) GIT_STEP seconds. Measured
on the H200 with Liger-Kernel's Mixtral regression (BENCHMARKS.md): 2.7 2.2 8 19.0 21.5 15.4.

Runs on any machine: the repro is a shell script that sleeps (a stand-in for a run of fixed length).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bisect_vs_git as g  # the history generator


def search_time(binary, repo, root, k):
    """Runs `start` once; returns (search wall time, probes, first bad commit)."""
    started = time.time()
    last = started
    answer = None
    probes = 0
    with subprocess.Popen(
        [
            binary,
            "start",
            f"{root}..main",
            "-C",
            repo,
            "--jobs",
            str(k),
            "--fresh",
            "--no-shrink",
            "--message-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as p:
        for line in p.stdout:
            event = json.loads(line)
            if event["type"] == "probe_finished":
                last = time.time()
                probes += 1
            elif event["type"] == "finished":
                answer = (event["data"]["report"].get("first_bad") or {}).get("commit")
    return last - started, probes, answer


def git_time(repo, root):
    """`git bisect run ./repro.sh` (after ./build.sh) on the same history; returns (wall, steps, answer)."""
    step = os.path.join(repo, ".git", "step.sh")
    with open(step, "w") as f:
        f.write("#!/bin/sh\n./build.sh && ./repro.sh >/dev/null; rc=$?; [ $rc -eq 0 ] && exit 0; exit 1\n")
    os.chmod(step, 0o755)
    started = time.time()
    subprocess.run(["git", "-C", repo, "bisect", "start", "main", root], check=True, capture_output=True)
    out = subprocess.run(["git", "-C", repo, "bisect", "run", step], capture_output=True, text=True).stdout
    wall = time.time() - started
    subprocess.run(["git", "-C", repo, "bisect", "reset"], check=True, capture_output=True)
    answer = next((w.split()[0] for w in out.splitlines() if "is the first bad commit" in w), None)
    return wall, out.count("\nrunning") + out.startswith("running"), answer


def main():
    binaries = [os.path.abspath(b) for b in sys.argv[1].split(",")]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    good = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    bad = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
    k = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    culprit = n * 62 // 80
    timed = f'if [ "$(cat build.out)" = bad ]; then sleep {bad}; else sleep {good}; fi\n'
    if len(sys.argv) > 8:
        cold_good, cold_bad, git_step = (float(a) for a in sys.argv[6:9])
        # A worker's first run is cold (a marker in its own TMPDIR); git's steps run with no worker.
        timed = (
            f'if [ "$(cat build.out)" = bad ]; then cold={cold_bad}; warm={bad}; '
            f"else cold={cold_good}; warm={good}; fi\n"
            f'if [ -z "$CUDABISECT_WORKER" ]; then sleep {git_step}\n'
            'elif [ -e "$TMPDIR/bench-warm" ]; then sleep $warm\n'
            'else touch "$TMPDIR/bench-warm"; sleep $cold; fi\n'
        )
    g.REPRO = g.REPRO.replace("sleep 0.02\n", timed)
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        g.fast_import(repo, g.linear(n, culprit))
        root = subprocess.run(
            ["git", "-C", repo, "rev-list", "--max-parents=0", "main"], capture_output=True, text=True
        ).stdout.split()[0]
        print(f"{n} commits, the fault from commit {culprit}; clean runs {good} s, faulting runs {bad} s")
        print("| tool | search | probes | answer |")
        print("|---|---|---|---|")
        wall, steps, answer = git_time(repo, root)
        print(f"| git bisect run | {wall:.1f} s | {steps} | {answer[:12] if answer else None} |", flush=True)
        for b in binaries:
            # Every worker starts cold, as on a fresh machine.
            shutil.rmtree(os.path.join(repo, ".git", "cudabisect", "workers"), ignore_errors=True)
            wall, probes, answer = search_time(b, repo, root, k)
            print(f"| {b} --jobs {k} | {wall:.1f} s | {probes} | {answer[:12] if answer else None} |", flush=True)


if __name__ == "__main__":
    main()
