#!/usr/bin/env python3
"""Shrinking a faulting PyTorch model: cudabisect's PyTorch harness against torch._functorch.fx_minifier
driving the same traced graph. Needs a GPU, torch and triton. Usage:

    python3 benches/torch_vs_fx_minifier.py BIN FIXTURE.py [FIXTURE.py ...]

For cudabisect: `cudabisect shrink` in a scratch repository holding the fixture (runs to the minimal
subgraph, wall time, final size, signature). For fx_minifier: its documented entry point,
`minifier(fx_graph, inputs, module_fails)`, with every query isolated in a fresh process (as its `--isolate`
default does) and judged by the same classifier, counting queries and time until it returns or fails.
"""
import json, os, shutil, subprocess, sys, tempfile, time

RUNNER = r'''
import sys, torch
sys.path.insert(0, sys.argv[2])
d = torch.load(sys.argv[1], weights_only=False)
gm, inps = d["gm"].cuda(), [i.cuda() for i in d["inps"]]
out = gm(*inps)
torch.cuda.synchronize()
'''


def classify(binary, text, code):
    r = subprocess.run([binary, "classify", "--json", "--exit-code", str(code), "-"], input=text,
                       capture_output=True, text=True)
    return json.loads(r.stdout)


def ours(binary, fixture):
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        os.makedirs(repo)
        shutil.copy(fixture, os.path.join(repo, "toy_model.py"))
        with open(os.path.join(repo, "bisect.toml"), "w") as f:
            f.write('[repro]\ncommand = ["true"]\n\n[shrink]\nmodel = "toy_model:build"\n'
                    'inputs = "toy_model:example_inputs"\nconfirm = 1\ntimeout = "10m"\n\n[bundle]\nenabled = false\n')
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "-c", "user.name=b", "-c", "user.email=b@b",
                                                                     "commit", "-qm", "m"]):
            subprocess.run(cmd, cwd=repo, check=True)
        t = time.perf_counter()
        r = subprocess.run([binary, "shrink", "--message-format", "json", "-C", repo], capture_output=True, text=True)
        wall = time.perf_counter() - t
        rep = next(json.loads(l)["report"] for l in r.stdout.splitlines() if '"shrink_done"' in l)
        return {"runs": rep["runs_to_minimal"], "wall_s": wall, "nodes_before": rep["nodes_before"],
                "nodes_after": rep["nodes_after"], "signature": (rep["signature"] or {}).get("class"),
                "kernel": (rep["signature"] or {}).get("kernel"), "result": rep["summary"]}


def fx_minifier(binary, fixture):
    import importlib.util
    import torch
    import torch.fx
    from torch._functorch.fx_minifier import minifier
    spec = importlib.util.spec_from_file_location("toy_model", fixture)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["toy_model"] = mod
    spec.loader.exec_module(mod)
    model = mod.build().cuda()
    inps = [x.cuda() for x in mod.example_inputs()]
    gm = torch.fx.symbolic_trace(model)
    nodes = len([n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")])
    tmp = tempfile.mkdtemp()
    state = {"queries": 0, "last": None}

    def module_fails(fx_g, args):
        state["queries"] += 1
        path = os.path.join(tmp, f"q{state['queries']}.pt")
        torch.save({"gm": fx_g, "inps": [a.cpu() for a in args]}, path)
        r = subprocess.run([sys.executable, "-c", RUNNER, path, os.path.dirname(os.path.abspath(fixture))],
                           capture_output=True, text=True, env=dict(os.environ, CUDA_LAUNCH_BLOCKING="1"))
        sig = classify(binary, r.stdout + r.stderr, r.returncode)
        state["last"] = sig
        return r.returncode != 0

    t = time.perf_counter()
    try:
        result = minifier(gm, inps, module_fails, dump_state=lambda *a, **k: None)
        final = result[0] if isinstance(result, tuple) else result
        size = len([n for n in final.graph.nodes if n.op not in ("placeholder", "output", "get_attr")])
        outcome = f"minimal graph of {size} nodes"
    except BaseException as e:  # noqa: BLE001 - what it died of is the measurement
        size = None
        outcome = f"no result: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return {"queries": state["queries"], "wall_s": time.perf_counter() - t, "nodes_before": nodes,
            "nodes_after": size, "signature": (state["last"] or {}).get("class"), "result": outcome}


def main():
    binary, fixtures = sys.argv[1], sys.argv[2:]
    rows = []
    for fx in fixtures:
        a = ours(binary, fx)
        # fx_minifier runs in its own process: its first eager pass may poison the CUDA context.
        r = subprocess.run([sys.executable, __file__, "--fx", binary, fx], capture_output=True, text=True)
        try:
            b = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            b = {"queries": None, "wall_s": None, "nodes_after": None, "signature": None,
                 "result": "crashed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:160]}
        rows.append((os.path.basename(fx), a, b))
    print("| model | tool | harness runs / queries | wall | nodes before → after | signature | result |")
    print("|---|---|---|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | cudabisect | {a['runs']} | {a['wall_s']:.1f} s | {a['nodes_before']} → {a['nodes_after']} | "
              f"{a['signature']} ({a['kernel']}) | {a['result']} |")
        w = f"{b['wall_s']:.1f} s" if b.get("wall_s") is not None else "—"
        print(f"| {name} | fx_minifier | {b.get('queries')} | {w} | {b.get('nodes_before', '?')} → {b.get('nodes_after')} | "
              f"{b.get('signature')} | {b['result']} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fx":
        print(json.dumps(fx_minifier(sys.argv[2], sys.argv[3])))
    else:
        main()
