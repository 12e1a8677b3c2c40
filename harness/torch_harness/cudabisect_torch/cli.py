"""The command line: arguments, building the model once (`prepare`), the verbs, and `main`."""

import argparse
import inspect
import json
import os
import sys
import traceback
from dataclasses import dataclass, field, replace
from typing import Optional
from . import store
from .protocol import load_attr, say, timing
from .graph import Ref, build_graph, describe, whole_call_graph
from .node import announce_triton_launches, harness_error, resolve_device, to_device
from .run import run
from .training import TRAINING_KINDS, Training, step_source, training_steps
from .record import boundary_env, describe_graph, descended
from .repro import ExtractError, extract
from .warm import App, forward, serve, without_via


@dataclass
class Prepared:
    """The model built on the CPU, its example inputs and its graph: what a warm server keeps between
    candidates, and what a cold run builds for itself."""

    key: tuple
    example: tuple
    steps: list
    placeholders: list
    attrs: dict
    traced_by: str
    root: object
    opaque: set = field(default_factory=set)
    training: Optional[Training] = None
    forward_steps: list = field(default_factory=list)
    attr_targets: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    rng: object = None  # the random state at the start of a captured step
    device: Optional[str] = None  # the device a captured step ran on
    autocast: object = None  # the autocast a captured step ran under: {"device_type", "dtype"}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="torch_harness")
    p.add_argument("--model", help="module:factory returning the nn.Module")
    p.add_argument("--example-inputs", dest="example", help="module:factory returning the model's example inputs")
    p.add_argument(
        "--capture",
        help="a captured training step (model, optimizer, batch, gradients) instead of "
        "factories: the directory the capture wrote",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="the whole training step: forward, loss, backward and (with --optimizer) the update",
    )
    p.add_argument(
        "--loss", help="module:function, the model's output -> a scalar loss (default: the sum of the outputs)"
    )
    p.add_argument("--optimizer", help="module:factory, the model -> its optimizer")
    p.add_argument(
        "--device",
        default="auto",
        help="cuda, cpu, cuda:N, or auto (default): a captured step's own device, else cuda when a GPU is usable",
    )
    p.add_argument(
        "--via",
        help="a warm server's socket: run there (forked from the built model); run cold here when it cannot be reached",
    )
    sub = p.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("describe")
    d.add_argument("--out", help="write the description here (the protocol's channel) instead of stdout")
    d.add_argument(
        "--recording",
        help="describe the graph as this recording saw it (descended into modules kept whole, along the fault)",
    )
    r = sub.add_parser("run")
    r.add_argument("--keep")
    r.add_argument("--recording", help="the recording boundary inputs come from")
    r.add_argument("--record")
    x = sub.add_parser("extract")
    x.add_argument("--keep", required=True)
    x.add_argument("--recording")
    x.add_argument("--out", required=True)
    x.add_argument(
        "--generate-over",
        type=int,
        help="repro.py generates the values over this many bytes "
        "from their shape, dtype and range instead of shipping them",
    )
    s = sub.add_parser("serve")
    s.add_argument("--socket", required=True, help="the Unix socket to listen on")
    a = p.parse_args(argv)
    if not a.capture and not (a.model and a.example):
        p.error("give --model and --example-inputs, or --capture DIR")
    return a


def prepare_key(a):
    return (a.model, a.example, a.capture, a.train, a.loss, a.optimizer)


def load_script_definitions(d, script):
    """The captured script's own definitions (cudabisect_main.py, their lines where the script has them)
    as the module `cudabisect_main`, compiled under the script's own name: its classes' frames then read
    as the script's, and the fault is met where the user's run met it."""
    path = os.path.join(d, "cudabisect_main.py")
    if "cudabisect_main" in sys.modules or not os.path.exists(path):
        return
    import types

    with open(path) as f:
        text = f.read()
    name = script if script and os.path.exists(script) else path
    module = types.ModuleType("cudabisect_main")
    module.__file__ = name
    sys.modules["cudabisect_main"] = module
    try:
        exec(compile(text, name, "exec"), module.__dict__)  # noqa: S102 - the capture's own file of the script's definitions
    except BaseException:
        del sys.modules["cudabisect_main"]
        raise


