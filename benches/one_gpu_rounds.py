#!/usr/bin/env python3
"""Several probes at once on one GPU against one at a time and `git bisect run`, in one run, on the same
generated PyTorch + Triton training package and the same repro.

    python3 benches/one_gpu_rounds.py CUDABISECT [COMMITS] [OUT_DIR]
    (ONE_GPU_BENCH_RUNS=git,auto leaves out the serial run; git bisect run always runs.)

The package is `warm_probes.py`'s (a target planted at COMMITS*3/4 in `hash_embed`, another bug of its
class in `bias_gelu` in the middle), its `train.py` a short training loop whose step calls the Triton ops.
The config is what a user writes: `[repro]` only. cudabisect runs `start --fresh` twice, with `--jobs 1`
and with the default (`auto`: as many probes at once on the GPU as its memory holds); `git bisect run
python3 train.py` runs on the same history. For each: the search's wall time (to the last probe of the
search, read from the JSON Lines as they arrive), the whole run, probes, and the answer. Writes the event
streams and raw numbers to OUT_DIR. Needs a CUDA GPU, torch and triton.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warm_probes

TRAIN = """import torch
from pkg.model import forward

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(256, 256, device="cuda")
    h = net(x)
    feats = forward(h.detach().reshape(-1).contiguous())
    loss = (h * feats.reshape(h.shape)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print("ok", float(loss))
"""


def files(bias_bug, embed_bug, note):
    f = warm_probes.original_files(bias_bug, embed_bug, note)
    f["train.py"] = TRAIN
    return f


def run_start(bin_, repo, root, config, out, name, extra):
    report = out / f"{name}.json"
    t0 = time.time()
    proc = subprocess.Popen([bin_, "start", f"{root}..main", "--fresh", "--config", str(config), "--report",
                             str(report), "--message-format", "json", "-C", str(repo), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events, search_end, last_probe = [], None, None
    for line in proc.stdout:
        now = time.time() - t0
        try:
            e = json.loads(line)
        except ValueError:
            continue
        events.append((round(now, 2), e))
        kind = e.get("type")
        if kind == "probe_finished" and search_end is None:
            last_probe = now
        after = ("stage_began", "shrink_started", "environment_probe", "triage_finished")
        if kind in after and search_end is None:
            search_end = last_probe or now
    stderr = proc.stderr.read()
    proc.wait()
    wall = time.time() - t0
    (out / f"{name}.events.jsonl").write_text("\n".join(json.dumps({"t": t, **e}) for t, e in events))
    (out / f"{name}.stderr").write_text(stderr)
    r = json.loads(report.read_text())
    at_once = [e["data"] for _, e in events if e.get("type") == "probes_at_once"]
    searched = [p for p in r["probes"] if p["role"] in ("search", "bad_endpoint", "good_endpoint")]
    return {"wall": wall, "search": search_end or wall, "probes": len(searched),
            "first_bad": r.get("first_bad", {}).get("subject"), "at_once": at_once,
            "shrink_s": (r.get("shrink") or {}).get("duration_s")}


def main():
    bin_ = os.path.abspath(sys.argv[1])
    commits = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    out = Path(sys.argv[3] if len(sys.argv) > 3 else "one-gpu-bench").resolve()
    out.mkdir(parents=True, exist_ok=True)
    warm_probes.original_files = warm_probes.files
    warm_probes.files = files
    repo = out / "pkg"
    root, bad = warm_probes.make_repo(repo, commits)
    config = out / "bisect.toml"
    config.write_text('[repro]\ncommand = "python3 train.py"\ntimeout = "300s"\n')
    want = f"commit {bad}"
    raw = {}
    runs = os.environ.get("ONE_GPU_BENCH_RUNS", "git,serial,auto").split(",")
    # git bisect run first: it warms the machine's Triton cache for everyone alike.
    t = time.time()
    warm_probes.git(repo, "bisect", "start", "main", root)
    proc = subprocess.run(["git", "bisect", "run", "python3", "train.py"], check=False, cwd=repo,
                          capture_output=True, text=True)
    gwall = time.time() - t
    first = [line for line in proc.stdout.splitlines() if "is the first bad commit" in line]
    named = warm_probes.git(repo, "log", "-1", "--format=%s", first[0].split()[0]).strip() if first else "none"
    warm_probes.git(repo, "bisect", "reset")
    raw["git bisect run"] = {"wall": gwall, "search": gwall, "probes": proc.stdout.count("running"),
                             "first_bad": named}
    for name, extra in (("serial", ["--jobs", "1"]), ("auto", [])):
        if name in runs:
            raw[f"cudabisect {name}"] = run_start(bin_, repo, root, config, out, name, extra)
    (out / "raw.json").write_text(json.dumps(raw, indent=1))
    g = raw["git bisect run"]["wall"]
    print(f"{commits} commits, target at commit {bad}")
    print("| tool | search | × git bisect run | whole run | × git bisect run | probes | at once | answer |")
    print("|---|---|---|---|---|---|---|---|")
    for name, v in raw.items():
        right = "right" if v["first_bad"] == want else f"WRONG ({v['first_bad']})"
        at = ", ".join(f"{a['probes']} of {a['workers']}" for a in v.get("at_once", [])) or "-"
        print(f"| {name} | {v['search']:.0f} s | {g / v['search']:.2f} | {v['wall']:.0f} s | {g / v['wall']:.2f} "
              f"| {v['probes']} | {at} | {right} |")


if __name__ == "__main__":
    main()
