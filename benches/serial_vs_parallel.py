#!/usr/bin/env python3
"""Reliability: the parallel search against the serial one on messy histories, with real git and real processes.

Each round generates a linear history with random run times, a culprit, and around it what real histories hold:
commits whose build breaks, another bug of the target's class at another site, a bug of another class, a
crash; the bad end is often the slowest probe (on a GPU it compiles the kernels the older commits lack). It
runs `cudabisect start` with `--jobs 1` and with `--jobs K` (K drawn from 3, 4, 8) on the same history and
checks that both give the same answer (the first bad commit, or the same kind of end), and that where the
history is plain the answer is the planted culprit.

Usage: python3 benches/serial_vs_parallel.py CUDABISECT [ROUNDS] [SEED] [--find-fix]
       (defaults: 40 rounds, seed 1; with --find-fix the older commits fault and the planted commit fixes it)

Prints one line per round and a total; exits 1 when any round disagreed. Runs on any machine (the repro is a
shell script that sleeps and prints recorded fault messages); about 10 s a round on 2 cores.
"""

import json
import os
import random
import subprocess
import sys
import tempfile


REPRO = r"""#!/bin/sh
sleep "$(cat delay.txt)"
trace() {
  echo "Traceback (most recent call last):"
  echo "  File \"$CUDABISECT_WORKTREE/train.py\", line 40, in <module>"
  echo "    loss = step(batch)"
  echo "  File \"$CUDABISECT_WORKTREE/$1\", line $2, in $3"
  echo "    out = kernel[grid](x, y)"
}
case "$(cat mode.txt)" in
  clean) echo "step ok"; exit 0 ;;
  target) trace pkg/embed.py 27 hash_embed
    echo "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"; exit 1 ;;
  other) trace pkg/ops.py 31 bias_gelu
    echo "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"; exit 1 ;;
  misaligned) trace pkg/ops.py 31 bias_gelu
    echo "torch.AcceleratorError: CUDA error: misaligned address"; exit 1 ;;
  segv) echo "about to crash"; kill -SEGV $$ ;;
esac
echo "unknown mode"; exit 99
"""
BUILD = "#!/bin/sh\nif grep -q broken build.txt; then echo 'error: expected ;' >&2; exit 2; fi\necho built\n"
CONFIG = (
    '[build]\ncommand = ["./build.sh"]\n\n[repro]\ncommand = ["./repro.sh"]\ntimeout = "60s"\n\n'
    "[triage]\nenabled = false\n"
)


def history(rng, n, fix):
    """A list of (mode, builds, delay) per commit and the planted culprit (with `fix`, the commit that fixes
    the fault the older ones show); `plain` when nothing else is in it."""
    culprit = rng.randint(1, n - 1)
    plain = rng.random() < 0.25
    base = rng.choice([0.1, 0.2, 0.3])
    slow_bad = rng.random() < 0.6
    commits = []
    for i in range(n):
        faults = i < culprit if fix else i >= culprit
        mode = "target" if faults else "clean"
        builds = True
        if not plain and 0 < i < n - 1:
            r = rng.random()
            if r < 0.08:
                builds = False
            elif r < 0.13 and not faults:
                mode = "other"
            elif r < 0.16 and not faults:
                mode = "misaligned"
            elif r < 0.18:
                mode = "segv"
        delay = base + rng.random() * base
        if mode == "target" and slow_bad:
            delay += base * 1.5
        commits.append((mode, builds, round(delay, 2)))
    return commits, culprit, plain


def write_repo(path, commits):
    """The history through git fast-import; returns the commit ids, oldest first."""
    subprocess.run(["git", "init", "-q", "-b", "main", path], check=True)
    data = []

    def blob(text):
        raw = text.encode()
        return b"data %d\n%s\n" % (len(raw), raw)

    for i, (mode, builds, delay) in enumerate(commits):
        msg = b"commit %d" % i
        out = [
            b"commit refs/heads/main",
            b"committer B <b@x> %d +0000" % (1700000000 + i * 60),
            b"data %d" % len(msg),
            msg,
            b"deleteall",
        ]
        files = [
            ("repro.sh", REPRO, "755"),
            ("build.sh", BUILD, "755"),
            ("bisect.toml", CONFIG, "644"),
            ("mode.txt", mode + "\n", "644"),
            ("build.txt", "ok\n" if builds else "broken\n", "644"),
            ("delay.txt", f"{delay}\n", "644"),
        ]
        lines = b"\n".join(out) + b"\n"
        for name, text, perm in files:
            lines += b"M %s inline %s\n" % (perm.encode(), name.encode()) + blob(text)
        data.append(lines)
    subprocess.run(["git", "-C", path, "fast-import", "--quiet"], input=b"".join(data), check=True)
    subprocess.run(["git", "-C", path, "reset", "-q", "--hard", "main"], check=True)
    return subprocess.run(
        ["git", "-C", path, "rev-list", "--reverse", "main"], capture_output=True, text=True, check=True
    ).stdout.split()


def start(binary, repo, root, jobs, fix):
    """One `start`; returns (exit code, result kind, first bad (or fixed) commit or None, probes)."""
    out = subprocess.run(
        [binary, "start", f"{root}..main", "-C", repo, "--jobs", str(jobs), "--fresh", "--no-shrink"]
        + ["--message-format", "json"]
        + (["--find-fix"] if fix else []),
        capture_output=True,
        text=True,
    )
    report = None
    probes = 0
    for line in out.stdout.splitlines():
        event = json.loads(line)
        if event["type"] == "finished":
            report = event["data"]["report"]
        elif event["type"] == "probe_finished":
            probes += 1
    if report is None:
        return out.returncode, "none: " + out.stderr.strip()[-200:], None, probes
    # An ambiguous answer is its candidates.
    answer = (report.get("first_bad") or {}).get("commit") or ",".join(
        sorted(c["commit"][:8] for c in report.get("candidates") or [])
    )
    return out.returncode, report["result"], answer or None, probes


def main():
    binary = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    fix = "--find-fix" in sys.argv[4:]
    wrong = 0
    for r in range(rounds):
        n = rng.choice([12, 24, 48, 80])
        commits, culprit, plain = history(rng, n, fix)
        jobs = rng.choice([3, 4, 8])
        with tempfile.TemporaryDirectory() as tmp:
            repo = os.path.join(tmp, "repo")
            oids = write_repo(repo, commits)
            serial = start(binary, repo, oids[0], 1, fix)
            parallel = start(binary, repo, oids[0], jobs, fix)
        same = serial[:3] == parallel[:3]
        right = not plain or serial[2] == oids[culprit]
        verdict = "ok" if same and right else "WRONG"
        wrong += verdict != "ok"
        mix = "".join(
            {"clean": ".", "target": "T", "other": "o", "misaligned": "m", "segv": "s"}[m] if b else "x"
            for m, b, _ in commits
        )
        print(
            f"{verdict} round {r}: {n} commits, culprit {culprit}{' (plain)' if plain else ''}, --jobs {jobs}: "
            f"serial {serial[1]} {(serial[2] or '-')[:26]} ({serial[3]} probes), "
            f"parallel {parallel[1]} {(parallel[2] or '-')[:26]} ({parallel[3]} probes)  {mix}",
            flush=True,
        )
    print(f"{rounds} rounds, {wrong} disagreed")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
