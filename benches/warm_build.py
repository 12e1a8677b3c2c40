#!/usr/bin/env python3
"""Benchmark: a Python build command run warm (`[build] warm`, the default) against cold, and `git bisect run`.

Usage: python3 benches/warm_build.py [path/to/cudabisect] [COMMITS] [REPEATS]
       (defaults: target/release/cudabisect, 40, 3)

It generates a history of COMMITS commits (the culprit at two thirds) whose build step is `python3 build.py`:
it imports PyTorch's extension builder (`torch.utils.cpp_extension`, as a `setup.py build_ext` does) and
writes `built.txt`, which the repro (`python3 repro.py`, no torch) checks before it fails or passes. Then
it runs, REPEATS times each and in turns: `git bisect run sh -c 'python3 build.py && python3 repro.py'`,
`cudabisect start` with the config a user writes (`[build]` and `[repro]`), and the same with `[build] warm
= false`. It prints the min/median/max wall time of each, the probes, and the culprit each named.
"""
import json, os, statistics, subprocess, sys, tempfile, time

BUILD = "import torch.utils.cpp_extension  # what a setup.py build_ext imports\nv = open('version.txt').read()\nopen('built.txt', 'w').write(v)\n"
REPRO = (
    "import sys\n"
    "v = open('version.txt').read()\n"
    "if open('built.txt').read() != v:\n"
    "    sys.exit('not built')\n"
    "if int(v) >= @BAD@:\n"
    "    print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr)\n"
    "    sys.exit(1)\n"
)
CONFIG = '[build]\ncommand = "python3 build.py"\n@WARM@[repro]\ncommand = "python3 repro.py"\n[triage]\nenabled = false\n'


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def history(path, n, bad):
    os.makedirs(path)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "b@x")
    git(path, "config", "user.name", "B")
    open(os.path.join(path, "build.py"), "w").write(BUILD)
    open(os.path.join(path, "repro.py"), "w").write(REPRO.replace("@BAD@", str(bad)))
    open(os.path.join(path, ".gitignore"), "w").write("built.txt\n")
    for i in range(1, n + 1):
        open(os.path.join(path, "version.txt"), "w").write(f"{i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"commit {i}")
    return git(path, "rev-list", "--max-parents=0", "HEAD").strip()


def git_bisect(repo, good):
    git(repo, "bisect", "start", "main", good)
    started = time.monotonic()
    out = subprocess.run(
        ["git", "-C", repo, "bisect", "run", "sh", "-c", "python3 build.py && python3 repro.py"],
        capture_output=True, text=True,
    ).stdout
    wall = time.monotonic() - started
    steps = out.count("running")
    culprit = next((line.split()[0] for line in out.splitlines() if "is the first bad commit" in line), "?")
    git(repo, "bisect", "reset")
    subject = git(repo, "log", "-1", "--format=%s", culprit) if culprit != "?" else "?"
    return wall, steps, subject.strip()


def cudabisect(binary, repo, good, config, tmp):
    report_path = os.path.join(tmp, "report.json")
    started = time.monotonic()
    run = subprocess.run(
        [binary, "start", f"{good}..main", "--config", config, "--fresh", "--report", report_path, "-C", repo],
        capture_output=True, text=True,
    )
    wall = time.monotonic() - started
    if run.returncode != 0:
        sys.exit(f"cudabisect exited {run.returncode}:\n{run.stderr[-2000:]}")
    report = json.load(open(report_path))
    probes = report["probes"]
    runners = sorted({(p.get("build_runner") or "none").split(":")[0] for p in probes})
    subject = (report.get("first_bad") or {}).get("subject", "?")
    return wall, len(probes), subject, runners


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/cudabisect")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    bad = n * 2 // 3
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        good = history(repo, n, bad)
        configs = {}
        for name, warm in (("warm", ""), ("cold", "warm = false\n")):
            configs[name] = os.path.join(tmp, f"{name}.toml")
            open(configs[name], "w").write(CONFIG.replace("@WARM@", warm))
        times = {"git bisect run": [], "cudabisect, build warm (default)": [], "cudabisect, [build] warm = false": []}
        facts = {}
        for _ in range(repeats):
            wall, steps, subject = git_bisect(repo, good)
            times["git bisect run"].append(wall)
            facts["git bisect run"] = (steps, subject, "-")
            for name, label in (("warm", "cudabisect, build warm (default)"), ("cold", "cudabisect, [build] warm = false")):
                wall, probes, subject, runners = cudabisect(binary, repo, good, configs[name], tmp)
                times[label].append(wall)
                facts[label] = (probes, subject, ",".join(runners))
        print(f"{n} commits, culprit commit {bad}, {repeats} runs each, {os.cpu_count()} cores")
        print("| tool | wall min / median / max | probes | builds ran | answer |")
        print("|---|---|---|---|---|")
        for label, walls in times.items():
            probes, subject, runners = facts[label]
            print(f"| {label} | {min(walls):.1f} / {statistics.median(walls):.1f} / {max(walls):.1f} s | {probes} | {runners} | {subject} |")


if __name__ == "__main__":
    main()
