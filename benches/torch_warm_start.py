#!/usr/bin/env python3
"""The PyTorch harness's time per candidate: every call a fresh Python process (cold) against the warm
server that builds the model once and forks each call from it, and confirmation runs one by one against
several at once. Needs a GPU, torch and triton (and torchvision for the ResNet fixtures). Usage:

    python3 benches/torch_warm_start.py BIN FIXTURE.py [FIXTURE.py ...]

For every fixture and mode, `cudabisect shrink` runs in a scratch repository holding the fixture
(`confirm = 5`). Times come from the shrink's own files: its wall time from the report, the first (cold)
part from the start to the located run's log, each later harness run from the gap between consecutive run
logs (each is written the moment its run ends), and the confirmation from the last five logs.
Prints one Markdown table row per fixture and mode. `MODES=warm` in the environment runs only the
modes whose name holds that word (the cold mode takes about 100 s a fixture).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODES = [
    ("cold: a process per call", "warm-start = false\nconfirm-jobs = 1\n"),
    ("warm server", "warm-start = true\nconfirm-jobs = 1\n"),
    ("warm server, confirm-jobs = 5", "warm-start = true\nconfirm-jobs = 5\n"),
]
CONFIRM = 5


def shrink(binary, fixture, mode):
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        os.makedirs(repo)
        shutil.copy(fixture, os.path.join(repo, "toy_model.py"))
        with open(os.path.join(repo, "bisect.toml"), "w") as f:
            f.write('[repro]\ncommand = ["true"]\n\n[shrink]\nmodel = "toy_model:build"\n'
                    f'inputs = "toy_model:example_inputs"\nconfirm = {CONFIRM}\ntimeout = "10m"\n{mode}'
                    '\n[bundle]\nenabled = false\n')
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "m"]):
            subprocess.run(cmd, cwd=repo, check=True)
        start = time.time()
        out = subprocess.run([binary, "shrink", "--message-format", "json", "-C", repo],
                             capture_output=True, text=True)
        report = next((json.loads(line)["data"]["report"] for line in out.stdout.splitlines()
                       if line.startswith("{") and json.loads(line).get("type") == "shrink_done"), None)
        if report is None:
            return None, out.stderr[-2000:]
        logs = os.path.join(report["out_dir"], "logs")
        first = os.path.getmtime(os.path.join(logs, "locate.log")) - start
        runs = sorted(f for f in os.listdir(logs) if f.startswith("run-"))
        times = [os.path.getmtime(os.path.join(logs, f)) for f in runs]
        before = os.path.getmtime(os.path.join(logs, "descend.log" if os.path.exists(
            os.path.join(logs, "descend.log")) else "locate.log"))
        reducer = times[:-CONFIRM]
        gaps = [b - a for a, b in zip([before] + reducer, reducer)]
        confirm_start = reducer[-1] if reducer else before
        confirm = times[-1] - confirm_start if len(times) >= CONFIRM else float("nan")
        return {
            "wall": report["duration_s"],
            "runs": report["harness_runs"],
            "kept": ", ".join(n["id"] for n in report["kept"]),
            "confirmed": report["confirmation"]["reproduced"] if report.get("confirmation") else 0,
            "first": first,
            "per_run": statistics.median(gaps) if gaps else float("nan"),
            "confirm": confirm,
        }, None


def main():
    binary, fixtures = sys.argv[1], sys.argv[2:]
    print("| model | mode | harness runs | shrink wall | first call to located run | "
          "per candidate after (median) | 5 confirmation runs | kept (confirmed) |")
    print("|---|---|---|---|---|---|---|---|")
    only = os.environ.get("MODES")
    modes = [(n, m) for n, m in MODES if not only or only in n]
    for fixture in fixtures:
        for name, mode in modes:
            r, err = shrink(binary, fixture, mode)
            label = os.path.basename(fixture)
            if r is None:
                print(f"| {label} | {name} | failed: {err!r} |||||")
                continue
            print(f"| {label} | {name} | {r['runs']} | {r['wall']:.1f} s | {r['first']:.1f} s | "
                  f"{r['per_run']:.2f} s | {r['confirm']:.1f} s | {r['kept']} ({r['confirmed']}/{CONFIRM}) |",
                  flush=True)


if __name__ == "__main__":
    main()
