"""Training: the whole step as nodes. After the forward nodes come `loss` (the gradient of the model's
output: recorded from the user's own loss when the step was captured, else the given loss function's),
then one backward node per forward node, in reverse order, and last `optimizer_step` (the parameters'
update). Every forward node runs on inputs cut from the graph before it (detached leaves), so each
backward node is that node's own backward alone: `torch.autograd.grad` of its output, on the gradient
that the nodes after it passed back (live, or recorded when they are not kept), with a synchronise and
its own markers. A candidate that keeps a backward node without its forward runs that forward first, on
its recorded inputs: the candidate for a backward fault is the forward it differentiates plus its
backward on recorded gradients."""

import collections
import importlib
import importlib.util
import inspect
import os
from dataclasses import dataclass
from . import store
from .graph import Ref, Step, readable_path, refs_in
from .node import MissingValue, call, model_call, python_function, resolve, to_device


LOSS_NODE = "loss"
OPTIMIZER_NODE = "optimizer_step"
BACKWARD = "__backward"
GRADS_VALUE = "optimizer_step__grads"


@dataclass
class Training:
    """What the training step needs besides the forward graph."""

    output: object = None  # the model output's structure: Refs (what `loss` differentiates)
    out_grads: object = None  # the gradient of the output recorded in the user's own step (a list)
    loss_fn: object = None  # else: output -> scalar loss (default: the sum of every float output)
    optimizer: object = None  # a spec {"cls", "groups", "state"} or a factory model -> optimizer
    param_grads: object = None  # name -> the gradient the optimizer saw (captured; covers clipping)
    loss_call: object = None  # the user's own loss as captured: {"fn", "args", "kwargs"} (see run_loss_call)
    autocast: object = None  # the autocast the captured step ran under: {"device_type", "dtype"}


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
    loss_op = loss_name(training.loss_call)
    out.append(
        Step(
            LOSS_NODE, f"loss {loss_op}" if loss_op else "loss", loss_op or "loss", (training.output,), {}, None, "loss"
        )
    )
    for s in reversed(steps):
        producers = [c + BACKWARD for c in consumers[s.name]]
        if s.name in outputs:
            producers.append(LOSS_NODE)
        grad_producer = producers[0] if producers else None  # the earliest consumer's backward runs last
        grad = Ref(grad_name(s.name), grad_producer)
        out.append(
            Step(s.name + BACKWARD, f"backward of {s.op}", s.kernel, (s.args, s.kwargs, grad), {}, s.name, "backward")
        )
    if training.optimizer is not None:
        last = steps[0].name + BACKWARD if steps else None
        out.append(
            Step(
                OPTIMIZER_NODE,
                f"{optimizer_class_name(training.optimizer)}.step",
                "optimizer",
                (Ref(GRADS_VALUE, last),),
                {},
                None,
                "optimizer",
            )
        )
    return out


def loss_name(spec):
    """The user's own loss function's name, when the step's loss was captured."""
    if not spec:
        return None
    fn = spec["fn"]
    if "qualname" in fn:
        return fn["qualname"].rsplit(".", 1)[-1]
    owner = fn["object"]
    owner = owner.__name__ if isinstance(owner, type) else type(owner).__name__
    return f"{owner}.{fn['method']}"


def loss_callable(spec):
    """The captured loss's function: imported from its module, or the captured object's method."""
    fn = spec["fn"]
    if "qualname" in fn:
        target = importlib.import_module(fn["module"])
        for part in fn["qualname"].split("."):
            target = getattr(target, part)
        return target
    return getattr(fn["object"], fn["method"])


def optimizer_class_name(spec):
    if isinstance(spec, dict):
        return spec["cls"].rsplit(".", 1)[-1]
    return getattr(spec, "__name__", "optimizer")


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
        fn = python_function(fn)
        _, line = inspect.getsourcelines(fn)
        return f"{readable_path(inspect.getsourcefile(fn))}:{line}"
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


def run_loss_call(fn, args, kwargs, device):
    """The user's own loss, called on its captured inputs, then differentiated from the scalar it returns:
    the loss phase's own kernels, forward and backward. Its differentiable inputs are fresh leaves; the
    gradients that reached those taken from the model's output are returned as {output index: grad}."""
    import torch

    leaves, outputs = [], []

    def walk(x):
        if isinstance(x, dict) and x.get("__cudabisect__") in ("output", "leaf"):
            t = x["tensor"].to(device).detach().requires_grad_(True)
            leaves.append(t)
            if x["__cudabisect__"] == "output":
                outputs.append((x["index"], t))
            return t
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(walk(v) for v in x)
        return x.to(device) if isinstance(x, torch.Tensor) else x

    args, kwargs = walk(list(args)), walk(dict(kwargs))
    with torch.enable_grad():
        value = fn(*args, **kwargs)
        if not isinstance(value, torch.Tensor):
            value = getattr(value, "loss", None) if not isinstance(value, (tuple, list, dict)) else value
            found = [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]
            value = found[0] if found else None
        if value is None or not value.requires_grad or not leaves:
            return {}
        value = value.float().sum() if value.numel() != 1 else value.reshape(())
        got = torch.autograd.grad(value, leaves, allow_unused=True)
    by_leaf = {id(t): g for t, g in zip(leaves, got)}
    grads = {}
    for i, t in outputs:
        g = by_leaf.get(id(t))
        if g is not None:
            grads[i] = g if grads.get(i) is None else grads[i] + g
    return grads


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
    return [(name, i, g) for (name, i, _), g in zip(leaves, got)], list(got[len(leaves) :])


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
        spec.update(
            min=values.min().item(), max=values.max().item(), argmin=int(values.argmin()), argmax=int(values.argmax())
        )
    return spec


