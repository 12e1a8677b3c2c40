#!/usr/bin/env python3
"""cudabisect's PyTorch harness: speaks the harness protocol for an nn.Module.

    torch_harness.py --model pkg.mod:build --example-inputs pkg.mod:example_inputs [--device cuda] VERB ...

VERB is one of
    describe [--recording DIR] --out FILE     the graph as JSON in FILE; with a recording, descended along
                                              the recorded fault into the modules kept whole
    run [--record DIR]                        run every node, synchronising and printing a marker around
                                              each; save node outputs to DIR/<node>.pt
    run --keep A,B --recording DIR            run only the kept nodes; values made by other nodes come
                                              from DIR/<node>.pt (recorded, never random)
    extract --keep A,B --recording DIR --out DIR
                                              write a standalone repro.py (+ repro_data.pt) that needs
                                              nothing but torch (and triton, if a kept op uses it)
    serve --socket PATH                       a warm server: import torch and the user's package and
                                              build the model on the CPU once, then answer every request
                                              with a child forked from it (`--via PATH` before the verb)

Bundles are safe to open: repro_data.pt holds tensors, plain values and module state dicts, loaded with
`weights_only=True`; repro.py rebuilds torch.nn modules from code. Only modules of the user's own classes
are pickled whole (repro_modules.pt), and then repro.py says NOT STANDALONE. Custom ops (`torch.ops.<ns>`)
are called by their op name; repro.py carries a Python custom op's registration and kernels (Triton ones
too), or imports the compiled extension that defines it. repro.py is compiled before it is written.

Layer-by-layer descent: the model is traced with torch.fx, and a module whose own forward FX cannot trace
(Python control flow on tensor values, data-dependent shapes) is kept whole as one node while everything
around it is traced op by op (a model whose own forward cannot be traced is kept whole). The recorded run
then descends into what was kept whole through forward hooks: every call inside it records its actual
inputs and output and prints its own markers, and modules FX can trace below it run op by op through an FX
interpreter. `describe --recording` replaces each call on the way to the fault by the calls it made, so
the fault is pinned to one op or one leaf module; a level whose calls pass each one's output to the next
(checked on the recorded values) is used as a chain. The description's `graph` says how every level was
obtained (fx, hooks, chain).

Warm start: with `--via`, the verb runs in a child forked from a server that already imported torch and
built the model; the child initialises CUDA itself, so a sticky CUDA error dies with it. The client hands
the child its stdin, stdout, stderr and process group: its output and its timeout are the client's.
Nothing here needs a package index beyond the user's own torch. The code generation part
imports torch lazily, so it can be tested without torch.
"""

import argparse
import ast
import builtins
import collections
import importlib
import importlib.util
import inspect
import json
import os
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from typing import Optional

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


# ----------------------------------------------------------------------------------------------------
# The graph: FX nodes, modules FX cannot trace kept whole.


class Step:
    """One unit the shrinker can keep or cut."""

    def __init__(self, name, op, kernel, args, kwargs, target, kind, via=None):
        self.name = name      # node id
        self.op = op          # what it is, for humans
        self.kernel = kernel  # a short name for the marker
        self.args = args      # with Ref(...) where a value comes from another step or an input
        self.kwargs = kwargs
        self.target = target  # module path, function, or method name
        self.kind = kind      # call_module | call_function | call_method | call_recorded
        # call_recorded (a call found by descending into a module kept whole): how `target` is called,
        # call_module | call_function | call_method, on the (args, kwargs) recorded as the only argument.
        self.via = via
        self.source = None  # file:line of the user's code that made it, when known

    @property
    def module(self):
        """The module path this step calls, if it calls a module."""
        if self.kind == "call_module" or (self.kind == "call_recorded" and self.via == "call_module"):
            return self.target
        return None


class Ref:
    """A value produced by a step (`producer` is its name) or a model input (`producer` is None)."""

    def __init__(self, name, producer):
        self.name = name
        self.producer = producer

    def __repr__(self):
        return f"Ref({self.name!r})"


def short_name(target):
    if isinstance(target, str):
        return target.split(".")[-1]
    return getattr(target, "__name__", type(target).__name__)


def build_graph(model, example):
    """(steps, placeholders, get_attrs, traced_by) for `model` called on `example` (a tuple)."""
    import torch
    import torch.fx

    opaque = untraceable_modules(model)
    try:
        gm = torch.fx.GraphModule(model, LeafTracer(opaque).trace(model))
    except Exception as e:  # noqa: BLE001 - any tracing failure means: keep the model whole
        print(f"harness: torch.fx could not trace the model ({type(e).__name__}: {e}); "
              "keeping it whole: the recorded run descends into it through hooks", file=sys.stderr, flush=True)
        return whole_graph(model, len(example), opaque)
    traced_by = "fx"
    if opaque:
        names = sorted(n for n, m in model.named_modules() if id(m) in opaque)
        traced_by = f"fx; kept whole, their forward cannot be traced: {', '.join(names)}"
        print(f"harness: {traced_by}", file=sys.stderr, flush=True)
    steps, placeholders, attrs = [], [], {}
    refs, output, attr_targets = {}, None, {}

    def conv(a):
        # FX's own walk: tuples (named ones too), lists, dicts and slices.
        return torch.fx.node.map_aggregate(a, lambda x: refs[x.name] if isinstance(x, torch.fx.Node) else x)

    modules = dict(gm.named_modules())
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            placeholders.append(node.name)
            refs[node.name] = Ref(node.name, None)
        elif node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            attrs[node.name] = value
            attr_targets[node.name] = node.target
            refs[node.name] = Ref(node.name, None)
        elif node.op == "output":
            output = conv(node.args[0])
            continue
        else:
            if node.op == "call_module":
                mod = modules[node.target]
                op = f"{type(mod).__name__}"
                kernel = type(mod).__name__
            elif node.op == "call_function":
                op = short_name(node.target)
                kernel = op
            else:
                op = f"Tensor.{node.target}"
                kernel = node.target
            steps.append(Step(node.name, op, kernel, conv(node.args), conv(node.kwargs), node.target, node.op))
            steps[-1].source = fx_source(node)
            refs[node.name] = Ref(node.name, node.name)
    gm._cudabisect_output = output
    gm._cudabisect_attr_targets = attr_targets
    return steps, placeholders, attrs, (traced_by, gm, opaque)


def _leaf_tracer_class():
    import torch.fx

    class Tracer(torch.fx.Tracer):
        """FX's tracer, with the modules that cannot be traced kept as single call_module nodes."""

        def __init__(self, opaque):
            super().__init__()
            self.opaque = opaque

        def is_leaf_module(self, m, qualname):
            return id(m) in self.opaque or super().is_leaf_module(m, qualname)

        def trace(self, root, concrete_args=None):
            self.record_stack_traces = True
            with guarded_autograd_functions():
                return super().trace(root, concrete_args)

    return Tracer


class AutogradFunctionCall(Exception):
    """FX met a torch.autograd.Function: tracing through its forward would lose its own backward."""


def guarded_autograd_functions():
    """While tracing: a `torch.autograd.Function` applied to traced values stops the trace, so the module
    that applies it is kept whole and its own backward (a kernel library's backward kernel) still runs."""
    import contextlib

    import torch
    import torch.fx
    from torch.utils._pytree import tree_leaves

    @contextlib.contextmanager
    def guard():
        original = torch.autograd.Function.__dict__["apply"]

        def apply(cls, *args, **kwargs):
            if any(isinstance(x, torch.fx.Proxy) for x in tree_leaves((args, kwargs))):
                raise AutogradFunctionCall(f"{cls.__name__} is a torch.autograd.Function")
            return original.__func__(cls, *args, **kwargs)

        torch.autograd.Function.apply = classmethod(apply)
        try:
            yield
        finally:
            torch.autograd.Function.apply = original

    return guard()


def fx_source(node):
    """file:line of the user's code that made an FX node (the last frame of its recorded stack)."""
    trace = getattr(node, "stack_trace", None) or ""
    found = None
    for line in trace.splitlines():
        line = line.strip()
        if line.startswith("File "):
            parts = line.split(",")
            if len(parts) >= 2 and "-packages/" not in parts[0] and "/lib/python3" not in parts[0]:
                path = os.path.relpath(parts[0][5:].strip().strip(chr(34)))
                found = f"{path}:{parts[1].strip().removeprefix('line ')}"
    return found


def LeafTracer(opaque):
    return _leaf_tracer_class()(opaque)


def untraceable_modules(model):
    """ids of the user-defined submodules whose own forward FX cannot trace, found bottom-up: each module is
    traced with its already-untraceable descendants as leaves, so only the innermost culprits and the
    ancestors that fail for their own reasons are kept whole."""
    opaque = set()

    def visit(m, is_root):
        for child in m.children():
            visit(child, False)
        if is_root or type(m).__module__.startswith("torch.nn"):
            return  # torch.nn modules are FX leaves already; the root is traced by the caller
        try:
            LeafTracer(opaque).trace(m)
        except Exception:  # noqa: BLE001 - any tracing failure means: keep this module whole
            opaque.add(id(m))

    visit(model, True)
    return opaque


def whole_graph(model, n_inputs, opaque):
    """The model as one node, for a forward FX cannot trace at all: the recorded run descends into it."""
    inputs = [f"input_{i}" for i in range(n_inputs)]
    name = type(model).__name__
    step = Step("model", name, name, tuple(Ref(i, None) for i in inputs), {}, "", "call_module")
    return [step], inputs, {}, ("whole", model, opaque)


def refs_in(a):
    """Every Ref inside an argument structure, in order."""
    if isinstance(a, Ref):
        yield a
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from refs_in(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from refs_in(x)
    elif isinstance(a, slice):
        yield from refs_in((a.start, a.stop, a.step))


def describe(steps, placeholders, graph=None, sources=None):
    def tensors(args):
        # The shape is unknown until the model runs (the recording's shapes.json fills it in).
        return [{"name": r.name, "shape": None, "producer": r.producer} for r in refs_in(args)]

    sources = sources or {}

    def node(s):
        n = {"id": s.name, "op": s.op, "kernel": s.kernel, "phase": phase_of(s),
             "inputs": tensors((s.args, s.kwargs)),
             "outputs": [{"name": s.name, "shape": None, "producer": s.name}]}
        if s.kind == "backward":
            n["forward"] = s.target
        where = sources.get(s.target if s.kind == "backward" else s.name)
        if where:
            n["source"] = where
        return n

    return {
        "protocol": PROTOCOL_VERSION,
        "harness": "torch",
        "inputs": placeholders,
        "graph": graph,
        "nodes": [node(s) for s in steps],
    }


# ----------------------------------------------------------------------------------------------------
# Running.


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
        (args, kwargs), = args
        return call(Step(step.name, step.op, step.kernel, tuple(args), dict(kwargs), step.target, step.via),
                    root, {})
    if step.kind == "call_module":
        return model_call(root.get_submodule(step.target), *args, **kwargs)
    if step.kind == "call_function":
        return model_call(step.target, *args, **kwargs)
    self_obj, *rest = args
    return model_call(getattr(self_obj, step.target), *rest, **kwargs)


def to_device(v, device):
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, v)


def needed_refs(steps):
    return {r.name for s in steps for r in refs_in((s.args, s.kwargs))}


