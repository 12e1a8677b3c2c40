"""Tracing never starts the device: a module whose forward launches a Triton kernel (plain or autotuned),
makes a CUDA tensor from constants or asks for the current device is kept whole, and neither Triton's
launcher nor torch's CUDA initialisation is entered. Entering them initialises CUDA, which in a warm server
makes every call run cold. With the real Triton and torch; no GPU needed.

Runs under pytest, or alone (`python3 harness/tests/test_trace_guard.py`).
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_harness_modules import h  # noqa: E402

KERNELS = """
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < n
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])
@triton.jit
def add_one_tuned(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < n
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)
"""


def test_a_forward_that_launches_a_triton_kernel_is_kept_whole_without_entering_triton():
    import importlib

    import torch
    import triton.runtime.autotuner as autotuner
    import triton.runtime.jit as jit

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "guard_kernels.py"), "w") as f:
            f.write(KERNELS)  # @triton.jit reads the kernel's source from its file
        sys.path.insert(0, tmp)
        try:
            kernels = importlib.import_module("guard_kernels")
        finally:
            sys.path.remove(tmp)

    class Plain(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            kernels.add_one[(1,)](y, y.numel(), BLOCK=16)
            return y

    class Tuned(torch.nn.Module):
        def forward(self, x):
            y = x * 3
            kernels.add_one_tuned[(1,)](y, y.numel())
            return y

    entered = []
    launchers = {jit.JITFunction: jit.JITFunction.run, autotuner.Autotuner: autotuner.Autotuner.run}

    def sentinel(cls):
        def run(self, *args, **kwargs):
            entered.append(cls.__name__)
            raise RuntimeError("Triton was entered")

        return run

    try:
        for cls in launchers:
            cls.run = sentinel(cls)
        model = torch.nn.Sequential(Plain(), Tuned(), torch.nn.Linear(4, 4))
        steps, _, _, (traced_by, _, _) = h.build_graph(model, (torch.ones(4),))
        assert entered == [], entered
        ops = [s.op for s in steps]
        assert "Plain" in ops and "Tuned" in ops, ops
        assert "Linear" in ops, f"the rest of the model is still traced: {ops}"
        assert traced_by.startswith("fx"), traced_by
        # Put back as they were.
        assert all(cls.run.__name__ == "run" and cls.run is not launchers[cls] for cls in launchers)
    finally:
        for cls, run in launchers.items():
            cls.run = run


def test_a_forward_that_would_initialise_cuda_through_torch_is_kept_whole_without_initialising_it():
    import torch

    class Constant(torch.nn.Module):
        def forward(self, x):
            return x + torch.zeros(1, device="cuda")

    class Query(torch.nn.Module):
        def forward(self, x):
            return x * torch.cuda.current_device()

    entered = []
    original = torch.cuda._lazy_init

    def sentinel(*args, **kwargs):
        entered.append("_lazy_init")
        raise RuntimeError("CUDA was initialised")

    torch.cuda._lazy_init = sentinel
    try:
        model = torch.nn.Sequential(Constant(), Query(), torch.nn.Linear(4, 4))
        steps, _, _, _ = h.build_graph(model, (torch.ones(4),))
        assert entered == [], entered
        ops = [s.op for s in steps]
        assert "Constant" in ops and "Query" in ops and "Linear" in ops, ops
        assert torch.cuda._lazy_init is sentinel, "put back as it was"
        # A descent's trace (in a forked child) is not stopped by it: a child that started the device
        # and one that has not trace a module alike.
        try:
            h.traced(Constant(), set())
        except RuntimeError:
            pass
        assert entered == ["_lazy_init"], entered
    finally:
        torch.cuda._lazy_init = original


if __name__ == "__main__":
    test_a_forward_that_launches_a_triton_kernel_is_kept_whole_without_entering_triton()
    test_a_forward_that_would_initialise_cuda_through_torch_is_kept_whole_without_initialising_it()
    print("ok")
