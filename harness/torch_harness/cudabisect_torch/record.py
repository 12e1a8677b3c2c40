"""Descent into the modules kept whole. The recording run puts forward hooks on every module inside them:
each call, at any depth, prints its own markers and records its actual inputs and output, whatever the
Python around it does. Inside a module FX can trace (a user module below one that it cannot), the module
runs through an FX interpreter that does the same for every op. The innermost open marker is the
faulting call; `expand` later replaces each call on the way to it by the calls it made, so the shrinker
sees the fault pinned to a single op or a leaf module, each level obtained by hooks or by fx."""

import collections
import inspect
import json
import os
import sys
from . import store
from .protocol import MARKER, say
from .graph import LeafTracer, Ref, Step, short_name, wrap_function_apply
from .node import needed_refs, shape_of, to_device
from .training import BACKWARD, GRADS_VALUE, TRAINING_KINDS, grad_name, training_steps


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
        # The backward of the calls: a gradient hook on each tensor a call made or got, so that the
        # backward of every call is marked like its forward (see `watch_backward`).
        self.inputs, self.watched, self.grads, self.bw_seq = {}, {}, {}, 0
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
        self.unpatch = self.watch_functions() if whole else None

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
        self.inputs[cid] = value
        self.save(f"{cid}__in", value)
        return cid

    def save(self, name, value):
        v = to_device(plain(value), "cpu")
        try:
            store.save(v, os.path.join(self.record, f"{name}.pt"))
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
        self.watch_backward(cid, op, kernel, out)
        if self.stack and self.stack[-1] == cid:
            self.stack.pop()

    def watch_backward(self, cid, op, kernel, out):
        """In a training run: marks the call's own backward. It begins when the gradient of the call's
        output arrives and ends when the gradients of its inputs are made, so the innermost backward
        still open when a backward faults is the call whose backward it was, at any depth, with no
        module backward hooks (which in-place ops downstream refuse). The gradient that reached the
        output is recorded, as `<call>__grad`, for that call's backward node alone."""
        import torch
        from torch.utils._pytree import tree_leaves

        inputs = self.inputs.pop(cid, None)
        if not torch.is_grad_enabled():
            return
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not any(t.requires_grad for t in outs):
            return
        mine = {id(t) for t in outs}
        for t in tree_leaves(inputs):
            if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in mine:
                self.watch(t)[2].append(cid)
        marker_op = f"backward_of_{op}".replace(" ", "_")
        for i, t in enumerate(outs):
            if t.requires_grad:
                self.watch(t)[1].append((cid, i, marker_op, kernel))

    def watch(self, t):
        """The hook's entry of tensor `t`: [t, calls whose output it is, calls whose input it is]."""
        entry = self.watched.get(id(t))
        if entry is None or entry[0] is not t:
            entry = [t, [], []]
            self.watched[id(t)] = entry
            from torch.utils.hooks import unserializable_hook

            # A recording saves tensors that carry this hook: it is not part of what they hold.
            t.register_hook(unserializable_hook(lambda g, e=entry: self.on_grad(e, g)))
        return entry

    def on_grad(self, entry, g):
        for cid in entry[2]:
            c = self.index[cid]
            if c.get("bw") == "begun":
                c["bw"] = "ended"
                say(MARKER.format(node=cid + BACKWARD, op=c["bw_op"], kernel=c["bw_kernel"], phase="end"))
        # Outer calls first: a module and the last call inside it share their output tensor, and the
        # innermost marker is the one a fault is charged to.
        for cid, i, op, kernel in reversed(entry[1]):
            self.grads.setdefault(cid, {})[i] = g.detach().cpu()
            c = self.index[cid]
            if "bw" not in c:
                self.bw_seq += 1
                c.update(bw="begun", bw_seq=self.bw_seq, bw_op=op, bw_kernel=kernel)
                say(MARKER.format(node=cid + BACKWARD, op=op, kernel=kernel, phase="begin"))
        return None

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

    def watch_functions(self):
        """Makes every `torch.autograd.Function` of the user's that a call kept whole applies a call of its
        own, like a submodule's: FX cannot trace through one (it would lose its backward), so without
        this a Function applied in a forward FX cannot trace was charged to the module around it. Only a
        class repro.py can name again (`module:qualname`, not a local one) is recorded. Returns the undo."""
        import torch

        recorder = self

        def record(cls, apply, *args, **kwargs):
            name = function_name(cls)
            compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)()
            if not recorder.stack or name is None or compiling:
                return apply(*args, **kwargs)
            op = cls.__name__
            cid = recorder.new_call(
                op, {"via": "call_function", "function": name, "target": "", "op": op, "kernel": op}, (args, kwargs)
            )
            recorder.begin(cid, op, op)
            out = apply(*args, **kwargs)
            recorder.end(cid, op, op, out)
            return out

        return wrap_function_apply(record)

    def interpret(self, module, path, opaque):
        """Runs `module` through FX, op by op, with markers and recordings (it can be traced). FX
        specialises a forward's `if x is None` on what it traced, so it is traced twice, before anything
        is patched: with every argument given, and with the arguments that default to None as the
        constant None (how callers such as transformers' models leave them). A call matching neither
        runs as it is, under the hooks."""
        import types

        import torch.fx

        try:
            signature = inspect.signature(module.forward)
        except (TypeError, ValueError):
            return
        optional = tuple(k for k, p in signature.parameters.items() if p.default is None)
        graphs = {}
        for nones in {(), optional}:
            try:
                graphs[nones] = torch.fx.GraphModule(module, traced(module, opaque, nones))
            except Exception:  # noqa: BLE001 - not traceable this way: hooks alone for these calls
                pass
        if not graphs:
            return
        original, recorder = module.forward, self

        class Interpreter(torch.fx.Interpreter):
            def __init__(self, gm, nones):
                super().__init__(gm)
                self.nones = nones

            def run_node(self, n):
                if n.op not in ("call_function", "call_method") or not recorder.stack:
                    return super().run_node(n)
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                op = short_name(n.target) if n.op == "call_function" else f"Tensor.{n.target}"
                kernel = short_name(n.target)
                entry = {
                    "via": n.op,
                    "target": path,
                    "fx": n.name,
                    "op": op,
                    "kernel": kernel,
                    "none_args": list(self.nones),
                }
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
            nones = tuple(k for k, v in bound.arguments.items() if v is None)
            gm = graphs.get(nones)
            if gm is None:
                return original(*args, **kwargs)
            return Interpreter(gm, nones).run(*bound.arguments.values())

        module.forward = types.MethodType(forward, module)

    def write(self):
        for h in self.handles:
            h.remove()
        if self.unpatch:
            self.unpatch()
            self.unpatch = None
        for cid, grads in self.grads.items():
            store.save(grads, os.path.join(self.record, f"{grad_name(cid)}.pt"))
        self.watched.clear()
        with open(os.path.join(self.record, HOOKS_FILE), "w") as f:
            json.dump({"whole": sorted(self.whole), "calls": self.calls}, f)


