"""The graph: FX nodes, and modules FX cannot trace kept whole."""

import os
import sys
from .protocol import PROTOCOL_VERSION


class Step:
    """One unit the shrinker can keep or cut."""

    def __init__(self, name, op, kernel, args, kwargs, target, kind, via=None):
        self.name = name  # node id
        self.op = op  # what it is, for humans
        self.kernel = kernel  # a short name for the marker
        self.args = args  # with Ref(...) where a value comes from another step or an input
        self.kwargs = kwargs
        self.target = target  # module path, function, or method name
        self.kind = kind  # call_module | call_function | call_method | call_recorded
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


def readable_path(path):
    """A source file as a maintainer reads it: relative to the project (the working directory) when it is
    the project's, from the package's own name when it is an installed library's, never a path of this
    machine's checkout or environment."""
    full = os.path.abspath(path)
    root = os.path.abspath(os.getcwd()) + os.sep
    if full.startswith(root):
        return os.path.relpath(full)
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in full:
            return full.split(marker, 1)[1]
    return os.path.basename(full)


def short_name(target):
    if isinstance(target, str):
        return target.split(".")[-1]
    return getattr(target, "__name__", type(target).__name__)


def build_graph(model, example):
    """(steps, placeholders, get_attrs, traced_by) for `model` called on `example` (a tuple)."""
    import torch
    import torch.fx

    with no_cuda_initialisation():
        opaque = untraceable_modules(model)
        try:
            gm = torch.fx.GraphModule(model, LeafTracer(opaque).trace(model))
        except Exception as e:  # noqa: BLE001 - any tracing failure means: keep the model whole
            print(
                f"harness: torch.fx could not trace the model ({type(e).__name__}: {e}); "
                "keeping it whole: the recorded run descends into it through hooks",
                file=sys.stderr,
                flush=True,
            )
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
            with guarded_autograd_functions(), guarded_triton_launches():
                return super().trace(root, concrete_args)

    return Tracer


class AutogradFunctionCall(Exception):
    """FX met a torch.autograd.Function: tracing through its forward would lose its own backward."""


def wrap_function_apply(around):
    """Replaces `torch.autograd.Function.apply` for every Function with `around(cls, apply, *args,
    **kwargs)`, where `apply(*args, **kwargs)` is the real one bound to `cls` (torch defines it in Python
    in some versions and in C in others); returns the undo."""
    import torch

    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        return around(cls, original.__get__(None, cls), *args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)

    def undo():
        torch.autograd.Function.apply = original

    return undo


class DeviceUse(Exception):
    """FX met code that would start the device (a Triton launch, a CUDA tensor made or queried)."""


# Triton's launchers: `kernel[grid](...)` and `kernel.run(...)` of a plain, autotuned or heuristic kernel.
TRITON_LAUNCHERS = (
    ("triton.runtime.jit", "JITFunction"),
    ("triton.runtime.autotuner", "Autotuner"),
    ("triton.runtime.autotuner", "Heuristics"),
)


def _raising(what):
    def raise_instead(*args, **kwargs):
        raise DeviceUse(f"{what} while tracing")

    return raise_instead


def guarded_triton_launches():
    """While tracing: a Triton kernel launched from a forward stops the trace before Triton is entered (it
    asks for the device first), so the module that launches it is kept whole. Whatever the process's CUDA
    state, so every process traces a module the same way."""
    import contextlib
    import importlib

    @contextlib.contextmanager
    def guard():
        undo = []
        if "triton" in sys.modules:  # never imported for this: a model without Triton pays nothing
            for module, name in TRITON_LAUNCHERS:
                try:
                    cls = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError):
                    continue
                original = cls.__dict__.get("run")
                if original is not None:
                    cls.run = _raising(f"a Triton kernel ({name}) launched")
                    undo.append((cls, original))
        try:
            yield
        finally:
            for cls, original in undo:
                cls.run = original

    return guard()


def no_cuda_initialisation():
    """While the model's graph is built (in a warm server, or in a cold call before it starts the device):
    anything that would initialise CUDA through torch raises instead (a CUDA tensor made from constants, a
    device query; torch initialises CUDA through `torch.cuda._lazy_init`, from Python and C++ alike), so
    the trace fails and the module is kept whole. Initialising CUDA in a warm server would make every call
    run cold. Both places build the graph before CUDA starts, so both keep the same modules whole."""
    import contextlib

    @contextlib.contextmanager
    def guard():
        cuda = sys.modules.get("torch.cuda")
        original = None
        if cuda is not None and not cuda.is_initialized():
            original = cuda._lazy_init
            cuda._lazy_init = _raising("CUDA initialised")
        try:
            yield
        finally:
            if original is not None:
                cuda._lazy_init = original

    return guard()


def guarded_autograd_functions():
    """While tracing: a `torch.autograd.Function` applied to traced values stops the trace, so the module
    that applies it is kept whole and its own backward (a kernel library's backward kernel) still runs."""
    import contextlib

    import torch.fx
    from torch.utils._pytree import tree_leaves

    def stop_at_proxies(cls, apply, *args, **kwargs):
        if any(isinstance(x, torch.fx.Proxy) for x in tree_leaves((args, kwargs))):
            raise AutogradFunctionCall(f"{cls.__name__} is a torch.autograd.Function")
        return apply(*args, **kwargs)

    @contextlib.contextmanager
    def guard():
        undo = wrap_function_apply(stop_at_proxies)
        try:
            yield
        finally:
            undo()

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
                path = readable_path(parts[0][5:].strip().strip(chr(34)))
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


def whole_call_graph(model, call):
    """The model as one node called as the user called it: (steps, placeholders, example). Positional
    inputs are `input_<i>`, keyword inputs keep their names."""
    args, kwargs = call
    names = [f"input_{i}" for i in range(len(args))]
    name = type(model).__name__
    step = Step(
        "model", name, name, tuple(Ref(n, None) for n in names), {k: Ref(k, None) for k in kwargs}, "", "call_module"
    )
    return [step], names + list(kwargs), tuple(args) + tuple(kwargs.values())


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
        n = {
            "id": s.name,
            "op": s.op,
            "kernel": s.kernel,
            "phase": phase_of(s),
            "inputs": tensors((s.args, s.kwargs)),
            "outputs": [{"name": s.name, "shape": None, "producer": s.name}],
        }
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


def phase_of(step):
    return {"loss": "loss", "backward": "backward", "optimizer": "optimizer"}.get(step.kind, "forward")
