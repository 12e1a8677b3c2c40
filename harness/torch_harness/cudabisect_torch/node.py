"""One node: its inputs resolved from the values so far, the call itself, its markers, and how a failure is
told apart as the model's or the harness's own."""

import json
import os
import sys
import traceback
from .protocol import MARKER, say, timing
from .graph import Ref, Step, refs_in


TRITON_WRAPPERS = ("JITFunction", "Autotuner", "Heuristics")


def is_triton_kernel(fn):
    """A `@triton.jit` kernel or a wrapper of one, a library's own subclass of Triton's autotuner included
    (flash-linear-attention's `CachedAutotuner`)."""
    return type(fn).__name__ in TRITON_WRAPPERS or any(
        c.__name__ in TRITON_WRAPPERS and c.__module__.startswith("triton.") for c in type(fn).__mro__
    )


def python_function(fn):
    """The Python function under a Triton kernel's or a decorator's wrappers, `fn` itself for anything
    else. `@triton.autotune` over `@triton.heuristics` over `@triton.jit` each keep the next as `.fn`, and
    `functools.wraps` decorators (`functools.lru_cache`, `torch.no_grad()`) keep it as `__wrapped__`; only
    the innermost is the user's code, and its source carries the decorators. An autotuned kernel's own
    `__module__` is the autotuner's (`triton.runtime.autotuner`), so read from the wrapper it named a
    library that does not define the kernel."""
    for _ in range(16):
        if is_triton_kernel(fn) and hasattr(fn, "fn"):
            fn = fn.fn
        elif not isinstance(fn, type) and callable(getattr(fn, "__wrapped__", None)):
            fn = fn.__wrapped__
        else:
            break
    return fn


class MissingValue(Exception):
    """A kept step needs a value that neither a kept step made nor the recording holds."""


def resolve(a, env):
    """`a` with every Ref replaced by its value (FX's walk keeps namedtuples and slices intact)."""
    from torch.fx.node import map_aggregate

    def value(x):
        if not isinstance(x, Ref):
            return x
        if x.name not in env:
            raise MissingValue(x.name)
        return env[x.name]

    return map_aggregate(a, value)


def model_call(fn, *args, **kwargs):
    """Calls the model's code (a module, an op, a loss, a backward, an update): whatever it raises is
    marked as the model's failure, never the harness's, even when no Python frame of the model's is on
    the traceback (an op implemented in C raises right at the harness's call)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        try:
            e._cudabisect_model = True
        except AttributeError:
            pass
        raise


def call(step, root, env):
    args, kwargs = resolve(step.args, env), resolve(step.kwargs, env)
    if step.kind == "call_recorded":
        # The one argument is the (args, kwargs) the call got on the recorded run.
        ((args, kwargs),) = args
        return call(Step(step.name, step.op, step.kernel, tuple(args), dict(kwargs), step.target, step.via), root, {})
    if step.kind == "call_module":
        return model_call(root.get_submodule(step.target), *args, **kwargs)
    if step.kind == "call_function":
        return model_call(step.target, *args, **kwargs)
    self_obj, *rest = args
    return model_call(getattr(self_obj, step.target), *rest, **kwargs)


def resolve_device(requested, captured=None):
    """The device to run on: as asked, or for `auto` the one the fault happened on (a captured step's
    own device), else `cuda` when a GPU is usable and `cpu` when not. Asked in the run's own process,
    never in a warm server before it forks."""
    if requested != "auto":
        return requested
    if captured:
        return captured
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def to_device(v, device):
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, v)


def needed_refs(steps):
    return {r.name for s in steps for r in refs_in((s.args, s.kwargs))}


def shape_of(v):
    """{"shape", "dtype"} of a tensor value (of the first tensor in a container), else None."""
    if isinstance(v, (tuple, list, dict)):
        for x in v.values() if isinstance(v, dict) else v:
            sh = shape_of(x)
            if sh:
                return sh
        return None
    shape = getattr(v, "shape", None)
    dtype = getattr(v, "dtype", None)
    if shape is None or dtype is None:
        return None
    return {"shape": [int(d) for d in shape], "dtype": str(dtype).replace("torch.", "")}


def write_shapes(record, env, more=None):
    """The recording's `shapes.json`: what `describe` cannot know without running the model."""
    shapes = {k: sh for k, sh in ((k, shape_of(v)) for k, v in env.items()) if sh}
    shapes.update(more or {})
    with open(os.path.join(record, "shapes.json"), "w") as f:
        json.dump(shapes, f)


# A failure of the harness's own making (a bug here, a fork that cannot use CUDA) is said on this line
# and exits with HARNESS_ERROR_EXIT, so the driver never takes it for the model's failure.
HARNESS_ERROR = "@@cudabisect harness-error"
HARNESS_ERROR_EXIT = 4
# Printed inside a node before every Triton launch: the kernel a node launched last is the one that
# faulted (launches are synchronous under CUDA_LAUNCH_BLOCKING=1), whatever the node is called.
LAUNCH = "@@cudabisect launch kernel={kernel}"
DEVICE_ERROR_WORDS = (
    "CUDA",
    "CUBLAS",
    "CUDNN",
    "cuda",
    "device-side",
    "Triton Error",
    "illegal memory",
    "misaligned address",
    "AcceleratorError",
)


def harness_error(text):
    say(f"{HARNESS_ERROR}: {text}")
    return HARNESS_ERROR_EXIT


def node_failed(name):
    """Prints the failure of node `name`; 1 when it is the model's (the finding), HARNESS_ERROR_EXIT
    when the harness caused it itself (its own code raised, or a forked child cannot use CUDA)."""
    etype, e, tb = sys.exc_info()
    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()
    text = f"{etype.__name__}: {e}"
    frames = traceback.extract_tb(tb)
    ours = bool(frames) and os.path.abspath(frames[-1].filename) == os.path.abspath(__file__)
    models = getattr(e, "_cudabisect_model", False)
    device_error = any(w in text for w in DEVICE_ERROR_WORDS)
    if "Cannot re-initialize CUDA in forked subprocess" in text:
        return harness_error(f"node {name}: a forked child cannot use CUDA: {text}")
    if ours and not models and not device_error:
        return harness_error(f"node {name}: the harness itself raised {text}")
    say(f"harness: node {name} failed")
    timing("failed")
    return 1


def announce_triton_launches():
    """Makes every Triton launch say its kernel's name first (a wrapper around JITFunction.run, the one
    path autotuned, heuristic and plain kernels all take). repro.py carries it too, so a repro's fault
    names the same kernel as the harness's."""
    if "triton" not in sys.modules:
        return
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001 - a Triton without it: nodes keep their own names
        return
    if getattr(JITFunction.run, "_cudabisect", False):
        return
    original = JITFunction.run

    def launch(self, *args, **kwargs):
        print(LAUNCH.format(kernel=getattr(getattr(self, "fn", None), "__name__", None) or "triton_kernel"), flush=True)
        return original(self, *args, **kwargs)

    launch._cudabisect = True
    JITFunction.run = launch


def markers(s):
    """The begin and end marker lines of step `s`."""
    op = s.op.replace(" ", "_")
    return (
        MARKER.format(node=s.name, op=op, kernel=s.kernel, phase="begin"),
        MARKER.format(node=s.name, op=op, kernel=s.kernel, phase="end"),
    )
