#!/usr/bin/env python3
"""Where one probe of `one_gpu_rounds.py`'s training package spends its time, cold and warm: its
`train.py`, instrumented to print how long each part took (the imports, CUDA's start, building the model,
the forward with the Triton ops, the backward, the optimizer step), run cold from a shell twice, then as
the probes of `cudabisect start --jobs 1` (warm children of one server) and of the default `--jobs auto`
(as many at once as the GPU holds) over 80 commits, their timings read back from the probe logs beside
each probe's recorded time: what a probe costs outside the repro is the difference.

    python3 benches/probe_anatomy.py CUDABISECT [OUT_DIR]

`ANATOMY_JOBS=auto` runs only the default (a comma-separated list; `1,auto` when unset). Needs a CUDA
GPU, torch and triton. Prints one line per run: its time, the time inside the repro, and
its parts (those of 50 ms or more) in seconds.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import one_gpu_rounds
import warm_probes

TRAIN = """import atexit, sys, time
_t = [("start", time.time())]
def _mark(name):
    _t.append((name, time.time()))
atexit.register(lambda: print("ANATOMY " + " ".join(f"{n}={b - a:.3f}" for (_, a), (n, b) in zip(_t, _t[1:])),
                              file=sys.stderr, flush=True))
import torch
_mark("import_torch")
from pkg.model import forward
_mark("import_pkg")
torch.cuda.init(); torch.zeros(1, device="cuda")
_mark("cuda_init")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
_mark("model")
for step in range(3):
    x = torch.randn(256, 256, device="cuda")
    h = net(x)
    _mark(f"s{step}_linear")
    feats = forward(h.detach().reshape(-1).contiguous())
    _mark(f"s{step}_triton")
    loss = (h * feats.reshape(h.shape)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    _mark(f"s{step}_backward")
    opt.step()
    _mark(f"s{step}_adamw")
torch.cuda.synchronize()
_mark("end")
print("ok", float(loss))
"""


def files(bias_bug, embed_bug, note):
    f = warm_probes.original_files(bias_bug, embed_bug, note)
    f["train.py"] = TRAIN
    return f


def main():
    bin_ = os.path.abspath(sys.argv[1])
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "anatomy-bench").resolve()
    out.mkdir(parents=True, exist_ok=True)
    warm_probes.original_files = warm_probes.files
    warm_probes.files = files
    repo = out / "pkg"
    root, _ = warm_probes.make_repo(repo, 80)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for i in range(2):
        t = time.time()
        p = subprocess.run([sys.executable, "train.py"], cwd=repo, env=env, capture_output=True, text=True)
        line = next((l for l in p.stderr.splitlines() if l.startswith("ANATOMY")), p.stderr[-300:])
        print(f"cold {i}: wall {time.time() - t:.2f} | {line}", flush=True)
    config = out / "bisect.toml"
    config.write_text('[repro]\ncommand = "python3 train.py"\n')
    for jobs in os.environ.get("ANATOMY_JOBS", "1,auto").split(","):
        t = time.time()
        report = out / f"report-{jobs}.json"
        p = subprocess.run([bin_, "start", f"{root}..main", "--fresh", "--no-triage", "--no-shrink", "--jobs", jobs,
                            "--config", str(config), "--report", str(report), "-C", str(repo)],
                           capture_output=True, text=True)
        print(f"start --jobs {jobs}: exit {p.returncode}, wall {time.time() - t:.2f}", flush=True)
        for probe in json.loads(report.read_text())["probes"]:
            text = Path(probe["log"]).read_text(errors="replace")
            m = re.search(r"ANATOMY (.*)", text)
            parts = dict(kv.split("=") for kv in m.group(1).split()) if m else {}
            inside = sum(float(v) for v in parts.values())
            said = " ".join(f"{k}={v}" for k, v in parts.items() if float(v) >= 0.05) or text[-90:].strip()
            print(f"  {probe['role']:<13} {probe['verdict']:<5} {probe['runner']}: {probe['duration_s']:.2f} s, "
                  f"inside {inside:.2f} s | {said}")


if __name__ == "__main__":
    main()
