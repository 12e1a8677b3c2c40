"""The harness protocol as this harness speaks it: its version, the node markers, and the small helpers
every part uses (printing a line at once, timings, loading `pkg.mod:attr`)."""

import importlib
import importlib.util
import os
import sys


PROTOCOL_VERSION = 2
MARKER = "@@cudabisect node={node} op={op} kernel={kernel} {phase}"


def say(text):
    print(text, flush=True)


def timing(label):
    """With CUDABISECT_HARNESS_TIMING=1: when each part of a call happened (wall clock, to the
    millisecond, comparable across the client and the server's child), on stderr."""
    if os.environ.get("CUDABISECT_HARNESS_TIMING") == "1":
        import time

        print(f"harness timing: {label} {time.time():.3f}", file=sys.stderr, flush=True)


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
