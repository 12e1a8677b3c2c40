#!/usr/bin/env python3
"""Probe cost of a PyTorch + Triton package on a GPU: cudabisect with warm probes, with `[repro] warm =
false`, and `git bisect run` with the same repro on the same history, one after the other in one run.

    python3 benches/warm_probes.py CUDABISECT [COMMITS] [OUT_DIR]
    (WARM_BENCH_SKIP_COLD=1 leaves out the run with `warm = false`)

The package (generated here) launches every Triton kernel through one wrapper; commit COMMITS*3/4 plants
an unmasked store with far too many blocks in `hash_embed` (the target), and commits in the middle plant
the same bug in `bias_gelu` (another bug of the same class, through the same launch site). Prints a
Markdown table and writes the reports and raw timings to OUT_DIR. Needs a CUDA GPU, torch and triton.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

KERNEL = '''import torch
import triton
import triton.language as tl
from pkg.launch import run


@triton.jit
def _{name}_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, {body}{mask})


def {name}(x):
    out = torch.empty_like(x)
    n = x.numel()
    run(_{name}_kernel, ({blocks},), x, out, n, BLOCK=1024)
    return out
'''


def files(bias_bug, embed_bug, note):
    def kernel(name, body, bug):
        return KERNEL.format(
            name=name,
            body=body,
            mask="" if bug else ", mask=offs < n",
            blocks="n * 64" if bug else "triton.cdiv(n, 1024)",
        )

    return {
        "pkg/__init__.py": "",
        "pkg/launch.py": "def run(kernel, grid, *args, **kw):\n    kernel[grid](*args, **kw)\n",
        "pkg/ops.py": kernel("bias_gelu", "x * 0.5", bias_bug),
        "pkg/embed.py": kernel("hash_embed", "x + 1.0", embed_bug),
        "pkg/model.py": "from pkg.embed import hash_embed\nfrom pkg.ops import bias_gelu\n\n\n"
        "def forward(x):\n    return hash_embed(bias_gelu(x))\n",
        "train.py": "import torch\nfrom pkg.model import forward\n\nx = torch.randn(1 << 16, device='cuda')\n"
        "y = forward(x)\ntorch.cuda.synchronize()\nprint('ok', float(y.sum()))\n",
        "NOTES.md": f"revision {note}\n",
    }


def git(repo, *args, **kw):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, **kw).stdout


def make_repo(repo, commits):
    bad = commits * 3 // 4
    other = range(commits // 3, commits // 3 + commits // 8)
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main", ".")
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@x", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@x")
    for i in range(commits):
        for path, text in files(i in other, i >= bad, i).items():
            p = repo / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"commit {i}"], cwd=repo, check=True, env=env)
    return git(repo, "rev-list", "--max-parents=0", "HEAD").strip(), bad


def start(bin_, repo, root, config, report):
    t = time.time()
    out = subprocess.run([bin_, "start", f"{root}..main", "--fresh", "--config", str(config), "--report",
                          str(report), "-C", str(repo)], capture_output=True, text=True)
    wall = time.time() - t
    r = json.loads(report.read_text())
    return wall, r, out


def timed(cmd, **kw):
    t = time.time()
    subprocess.run(cmd, check=True, capture_output=True, **kw)
    return time.time() - t


def breakdown(out):
    """Where a probe's time goes: a cold interpreter's imports, CUDA's start, and a warm child's fork."""
    runner = Path(__file__).resolve().parents[1] / "harness" / "warm" / "warm_probe.py"
    (out / "touch.py").write_text("import torch, triton\ntorch.zeros(1, device='cuda')\ntorch.cuda.synchronize()\n")
    (out / "nothing.py").write_text("pass\n")
    cold_imports = timed(["python3", "-c", "import torch, triton"])
    cold_cuda = timed(["python3", str(out / "touch.py")])
    server = subprocess.Popen(["python3", str(runner), "--preload", "torch,triton", "serve", "--socket",
                               str(out / "w.sock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    t = time.time()
    server.stdout.readline()
    preload = time.time() - t
    client = ["python3", "-S", "-E", str(runner), "client", str(out / "w.sock"), str(out / "status"), "--"]
    fork = min(timed(client + ["python3", str(out / "nothing.py")]) for _ in range(3))
    warm_cuda = min(timed(client + ["python3", str(out / "touch.py")]) for _ in range(3))
    server.stdin.close()
    server.wait()
    rows = {"cold: import torch, triton": cold_imports, "cold: import and start CUDA": cold_cuda,
            "warm server: preload torch, triton (once per worker)": preload,
            "warm: client, fork, empty script": fork, "warm: client, fork, start CUDA": warm_cuda}
    for k, v in rows.items():
        print(f"{k}: {v:.2f} s")
    return rows


def main():
    bin_ = os.path.abspath(sys.argv[1])
    commits = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    out = Path(sys.argv[3] if len(sys.argv) > 3 else "warm-bench").resolve()
    out.mkdir(parents=True, exist_ok=True)
    repo = out / "pkg"
    root, bad = make_repo(repo, commits)
    rows, raw = [], {}
    kinds = [("cudabisect, warm probes", "true"), ("cudabisect, cold probes", "false")]
    if os.environ.get("WARM_BENCH_SKIP_COLD") == "1":
        kinds = kinds[:1]  # the cold run takes minutes; its numbers change only with the probe path
    for name, warm in kinds:
        config = out / f"{'warm' if warm == 'true' else 'cold'}.toml"
        config.write_text(f"[repro]\ncommand = \"python3 train.py\"\ntimeout = \"300s\"\nwarm = {warm}\n"
                          "[triage]\nenabled = true\ntimeout = \"10m\"\n")
        wall, r, proc = start(bin_, repo, root, config, out / f"{config.stem}.json")
        (out / f"{config.stem}.stderr").write_text(proc.stderr)
        probes = [p for p in r["probes"] if p["role"] in ("search", "bad_endpoint", "good_endpoint")]
        clean = [p["duration_s"] for p in probes if p["verdict"] == "good"]
        badp = [p["duration_s"] for p in probes if p["verdict"] == "bad"]
        other = [p["duration_s"] for p in probes if p["verdict"] == "skip"]
        sanitizer = sum(1 for p in r["probes"] if p.get("sanitizer"))
        search = sum(p["duration_s"] for p in r["probes"])
        ok = r.get("first_bad", {}).get("subject") == f"commit {bad}"
        raw[name] = {"wall": wall, "clean": clean, "bad": badp, "other": other, "sanitizer_runs": sanitizer,
                     "runners": [p.get("runner") for p in r["probes"]], "right": ok}
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")  # noqa: E731
        rows.append((name, f"{med(clean[1:] or clean):.1f} s", f"{med(badp[1:] or badp):.1f} s",
                     f"{med(other):.1f} s" if other else "-", f"{search:.0f} s", f"{wall:.0f} s",
                     str(sanitizer), "right" if ok else f"WRONG ({r.get('message')})"))
    # git bisect run with the same repro: exit 1 (the fault) is bad, 0 good.
    git(repo, "bisect", "reset")
    t = time.time()
    git(repo, "bisect", "start", "main", root)
    proc = subprocess.run(["git", "bisect", "run", "python3", "train.py"], cwd=repo, capture_output=True,
                          text=True)
    gwall = time.time() - t
    first = [line for line in proc.stdout.splitlines() if "is the first bad commit" in line]
    named = git(repo, "log", "-1", "--format=%s", first[0].split()[0]).strip() if first else "none"
    git(repo, "bisect", "reset")
    steps = proc.stdout.count("running")
    raw["git bisect run"] = {"wall": gwall, "steps": steps, "named": named}
    rows.append(("git bisect run", "-", "-", "-", f"{gwall:.0f} s", f"{gwall:.0f} s", "0",
                 "right" if named == f"commit {bad}" else f"WRONG ({named})"))
    raw["breakdown"] = breakdown(out)
    (out / "raw.json").write_text(json.dumps(raw, indent=1))
    print(f"{commits} commits, target planted at commit {bad}, another bug of its class at "
          f"{commits // 3}..{commits // 3 + commits // 8 - 1}")
    print("| tool | clean probe (median after the first) | bad probe | other-bug probe | all probes | whole run "
          "| sanitizer runs | answer |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
