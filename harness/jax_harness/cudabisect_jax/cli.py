"""The command line: arguments, the verbs, and `main`."""

import argparse
import os
import sys
import traceback
from .protocol import HARNESS_ERROR, HARNESS_ERROR_EXIT, say
from .keras import build_program
from .run import describe, execute, jit_check
from .repro import ExtractError, extract


def parse_args(argv):
    p = argparse.ArgumentParser(prog="jax_harness")
    p.add_argument("--function")
    p.add_argument("--model")
    p.add_argument("--example-inputs", required=True)
    p.add_argument("--train", action="store_true")
    p.add_argument("--loss")
    p.add_argument("--device", default="auto", help="cuda, cpu, or auto (JAX's own choice: a GPU when usable)")
    sub = p.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("describe")
    d.add_argument("--recording")
    d.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--keep")
    r.add_argument("--recording")
    r.add_argument("--record")
    r.add_argument("--generate-over", type=int)
    e = sub.add_parser("extract")
    e.add_argument("--keep", required=True)
    e.add_argument("--recording", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--generate-over", type=int)
    sub.add_parser("jitted")
    a = p.parse_args(argv)
    if bool(a.function) == bool(a.model):
        p.error("name exactly one of --function (a JAX function) and --model (a Keras model factory)")
    return a


def select_device(device):
    """JAX's platform from the harness's device (cuda/gpu, or cpu; auto leaves JAX's own choice, a GPU
    when one is usable), before jax is imported."""
    if device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    elif device in ("cuda", "gpu") or device.startswith("cuda:"):
        os.environ.setdefault("JAX_PLATFORMS", "cuda")
    os.environ.setdefault("KERAS_BACKEND", "jax")


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    select_device(a.device)
    try:
        prog = build_program(a)
    except Exception:  # noqa: BLE001 - the user's factories failing is said, never taken for the fault
        sys.stdout.write(traceback.format_exc())
        last = traceback.format_exception_only(*sys.exc_info()[:2])[-1].strip()
        say(f"{HARNESS_ERROR}: could not build the program: {last}")
        return HARNESS_ERROR_EXIT
    if a.verb == "describe":
        return describe(prog, a.out)
    if a.verb == "jitted":
        import jax

        jax.block_until_ready(prog.jitted())
        return 0
    if a.verb == "run":
        keep = set(a.keep.split(",")) if a.keep else None
        code = execute(prog, keep, a.recording, a.record)
        if code == 0 and keep is None and a.record and prog.jitted is not None:
            return jit_check(a, a.record)
        return code
    title = f"{a.function or a.model}, nodes {a.keep}"
    try:
        return extract(prog, a.keep.split(","), a.recording, a.out, title)
    except ExtractError as e:
        print(f"extract: {e}", file=sys.stderr)
        return 1
