#!/usr/bin/env python3
"""Benchmark: `cudabisect start` against `git bisect run` on generated histories, same build and repro.

Usage: python3 benches/bisect_vs_git.py [path/to/cudabisect] [SIZE,SIZE...]
       (defaults: target/release/cudabisect, 1000)

For each size and history (linear; merge-heavy with a 3-commit side branch merged every 8 commits) it plants
a culprit, runs both tools from a fresh clone, and prints probes, wall time and peak RSS (the largest process
of the run, from /usr/bin/time) side by side. Every probe runs the same `build.sh` and `repro.sh` (a 20 ms
stand-in for a real build and GPU run).
"""
import json, os, shutil, subprocess, sys, tempfile, time

BUILD = "#!/bin/sh\ncp state.txt build.out\n"
REPRO = "#!/bin/sh\nsleep 0.02\nif [ \"$(cat build.out)\" = bad ]; then\n  echo 'CUDA error: an illegal memory access was encountered'; exit 42\nfi\necho ok\n"
CONFIG = '[build]\ncommand = ["./build.sh"]\n[repro]\ncommand = ["./repro.sh"]\n[triage]\nenabled = false\n'


def fast_import(path, commits):
    """commits: list of (mark, parents, state). Writes them with git fast-import."""
    subprocess.run(["git", "init", "-q", "-b", "main", path], check=True)
    lines = []
    blobs = {}
    for name, body in [("build.sh", BUILD), ("repro.sh", REPRO), ("bisect.toml", CONFIG), ("good", "good\n"), ("bad", "bad\n")]:
        mark = len(blobs) + 1
        blobs[name] = mark
        data = body.encode()
        lines.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(data), data))
    base = 100
    for i, (mark, parents, state) in enumerate(commits):
        msg = b"commit %d" % i
        out = [b"commit refs/heads/main", b"mark :%d" % (base + mark),
               b"committer B <b@x> %d +0000" % (1700000000 + i * 60), b"data %d" % len(msg), msg]
        if parents:
            out.append(b"from :%d" % (base + parents[0]))
            for p in parents[1:]:
                out.append(b"merge :%d" % (base + p))
        out.append(b"deleteall")
        out.append(b"M 755 :%d build.sh" % blobs["build.sh"])
        out.append(b"M 755 :%d repro.sh" % blobs["repro.sh"])
        out.append(b"M 644 :%d bisect.toml" % blobs["bisect.toml"])
        out.append(b"M 644 :%d state.txt" % blobs[state])
        lines.append(b"\n".join(out) + b"\n")
    subprocess.run(["git", "-C", path, "fast-import", "--quiet"], input=b"".join(lines), check=True)
    subprocess.run(["git", "-C", path, "reset", "-q", "--hard", "main"], check=True)


def linear(n, culprit):
    return [(i, [i - 1] if i else [], "bad" if i >= culprit else "good") for i in range(n)]


def merge_heavy(n, culprit_side):
    """Main line; every 5th main commit merges a 3-commit side branch. The culprit is on a side branch."""
    commits, mark, head, bad = [(0, [], "good")], 1, 0, False
    rounds = 0
    while mark < n:
        side = head
        for j in range(3):
            planted = rounds == culprit_side and j == 1
            bad_side = bad or planted or (rounds == culprit_side and j > 1)
            commits.append((mark, [side], "bad" if bad_side else "good")); side = mark; mark += 1
        for _ in range(4):
            commits.append((mark, [head], "bad" if bad else "good")); head = mark; mark += 1
        bad = bad or rounds == culprit_side
        commits.append((mark, [head, side], "bad" if bad else "good")); head = mark; mark += 1
        rounds += 1
    return commits


def timed(argv, **kw):
    """Runs argv under /usr/bin/time; returns (CompletedProcess, peak RSS in MiB)."""
    rss = tempfile.mktemp()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss] + argv, capture_output=True, text=True, **kw)
    peak = int(open(rss).read().split()[-1]) / 1024
    os.unlink(rss)
    return out, peak


def run_git(path):
    root = subprocess.run(["git", "-C", path, "rev-list", "--max-parents=0", "main"], capture_output=True, text=True).stdout.split()[0]
    counter = os.path.join(path, ".git", "probe-count")
    script = f"echo x >> {counter}; ./build.sh && ./repro.sh"
    t = time.monotonic()
    _, peak1 = timed(["git", "-C", path, "bisect", "start", "main", root], check=True)
    out, peak2 = timed(["git", "-C", path, "bisect", "run", "sh", "-c", script])
    wall = time.monotonic() - t
    first = [l for l in out.stdout.splitlines() if "is the first bad commit" in l]
    subprocess.run(["git", "-C", path, "bisect", "reset"], capture_output=True)
    probes = sum(1 for _ in open(counter))
    return probes, wall, max(peak1, peak2), first[0].split()[0] if first else None


def run_cudabisect(binary, path):
    root = subprocess.run(["git", "-C", path, "rev-list", "--max-parents=0", "main"], capture_output=True, text=True).stdout.split()[0]
    report = os.path.join(path, "..", "report.json")
    t = time.monotonic()
    _, peak = timed([binary, "start", f"{root}..main", "-C", path, "--report", report])
    wall = time.monotonic() - t
    r = json.load(open(report))
    search = sum(1 for p in r["probes"] if p["role"] == "search")
    return len(r["probes"]), search, wall, peak, r["first_bad"]["commit"] if r["first_bad"] else None


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/cudabisect")
    sizes = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1000").split(",")]
    print(f"{'history':<30} {'tool':<12} {'probes':>14} {'wall s':>8} {'peak MiB':>9}  culprit")
    histories = []
    for n in sizes:
        histories.append((f"linear, {n} commits", linear(n, n * 617 // 1000)))
        histories.append((f"merge-heavy, {n} commits", merge_heavy(n, n * 77 // 1000)))
    for name, commits in histories:
        tmp = tempfile.mkdtemp()
        try:
            a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
            fast_import(a, commits)
            shutil.copytree(a, b)
            gp, gw, gm, gc = run_git(a)
            total, search, cw, cm, cc = run_cudabisect(binary, b)
            print(f"{name:<30} {'git bisect':<12} {gp:>14} {gw:>8.2f} {gm:>9.1f}  {gc[:12] if gc else '-'}")
            print(f"{'':<30} {'cudabisect':<12} {f'{search} (+{total - search} ends)':>14} {cw:>8.2f} {cm:>9.1f}  {cc[:12] if cc else '-'}", flush=True)
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