def load_capture(d):
    """The captured step: the model (unpickled on the CPU), its batch as positional inputs, and what the
    training graph needs (the output's gradient, the optimizer, the gradients it saw)."""
    for path in (d, os.getcwd()):  # the captured script's own definitions (cudabisect_main.py), the project
        if path not in sys.path:
            sys.path.insert(0, path)
    with open(os.path.join(d, "capture.json")) as f:
        meta = json.load(f)
    load_script_definitions(d, meta.get("script"))
    fault = os.path.join(d, "fault.json")
    if os.path.exists(fault):
        with open(fault) as f:
            meta.update(json.load(f))  # where the step failed, not where it was saved

    def load(name):
        return store.exists_then_load(os.path.join(d, name))

    model = load("model.pt")
    restore_program_state(load("program_state.pt") or {})
    batch = load("batch.pt") or {"args": [], "kwargs": {}}
    call = (tuple(batch["args"]), dict(batch["kwargs"]))
    training = Training(
        out_grads=load("output_grads.pt"),
        optimizer=load("optimizer.pt"),
        param_grads=load("param_grads.pt"),
        loss_call=load("loss_call.pt"),
    )
    meta["rng"] = load("rng.pt")
    return model, call, training, meta


def inputs_call(inputs):
    """The model's call from what an inputs factory returned: a dict is keyword inputs, a tuple or list
    positional ones, anything else the one input."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def bound_example(model, call):
    """Every parameter of the model's forward as one positional value (defaults filled in): what FX's
    placeholders take. A forward with *args or **kwargs takes the call's positional inputs (FX cannot
    trace it anyway, and the call is then made as it was)."""
    args, kwargs = call
    try:
        sig = inspect.signature(model.forward)
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            return tuple(args) + tuple(kwargs.values())
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())
    except (TypeError, ValueError):
        return tuple(args) + tuple(kwargs.values())


def restore_program_state(state):
    """Puts the program's own state back as it was at the start of the captured step: the module-level
    values of the script (as cudabisect_main) and of the project's modules, and their classes' plain
    attributes. A module that no longer imports is said, not fatal: the replay may not need it."""
    import importlib

    for name, saved in state.items():
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the replay goes on; a node that needs it fails and says so
            print(
                f"harness: the captured state of {name} is not restored ({type(e).__name__}: {e})",
                file=sys.stderr,
                flush=True,
            )
            continue
        for k, v in saved.get("globals", {}).items():
            setattr(module, k, v)
        for cls_name, attrs in saved.get("classes", {}).items():
            cls = getattr(module, cls_name, None)
            if isinstance(cls, type):
                for k, v in attrs.items():
                    setattr(cls, k, v)


def prepare(a):
    """Imports torch and the user's package and builds the model, its inputs and its graph on the CPU.
    CUDA is not touched here, so a warm server can fork children that each initialise it afresh."""
    import torch

    torch.manual_seed(0)
    training, rng, device, meta = None, None, None, {}
    if a.capture:
        model, call, training, meta = load_capture(a.capture)
        rng, device = meta.get("rng"), meta.get("device")
        if meta.get("phase") == "forward" and not a.train:
            training = None  # a forward fault needs no backward
    else:
        model = load_attr(a.model)()
        call = inputs_call(load_attr(a.example)())
        if a.train or a.optimizer or a.loss:
            training = Training(
                loss_fn=load_attr(a.loss) if a.loss else None, optimizer=load_attr(a.optimizer) if a.optimizer else None
            )
        model = model.train() if training else model.eval()
    example = bound_example(model, call)
    steps, placeholders, attrs, (traced_by, root, opaque) = build_graph(model, example)
    if traced_by == "whole":
        # The model is one node, called exactly as the user called it (keyword inputs stay keywords).
        steps, placeholders, example = whole_call_graph(model, call)
    if training is not None:
        training.autocast = meta.get("autocast")
    forward_steps = steps
    if training is not None:
        training.output = getattr(root, "_cudabisect_output", None) or Ref("model", "model")
        steps = training_steps(forward_steps, training)
        traced_by += "; the training step: forward, loss, backward" + (", optimizer" if training.optimizer else "")
    sources = {s.name: src for s in forward_steps if (src := step_source(s, root))}
    return Prepared(
        prepare_key(a),
        tuple(example),
        steps,
        placeholders,
        attrs,
        traced_by,
        root,
        opaque,
        training,
        forward_steps,
        getattr(root, "_cudabisect_attr_targets", {}),
        sources,
        rng,
        device,
        meta.get("autocast"),
    )


def execute(a, w):
    """Runs one verb on a prepared model: moves what the verb needs to the device, then describes, runs
    or extracts."""
    import torch

    torch.manual_seed(0)
    announce_triton_launches()
    a.device = resolve_device(a.device, w.device)
    coarse = w
    steps, forward_steps, levels = descended(w, getattr(a, "recording", None))
    if levels:
        w = replace(w, steps=steps, forward_steps=forward_steps)
    if a.verb == "describe":
        graph = describe_graph(w.traced_by, levels)
        text = json.dumps(describe(steps, w.placeholders, graph, w.sources), indent=1)
        if a.out:
            tmp = a.out + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, a.out)
        else:
            print(text)
        return 0
    if a.keep:
        keep = [k for k in a.keep.split(",") if k]
        # The ids of the graph as recorded (descended) or as first described: a driver whose descent did
        # not reproduce goes on with the coarse nodes, on the same recording.
        for graph in (w, coarse):
            if all(k in {s.name for s in graph.steps} for k in keep):
                steps, w = graph.steps, graph
                break
        else:
            unknown = [k for k in keep if k not in {s.name for s in steps}]
            raise SystemExit(f"error: --keep: no node {unknown[0]!r}")
        kept = [s for s in steps if s.name in keep]
    else:
        kept = steps
    how = w.traced_by.split(";")[0]
    say(f"harness: torch {torch.__version__}, {how} graph, {len(kept)} of {len(steps)} nodes on {a.device}")
    timing("start")
    example = tuple(to_device(x, a.device) for x in w.example)
    timing("inputs on the device")
    training = any(s.kind in TRAINING_KINDS for s in kept)
    rng = w.rng
    if rng:
        # The captured step's random state (its dropout masks), as the user's run had it.
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and str(a.device).startswith("cuda"):
            torch.cuda.set_rng_state(rng["cuda"])
    with torch.no_grad():
        env = boundary_env(kept, w.placeholders, example, w.attrs, getattr(a, "recording", None), a.device)
        over = getattr(a, "generate_over", None)
        timing("boundary values on the device")
        if a.verb == "extract":
            source = "a captured training step" if a.capture else a.model
            title = f"Minimal repro: {len(kept)} of {len(steps)} nodes of {source} ({', '.join(s.name for s in kept)})"
            try:
                written = extract(
                    kept,
                    w.root,
                    env,
                    a.out,
                    title,
                    a.device,
                    w if training else None,
                    getattr(a, "recording", None),
                    over,
                    w.autocast,
                )
            except ExtractError as e:
                print(f"error: extract: {e}", file=sys.stderr, flush=True)
                return 2
            print(json.dumps(written), flush=True)
            return 0
        # Only the modules the kept steps call go to the device: a candidate of three nodes does not pay
        # for moving the whole model (the update moves all of it: it changes every parameter).
        forward = {s.name: s for s in w.forward_steps}
        for s in kept:
            if s.kind == "optimizer":
                w.root.to(a.device)
            module = forward[s.target].module if s.kind == "backward" and s.target in forward else s.module
            if module is not None:
                w.root.get_submodule(module).to(a.device)
        timing("modules on the device")
        if a.record:
            os.makedirs(a.record, exist_ok=True)
        return run(kept, w.root, env, a.device, a.record, w)


def main(argv=None, warm=None, prepare=prepare, execute=execute, app=None):
    """Runs one verb. `prepare`, `execute` and the warm server's `app` are parameters so that a test can
    hand in stand-ins (the server then runs them, not this module's own)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.verb == "serve":
        return serve(a, app or APP)
    if a.via:
        code = forward(a.via, without_via(argv))
        if code is not None:
            return code
    try:
        if getattr(warm, "key", None) != prepare_key(a):
            warm = prepare(a)
        return execute(a, warm)
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - outside every node: the harness failed, not the model
        traceback.print_exc()
        return harness_error(f"{a.verb}: {type(e).__name__}: {e}")


# The warm server runs the harness through these.
APP = App(parse_args, prepare, main)
