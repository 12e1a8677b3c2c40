"""How many of a kernel library's `torch.autograd.Function`s the PyTorch harness can write into a repro.py:
for each Function class defined in the named modules, the code the writer copies for it (its methods,
the kernels and helpers they call, what those read at module level) is laid out as repro.py lays it
out, compiled, linted for names it never defines, and run as a file (Triton kernels are defined, not
launched: no GPU needed).

Usage, from the library's checkout (so it counts as the project under test, as in a bisection):
    PYTHONPATH=src:. python3 <cudabisect>/benches/extract_coverage.py liger_kernel.ops.rms_norm ...
Prints one line per class and a total; exits 0.
"""

import importlib
import inspect
import os
import runpy
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness", "tests"))
from torch_harness_modules import h


def repro_text(cls):
    """The copied code for `cls`, laid out as repro.py is: imports, constants, definitions."""
    imports, sources = h.user_source([cls])
    plain = [i for i in imports if i.startswith(("import ", "from "))]
    consts = [i for i in imports if i not in plain]
    head = ["from __future__ import annotations", "import torch", *plain, *consts]
    return "\n".join(head) + "\n\n" + "\n\n".join(sources)


def check(cls):
    """None when the text compiles, lints and runs as a file; else what went wrong."""
    try:
        text = repro_text(cls)
    except Exception as e:  # noqa: BLE001 - a writer defect is a result here
        return f"the writer raised {type(e).__name__}: {e}"
    problem = h.lint(text)
    if problem:
        return problem
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "repro.py")  # triton.jit reads a kernel's source from its file
        with open(path, "w") as f:
            f.write(text)
        try:
            runpy.run_path(path)
        except Exception as e:  # noqa: BLE001
            return f"running it: {type(e).__name__}: {str(e)[:200]}"
    return None


def main(modules):
    import torch

    good = total = 0
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a module this machine cannot import is said and skipped
            print(f"{name}: cannot import: {type(e).__name__}: {str(e)[:160]}")
            continue
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and issubclass(cls, torch.autograd.Function) and cls.__module__ == name):
                continue
            total += 1
            problem = check(cls)
            good += problem is None
            print(f"{name}.{cls.__name__}: {problem or 'ok'}")
    print(f"{good} of {total} write a repro.py that compiles, lints and runs as a file")


if __name__ == "__main__":
    main(sys.argv[1:])