def shape_of(v):
    """{"shape", "dtype"} of a tensor value (of the first tensor in a container), else None."""
    if isinstance(v, (tuple, list, dict)):
        for x in (v.values() if isinstance(v, dict) else v):
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
DEVICE_ERROR_WORDS = ("CUDA", "CUBLAS", "CUDNN", "cuda", "device-side", "Triton Error", "illegal memory",
                      "misaligned address", "AcceleratorError")


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
        print(LAUNCH.format(kernel=getattr(getattr(self, "fn", None), "__name__", None) or "triton_kernel"),
              flush=True)
        return original(self, *args, **kwargs)

    launch._cudabisect = True
    JITFunction.run = launch


def markers(s):
    """The begin and end marker lines of step `s`."""
    op = s.op.replace(" ", "_")
    return (MARKER.format(node=s.name, op=op, kernel=s.kernel, phase="begin"),
            MARKER.format(node=s.name, op=op, kernel=s.kernel, phase="end"))


def run(steps, root, env, device, record=None, prepared=None):
    """Runs `steps` in order on `env`, a marker and a synchronise around each; returns 0 clean, 1 when a
    step raised (the finding), 2 when a recorded value is missing. A recording run also records, through
    hooks, every call inside the modules kept whole (see `Recorder`). With training steps among them,
    forward steps run on fresh leaves so that each backward step is its node's own (see `TrainRun`); a
    kept backward step whose forward is not kept runs that forward first."""
    import torch
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    recorder = Recorder(root, steps, prepared.opaque if prepared else set(), record, sync) if record else None
    tr = None
    if any(s.kind in TRAINING_KINDS for s in steps):
        tr = TrainRun(root, env, prepared.training, device, record, prepared.forward_steps, prepared.attr_targets)
    current = [None]

    def plain(s):
        env[s.name] = call(s, root, env)

    def marked(s, fn):
        current[0] = s
        forward = s.kind not in TRAINING_KINDS
        begin, end = markers(s)
        say(begin)
        if recorder and forward:
            recorder.enter(s.name)
        fn(s)
        sync()
        if recorder and forward:
            recorder.leave()
        say(end)
        if record and forward:
            torch.save(to_device(env[s.name], "cpu"), os.path.join(record, f"{s.name}.pt"))

    try:
        for s in steps:
            if s.kind == "loss":
                marked(s, tr.loss)
            elif s.kind == "backward":
                if s.target not in tr.graphs:
                    marked(tr.forward[s.target], tr.forward_step)
                marked(s, tr.backward_step)
            elif s.kind == "optimizer":
                marked(s, tr.optimizer_step)
            else:
                marked(s, tr.forward_step if tr else plain)
        say(f"harness: ok: {len(steps)} nodes on {device}")
        timing("ran")
        return 0
    except MissingValue as e:
        # Not a finding: the recording ends where the recorded run died.
        name = current[0].name if current[0] else "?"
        print(f"error: no recording of value {e} for node {name}", file=sys.stderr, flush=True)
        return 2
    except Exception:  # noqa: BLE001 - the failure is the finding; the classifier reads the text
        return node_failed(current[0].name if current[0] else "?")
    finally:
        if recorder:
            write_shapes(record, env, recorder.shapes)
            recorder.write()


# ----------------------------------------------------------------------------------------------------
# Training: the whole step as nodes. After the forward nodes come `loss` (the gradient of the model's
# output: recorded from the user's own loss when the step was captured, else the given loss function's),
# then one backward node per forward node, in reverse order, and last `optimizer_step` (the parameters'
# update). Every forward node runs on inputs cut from the graph before it (detached leaves), so each
# backward node is that node's own backward alone: `torch.autograd.grad` of its output, on the gradient
# that the nodes after it passed back (live, or recorded when they are not kept), with a synchronise and
# its own markers. A candidate that keeps a backward node without its forward runs that forward first, on
# its recorded inputs: the candidate for a backward fault is the forward it differentiates plus its
# backward on recorded gradients.

LOSS_NODE = "loss"
OPTIMIZER_NODE = "optimizer_step"
BACKWARD = "__backward"
GRADS_VALUE = "optimizer_step__grads"


@dataclass
class Training:
    """What the training step needs besides the forward graph."""

    output: object = None          # the model output's structure: Refs (what `loss` differentiates)
    out_grads: object = None       # the gradient of the output recorded in the user's own step (a list)
    loss_fn: object = None         # else: output -> scalar loss (default: the sum of every float output)
    optimizer: object = None       # a spec {"cls", "groups", "state"} or a factory model -> optimizer
    param_grads: object = None     # name -> the gradient the optimizer saw (captured; covers clipping)


def grad_name(step_name):
    return f"{step_name}__grad"


def flat_tensors(v):
    """The tensors inside a value, in pytree order."""
    import torch
    from torch.utils._pytree import tree_leaves
    return [x for x in tree_leaves(v) if isinstance(x, torch.Tensor)]


def training_steps(steps, training):
    """The forward steps followed by the loss, the backward steps (reverse order) and the update."""
    out = list(steps)
    forward = {s.name: s for s in steps}
    # The output's grad comes from `loss`; every other value's from the last consumer's backward to run.
    consumers = collections.defaultdict(list)
    for s in steps:
        for r in refs_in((s.args, s.kwargs)):
            if r.producer in forward:
                consumers[r.producer].append(s.name)
    outputs = {r.producer for r in refs_in(training.output) if r.producer}
    out.append(Step(LOSS_NODE, "loss", "loss", (training.output,), {}, None, "loss"))
    for s in reversed(steps):
        producers = [c + BACKWARD for c in consumers[s.name]]
        if s.name in outputs:
            producers.append(LOSS_NODE)
        grad_producer = producers[0] if producers else None  # the earliest consumer's backward runs last
        grad = Ref(grad_name(s.name), grad_producer)
        out.append(Step(s.name + BACKWARD, f"backward of {s.op}", s.kernel, (s.args, s.kwargs, grad), {},
                        s.name, "backward"))
    if training.optimizer is not None:
        last = steps[0].name + BACKWARD if steps else None
        out.append(Step(OPTIMIZER_NODE, f"{optimizer_class_name(training.optimizer)}.step", "optimizer",
                        (Ref(GRADS_VALUE, last),), {}, None, "optimizer"))
    return out


def optimizer_class_name(spec):
    if isinstance(spec, dict):
        return spec["cls"].rsplit(".", 1)[-1]
    return getattr(spec, "__name__", "optimizer")


def phase_of(step):
    return {"loss": "loss", "backward": "backward", "optimizer": "optimizer"}.get(step.kind, "forward")


def step_source(step, root):
    """file:line of the user's code that made a forward step (where FX saw the call), else of the code it
    runs: where the inputs of that step's backward were created."""
    if getattr(step, "source", None):
        return step.source
    try:
        if step.module is not None:
            fn = type(root.get_submodule(step.module)).forward
        elif callable(step.target):
            fn = step.target
        else:
            return None
        fn = getattr(fn, "fn", fn)
        _, line = inspect.getsourcelines(fn)
        return f"{os.path.relpath(inspect.getsourcefile(fn))}:{line}"
    except (OSError, TypeError, ValueError):
        return None


# The training step's arithmetic, shared with repro.py: these functions are copied into it as they are
# (so each imports torch itself), and the harness runs the same code.


def cut(v, name, leaves, clone=False):
    """`v` with its differentiable tensors made fresh leaves (noted in `leaves` as (name, index, leaf)):
    a backward stops at them. A step that works in place gets a copy, which a leaf cannot be."""
    import torch
    flat, spec = torch.utils._pytree.tree_flatten(v)
    out, i = [], 0  # i: the tensor's position among the value's tensors, as gradients are indexed
    for x in flat:
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() or x.is_complex():
                leaf = x.detach().requires_grad_(True)
                leaves.append((name, i, leaf))
                x = leaf.clone() if clone else leaf
            i += 1
        out.append(x)
    return torch.utils._pytree.tree_unflatten(out, spec)


def add_grads(store, name, grads):
    """Accumulates gradients {tensor index: grad} of value `name` into `store`."""
    slot = store.setdefault(name, {})
    for i, g in grads.items():
        if g is not None:
            slot[i] = g if slot.get(i) is None else slot[i] + g


def node_backward(leaves, params, out, grads):
    """One node's own backward, given the gradients {index: grad} of its output's tensors: the gradients
    of its leaves as [(name, index, grad)] and of its parameters as [grad]."""
    import torch
    tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    outs, gos = [], []
    for i, x in enumerate(tensors):
        if x.requires_grad and grads.get(i) is not None:
            outs.append(x)
            gos.append(grads[i])
    targets = [leaf for _, _, leaf in leaves] + list(params)
    if not outs or not targets:
        return [], []
    got = torch.autograd.grad(outs, targets, grad_outputs=gos, allow_unused=True)
    return [(name, i, g) for (name, i, _), g in zip(leaves, got)], list(got[len(leaves):])


def optimizer_from_spec(optimizer_class, spec, params):
    """The optimizer over `params` (by name) with its recorded groups and state."""
    groups = []
    for g in spec["groups"]:
        group = {k: v for k, v in g.items() if k != "params"}
        group["params"] = [params[n] for n in g["params"] if n in params]
        groups.append(group)
    optimizer = optimizer_class(groups)
    if spec.get("state"):
        optimizer.load_state_dict(spec["state"])
    return optimizer


# Data reduction: a recorded value larger than a limit can stand as a spec of its shape, dtype and
# range, and be generated again (the exact minimum and maximum put back where they were: an index that
# reaches past a buffer stays). The shrink checks the fault still shows that way before repro.py ships
# specs instead of data. `generated_spec` and `regenerate` are copied into repro.py as they are.


def generated_spec(t):
    """A tensor as its shape, dtype, range and where its extremes are."""
    import torch
    flat = t.detach().reshape(-1)
    spec = {"__generated__": True, "shape": [int(d) for d in t.shape], "dtype": str(t.dtype).replace("torch.", "")}
    if flat.numel():
        values = flat.to(torch.int8) if t.dtype == torch.bool else flat
        spec.update(min=values.min().item(), max=values.max().item(), argmin=int(values.argmin()),
                    argmax=int(values.argmax()))
    return spec


def regenerate(v, device):
    """`v` with every generated spec in it made a tensor again (seeded: the same values every time)."""
    import torch
    if isinstance(v, dict) and v.get("__generated__"):
        dtype, shape = getattr(torch, v["dtype"]), v["shape"]
        gen = torch.Generator(device=device).manual_seed(0)
        lo, hi = v.get("min", 0), v.get("max", 0)
        if dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen, device=device).to(torch.bool)
        elif dtype.is_floating_point:
            t = torch.empty(shape, dtype=dtype, device=device).uniform_(lo, hi, generator=gen)
        else:
            top = hi + 1 if hi < torch.iinfo(dtype).max else hi
            t = torch.randint(lo, max(top, lo + 1), shape, dtype=dtype, device=device, generator=gen)
        if "argmin" in v:
            flat = t.view(-1)
            flat[v["argmin"]] = lo
            flat[v["argmax"]] = hi
        return t
    if isinstance(v, dict):
        return {k: regenerate(x, device) for k, x in v.items()}
    if isinstance(v, list):
        return [regenerate(x, device) for x in v]
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return tuple(regenerate(x, device) for x in v)
    return v


def with_generated(v, over):
    """`v` with every tensor of more than `over` bytes (finite, real) replaced by its spec."""
    import torch
    if isinstance(v, torch.Tensor):
        big = v.numel() * v.element_size() > over and not v.is_complex()
        finite = not v.is_floating_point() or bool(torch.isfinite(v).all())
        return generated_spec(v) if big and finite else v
    if isinstance(v, dict):
        return {k: with_generated(x, over) for k, x in v.items()}
    if isinstance(v, list):
        return [with_generated(x, over) for x in v]
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return tuple(with_generated(x, over) for x in v)
    return v


