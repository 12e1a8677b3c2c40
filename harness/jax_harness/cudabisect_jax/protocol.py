"""The harness protocol as this harness speaks it: its version, the markers, the exit statuses, and the
small helpers every part uses."""

import importlib
import os
import sys


PROTOCOL_VERSION = 2
MARKER = "@@cudabisect node={node} op={op} kernel={kernel} {phase}"
# Printed inside a node before a launch the harness can name (a Pallas kernel): the kernel a node
# launched last is the one that faulted.
LAUNCH = "@@cudabisect launch kernel={kernel}"
# A failure of the harness's own making, so the driver never takes it for the model's.
HARNESS_ERROR = "@@cudabisect harness-error"
HARNESS_ERROR_EXIT = 4
# The full run did not fault equation by equation, but jitted it did.
JIT_ONLY = "@@cudabisect jit-only dump={dump}"

# Primitives that only call a jaxpr on their operands: inlined into the graph. Their jaxpr parameter.
INLINED = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "remat2": "jaxpr",
}


def say(text):
    print(text, flush=True)


def load_attr(spec):
    """`pkg.module:attr` -> the object; the current directory (the probed worktree) is importable."""
    if ":" not in spec:
        raise SystemExit(f"error: {spec!r} is not module:attribute")
    mod, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def as_args(value):
    """The example inputs factory's result as positional arguments: a tuple or list is the arguments,
    anything else is the one argument."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
