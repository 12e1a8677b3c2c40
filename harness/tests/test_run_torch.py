"""The PyTorch harness's run loop with a real torch (CI installs it; these tests fail without it): a
failure of the model's own code is the finding, exit 1, even when an op implemented in C raises right at
the harness's call; a failure of the harness's own making is said as such, exit 4."""

import operator
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_harness_modules import h, node, run as run_module  # noqa: E402

R = h.Ref


def test_an_op_in_c_that_raises_is_the_models_failure(capsys):
    steps = [
        h.Step("pick", "getitem", "getitem", (R("x", None), (slice(None), 99)), {}, operator.getitem, "call_function")
    ]
    code = h.run(steps, torch.nn.Module(), {"x": torch.zeros(2, 4)}, "cpu")
    out = capsys.readouterr().out
    assert code == 1, out
    assert "IndexError" in out and h.HARNESS_ERROR not in out, out


def test_the_harness_raising_by_itself_is_a_harness_error(capsys, monkeypatch):
    # A bug inside the harness's own code, before the model is called: resolving arguments calls a
    # function of the harness with the wrong arguments.
    monkeypatch.setattr(node, "resolve", h.short_name)
    steps = [h.Step("y", "relu", "relu", (R("x", None),), {}, torch.relu, "call_function")]
    code = h.run(steps, torch.nn.Module(), {"x": torch.zeros(2)}, "cpu")
    out = capsys.readouterr().out
    assert code == h.HARNESS_ERROR_EXIT, out
    assert f"{h.HARNESS_ERROR}: node y: the harness itself raised TypeError" in out, out


def test_a_cuda_error_text_is_the_models_even_at_the_harness_frame(capsys, monkeypatch):
    def sticky(step, root, env):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(run_module, "call", sticky)
    steps = [h.Step("y", "relu", "relu", (R("x", None),), {}, torch.relu, "call_function")]
    assert h.run(steps, torch.nn.Module(), {"x": torch.zeros(2)}, "cpu") == 1


if __name__ == "__main__":
    sys.exit("run with pytest")
