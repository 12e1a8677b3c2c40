"""The warm server's Triton head start, without Triton or torch: with a stand-in `triton` package, the
server computes Triton's own hash and the source key of every kernel in the user's modules (bare, or
wrapped the way @triton.autotune wraps one) once, and never looks into installed packages.

Runs under pytest, or alone (`python3 harness/tests/test_triton_hash.py`), which is how `cargo test` runs it.
"""

import os
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_harness_modules import h  # noqa: E402


def install_fake_triton():
    calls = {"triton_key": 0, "keys": []}

    class JITFunction:
        def __init__(self, name):
            self.name = name

        @property
        def cache_key(self):
            calls["keys"].append(self.name)
            return self.name

    class Autotuner:  # what @triton.autotune returns: the kernel under `.fn`
        def __init__(self, fn):
            self.fn = fn

    def triton_key():
        calls["triton_key"] += 1
        return "k"

    triton = types.ModuleType("triton")
    runtime = types.ModuleType("triton.runtime")
    cache = types.ModuleType("triton.runtime.cache")
    jit = types.ModuleType("triton.runtime.jit")
    autotuner = types.ModuleType("triton.runtime.autotuner")
    cache.triton_key = triton_key
    jit.JITFunction = JITFunction
    Autotuner.__module__ = "triton.runtime.autotuner"
    autotuner.Autotuner = Autotuner
    triton.runtime, runtime.cache, runtime.jit = runtime, cache, jit
    for m in (triton, runtime, cache, jit, autotuner):
        sys.modules[m.__name__] = m
    return calls, JITFunction, Autotuner


def test_kernels_in_user_modules_are_hashed_once_and_installed_packages_are_left_alone():
    calls, JITFunction, Autotuner = install_fake_triton()
    with tempfile.TemporaryDirectory() as tmp:
        user = types.ModuleType("user_kernels")
        user.__file__ = os.path.join(tmp, "user_kernels.py")
        user.plain = JITFunction("plain")
        user.tuned = Autotuner(JITFunction("tuned"))
        user.other = object()
        installed = types.ModuleType("vendor_kernels")
        installed.__file__ = os.path.join(tmp, "lib", "site-packages", "vendor_kernels.py")
        installed.vendored = JITFunction("vendored")
        sys.modules["user_kernels"], sys.modules["vendor_kernels"] = user, installed
        try:
            h.hash_triton_kernels()
        finally:
            for name in (
                "user_kernels",
                "vendor_kernels",
                "triton",
                "triton.runtime",
                "triton.runtime.cache",
                "triton.runtime.jit",
                "triton.runtime.autotuner",
            ):
                sys.modules.pop(name, None)
    assert calls["triton_key"] == 1, calls
    assert sorted(calls["keys"]) == ["plain", "tuned"], calls


def test_nothing_happens_without_triton():
    sys.modules.pop("triton", None)
    h.hash_triton_kernels()  # no error, nothing to do


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from standalone import run_all

    run_all(globals())
