#!/usr/bin/env python3
"""Where the time after the search goes, at the culprit of `one_gpu_rounds.py`'s training package: the repro
run plain, compute-sanitizer's memcheck run as triage runs it (every kernel checked) and with its check
narrowed to the target's kernel (`--kernel-name kns=`), and `cudabisect shrink` at the same commit, its
events timed as they arrive.

    python3 benches/stage_costs.py CUDABISECT [OUT_DIR]

`STAGE_COSTS=memcheck` stops after the sanitizer options, `STAGE_COSTS=contention` measures memcheck beside
CPU and GPU load, `STAGE_COSTS=report` measures the XML report and host backtraces triage's run asks for,
`STAGE_COSTS=first` whether a machine's first sanitizer run costs more than the next.

Needs a CUDA GPU, compute-sanitizer, torch and triton. Prints one line per measurement and writes the
logs and events to OUT_DIR.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import one_gpu_rounds
import warm_probes

KERNEL = "_hash_embed_kernel"


def timed(name, cmd, cwd, out, env=None):
    t = time.time()
    proc = subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.time() - t
    (out / ("".join(c if c.isalnum() else "-" for c in name) + ".log")).write_text(proc.stdout + proc.stderr)
    said = next((l for l in (proc.stdout + proc.stderr).splitlines() if "Invalid" in l or "error" in l), "")
    print(f"{name}: {wall:.1f} s, exit {proc.returncode} | {said.strip()[:120]}", flush=True)
    return wall


def contention(repo, out, env, memcheck, san):
    """Triage's memcheck run alone, beside CPU-only load, and beside training runs on the GPU (what the
    capture does while triage runs): which of the two slows it."""
    timed("memcheck alone", memcheck, repo, out, san)
    spin = [subprocess.Popen(["python3", "-c", "while True: pass"]) for _ in range(4)]
    timed("memcheck beside 4 busy CPU processes", memcheck, repo, out, san)
    for p in spin:
        p.kill()
    loop = "for i in $(seq 30); do python3 train.py >/dev/null 2>&1; done"
    gpu = [subprocess.Popen(["sh", "-c", loop], cwd=repo, env=env) for _ in range(2)]
    timed("memcheck beside 2 training loops on the GPU", memcheck, repo, out, san)
    for p in gpu:
        p.kill()


def report(bin_, repo, out, san, memcheck):
    """Triage's memcheck run as `cudabisect triage` runs it (an XML report saved beside the text) against
    the plain run, with and without the host backtraces compute-sanitizer collects for every error, and
    the whole `cudabisect triage` at the same commit: where the triage stage's time beyond memcheck goes."""
    xml = ["--xml", "--save", str(out / "report.xml")]
    timed("memcheck, text only", [*memcheck, "python3", "train.py"], repo, out, san)
    timed("memcheck, text and XML report", [*memcheck, *xml, "python3", "train.py"], repo, out, san)
    for shown in ("device", "no"):
        timed(f"memcheck, text and XML report, backtraces {shown}",
              [*memcheck, *xml, "--show-backtrace", shown, "python3", "train.py"], repo, out, san)
    timed("cudabisect triage", [bin_, "triage", "-C", str(repo)], repo, out)


def first_run(repo, out, san, memcheck):
    """Whether a machine's first compute-sanitizer run pays a start-up of its own: memcheck on a program
    that only starts CUDA through torch, then triage's memcheck run twice (`STAGE_COSTS_EXTRA`: more
    sanitizer options for the last run)."""
    start_cuda = ["python3", "-c", "import torch; torch.ones(1, device='cuda'); torch.cuda.synchronize()"]
    timed("memcheck, a program that only starts CUDA", [*memcheck, *start_cuda], repo, out, san)
    timed("memcheck, the same again", [*memcheck, *start_cuda], repo, out, san)
    timed("memcheck, every kernel", [*memcheck, "python3", "train.py"], repo, out, san)
    timed("memcheck, every kernel, again", [*memcheck, "python3", "train.py"], repo, out, san)
    extra = os.environ.get("STAGE_COSTS_EXTRA", "").split()
    if extra:
        timed(f"memcheck, {' '.join(extra)}", [*memcheck, *extra, "python3", "train.py"], repo, out, san)


def main():
    bin_ = os.path.abspath(sys.argv[1])
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "stage-costs").resolve()
    out.mkdir(parents=True, exist_ok=True)
    warm_probes.original_files = warm_probes.files
    warm_probes.files = one_gpu_rounds.files
    repo = out / "pkg"
    warm_probes.make_repo(repo, 8)
    (repo / "bisect.toml").write_text('[repro]\ncommand = "python3 train.py"\ntimeout = "300s"\n')
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    timed("plain, cold Triton cache", ["python3", "train.py"], repo, out, env)
    timed("plain, warm", ["python3", "train.py"], repo, out, env)
    san = dict(env, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    memcheck = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "1000", "--error-exitcode", "86"]
    if os.environ.get("STAGE_COSTS") == "contention":
        contention(repo, out, env, [*memcheck, "python3", "train.py"], san)
        return
    if os.environ.get("STAGE_COSTS") == "first":
        first_run(repo, out, san, memcheck)
        return
    if os.environ.get("STAGE_COSTS") == "report":
        report(bin_, repo, out, san, memcheck)
        return
    timed("memcheck, every kernel", [*memcheck, "python3", "train.py"], repo, out, san)
    timed("memcheck, the target's kernel only", [*memcheck, "--kernel-name", f"kns={KERNEL}", "python3",
                                                  "train.py"], repo, out, san)
    timed("memcheck, the target's kernel only, caching allocator on",
          [*memcheck, "--kernel-name", f"kns={KERNEL}", "python3", "train.py"], repo, out, env)
    # Options that may cut the sanitizer's own start (patching every module a library loads).
    for name, extra in (("lazy patching", ["--lazy-patching", "yes"]),
                        ("no API memory-access checks", ["--check-api-memory-access", "no"]),
                        ("application only", ["--target-processes", "application-only"]),
                        ("no device heap check", ["--check-device-heap", "no"])):
        timed(f"memcheck, {name}", [*memcheck, *extra, "python3", "train.py"], repo, out, san)
    timed("memcheck, lazy module loading", [*memcheck, "python3", "train.py"], repo, out,
          dict(san, CUDA_MODULE_LOADING="LAZY"))
    if os.environ.get("STAGE_COSTS") == "memcheck":
        return
    t0 = time.time()
    proc = subprocess.Popen([bin_, "shrink", "--message-format", "json", "-C", str(repo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        now = time.time() - t0
        try:
            kind = json.loads(line).get("type")
        except ValueError:
            continue
        lines.append(f"{now:6.1f} s {kind}")
    proc.wait()
    (out / "shrink.stderr").write_text(proc.stderr.read())
    print("cudabisect shrink, events as they arrived:\n  " + "\n  ".join(lines), flush=True)
    timed("cudabisect triage", [bin_, "triage", "-C", str(repo)], repo, out)


if __name__ == "__main__":
    main()
