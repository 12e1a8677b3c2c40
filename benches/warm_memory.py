#!/usr/bin/env python3
"""What a second `start` gains from what the first one's warm probes taught (kept in the state directory):
the same bisection run again and again on one repository, alternately with that lesson removed first and
kept, on a CPU machine.

    python3 benches/warm_memory.py CUDABISECT [PAIRS] [OUT_DIR]

The package (generated here, 40 commits, the fault from commit 30) imports `transformers` inside a function
it calls at import, as Liger-Kernel's device check does: no source line a first guess reads shows that
import, so without a lesson every first-round probe imports it in its own child. The repro prints the
CUDA error a fault would (no GPU is needed). Prints, for each kind of run, the median of the whole `start`
and of the first round (the end of the last probe that started at once with the others), and writes the
JSON Lines of every run to OUT_DIR. Needs git, torch and transformers on PATH's python3.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PKG = """import torch


def _device():
    # Imported where no top-level line shows it, as a library's device check does.
    import transformers  # noqa: F401

    return "cpu"


DEVICE = _device()
"""

TRAIN = """import sys

import torch

import pkg

v = int(open("version.txt").read())
x = torch.randn(64, 64, device=pkg.DEVICE, requires_grad=True)
(x @ x).sum().backward()
if v >= 30:
    print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
    sys.exit(1)
print("ok", v)
"""

CONFIG = """[repro]
command = "python3 train.py"
timeout = "120s"
"""


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_repo(repo):
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "__init__.py").write_text(PKG)
    (repo / "train.py").write_text(TRAIN)
    for v in range(40):
        (repo / "version.txt").write_text(f"{v}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {v}")
        if v == 0:
            git(repo, "tag", "v0")


def one_run(binary, repo, config, events):
    started = time.monotonic()
    with open(events, "w") as out:
        rc = subprocess.run(
            [
                binary,
                "start",
                "v0..main",
                "--fresh",
                "--config",
                str(config),
                "-C",
                str(repo),
                "--message-format",
                "json",
            ],
            stdout=out,
            stderr=subprocess.DEVNULL,
            check=False,
        ).returncode
    whole = time.monotonic() - started
    culprit, durations = None, {}
    with open(events) as f:
        lines = f.readlines()
    for line in lines:
        e = json.loads(line)
        if e["type"] == "probe_finished":
            durations[e["data"]["step"]] = e["data"]["record"]["duration_s"]
        if e["type"] == "finished":
            culprit = (e["data"]["report"].get("first_bad") or {}).get("subject")
    # The first round: the longest of its probes, the first as many steps as there are workers (one per
    # core, as `--jobs auto` picks without a GPU).
    workers = min(len(durations), os.cpu_count() or 1)
    first_round = max((durations[s] for s in sorted(durations)[:workers]), default=0.0)
    return rc, whole, first_round, culprit


def main():
    binary = os.path.abspath(sys.argv[1])
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    out = Path(
        sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="warm-memory-")
    )
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="warm-memory-repo-"))
    repo = work / "repo"
    make_repo(repo)
    config = work / "bisect.toml"
    config.write_text(CONFIG)
    lesson = repo / ".git" / "cudabisect" / "warm"
    runs = {"without the lesson": [], "with the lesson": []}
    for n in range(pairs + 1):  # the first pair warms the page cache and is not counted
        for kind, got in runs.items():
            if kind == "without the lesson":
                shutil.rmtree(lesson, ignore_errors=True)
            rc, whole, first_round, culprit = one_run(
                binary, repo, config, out / f"{n}-{kind.replace(' ', '-')}.jsonl"
            )
            if rc != 0 or culprit != "commit 30":
                sys.exit(f"{kind}: exit {rc}, culprit {culprit!r}")
            if n > 0:
                got.append((whole, first_round))
    print(
        f"{pairs} runs of each, alternately, {os.cpu_count()} cores; every culprit commit 30"
    )
    print("| run | whole `start` (median, min–max) | first round (median, min–max) |")
    print("|---|---|---|")
    for kind, got in runs.items():
        whole = [w for w, _ in got]
        first = [f for _, f in got]
        print(
            f"| {kind} | {statistics.median(whole):.2f} s ({min(whole):.2f}–{max(whole):.2f}) "
            f"| {statistics.median(first):.2f} s ({min(first):.2f}–{max(first):.2f}) |"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