def function_name(cls):
    """`module:qualname` of a user's `torch.autograd.Function` class that can be found again by that name,
    else None (torch's own Functions, compiled graphs' generated ones, classes local to a function)."""
    mod, qual = getattr(cls, "__module__", "") or "", getattr(cls, "__qualname__", "")
    if mod.split(".")[0] == "torch" or "<" in qual or find_function(f"{mod}:{qual}") is not cls:
        return None
    return f"{mod}:{qual}"


def find_function(name):
    """The class a `module:qualname` names, among the modules loaded, or None."""
    mod, _, qual = name.partition(":")
    obj = sys.modules.get(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return obj


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


def traced(module, opaque, nones=()):
    """`module`'s FX graph with the arguments named in `nones` traced as the constant None."""
    return LeafTracer(opaque).trace(module, concrete_args={k: None for k in nones} or None)


def fx_target(root, path, node_name, opaque, cache, nones=()):
    """The function an FX node of the module at `path` calls, traced again as the recording run did."""
    key = (path, tuple(nones))
    if key not in cache:
        cache[key] = {n.name: n.target for n in traced(root.get_submodule(path), opaque, nones).nodes}
    return cache[key][node_name]


def recorded_step(c, root, opaque, cache):
    via = c["via"]
    if via == "call_function" and "function" in c:
        cls = find_function(c["function"])
        if cls is None:
            raise SystemExit(f"error: the torch.autograd.Function {c['function']} the recording applied is not loaded")
        target = cls.apply
    elif via == "call_function":
        target = fx_target(root, c["target"], c["fx"], opaque, cache, c.get("none_args", ()))
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


def descended(w, recording):
    """The graph a verb on `recording` works on: (steps, forward steps, levels). Descended along the
    recorded fault when the recording has one inside a node kept whole: a forward fault gives the forward
    calls alone (it needs no backward), a backward fault the training step over the finer forward calls,
    so the faulting call's own backward is a node."""
    if not recording:
        return w.steps, w.forward_steps, []
    forward, levels, backward = expand(w.forward_steps, w.root, recording, w.opaque)
    if not levels:
        return w.steps, w.forward_steps, []
    if backward and w.training is not None:
        return training_steps(forward, w.training), forward, levels
    return [s for s in forward if s.kind not in TRAINING_KINDS], forward, levels


def expand(steps, root, recording, opaque=frozenset()):
    """`steps` with each call on the way to the recorded fault replaced by the calls it made, level by
    level, down to the innermost one that was still running (in the forward pass, else in the
    backward); what each level was obtained by; and whether the way led to a backward. A recording
    without hooks (or a clean one) leaves the steps as they are."""
    path = os.path.join(recording, HOOKS_FILE)
    if not os.path.exists(path):
        return steps, [], False
    with open(path) as f:
        calls = json.load(f).get("calls", [])
    open_calls = [c for c in calls if not c.get("ended")]
    backward = False
    if not open_calls:
        begun = [c for c in calls if c.get("bw") == "begun"]
        if not begun:
            return steps, [], False
        open_calls, backward = [max(begun, key=lambda c: c["bw_seq"])], True
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
        how = "fx" if any("fx" in k for k in kids) else "hooks"
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
                st = Step(st.name, st.op, st.kernel, (Ref(prev, prev),), {}, st.target, st.via)
            out.append(st)
        return out

    out = []
    for s in steps:
        if s.name == way[0] and len(way) > 1:
            out.extend(level(s.name, 0))
        else:
            out.append(s)
    return out, levels, backward


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

    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key in RECORDED:
        return RECORDED[key]
    # On the CPU whatever was saved: a value inside a container torch's tree functions do not know (a
    # model's output object) may have been saved on the device, and loading it there would start CUDA in
    # a warm server, whose forked children could then not use it.
    try:
        value = store.load(path, weights_only=True)
    except pickle.UnpicklingError:
        value = store.load(path, weights_only=False)
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