def count_generated(v):
    if isinstance(v, dict):
        return 1 if v.get("__generated__") else sum(count_generated(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return sum(count_generated(x) for x in v)
    return 0


class TrainRun:
    """The state of one run of a training graph: each forward node's leaves and output, the gradients
    accumulated so far, the parameters' gradients."""

    def __init__(self, root, env, training, device, record, forward_steps, attr_targets):
        self.root, self.env, self.training, self.device, self.record = root, env, training, device, record
        self.forward = {s.name: s for s in forward_steps}
        self.attr_targets = attr_targets  # get_attr value -> the parameter's name
        self.graphs = {}          # forward step -> (leaves [(ref name, index, leaf)], params [(name, p)], out)
        self.grads = {}           # value name -> {tensor index: grad}
        self.contributed = set()  # values that got a live contribution in this run
        self.param_grads = {}     # parameter name -> accumulated gradient

    def forward_step(self, step):
        """Runs a forward step on fresh leaves and keeps what its backward needs."""
        import torch
        from torch.fx.node import map_aggregate
        inplace, leaves = step_is_inplace(step, self.root), []

        def value(x):
            if not isinstance(x, Ref):
                return x
            if x.name not in self.env:
                raise MissingValue(x.name)
            return cut(self.env[x.name], x.name, leaves, inplace)

        cut_step = Step(step.name, step.op, step.kernel, map_aggregate(step.args, value),
                        map_aggregate(step.kwargs, value), step.target, step.kind, step.via)
        with torch.enable_grad():
            out = call(cut_step, self.root, {})
        params = []
        if step.module is not None:
            params = [(f"{step.module}.{n}" if step.module else n, p)
                      for n, p in self.root.get_submodule(step.module).named_parameters() if p.requires_grad]
        self.graphs[step.name] = (leaves, params, out)
        self.env[step.name] = out

    def give_grad(self, name, grads):
        add_grads(self.grads, name, grads)
        self.contributed.add(name)

    def loss(self, step):
        """The gradient of every model output: recorded from the user's loss, or from the loss function."""
        import torch
        if self.training.out_grads is not None:
            grads = [to_device(g, self.device) for g in self.training.out_grads]
        else:
            leaves = []
            out = cut(resolve(self.training.output, self.env), "output", leaves)
            with torch.enable_grad():
                value = (model_call(self.training.loss_fn, out) if self.training.loss_fn
                         else sum(leaf.float().sum() for _, _, leaf in leaves))
            got = torch.autograd.grad(value, [leaf for _, _, leaf in leaves], allow_unused=True) if leaves else ()
            by_index = {i: g for (_, i, _), g in zip(leaves, got)}
            grads = [by_index.get(i) for i in range(len(flat_tensors(out)))]
        # Each output value gets its share, in the order the outputs' tensors come.
        at = 0
        for r in refs_in(step.args):
            if r.name in self.env:
                n = len(flat_tensors(self.env[r.name]))
                self.give_grad(r.name, dict(enumerate(grads[at:at + n])))
                at += n

    def backward_step(self, step):
        """The backward of forward node `step.target`, on what the later nodes passed back (else the
        recording's, loaded with the boundary values)."""
        import torch
        leaves, params, out = self.graphs[step.target]
        grads = (self.grads.get(step.target, {}) if step.target in self.contributed
                 else self.env.get(grad_name(step.target)) or {})
        if self.record:
            torch.save({i: g.detach().cpu() for i, g in grads.items()},
                       os.path.join(self.record, f"{grad_name(step.target)}.pt"))
        leaf_grads, param_grads = model_call(node_backward, leaves, [p for _, p in params], out, grads)
        for name, i, g in leaf_grads:
            if g is None:
                continue
            if name in self.attr_targets:
                # A get_attr input is a parameter of the model: its gradient is the parameter's.
                add_grads(self.param_grads, self.attr_targets[name], {0: g})
            else:
                self.give_grad(name, {i: g})
        for (name, _), g in zip(params, param_grads):
            add_grads(self.param_grads, name, {0: g})

    def optimizer_step(self, step):
        """The parameters' update: the optimizer rebuilt with its recorded state, on the gradients it saw
        (captured: clipping and accumulation included), else those this run's backward nodes made, else
        the recording's."""
        import torch
        params = dict(self.root.named_parameters())
        if self.training.param_grads is not None:
            grads = {k: to_device(v, self.device) for k, v in self.training.param_grads.items()}
        elif self.param_grads:
            grads = {k: v[0] for k, v in self.param_grads.items()}
        else:
            grads = self.env.get(GRADS_VALUE) or {}
        if self.record:
            torch.save({k: v.detach().cpu() for k, v in grads.items()}, os.path.join(self.record, f"{GRADS_VALUE}.pt"))
        for name, p in params.items():
            g = grads.get(name)
            p.grad = None if g is None else g.detach().to(device=p.device, dtype=p.dtype)
        model_call(lambda: build_optimizer(self.training.optimizer, self.root).step())


def step_is_inplace(step, root):
    if step.module is not None:
        try:
            return bool(getattr(root.get_submodule(step.module), "inplace", False))
        except AttributeError:
            return False
    name = step.target if isinstance(step.target, str) else getattr(step.target, "__name__", "")
    return bool(step.kwargs.get("inplace")) or (isinstance(name, str) and name.endswith("_")
                                                 and not name.endswith("__"))


def build_optimizer(spec, root):
    """The optimizer over the model's parameters (by name), with its recorded state: from a captured
    spec, or from the user's factory."""
    if not isinstance(spec, dict):
        return spec(root)
    module, _, cls_name = spec["cls"].rpartition(".")
    cls = importlib.import_module(module)
    for part in cls_name.split("."):
        cls = getattr(cls, part)
    return optimizer_from_spec(cls, spec, dict(root.named_parameters()))


TRAINING_KINDS = ("loss", "backward", "optimizer")


# ----------------------------------------------------------------------------------------------------
# Descent into the modules kept whole. The recording run puts forward hooks on every module inside them:
# each call, at any depth, prints its own markers and records its actual inputs and output, whatever the
# Python around it does. Inside a module FX can trace (a user module below one that it cannot), the module
# runs through an FX interpreter that does the same for every op. The innermost open marker is the
# faulting call; `expand` later replaces each call on the way to it by the calls it made, so the shrinker
# sees the fault pinned to a single op or a leaf module, each level obtained by hooks or by fx.

HOOKS_FILE = "hooks.json"


def is_torch_module(m):
    return type(m).__module__.startswith("torch.")


class Recorder:
    """Records the calls made inside the steps that are user modules kept whole (or the whole model)."""

    def __init__(self, root, steps, opaque, record, sync):
        self.record, self.sync = record, sync
        self.stack, self.calls, self.shapes, self.handles = [], [], {}, []
        self.counts = collections.Counter()
        self.index = {}
        whole = set()
        for s in steps:
            m = root.get_submodule(s.target) if s.kind == "call_module" else None
            if m is not None and not is_torch_module(m):
                whole.add(s.name)
                for qual, sub in m.named_modules():
                    if sub is m:
                        continue
                    path = f"{s.target}.{qual}" if s.target else qual
                    self.hook(sub, path)
                    if not is_torch_module(sub) and id(sub) not in opaque:
                        self.interpret(sub, path, opaque)
        self.whole = whole

    def enter(self, name):
        self.stack = [name]

    def leave(self):
        self.stack = []

    def new_call(self, name, entry, value):
        parent = self.stack[-1]
        key = (parent, name)
        self.counts[key] += 1
        k = self.counts[key] - 1
        cid = f"{parent}__{name}" + (f"_{k}" if k else "")
        entry.update(id=cid, parent=parent, ended=False)
        self.calls.append(entry)
        self.index[cid] = entry
        self.save(f"{cid}__in", value)
        return cid

    def save(self, name, value):
        import torch
        v = to_device(plain(value), "cpu")
        try:
            torch.save(v, os.path.join(self.record, f"{name}.pt"))
        except Exception as e:  # noqa: BLE001 - a value torch cannot save only limits how far we descend
            print(f"harness: cannot record {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return
        sh = shape_of(v)
        if sh:
            self.shapes[name] = sh

    def begin(self, cid, op, kernel):
        say(MARKER.format(node=cid, op=op, kernel=kernel, phase="begin"))
        self.stack.append(cid)

    def end(self, cid, op, kernel, out):
        self.sync()
        say(MARKER.format(node=cid, op=op, kernel=kernel, phase="end"))
        self.save(cid, out)
        self.index[cid]["ended"] = True
        if self.stack and self.stack[-1] == cid:
            self.stack.pop()

    def hook(self, module, path):
        name = path.split(".")[-1]
        op = type(module).__name__

        def pre(mod, args, kwargs):
            if not self.stack:
                return None
            cid = self.new_call(name, {"via": "call_module", "target": path, "op": op}, (args, kwargs))
            self.begin(cid, op, op)
            return None

        def post(mod, args, kwargs, out):
            if not self.stack or self.stack[-1] not in self.index or self.index[self.stack[-1]]["target"] != path:
                return None
            self.end(self.stack[-1], op, op, out)
            return None

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post, with_kwargs=True))

    def interpret(self, module, path, opaque):
        """Runs `module` through FX, op by op, with markers and recordings (it can be traced)."""
        import types

        import torch.fx
        try:
            gm = torch.fx.GraphModule(module, LeafTracer(opaque).trace(module))
            signature = inspect.signature(module.forward)
        except Exception:  # noqa: BLE001 - not traceable after all: hooks alone then
            return
        recorder = self

        class Interpreter(torch.fx.Interpreter):
            def run_node(self, n):
                if n.op not in ("call_function", "call_method") or not recorder.stack:
                    return super().run_node(n)
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                op = short_name(n.target) if n.op == "call_function" else f"Tensor.{n.target}"
                kernel = short_name(n.target)
                entry = {"via": n.op, "target": path, "fx": n.name, "op": op, "kernel": kernel}
                if n.op == "call_method":
                    entry["method"] = n.target
                cid = recorder.new_call(n.name, entry, (args, kwargs))
                recorder.begin(cid, op.replace(" ", "_"), kernel)
                out = getattr(self, n.op)(n.target, args, kwargs)
                recorder.end(cid, op.replace(" ", "_"), kernel, out)
                return out

        def forward(self, *args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return Interpreter(gm).run(*bound.arguments.values())

        module.forward = types.MethodType(forward, module)

    def write(self):
        for h in self.handles:
            h.remove()
        with open(os.path.join(self.record, HOOKS_FILE), "w") as f:
            json.dump({"whole": sorted(self.whole), "calls": self.calls}, f)


def plain(v):
    """`v` with FX's immutable lists and dicts (what an interpreter hands an op) made plain ones, so that
    a recording loads with `weights_only=True`; namedtuples are kept as they are."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return tuple(plain(x) for x in v)
    return v


def fx_target(root, path, node_name, opaque, cache):
    """The function an FX node of the module at `path` calls, traced again as the recording run did."""
    if path not in cache:
        m = root.get_submodule(path)
        cache[path] = {n.name: n.target for n in LeafTracer(opaque).trace(m).nodes}
    return cache[path][node_name]


def recorded_step(c, root, opaque, cache):
    via = c["via"]
    if via == "call_function":
        target = fx_target(root, c["target"], c["fx"], opaque, cache)
    elif via == "call_method":
        target = c["method"]
    else:
        target = c["target"]
    kernel = c.get("kernel", c["op"])
    return Step(c["id"], c["op"], kernel, (Ref(c["id"] + "__in", None),), {}, target, "call_recorded", via)


def chain_links(children, recording):
    """True when each recorded call got exactly the previous call's output as its only input: then the
    calls are a chain and each is fed its predecessor's live output (checked on the recorded run)."""
    import torch
    for prev, cur in zip(children, children[1:]):
        try:
            (args, kwargs) = load_recorded(os.path.join(recording, cur["id"] + "__in.pt"))
            out = load_recorded(os.path.join(recording, prev["id"] + ".pt"))
        except (OSError, RuntimeError, ValueError):
            return False
        if kwargs or len(args) != 1 or not isinstance(out, torch.Tensor) or not isinstance(args[0], torch.Tensor):
            return False
        if args[0].shape != out.shape or args[0].dtype != out.dtype or not torch.equal(args[0], out):
            return False
    return len(children) > 1


def expand(steps, root, recording, opaque=frozenset()):
    """`steps` with each call on the way to the recorded fault replaced by the calls it made, level by
    level, down to the innermost one that was still running; and what each level was obtained by.
    A recording without hooks (or a clean one) leaves the steps as they are."""
    path = os.path.join(recording, HOOKS_FILE)
    if not os.path.exists(path):
        return steps, []
    with open(path) as f:
        calls = json.load(f).get("calls", [])
    open_calls = [c for c in calls if not c.get("ended")]
    if not open_calls:
        return steps, []
    by_id = {c["id"]: c for c in calls}
    # The way down: the innermost call still running, then its parents up to a step.
    way = [open_calls[-1]["id"]]
    while way[-1] in by_id:
        way.append(by_id[way[-1]]["parent"])
    way.reverse()  # step, call, call, ..., innermost
    children = collections.defaultdict(list)
    for c in calls:
        children[c["parent"]].append(c)
    cache, levels = {}, []

    def level(parent, depth):
        kids = children[parent]
        how = "fx" if any(k["via"] != "call_module" for k in kids) else "hooks"
        chained = how == "hooks" and chain_links(kids, recording)
        levels.append(f"{parent}: {'chain of children (checked on the recorded run)' if chained else how}")
        out = []
        for i, c in enumerate(kids):
            if depth + 1 < len(way) - 1 and c["id"] == way[depth + 1]:
                out.extend(level(c["id"], depth + 1))
                continue
            st = recorded_step(c, root, opaque, cache)
            if chained and i > 0:
                prev = kids[i - 1]["id"]
                st = Step(st.name, st.op, st.kernel, (Ref(prev, prev),), {}, st.target, "call_module")
            out.append(st)
        return out

    out = []
    for s in steps:
        if s.name == way[0] and len(way) > 1:
            out.extend(level(s.name, 0))
        else:
            out.append(s)
    return out, levels


def describe_graph(traced_by, levels):
    """The description's `graph`: how the top level was obtained, then each level descended into."""
    base = {"whole": "the model's forward cannot be traced: kept whole"}.get(traced_by, traced_by)
    if levels:
        base += "; descended along the fault: " + " -> ".join(levels)
    return base


def load_recorded(path):
    """A recorded value. Plain tensors and containers load with `weights_only=True`; only a value of a
    type torch does not allow there (a user class the model returned) needs a full unpickle, and these
    recordings are our own, written by `run --record` in the run directory."""
    import pickle

    import torch
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key in RECORDED:
        return RECORDED[key]
    try:
        value = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        value = torch.load(path, weights_only=False)
    if len(RECORDED) >= 4096:
        RECORDED.clear()
    RECORDED[key] = value
    return value


# Recorded values already read, by (path, mtime, size): a warm server loads a request's recordings before
# it forks, so every child of a shrink shares them instead of reading them again.
RECORDED = {}


def boundary_env(kept, placeholders, example, attrs, inputs_dir, device):
    """The values kept steps read but no kept step makes: inputs, attributes, recordings."""
    made = {s.name for s in kept}
    env = {}
    for name in sorted(needed_refs(kept) - made):
        if name in placeholders:
            env[name] = example[placeholders.index(name)]
        elif name in attrs:
            env[name] = attrs[name]
        else:
            if not inputs_dir:
                if name.endswith("__grad") or name == GRADS_VALUE:
                    continue  # a gradient: the kept backward nodes make it live
                raise SystemExit(f"error: value {name!r} is made by a node that is not kept: pass --recording")
            path = os.path.join(inputs_dir, f"{name}.pt")
            if os.path.exists(path):
                env[name] = load_recorded(path)
            # else: a value the recorded run never made (it died first); a step that needs it says so.
    return {k: to_device(v, device) for k, v in env.items()}


# ----------------------------------------------------------------------------------------------------
# The standalone repro.


def literal(a, names):
    """Python source for an argument; Refs become env lookups (or `names`, a format of `name`)."""
    if isinstance(a, Ref):
        return names.format(name=a.name) if names else f"env[{a.name!r}]"
    if isinstance(a, tuple):
        inner = ", ".join(literal(x, names) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(literal(x, names) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {literal(v, names)}" for k, v in a.items()) + "}"
    if isinstance(a, slice):
        return f"slice({literal(a.start, names)}, {literal(a.stop, names)}, {literal(a.step, names)})"
    mod = type(a).__module__
    if mod == "torch" and type(a).__name__ in ("dtype", "device", "layout", "memory_format"):
        return repr(a) if type(a).__name__ != "device" else f"torch.device({str(a)!r})"
    if a is None or isinstance(a, (bool, int, float, str)):
        return repr(a)
    if a is Ellipsis:
        return "..."
    raise ValueError(f"cannot write {a!r} ({type(a).__name__}) into repro.py")


# Where torch itself defines ops: nothing to carry for these.
TORCH_NAMESPACES = {"aten", "prims", "prim", "quantized", "_quantized", "c10d", "_c10d_functional",
                    "_c10d_functional_autograd", "_dtensor", "higher_order", "profiler", "rngprims",
                    "debugprims", "inductor", "_inductor_test", "mkldnn", "onednn", "_test"}
# Packages a repro may import by name: torch and triton are its only requirements.
IMPORTABLE = ("torch", "triton", "math", "operator", "builtins", "_operator")


class ExtractError(Exception):
    """What keeps repro.py from being standalone: names the op or function."""


@dataclass
class Needs:
    """What the kept steps call beyond torch: gathered while writing the calls, rendered after."""
    user_fns: list = field(default_factory=list)     # the user's Python functions, copied as source
    custom_ops: dict = field(default_factory=dict)   # "ns::op" -> the op's Python definition (a CustomOpDef)
    imports: set = field(default_factory=set)        # extra import lines
    notes: list = field(default_factory=list)        # what the repro needs beyond torch and triton
    missing: list = field(default_factory=list)      # what could not be carried, for the extract error
    optimizer_ref: str = "None"                      # how repro.py names the optimizer's class
    requires: list = field(default_factory=list)     # what must be installed: torch, triton, packages
    project: list = field(default_factory=list)      # the project's own modules the copied code imports
    generated: int = 0                               # recorded values repro.py generates instead of loading


def op_path(fn):
    """(namespace, op, overload or None) of a `torch.ops` callable, else None."""
    kind = type(fn).__name__
    if kind == "OpOverload":
        qual, overload = fn._schema.name, fn._overloadname
    elif kind == "OpOverloadPacket":
        qual, overload = fn._qualified_op_name, None
    else:
        return None
    ns, _, op = qual.partition("::")
    return ns, op, overload


def python_custom_op(qualname):
    """The CustomOpDef behind a `torch.library.custom_op`, when the op was defined in Python."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    return OPDEFS.get(qualname)


def extension_for(ns):
    """Import lines for the compiled extension that defines ops in namespace `ns`: a loaded extension
    module named after it, or the package that loaded a library through `torch.ops.load_library`."""
    found = []
    libs = []
    try:
        import torch
        libs = [os.path.realpath(p) for p in getattr(torch.ops, "loaded_libraries", ())]
    except ImportError:
        pass
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None) or ""
        top = name.split(".")[0]
        if not path or top in IMPORTABLE or top.startswith("_"):
            continue
        if path.endswith((".so", ".pyd")) and ns in name.split("."):
            found.append(f"import {name}")
        elif path.endswith("__init__.py") and "." not in name:
            pkg_dir = os.path.dirname(os.path.realpath(path)) + os.sep
            if any(lib.startswith(pkg_dir) for lib in libs) and (ns == name or ns.startswith(name)):
                found.append(f"import {name}")
    return sorted(set(found))


def function_ref(fn, needs):
    """How repro.py names a callable: torch and the standard library by import path, `torch.ops` by op
    name, the user's own Python code by the source copied into repro.py, a compiled extension's function by
    importing the extension."""
    path = op_path(fn)
    if path:
        ns, op, overload = path
        if ns not in TORCH_NAMESPACES:
            qual = f"{ns}::{op}"
            opdef = python_custom_op(qual)
            if opdef is not None:
                needs.custom_ops[qual] = opdef
            else:
                lines = extension_for(ns)
                if lines:
                    needs.imports.update(lines)
                    needs.notes.append(f"{qual} comes from a compiled extension: "
                                       f"{', '.join(line.split()[-1] for line in lines)} must be importable")
                else:
                    needs.missing.append(f"custom op {qual}: neither a torch.library.custom_op defined in "
                                         "Python nor a loaded compiled extension that defines it")
        return f"torch.ops.{ns}.{op}" + (f".{overload}" if overload else "")
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if fn in vars(builtins).values():
        return name
    if mod in ("_operator", "operator"):
        needs.imports.add("import operator")
        return f"operator.{fn.__name__}"
    if mod.startswith("torch") or mod == "math":
        needs.imports.add(f"import {mod}" if mod.split(".")[0] != "torch" else "import torch")
        return f"{mod}.{name}"
    if (inspect.isbuiltin(fn) or type(fn).__name__ == "builtin_function_or_method") and mod:
        # A function of a compiled extension: there is no Python source to copy.
        needs.imports.add(f"import {mod}")
        needs.notes.append(f"{mod}.{name} comes from a compiled extension: {mod} must be importable")
        return f"{mod}.{name}"
    needs.user_fns.append(fn)
    return fn.__name__


def strip_decorators(code):
    """`code` (one def or class) from its `def`/`class` line on: repro.py writes registrations itself."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return code
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.decorator_list:
        return "".join(code.splitlines(keepends=True)[node.lineno - 1:])
    return code


def source_of(fn):
    """The dedented source of a function, a class or a Triton kernel, or None when it cannot be read."""
    target = getattr(fn, "fn", fn)  # a triton JITFunction wraps the Python function
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        src = getattr(fn, "src", None)  # Triton keeps the kernel's text even when the file is gone
        return textwrap.dedent(src) if isinstance(src, str) else None


def is_triton_kernel(fn):
    return type(fn).__name__ in ("JITFunction", "Autotuner", "Heuristics")


def user_source(fns, missing=None, carried_ops=None):
    """Source of the user's functions the kept steps call, and of the globals they use that are functions,
    classes, Triton kernels, Python custom ops (those not in `carried_ops` already) or plain constants from
    the user's code: enough to run without the user's package. What cannot be read is appended to
    `missing`."""
    missing = [] if missing is None else missing
    carried_ops = set() if carried_ops is None else carried_ops
    out, seen, imports = [], set(), set()
    queue = [f if isinstance(f, tuple) else (f, None) for f in fns]
    while queue:
        fn, alias = queue.pop(0)
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if type(fn).__name__ == "CustomOpDef":
            # A custom op the copied code calls by its Python name (a backward calling another op).
            qual = f"{fn._namespace}::{fn._name}"
            if qual not in carried_ops:
                carried_ops.add(qual)
                src, deps = custom_op_source(qual, fn, missing)
                if src:
                    var = fn._init_fn.__name__
                    out.append(src + (f"\n\n{alias} = {var}\n" if alias and alias != var else ""))
                    for dep in deps:
                        queue.extend(globals_used(dep, imports))
            continue
        target = getattr(fn, "fn", fn)
        code = source_of(fn)
        if code is None:
            missing.append(f"function {getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}: "
                           "its source cannot be read")
            continue
        if is_triton_kernel(fn):
            imports.update({"import triton", "import triton.language as tl"})
            if not code.lstrip().startswith("@"):
                code = "@triton.jit\n" + code
        if alias and alias != getattr(target, "__name__", alias):
            # The caller names it differently (`kernel = triton.jit(store_kernel)`): keep that name too.
            code += f"\n\n{alias} = {target.__name__}\n"
        out.append(code)
        imports.update(body_imports(code, getattr(target, "__module__", None)))
        queue.extend(globals_used(target, imports))
    return sorted(imports), out


def body_imports(code, module):
    """The imports a copied definition makes inside its body (`from mylib.ops import fused` in a
    forward), as import lines for the top of repro.py: what they need is then said there, and a missing
    one fails at once. A relative import names the definition's own package, absolutely."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    package = (module or "").rpartition(".")[0]
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines.update(f"import {a.name}" + (f" as {a.asname}" if a.asname else "") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name != "*":
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(p for p in parts + ([node.module] if node.module else []) if p)
            if base and base != "__future__":
                names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
                lines.add(f"from {base} import {names}")
    return lines


def import_top(line):
    """The top-level module an import line loads, or None for a constant line."""
    words = line.split()
    if len(words) >= 2 and words[0] in ("import", "from"):
        return words[1].split(".")[0]
    return None


def requirement(top):
    """What running repro.py asks of the machine for module `top`: None (torch, triton, the standard
    library), "project" (the project under test: a module of the worktree the harness runs in) or
    "package" (something else that must be installed)."""
    if top in ("torch", "triton", "__future__") or top in getattr(sys, "stdlib_module_names", ()):
        return None
    mod = sys.modules.get(top)
    path = getattr(mod, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        path = getattr(spec, "origin", None)
    here = os.path.realpath(os.getcwd()) + os.sep
    if path and os.path.realpath(path).startswith(here):
        return "project"
    return "package"


def globals_used(target, imports):
    """The user-code globals a function (or each method and base of a class) reads, as (value, name) to
    copy; imports for the library ones."""
    if inspect.isclass(target):
        found = []
        for v in vars(target).values():
            fn = getattr(v, "__func__", v)
            if inspect.isfunction(fn):
                # torch wraps some methods in place (an optimizer's `step`): the user's own is inside.
                fn = inspect.unwrap(fn)
                if (getattr(fn, "__module__", "") or "").split(".")[0] == "torch":
                    continue
                found.extend(globals_used(fn, imports))
        module = sys.modules.get(target.__module__)
        code = source_of(target)
        if module is not None and code is not None:
            found.extend(named_globals(base_names(code), vars(module), imports))
        return found
    names = getattr(getattr(target, "__code__", None), "co_names", ())
    return named_globals(names, getattr(target, "__globals__", {}), imports)


def base_names(class_code):
    """The root names of a class statement's bases (`nn` for `nn.Module`)."""
    try:
        node = ast.parse(class_code).body[0]
    except (SyntaxError, IndexError):
        return []
    out = []
    for base in getattr(node, "bases", []):
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name):
            out.append(base.id)
    return out


def named_globals(names, globs, imports):
    found = []
    for name in names:
        if name not in globs:
            continue
        g = globs[name]
        if inspect.ismodule(g):
            # Any module the copied code reads: torch and the standard library as they are, others (the
            # project's own modules, packages) declared at the top of repro.py as what it needs.
            imports.add(f"import {g.__name__} as {name}" if g.__name__ != name else f"import {name}")
            continue
        if type(g).__name__ == "CustomOpDef":
            found.append((g, name))  # carried with its registration
            continue
        if is_triton_kernel(g) or inspect.isfunction(g) or inspect.isclass(g):
            mod = getattr(g, "__module__", "") or ""
            if mod.split(".")[0] in ("torch", "triton", "builtins", "math", "typing", "dataclasses"):
                # A library function the user imported by name (`from torch.library import wrap_triton`).
                real = getattr(g, "__name__", name)
                imports.add(f"from {mod} import {real}" + (f" as {name}" if real != name else ""))
                continue
            found.append((g, name))
        elif isinstance(g, (bool, int, float, str)) or g is None:
            imports.add(f"{name} = {g!r}")
    return found


def custom_op_source(qual, opdef, missing):
    """repro.py's definition of a Python custom op: its kernels' source without decorators, registered
    again under the same name and schema, so `torch.ops.<ns>.<op>` means the same thing."""
    init = opdef._init_fn
    code = source_of(init)
    if code is None:
        missing.append(f"custom op {qual}: the source of {getattr(init, '__qualname__', init)} cannot be read")
        return None, []
    var = init.__name__
    schema = str(opdef._opoverload._schema)
    schema = schema[schema.index("("):]
    mutates = tuple(a.name for a in opdef._opoverload._schema.arguments
                    if a.alias_info is not None and a.alias_info.is_write)
    backends = dict(getattr(opdef, "_backend_fns", {}) or {})
    devices = sorted((d for d, f in backends.items() if f is init and d is not None), key=str)
    device_types = None if not backends or None in backends else (devices or None)
    parts = [strip_decorators(code),
             f"{var} = torch.library.custom_op({qual!r}, mutates_args={mutates!r}, "
             f"device_types={device_types!r}, schema={schema!r})({var})"]
    deps = [init]
    for device, fn in sorted(backends.items(), key=lambda kv: str(kv[0])):
        if fn is init or device is None:
            continue
        src = source_of(fn)
        if src is None:
            missing.append(f"custom op {qual}: the source of its {device} kernel cannot be read")
            continue
        parts += [strip_decorators(src), f"{var}.register_kernel({device!r}, {fn.__name__})"]
        deps.append(fn)
    fake = getattr(opdef, "_abstract_fn", None)
    fake_src = source_of(fake) if fake is not None else None
    if fake_src is not None and fake.__name__ != "<lambda>":
        # Only tracing needs the fake; carried so the repro also works under torch.compile.
        parts += [strip_decorators(fake_src), f"{var}.register_fake({fake.__name__})"]
    # Its backward (register_autograd): a backward node of a training step runs it.
    backward, setup = getattr(opdef, "_backward_fn", None), getattr(opdef, "_setup_context_fn", None)
    if backward is not None:
        for fn in (setup, backward):
            if fn is None:
                continue
            src = source_of(fn)
            if src is None:
                missing.append(f"custom op {qual}: the source of its autograd function "
                               f"{getattr(fn, '__qualname__', fn)} cannot be read")
                continue
            parts.append(strip_decorators(src))
            deps.append(fn)
        context = f", setup_context={setup.__name__}" if setup is not None else ""
        parts.append(f"{var}.register_autograd({backward.__name__}{context})")
    return "\n\n".join(parts) + "\n", deps


@dataclass
class ModuleSpec:
    """A module the kept steps call: built from code (`ctor`) with its state dict, or pickled whole. For a
    module of the user's own class, `cls` is that class, whose source repro.py carries."""
    name: str
    ctor: Optional[str]
    cls: Optional[type] = None


PLAIN = (bool, int, float, str, type(None))


def revived_ctor(name, m):
    """For a leaf module of the user's own class whose attributes are plain values: source that makes an
    instance without running its __init__ (whose arguments are unknown), sets those attributes and
    registers its parameters and buffers from the saved state dict. None when that cannot be done."""
    if list(m.children()) or source_of(type(m)) is None:
        return None
    attrs = {k: v for k, v in vars(m).items() if not k.startswith("_") and k != "training"}
    plain = all(isinstance(v, PLAIN) or (isinstance(v, tuple) and all(isinstance(x, PLAIN) for x in v))
                for v in attrs.values())
    if not plain:
        return None
    params = [k for k, v in m._parameters.items() if v is not None]
    buffers = [k for k, v in m._buffers.items() if v is not None]
    return (f"revive({type(m).__name__}, {attrs!r}, {params!r}, {buffers!r}, "
            f"data['states'][{name!r}])")


def module_ctor(m, nn):
    """Python source that builds a module of the same class and configuration as `m` (not its weights),
    for torch.nn leaf modules whose repr is their constructor call and for Sequential/ModuleList of those;
    None otherwise."""
    cls = type(m)
    if getattr(nn, cls.__name__, None) is not cls:
        return None
    children = list(m.named_children())
    if cls.__name__ in ("Sequential", "ModuleList"):
        parts = [module_ctor(c, nn) for _, c in children]
        if any(p is None for p in parts):
            return None
        if [n for n, _ in children] == [str(i) for i in range(len(children))]:
            inner = ", ".join(parts)
            if cls.__name__ == "Sequential":
                return f"torch.nn.Sequential({inner})"
            return f"torch.nn.ModuleList([{inner}])"
        if cls.__name__ == "Sequential":
            pairs = ", ".join(f"({n!r}, {p})" for (n, _), p in zip(children, parts))
            return f"torch.nn.Sequential(collections.OrderedDict([{pairs}]))"
        return None
    if children:
        return None
    text = repr(m)
    if "\n" in text or not text.startswith(cls.__name__ + "("):
        return None
    return "torch.nn." + text


def checked_ctor(m, torch):
    """`module_ctor`, kept only when what it builds has `m`'s class, repr and state-dict layout."""
    ctor = module_ctor(m, torch.nn)
    if ctor is None:
        return None
    try:
        built = eval(ctor, {"__builtins__": {}, "torch": torch, "collections": collections})  # noqa: S307 - our own text
    except Exception:  # noqa: BLE001 - any failure means: this module is pickled instead
        return None
    want = {k: (tuple(v.shape), v.dtype) for k, v in m.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in built.state_dict().items()}
    if type(built) is not type(m) or repr(built) != repr(m) or got != {k: s for k, (s, _) in want.items()}:
        return None
    return ctor


# repro.py's training runtime when it keeps backward or optimizer nodes: the harness's own arithmetic
# (cut, add_grads, node_backward, optimizer_from_spec: copied from their source, so repro.py computes
# exactly what the harness did) and the state it keeps between nodes.
TRAINING_GLUE = '''\
LEAVES, GRAPHS, GRADS, CONTRIBUTED = [], {}, {}, set()


def forward_done(name, out, module):
    params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    GRAPHS[name] = (list(LEAVES), params, out)
    LEAVES.clear()


def give_grad(name, grads):
    add_grads(GRADS, name, grads)
    CONTRIBUTED.add(name)


def backward(name, recorded):
    # Node `name`'s own backward, on the gradient the nodes after it passed back (else the recorded one).
    leaves, params, out = GRAPHS[name]
    grads = GRADS.get(name, {}) if name in CONTRIBUTED else {i: g.to(DEVICE) for i, g in (recorded or {}).items()}
    leaf_grads, _ = node_backward(leaves, params, out, grads)
    for producer, i, g in leaf_grads:
        give_grad(producer, {i: g})


def update(optimizer_class, spec, params_state, grads):
    # The optimizer rebuilt over the recorded parameters, with its recorded state, on the recorded grads.
    params = {n: torch.nn.Parameter(t.to(DEVICE)) for n, t in params_state.items()}
    for n, p in params.items():
        g = grads.get(n)
        p.grad = None if g is None else g.to(device=DEVICE, dtype=p.dtype)
    optimizer_from_spec(optimizer_class, spec, params).step()
'''


def launch_helpers():
    """repro.py's announcement of each Triton launch (the harness's own), indented like the template."""
    text = "# --- every Triton launch says its kernel, as in the harness's runs ---\n"
    text += f"LAUNCH = {LAUNCH!r}\n\n\n" + inspect.getsource(announce_triton_launches) + "\n\n"
    return textwrap.indent(text, "        ").lstrip()


def generation_helpers():
    """repro.py's generator of the values it does not ship, indented like the template."""
    text = "# --- values generated from their recorded shape, dtype and range ---\n"
    text += "\n\n".join(inspect.getsource(f) for f in (regenerate,)) + "\n\n"
    return textwrap.indent(text, "        ").lstrip()


def training_helpers():
    """repro.py's training runtime, indented like the template it goes into."""
    shared = [inspect.getsource(f) for f in (cut, add_grads, node_backward, optimizer_from_spec)]
    text = "# --- the training step: forward nodes on fresh leaves, each backward node alone, the update ---\n"
    text += "\n\n".join(shared + [TRAINING_GLUE])
    return textwrap.indent(text, "        ").lstrip()


def training_call(s, needs):
    """repro.py's lines for a loss, backward or optimizer node."""
    begin, end = markers(s)
    if s.kind == "loss":
        body = ("    for name, g in data['output_grads'].items():\n"
                "        give_grad(name, {i: x.to(DEVICE) for i, x in g.items()})\n")
    elif s.kind == "backward":
        body = f"    backward({s.target!r}, data['grads'].get({s.target!r}))\n"
    else:
        body = (f"    update({needs.optimizer_ref}, data['optimizer'], data['params'], data['param_grads'])\n")
    return f"    print({begin!r}, flush=True)\n{body}    sync()\n    print({end!r}, flush=True)"


def render_repro(kept, boundary_names, modules, title, device="cuda", needs=None):
    """repro.py's text: markers and a synchronise around every node, like the harness, so the classifier
    reads it the same way. Raises ExtractError naming what it could not carry."""
    needs = needs or Needs()
    needs.imports.update({"import os", "import sys", "import torch", "import torch.utils._pytree"})
    lines = []
    differentiated = {s.target for s in kept if s.kind == "backward"}
    for s in kept:
        if s.kind in TRAINING_KINDS:
            lines.append(training_call(s, needs))
            continue
        fmt = None
        if s.name in differentiated:
            # Its inputs become fresh leaves, so its backward is its own alone.
            fmt = "cut(env[{name!r}], {name!r}, LEAVES" + (", clone=True)" if s.inplace else ")")
        args = ", ".join([literal(a, fmt) for a in (s.args[1:] if s.kind == "call_method" else s.args)]
                         + [f"{k}={literal(v, fmt)}" for k, v in s.kwargs.items()])
        if s.kind == "call_recorded":
            # A call found by descending into a module kept whole: its recorded (args, kwargs).
            rec = literal(s.args[0], None)
            if s.via == "call_module":
                expr = f"modules[{s.target!r}](*{rec}[0], **{rec}[1])"
            elif s.via == "call_method":
                expr = f"getattr({rec}[0][0], {s.target!r})(*{rec}[0][1:], **{rec}[1])"
            else:
                expr = f"{function_ref(s.target, needs)}(*{rec}[0], **{rec}[1])"
        elif s.kind == "call_module":
            expr = f"modules[{s.target!r}]({args})"
        elif s.kind == "call_method":
            expr = f"{literal(s.args[0], fmt)}.{s.target}({args})"
        else:
            expr = f"{function_ref(s.target, needs)}({args})"
        begin, end = markers(s)
        done = ""
        if s.name in differentiated:
            module = f"modules[{s.module!r}]" if s.module is not None else "None"
            done = f"    forward_done({s.name!r}, env[{s.name!r}], {module})\n"
        lines.append(f"    print({begin!r}, flush=True)\n"
                     f"    env[{s.name!r}] = {expr}\n"
                     f"{done}"
                     f"    sync()\n"
                     f"    print({end!r}, flush=True)")
    # The user's own module classes that repro.py revives from code.
    needs.user_fns.extend(s.cls for s in modules if s.ctor and s.cls is not None)
    op_sources, op_deps = [], []
    for qual, opdef in needs.custom_ops.items():
        src, deps = custom_op_source(qual, opdef, needs.missing)
        if src:
            op_sources.append(src)
            # What the op's kernels call (Triton kernels, helpers, constants), copied like any user code.
            for fn in deps:
                op_deps.extend(globals_used(fn, needs.imports))
    # (value, name) pairs keep the names the op's kernels use (`kernel = triton.jit(...)`).
    extra_imports, sources = user_source(op_deps + needs.user_fns, needs.missing, set(needs.custom_ops))
    if needs.missing:
        raise ExtractError("; ".join(dict.fromkeys(needs.missing)))
    needs.imports.update(extra_imports)
    if any(s.ctor and "collections." in s.ctor for s in modules):
        needs.imports.add("import collections")
    pickled = [s.name for s in modules if s.ctor is None]
    triton = any("triton" in i for i in needs.imports)
    tops = sorted({t for t in map(import_top, needs.imports) if t})
    packages = [t for t in tops if requirement(t) == "package"]
    project = [t for t in tops if requirement(t) == "project"]
    needs.project = project
    needs.requires = ["torch"] + (["triton"] if triton else []) + packages
    if packages:
        needs.notes.append(f"these installed packages: {', '.join(packages)}")
    if project:
        needs.notes.append(f"the project under test at the culprit commit on PYTHONPATH (the copied code imports "
                           f"{', '.join(project)}); reproduce.sh checks it out")
    notes = "".join(f"\n        Needs: {n}." for n in needs.notes)
    if needs.generated:
        values_text = (f"{needs.generated} large recorded values are generated from their recorded shape, dtype\n"
                       "        and range (extremes in place: the fault was checked to show that way); the rest of\n"
                       "        repro_data.pt is exact;")
    else:
        values_text = "The tensors in repro_data.pt are the exact values the full model produced, not random stand-ins;"
    base = "torch and triton" if triton else "torch"
    needs_text = f"{base}, and what follows" if packages or project else f"only {base}"
    head = textwrap.dedent(f'''\
        #!/usr/bin/env python3
        """{title}

        Generated by cudabisect. Needs {needs_text}.{notes}
        Run: CUDA_LAUNCH_BLOCKING=1 python repro.py   (exit status 1 and the CUDA error mean it reproduced)
        {values_text}
        it loads with weights_only=True (no code runs when it is opened).
        """
        from __future__ import annotations
        # cudabisect-needs-project: {", ".join(project)}
        ''')
    plain = sorted(i for i in needs.imports if i.startswith(("import ", "from ")))
    consts = sorted(i for i in needs.imports if not i.startswith(("import ", "from ")))
    body = "\n".join(plain) + "\n\n"
    if consts:
        body += "\n".join(consts) + "\n\n"
    if sources or op_sources:
        body += "# --- the model's own code that the kept nodes call, copied from its source ---\n\n"
        body += "\n\n".join(sources + op_sources) + "\n\n"
    body += textwrap.dedent(f'''\
        DEVICE = os.environ.get("REPRO_DEVICE", {device!r})
        HERE = os.path.dirname(os.path.abspath(__file__))


        def to_device(v):
            return torch.utils._pytree.tree_map(lambda x: x.to(DEVICE) if isinstance(x, torch.Tensor) else x, v)


        def sync():
            if DEVICE.startswith("cuda"):
                torch.cuda.synchronize()


        def revive(cls, attrs, params, buffers, state):
            # A module of the model's own class, without its __init__: plain attributes, then its tensors.
            module = cls.__new__(cls)
            torch.nn.Module.__init__(module)
            for k, v in attrs.items():
                setattr(module, k, v)
            for k in params:
                module.register_parameter(k, torch.nn.Parameter(state[k]))
            for k in buffers:
                module.register_buffer(k, state[k])
            return module


        {training_helpers() if any(s.kind in TRAINING_KINDS for s in kept) else ""}
        {generation_helpers() if needs.generated else ""}
        {launch_helpers()}
        def main():
            announce_triton_launches()
            data = torch.load(os.path.join(HERE, "repro_data.pt"), weights_only=True)
            {"data = regenerate(data, DEVICE)" if needs.generated else ""}
            # Inputs of the kept nodes that cut nodes made: {sorted(boundary_names)}
            env = to_device(data["values"])

            def build(name, module):
                # The module's exact parameters and buffers, in their own dtypes.
                module.load_state_dict(data["states"][name], assign=True)
                return module.train(data["training"][name]).to(DEVICE)

            modules = {{}}
        ''')
    for spec in modules:
        if spec.ctor:
            body += f"    modules[{spec.name!r}] = build({spec.name!r}, {spec.ctor})\n"
    if pickled:
        body += ("    # NOT STANDALONE: the model's own module classes, pickled whole; opening this file runs\n"
                 "    # code from their package, which must be importable.\n"
                 "    pickled = torch.load(os.path.join(HERE, \"repro_modules.pt\"), weights_only=False)\n")
        for name in pickled:
            body += f"    modules[{name!r}] = pickled[{name!r}].to(DEVICE)\n"
    body += "\n".join(lines) + "\n"
    body += textwrap.dedent('''\
            print("repro: ran clean", flush=True)


        if __name__ == "__main__":
            try:
                main()
            except Exception:
                import traceback
                traceback.print_exc(file=sys.stdout)
                sys.exit(1)
        ''')
    text = head + body
    try:
        compile(text, "repro.py", "exec")
    except SyntaxError as e:
        raise ExtractError(f"the written repro.py does not compile: {e}") from e
    return text


def optimizer_spec(opt, root):
    """An optimizer as plain data: its class, its groups by parameter name, its state dict."""
    names = {id(p): n for n, p in root.named_parameters()}
    groups = []
    for g in opt.param_groups:
        group = {k: v for k, v in g.items() if k != "params"}
        group["params"] = [names[id(p)] for p in g["params"] if id(p) in names]
        groups.append(group)
    cls = type(opt)
    return {"cls": f"{cls.__module__}.{cls.__qualname__}", "groups": groups, "state": opt.state_dict()}


def repro_steps(kept, w):
    """The kept steps with each kept backward node's forward run first when it is not kept itself."""
    forward = {s.name: s for s in w.forward_steps}
    out, done = [], set()
    for s in kept:
        if s.kind == "backward" and s.target not in done and s.target in forward:
            out.append(forward[s.target])
            done.add(s.target)
        if s.name not in done:
            out.append(s)
            done.add(s.name)
    return out


def training_data(kept, w, env, recording, needs):
    """What repro.py's training nodes read: recorded gradients, the optimizer, the parameters."""
    data = {"grads": {}, "output_grads": {}}

    def recorded(name):
        path = os.path.join(recording or "", f"{name}.pt")
        return load_recorded(path) if recording and os.path.exists(path) else None

    for s in kept:
        if s.kind == "backward":
            g = env.get(grad_name(s.target)) or recorded(grad_name(s.target))
            if g is not None:
                data["grads"][s.target] = to_device(g, "cpu")
        elif s.kind == "loss":
            for r in refs_in(s.args):
                g = recorded(grad_name(r.name))
                if g is not None:
                    data["output_grads"][r.name] = to_device(g, "cpu")
        elif s.kind == "optimizer":
            spec = w.training.optimizer
            if not isinstance(spec, dict):
                spec = optimizer_spec(spec(w.root), w.root)
            module, _, name = spec["cls"].rpartition(".")
            if module.split(".")[0] == "torch":
                needs.optimizer_ref = spec["cls"]
            else:
                cls = importlib.import_module(module)
                for part in name.split("."):
                    cls = getattr(cls, part)
                needs.user_fns.append(cls)
                needs.optimizer_ref = cls.__name__
            data["optimizer"] = to_device(spec, "cpu")
            data["params"] = {n: p.detach().cpu() for n, p in w.root.named_parameters()}
            grads = w.training.param_grads if w.training.param_grads is not None else \
                (env.get(GRADS_VALUE) or recorded(GRADS_VALUE) or {})
            data["param_grads"] = to_device(grads, "cpu")
    return data


def extract(kept, root, env, out_dir, title, device, w=None, recording=None, generate_over=None):
    """Writes repro.py, repro_data.pt (safe to open) and, only for the model's own module classes,
    repro_modules.pt (a full pickle); returns what it wrote, for the protocol's answer. With `w` (a
    training graph) it also writes the backward and update nodes it keeps."""
    import torch
    specs, states, training, pickled = [], {}, {}, {}
    needs = Needs()
    extra = {}
    if w is not None:
        kept = repro_steps(kept, w)
        for s in kept:
            s.inplace = s.kind not in TRAINING_KINDS and step_is_inplace(s, root)
        extra = training_data(kept, w, env, recording, needs)
    for s in kept:
        if s.module is None or s.module in states or s.module in pickled:
            continue
        m = root.get_submodule(s.module).cpu()
        ctor = checked_ctor(m, torch)
        own = None
        if ctor is None:
            ctor = revived_ctor(s.module, m)
            own = type(m) if ctor else None
        specs.append(ModuleSpec(s.module, ctor, own))
        if ctor:
            states[s.module] = m.state_dict()
            training[s.module] = m.training
        else:
            pickled[s.module] = m
    foreign = sorted({f"{type(m).__module__}.{type(m).__name__}" for m in pickled.values()})
    if foreign:
        title += ("\n\nNOT STANDALONE: it unpickles the model's own module classes "
                  f"({', '.join(foreign)}) from repro_modules.pt, so their package must be importable.")
        print(f"harness: repro.py needs the model's package for {', '.join(foreign)}", file=sys.stderr)
    names = sorted(env)
    data = {"values": {k: to_device(env[k], "cpu") for k in names}, "states": states, "training": training}
    data.update(extra)
    generated = 0
    if generate_over is not None:
        for key in ("values", "grads", "output_grads", "param_grads"):
            if key in data:
                data[key] = with_generated(data[key], generate_over)
        generated = count_generated(data)
    needs.generated = generated
    text = render_repro(kept, names, specs, title, device, needs)
    os.makedirs(out_dir, exist_ok=True)
    data_path = os.path.join(out_dir, "repro_data.pt")
    torch.save(data, data_path)
    try:
        torch.load(data_path, weights_only=True)
    except Exception as e:  # whatever torch refuses, the bundle would not open safely
        raise ExtractError(f"a recorded value cannot be saved in a safe form: {e}") from e
    if pickled:
        torch.save(pickled, os.path.join(out_dir, "repro_modules.pt"))
    path = os.path.join(out_dir, "repro.py")
    with open(path, "w") as f:
        f.write(text)
    return {"repro": path, "nodes": [s.name for s in kept], "standalone": not pickled and not needs.project,
            "pickled_modules": sorted(pickled), "requires": needs.requires, "project": needs.project,
            "generated": generated, "bytes": os.path.getsize(data_path)}


# ----------------------------------------------------------------------------------------------------


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


def parse_args(argv):
    p = argparse.ArgumentParser(prog="torch_harness.py")
    p.add_argument("--model", help="module:factory returning the nn.Module")
    p.add_argument("--example-inputs", dest="example", help="module:factory returning the model's example inputs")
    p.add_argument("--capture", help="a captured training step (model, optimizer, batch, gradients) instead of "
                                     "factories: the directory the capture wrote")
    p.add_argument("--train", action="store_true", help="the whole training step: forward, loss, backward "
                                                        "and (with --optimizer) the update")
    p.add_argument("--loss", help="module:function, the model's output -> a scalar loss (default: the sum of "
                                  "the outputs)")
    p.add_argument("--optimizer", help="module:factory, the model -> its optimizer")
    p.add_argument("--device", default="cuda")
    p.add_argument("--via", help="a warm server's socket: run there (forked from the built model); "
                                 "run cold here when it cannot be reached")
    sub = p.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("describe")
    d.add_argument("--out", help="write the description here (the protocol's channel) instead of stdout")
    d.add_argument("--recording", help="describe the graph as this recording saw it (descended into "
                                       "modules kept whole, along the fault)")
    r = sub.add_parser("run")
    r.add_argument("--keep")
    r.add_argument("--recording", help="the recording boundary inputs come from")
    r.add_argument("--record")
    r.add_argument("--generate-over", type=int, help="recorded values over this many bytes are generated "
                                                     "from their shape, dtype and range instead")
    x = sub.add_parser("extract")
    x.add_argument("--keep", required=True)
    x.add_argument("--recording")
    x.add_argument("--out", required=True)
    x.add_argument("--generate-over", type=int, help="repro.py generates the values over this many bytes "
                                                     "from their shape, dtype and range instead of shipping them")
    s = sub.add_parser("serve")
    s.add_argument("--socket", required=True, help="the Unix socket to listen on")
    a = p.parse_args(argv)
    if not a.capture and not (a.model and a.example):
        p.error("give --model and --example-inputs, or --capture DIR")
    return a


def prepare_key(a):
    return (a.model, a.example, a.capture, a.train, a.loss, a.optimizer)


def load_capture(d):
    """The captured step: the model (unpickled on the CPU), its batch as positional inputs, and what the
    training graph needs (the output's gradient, the optimizer, the gradients it saw)."""
    import torch
    for path in (d, os.getcwd()):  # the captured script's own definitions (cudabisect_main.py), the project
        if path not in sys.path:
            sys.path.insert(0, path)
    with open(os.path.join(d, "capture.json")) as f:
        meta = json.load(f)
    fault = os.path.join(d, "fault.json")
    if os.path.exists(fault):
        with open(fault) as f:
            meta.update(json.load(f))  # where the step failed, not where it was saved

    def load(name):
        path = os.path.join(d, name)
        return torch.load(path, map_location="cpu", weights_only=False) if os.path.exists(path) else None

    model = load("model.pt")
    batch = load("batch.pt") or {"args": [], "kwargs": {}}
    try:
        bound = inspect.signature(model.forward).bind(*batch["args"], **batch["kwargs"])
        bound.apply_defaults()
        example = tuple(bound.arguments.values())
    except TypeError:
        example = tuple(batch["args"])
    training = Training(out_grads=load("output_grads.pt"), optimizer=load("optimizer.pt"),
                        param_grads=load("param_grads.pt"))
    meta["rng"] = load("rng.pt")
    return model, example, training, meta


def prepare(a):
    """Imports torch and the user's package and builds the model, its inputs and its graph on the CPU.
    CUDA is not touched here, so a warm server can fork children that each initialise it afresh."""
    import torch
    torch.manual_seed(0)
    training, rng = None, None
    if a.capture:
        model, example, training, meta = load_capture(a.capture)
        rng = meta.get("rng")
        if meta.get("phase") == "forward" and not a.train:
            training = None  # a forward fault needs no backward
    else:
        model = load_attr(a.model)()
        example = load_attr(a.example)()
        if not isinstance(example, (tuple, list)):
            example = (example,)
        if a.train or a.optimizer or a.loss:
            training = Training(loss_fn=load_attr(a.loss) if a.loss else None,
                                optimizer=load_attr(a.optimizer) if a.optimizer else None)
        model = model.train() if training else model.eval()
    steps, placeholders, attrs, (traced_by, root, opaque) = build_graph(model, tuple(example))
    forward_steps = steps
    if training is not None:
        training.output = getattr(root, "_cudabisect_output", None) or Ref("model", "model")
        steps = training_steps(forward_steps, training)
        traced_by += "; the training step: forward, loss, backward" + (", optimizer" if training.optimizer else "")
    sources = {s.name: src for s in forward_steps if (src := step_source(s, root))}
    return Prepared(prepare_key(a), tuple(example), steps, placeholders, attrs, traced_by, root, opaque,
                    training, forward_steps, getattr(root, "_cudabisect_attr_targets", {}), sources, rng)


def execute(a, w):
    """Runs one verb on a prepared model: moves what the verb needs to the device, then describes, runs
    or extracts."""
    import torch
    torch.manual_seed(0)
    announce_triton_launches()
    steps, levels = w.steps, []
    if getattr(a, "recording", None):
        steps, levels = expand(w.steps, w.root, a.recording, w.opaque)
        if levels:
            # Descended into a forward node: a forward fault needs no backward.
            steps = [s for s in steps if s.kind not in TRAINING_KINDS]
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
        for graph in (steps, w.steps):
            if all(k in {s.name for s in graph} for k in keep):
                steps = graph
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
        if over is not None and a.verb == "run":
            env = {k: regenerate(with_generated(v, over), a.device) for k, v in env.items()}
        timing("boundary values on the device")
        if a.verb == "extract":
            source = "a captured training step" if a.capture else a.model
            title = f"Minimal repro: {len(kept)} of {len(steps)} nodes of {source} ({', '.join(s.name for s in kept)})"
            try:
                written = extract(kept, w.root, env, a.out, title, a.device, w if training else None,
                                  getattr(a, "recording", None), over)
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


def main(argv=None, warm=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.verb == "serve":
        return serve(a)
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


# ----------------------------------------------------------------------------------------------------
# Warm start: a server imports torch and the user's package and builds the model once; every request is
# answered by a child forked from it, which initialises CUDA afresh (a sticky CUDA error dies with its
# child). The client passes its own stdin, stdout and stderr and its process group, so the child's output
# is the client's output and a timeout that kills the client's group kills the child too.


def without_via(argv):
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--via":
            skip = True
        elif not x.startswith("--via="):
            out.append(x)
    return out


def forward(path, argv):
    """Runs `argv` in the warm server at `path`; its exit status, or None when it must run cold here."""
    import signal
    import socket
    timing("client started")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        print(f"harness: warm server unavailable ({e}); running cold", file=sys.stderr, flush=True)
        return None
    req = {"argv": argv, "pgid": os.getpgrp(), "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        send_request(s, req, [0, 1, 2])
    except OSError as e:
        print(f"harness: warm server unavailable ({e}); running cold", file=sys.stderr, flush=True)
        return None
    forked = False
    for line in s.makefile("rb"):
        word, _, rest = line.decode("ascii", "replace").strip().partition(" ")
        if word == "forked":
            forked = True
            timing("child forked")
            continue
        if word == "cold":
            print(f"harness: warm server cannot serve ({rest}); running cold", file=sys.stderr, flush=True)
            return None
        if word == "exit":
            timing("child exited")
            return int(rest)
        if word == "signal":
            # Die of the same signal, so the driver sees a crash as a crash.
            sig = int(rest)
            sys.stdout.flush()
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return 128 + sig
    if not forked:
        # The server died before it started this call (while building the model, say): nothing ran.
        print("harness: the warm server went away before the run; running cold", file=sys.stderr, flush=True)
        return None
    print("harness: the warm server went away during the run", file=sys.stderr, flush=True)
    return 70


def send_request(sock, req, fds):
    """A request on the wire: its length, its JSON, and the caller's stdin, stdout and stderr."""
    import socket
    import struct
    payload = json.dumps(req).encode()
    data = struct.pack("!Q", len(payload)) + payload
    sent = socket.send_fds(sock, [data], fds)
    if sent < len(data):
        # (Only the rest: an empty send to a peer that already read everything and closed is EPIPE.)
        sock.sendall(data[sent:])


def recv_request(conn, timeout=30):
    import socket
    import struct
    conn.settimeout(timeout)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 8:
        more = conn.recv(1 << 16)
        if not more:
            raise OSError("short request")
        data += more
    (size,) = struct.unpack("!Q", data[:8])
    body = data[8:]
    while len(body) < size:
        more = conn.recv(1 << 20)
        if not more:
            raise OSError("short request")
        body += more
    conn.settimeout(None)
    if len(fds) != 3:
        raise OSError(f"expected 3 file descriptors, got {len(fds)}")
    return json.loads(body), fds


def hash_triton_kernels():
    """In the server, when the user's code uses Triton: computes what Triton hashes before its first launch
    in a process (the hash of Triton itself, and each loaded kernel's source key), all on the CPU, so every
    forked child inherits them instead of computing them again (measured on an H200: a Triton kernel's first
    launch in a child fell from about 0.48 s to 0.12 s). Never touches the device."""
    if "triton" not in sys.modules:
        return
    try:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:
            from triton.compiler.compiler import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - only a head start
        pass
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001
        return
    # Only the user's own modules (not installed packages, whose attributes may be lazy hooks), and only
    # Triton's own wrappers are looked into.
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if not path or "-packages/" in path or "/lib/python3" in path:
            continue
        for value in list(getattr(module, "__dict__", {}).values()):
            # @triton.autotune and @triton.heuristics wrap the kernel: its JITFunction is under `.fn`.
            for _ in range(3):
                if isinstance(value, JITFunction):
                    try:
                        _ = value.cache_key  # the property computes and keeps it
                    except Exception:  # noqa: BLE001
                        pass
                    break
                if not type(value).__module__.startswith("triton."):
                    break
                value = getattr(value, "fn", None)


def warm_device(a, root=None):
    """In a spare child, before any request: start the device and the libraries the model will call
    (cuBLAS for matrix products, cuDNN for convolutions and norms, Triton's driver when the user's code
    imported Triton), so the run it serves does not wait for them. A spare serves one run only, so
    nothing it warms can leak into another."""
    import torch
    nn = torch.nn
    dev = torch.device(a.device)
    x = torch.ones(8, 8, device=dev)
    modules = list(root.modules()) if isinstance(root, nn.Module) else []
    uses = lambda *types: any(isinstance(m, types) for m in modules)  # noqa: E731
    if not modules or uses(nn.Linear, nn.MultiheadAttention, nn.modules.conv._ConvNd, nn.RNNBase):
        x @ x
    if torch.backends.cudnn.is_available() and uses(nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm):
        nn.functional.conv2d(x.view(1, 1, 8, 8), torch.ones(1, 1, 3, 3, device=dev))
    if "triton" in sys.modules:
        try:
            sys.modules["triton"].runtime.driver.active.get_current_device()
        except Exception:  # noqa: BLE001 - only a head start; the run starts Triton itself otherwise
            pass
    torch.cuda.synchronize(dev)


# Variables the device reads when it starts: a spare child that started it under other values cannot
# serve a request that asks for these.
DEVICE_ENV = ("CUDA_", "NVIDIA", "PYTORCH", "TORCH", "TRITON", "NCCL", "LD_", "CUBLAS", "CUDNN")


def device_env(env):
    return {k: v for k, v in env.items() if k.startswith(DEVICE_ENV)}


def preload(req, warm):
    """Loads the request's recorded boundary values in the server, so that every child inherits them
    instead of reading them again. Best effort: the child reports any problem itself."""
    try:
        a = parse_args(req["argv"])
        if getattr(a, "recording", None) and a.verb in ("run", "extract"):
            steps, _ = expand(warm.steps, warm.root, a.recording, warm.opaque)
            keep = set((a.keep or "").split(","))
            kept = [s for s in steps if s.name in keep] if a.keep else steps
            boundary_env(kept, warm.placeholders, warm.example, warm.attrs, a.recording, "cpu")
    except BaseException:  # noqa: BLE001 - the child will say what is wrong
        pass


def child(req, fds, warm, inherited):
    """In the forked child: become the client's process, run the request, never return."""
    code = 70
    try:
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.setpgid(0, int(req["pgid"]))
        except OSError:
            os.setpgid(0, 0)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import signal
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        code = main(req["argv"], warm=warm)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - whatever it was goes to the client's output
        traceback.print_exc()
        code = 1
    finally:
        timing("child exiting")
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def cuda_initialised():
    """Why this process can no longer fork children that use CUDA, or None: torch initialised it, or the
    driver was (a library that queried the device through it). Checked before every fork: a request can
    make the server import or trace code that touches the device."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised in the server (torch)"
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return None  # the driver library is not even loaded
    ctx = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 3:  # 3: CUDA_ERROR_NOT_INITIALIZED
        return "CUDA was initialised in the server (the driver)"
    return None


def serve(a):
    """The warm server: listens first (the driver waits for that line), then builds the model, then forks
    a child per request. Ends when its stdin closes (the driver is gone) or on SIGTERM."""
    import selectors
    import signal
    import socket
    try:
        os.unlink(a.socket)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(a.socket)
    srv.listen(128)
    say("harness: listening")
    # From here on stdout is the server's log, like stderr: the driver reads only the line above.
    os.dup2(2, 1)
    warm, why = None, None
    try:
        warm = prepare(a)
        hash_triton_kernels()
        if cuda_initialised():
            warm, why = None, "the model's factory initialised CUDA, which a forked child cannot use"
        elif not hasattr(os, "pidfd_open"):
            warm, why = None, "this Python has no os.pidfd_open"
    except BaseException as e:  # noqa: BLE001 - every request then runs cold and reports it itself
        why = f"building the model failed: {type(e).__name__}: {e}"
    say(f"harness: warm server {'ready' if warm else 'cold: ' + why}")
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, ("accept", None))
    sel.register(0, selectors.EVENT_READ, ("parent", None))
    jobs = {}  # pid -> (conn, pidfd)
    watching = set()  # children whose client connection is still watched for a hang-up
    # A spare: a child that started the device while the server waited, and now waits for one request
    # (pid, socket to it, pidfd). Starting CUDA is most of what a forked child pays before it runs.
    spare = None

    def open_fds():
        fds = [srv.fileno()] + [fd for c, p in jobs.values() for fd in (c.fileno(), p)]
        if spare:
            fds += [spare[1].fileno(), spare[2]]
        if hasattr(sel, "fileno"):
            fds.append(sel.fileno())
        return fds

    def start_spare():
        if warm is None or not str(a.device).startswith("cuda"):
            return None
        mine, theirs = socket.socketpair()
        closing = open_fds() + [mine.fileno()]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for fd in closing:
                try:
                    os.close(fd)
                except OSError:
                    pass
            try:
                warm_device(a, getattr(warm, "root", None))
                req, fds = recv_request(theirs, timeout=None)
            except BaseException:  # noqa: BLE001 - a spare that cannot start is simply not used
                os._exit(0)
            child(req, fds, warm, [theirs.fileno()])
        theirs.close()
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ, ("spare", pid))
        return (pid, mine, pidfd)

    def shutdown(*_):
        for pid in list(jobs) + ([spare[0]] if spare else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.unlink(a.socket)
        except OSError:
            pass
        os._exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    spare = start_spare()
    while True:
        for key, _ in sel.select():
            kind, data = key.data
            if kind == "parent":
                if not os.read(0, 4096):
                    shutdown()
            elif kind == "accept":
                conn, _ = srv.accept()
                try:
                    req, fds = recv_request(conn)
                except (OSError, ValueError) as e:
                    say(f"harness: bad request: {e}")
                    conn.close()
                    continue
                if warm is not None:
                    preload(req, warm)
                    touched = cuda_initialised() if str(a.device).startswith("cuda") else None
                    if touched:
                        # From now on every request runs cold, and says why.
                        warm, why = None, f"{touched}: a forked child could not use it"
                        say(f"harness: warm server cold from now on: {why}")
                if warm is None:
                    for fd in fds:
                        os.close(fd)
                    try:
                        conn.sendall(f"cold {why}\n".encode())
                    except OSError:
                        pass
                    conn.close()
                    continue
                pid = None
                if spare is not None and device_env(req["env"]) == device_env(os.environ):
                    # The spare takes it: it started the device under the same settings.
                    spid, mine, spfd = spare
                    spare = None
                    sel.unregister(spfd)
                    try:
                        send_request(mine, req, fds)
                        pid, pidfd = spid, spfd
                    except OSError:
                        os.kill(spid, signal.SIGKILL)
                        os.waitpid(spid, 0)
                        os.close(spfd)
                    mine.close()
                if pid is None:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    inherited = [0] + open_fds()
                    pid = os.fork()
                    if pid == 0:
                        child(req, fds, warm, inherited + [conn.fileno()])
                    pidfd = os.pidfd_open(pid)
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"forked {pid}\n".encode())
                except OSError:
                    pass  # the client is gone already; its hang-up is seen below
                jobs[pid] = (conn, pidfd)
                sel.register(pidfd, selectors.EVENT_READ, ("child", pid))
                sel.register(conn, selectors.EVENT_READ, ("client", pid))
                watching.add(pid)
                if spare is None:
                    spare = start_spare()
            elif kind == "spare":
                # The spare ended before it was used (it could not start the device): requests fork as
                # before until the next one starts. (An event of a spare handed a request earlier in this
                # batch is stale: that process is a job now.)
                if spare is None or spare[0] != data:
                    continue
                spid, mine, spfd = spare
                spare = None
                sel.unregister(spfd)
                os.waitpid(spid, 0)
                os.close(spfd)
                mine.close()
            elif kind == "child":
                pid = data
                conn, pidfd = jobs.pop(pid)
                _, status = os.waitpid(pid, 0)
                sel.unregister(pidfd)
                os.close(pidfd)
                if pid in watching:
                    watching.discard(pid)
                    sel.unregister(conn)
                if os.WIFSIGNALED(status):
                    answer = f"signal {os.WTERMSIG(status)}\n"
                else:
                    answer = f"exit {os.WEXITSTATUS(status)}\n"
                try:
                    conn.sendall(answer.encode())
                except OSError:
                    pass  # the client was killed (a timeout): nobody is waiting
                conn.close()
            elif kind == "client":
                # The client hung up before its child ended (killed by a timeout or Ctrl-C): the child
                # goes too, whether or not it could join the client's process group.
                pid = data
                if pid not in watching:
                    continue  # its child ended in this same batch of events: already answered
                watching.discard(pid)
                sel.unregister(jobs[pid][0])
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


if __name__ == "__main__":
    sys.exit(main())
