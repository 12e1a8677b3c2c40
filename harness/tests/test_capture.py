"""The capture of a training script, with a real torch (CI installs it; these tests fail without it): a
script whose backward faults only through its own state (a module-level flag computed at import, a
switch kept on a class) is captured by the start-up hook (find, then replay), and the PyTorch harness's
full run of the captured step faults the same way: the program's state is part of the replay."""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.join(HERE, "..", "capture")
HARNESS = os.path.join(HERE, "..", "torch_harness")

SCRIPT = """
import torch
from torch import nn

FLAG = open("flag.txt").read().strip() == "1"  # computed at import: not a literal of the source


class Scale(torch.autograd.Function):
    armed = False  # switched on by the loop below, read by the backward

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if FLAG and Scale.armed:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return g * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return Scale.apply(self.lin(x))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 5):
    if step == 3:
        Scale.armed = True
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def run(cmd, cwd, **env):
    full = dict(os.environ, PYTHONPATH=os.path.abspath(HOOK), **env)
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def test_the_scripts_own_globals_and_class_state_are_replayed(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "flag.txt").write_text("1\n")
    cap = tmp_path / "capture"
    found = run([sys.executable, "train.py"], tmp_path, CUDABISECT_CAPTURE="find", CUDABISECT_CAPTURE_DIR=str(cap))
    assert found.returncode != 0, found.stdout + found.stderr
    fault = json.loads((cap / "fault.json").read_text())
    assert (fault["step"], fault["phase"]) == (3, "backward"), fault
    shutil.copy(cap / "fault.json", cap / "fault-found.json")
    run(
        [sys.executable, "train.py"],
        tmp_path,
        CUDABISECT_CAPTURE="replay",
        CUDABISECT_CAPTURE_DIR=str(cap),
        CUDABISECT_CAPTURE_STEP=str(fault["step"]),
        CUDABISECT_CAPTURE_CALL=str(fault["call"]),
    )
    assert (cap / "model.pt").exists() and (cap / "program_state.pt").exists()
    # The harness runs in a fresh process, with none of the script's statements executed.
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, os.path.abspath(HARNESS), "--capture", str(cap), "--device", "cpu", "run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "an illegal memory access" in text and "NameError" not in text, text