def regenerate(v, device):
    """`v` with every generated spec in it made a tensor again (seeded: the same values every time)."""
    import torch

    if isinstance(v, dict) and v.get("__generated__"):
        dtype, shape = getattr(torch, v["dtype"]), v["shape"]
        gen = torch.Generator(device=device).manual_seed(0)
        lo, hi = v.get("min", 0), v.get("max", 0)
        # One allocation of the recorded size, filled in place: no temporary of its size lands below or
        # above it (a fault that reads far outside a buffer depends on what is mapped there).
        t = torch.empty(shape, dtype=dtype, device=device)
        if dtype == torch.bool:
            t.random_(0, 2, generator=gen)
        elif dtype.is_floating_point:
            t.uniform_(lo, hi, generator=gen)
        elif hi < torch.iinfo(dtype).max:
            t.random_(lo, max(hi + 1, lo + 1), generator=gen)
        else:
            t.random_(lo, None, generator=gen)
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
        self.graphs = {}  # forward step -> (leaves [(ref name, index, leaf)], params [(name, p)], out)
        self.grads = {}  # value name -> {tensor index: grad}
        self.contributed = set()  # values that got a live contribution in this run
        self.param_grads = {}  # parameter name -> accumulated gradient

    def forward_step(self, step):
        with autocast(self.training.autocast, self.device):
            self.forward_step_as_is(step)

    def forward_step_as_is(self, step):
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

        cut_step = Step(
            step.name,
            step.op,
            step.kernel,
            map_aggregate(step.args, value),
            map_aggregate(step.kwargs, value),
            step.target,
            step.kind,
            step.via,
        )
        with torch.enable_grad():
            out = call(cut_step, self.root, {})
        params = []
        if step.module is not None:
            params = [
                (f"{step.module}.{n}" if step.module else n, p)
                for n, p in self.root.get_submodule(step.module).named_parameters()
                if p.requires_grad
            ]
        self.graphs[step.name] = (leaves, params, out)
        self.env[step.name] = out

    def give_grad(self, name, grads):
        add_grads(self.grads, name, grads)
        self.contributed.add(name)

    def loss(self, step):
        """The gradient of every model output: recorded from the user's loss, or from the loss function.
        A captured loss of the user's own runs first, forward and backward, on its captured inputs."""
        import torch

        live = None
        if self.training.loss_call is not None:
            spec = self.training.loss_call
            with autocast(self.training.autocast, self.device):
                live = model_call(run_loss_call, loss_callable(spec), spec["args"], spec["kwargs"], self.device)
        if self.training.out_grads is not None:
            grads = [to_device(g, self.device) for g in self.training.out_grads]
        elif live is not None:
            grads = [live.get(i) for i in range(max(live, default=-1) + 1)]
        else:
            leaves = []
            out = cut(resolve(self.training.output, self.env), "output", leaves)
            with torch.enable_grad():
                value = (
                    model_call(self.training.loss_fn, out)
                    if self.training.loss_fn
                    else sum(leaf.float().sum() for _, _, leaf in leaves)
                )
            got = torch.autograd.grad(value, [leaf for _, _, leaf in leaves], allow_unused=True) if leaves else ()
            by_index = {i: g for (_, i, _), g in zip(leaves, got)}
            grads = [by_index.get(i) for i in range(len(flat_tensors(out)))]
        # Each output value gets its share, in the order the outputs' tensors come.
        at = 0
        for r in refs_in(step.args):
            if r.name in self.env:
                n = len(flat_tensors(self.env[r.name]))
                self.give_grad(r.name, dict(enumerate(grads[at : at + n])))
                at += n

    def backward_step(self, step):
        """The backward of forward node `step.target`, on what the later nodes passed back (else the
        recording's, loaded with the boundary values)."""
        leaves, params, out = self.graphs[step.target]
        grads = (
            self.grads.get(step.target, {})
            if step.target in self.contributed
            else self.env.get(grad_name(step.target)) or {}
        )
        if self.record:
            store.save(
                {i: g.detach().cpu() for i, g in grads.items()},
                os.path.join(self.record, f"{grad_name(step.target)}.pt"),
            )
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
        params = dict(self.root.named_parameters())
        if self.training.param_grads is not None:
            grads = {k: to_device(v, self.device) for k, v in self.training.param_grads.items()}
        elif self.param_grads:
            grads = {k: v[0] for k, v in self.param_grads.items()}
        else:
            grads = self.env.get(GRADS_VALUE) or {}
        if self.record:
            store.save({k: v.detach().cpu() for k, v in grads.items()}, os.path.join(self.record, f"{GRADS_VALUE}.pt"))
        for name, p in params.items():
            g = grads.get(name)
            p.grad = None if g is None else g.detach().to(device=p.device, dtype=p.dtype)
        model_call(lambda: build_optimizer(self.training.optimizer, self.root).step())


def autocast(spec, device):
    """The autocast the captured step ran its forward and loss under ({"device_type", "dtype"}), on this
    run's device; no autocast when it had none."""
    import contextlib

    import torch

    if not spec:
        return contextlib.nullcontext()
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return torch.autocast(device_type=kind, dtype=getattr(torch, spec["dtype"]))


def step_is_inplace(step, root):
    if step.module is not None:
        try:
            return bool(getattr(root.get_submodule(step.module), "inplace", False))
        except AttributeError:
            return False
    name = step.target if isinstance(step.target, str) else getattr(step.target, "__name__", "")
    return bool(step.kwargs.get("inplace")) or (
        isinstance(name, str) and name.endswith("_") and not name.endswith("__")
    )


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
