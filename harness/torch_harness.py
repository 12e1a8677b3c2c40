#!/usr/bin/env python3
"""cudabisect's PyTorch harness: speaks the harness protocol for an nn.Module.

    torch_harness.py --model pkg.mod:build --inputs pkg.mod:example_inputs [--device cuda] VERB ...

VERB is one of
    describe                                  the traced graph as JSON on stdout
    run [--record DIR]                        run every node, synchronising and printing a marker around
                                              each; save node outputs to DIR/<node>.pt
    run --keep A,B --inputs DIR               run only the kept nodes; values made by other nodes come
                                              from DIR/<node>.pt (recorded, never random)
    extract --keep A,B --inputs DIR --out DIR write a standalone repro.py (+ repro_data.pt) that needs
                                              nothing but torch (and triton, if a kept op uses it)

The model is traced with torch.fx; when tracing fails the chain of child modules is used instead, and the
harness says so. Nothing here needs a package index beyond the user's own torch. The code generation part
imports torch lazily, so it can be tested without torch.
"""

import argparse
import builtins
import importlib
import inspect
import json
import operator
import os
import sys
import textwrap
import traceback

PROTOCOL_VERSION = 2
MARKER = "@@cudabisect node={node} op={op} kernel={kernel} {phase}"


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


# ----------------------------------------------------------------------------------------------------
# The graph: FX nodes, or the chain of children when tracing fails.


class Step:
    """One unit the shrinker can keep or cut."""

    def __init__(self, name, op, kernel, args, kwargs, target, kind):
        self.name = name      # node id
        self.op = op          # what it is, for humans
        self.kernel = kernel  # a short name for the marker
        self.args = args      # with Ref(...) where a value comes from another step or an input
        self.kwargs = kwargs
        self.target = target  # module path, function, or method name
        self.kind = kind      # call_module | call_function | call_method


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

    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - any tracing failure means: use the child chain
        print(f"harness: torch.fx could not trace the model ({type(e).__name__}: {e}); "
              "falling back to the chain of child modules", file=sys.stderr, flush=True)
        return chain_graph(model)
    steps, placeholders, attrs = [], [], {}
    refs = {}

    def conv(a):
        if isinstance(a, torch.fx.Node):
            return refs[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        if isinstance(a, dict):
            return {k: conv(v) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(conv(a.start), conv(a.stop), conv(a.step))
        return a

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
            refs[node.name] = Ref(node.name, None)
        elif node.op == "output":
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
            refs[node.name] = Ref(node.name, node.name)
    return steps, placeholders, attrs, ("fx", gm)


def chain_graph(model):
    """Children called one after the other, each on the previous one's output."""
    steps = []
    prev = Ref("input_0", None)
    for name, child in model.named_children():
        node = name.replace(".", "_")
        steps.append(Step(node, type(child).__name__, type(child).__name__, (prev,), {}, name, "call_module"))
        prev = Ref(node, node)
    return steps, ["input_0"], {}, ("chain", model)


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


def describe(steps, placeholders):
    def tensors(args):
        return [{"name": r.name, "shape": [], "producer": r.producer} for r in refs_in(args)]

    return {
        "protocol": PROTOCOL_VERSION,
        "harness": "torch",
        "inputs": placeholders,
        "nodes": [
            {"id": s.name, "op": s.op, "kernel": s.kernel,
             "inputs": tensors((s.args, s.kwargs)),
             "outputs": [{"name": s.name, "shape": [], "producer": s.name}]}
            for s in steps
        ],
    }


# ----------------------------------------------------------------------------------------------------
# Running.


def resolve(a, env):
    if isinstance(a, Ref):
        return env[a.name]
    if isinstance(a, (list, tuple)):
        return type(a)(resolve(x, env) for x in a)
    if isinstance(a, dict):
        return {k: resolve(v, env) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(resolve(a.start, env), resolve(a.stop, env), resolve(a.step, env))
    return a


def call(step, root, env):
    args, kwargs = resolve(step.args, env), resolve(step.kwargs, env)
    if step.kind == "call_module":
        return root.get_submodule(step.target)(*args, **kwargs)
    if step.kind == "call_function":
        return step.target(*args, **kwargs)
    self_obj, *rest = args
    return getattr(self_obj, step.target)(*rest, **kwargs)


def to_device(v, device):
    import torch
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(to_device(x, device) for x in v)
    if isinstance(v, dict):
        return {k: to_device(x, device) for k, x in v.items()}
    return v


def needed_refs(steps):
    return {r.name for s in steps for r in refs_in((s.args, s.kwargs))}


def shape_of(v):
    """{"shape", "dtype"} of a tensor value, else None."""
    shape = getattr(v, "shape", None)
    dtype = getattr(v, "dtype", None)
    if shape is None or dtype is None:
        return None
    return {"shape": [int(d) for d in shape], "dtype": str(dtype).replace("torch.", "")}


def write_shapes(record, env):
    """The recording's `shapes.json`: what `describe` cannot know without running the model."""
    shapes = {k: sh for k, sh in ((k, shape_of(v)) for k, v in env.items()) if sh}
    with open(os.path.join(record, "shapes.json"), "w") as f:
        json.dump(shapes, f)


def run(steps, root, env, device, record=None):
    """Runs `steps` in order on `env`; returns 0 clean, 1 when a step raised."""
    import torch
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    for s in steps:
        say(MARKER.format(node=s.name, op=s.op.replace(" ", "_"), kernel=s.kernel, phase="begin"))
        try:
            env[s.name] = call(s, root, env)
            sync()
        except Exception:  # noqa: BLE001 - the failure is the finding; the classifier reads the text
            traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
            say(f"harness: node {s.name} failed")
            if record:
                write_shapes(record, env)
            return 1
        say(MARKER.format(node=s.name, op=s.op.replace(" ", "_"), kernel=s.kernel, phase="end"))
        if record:
            torch.save(to_device(env[s.name], "cpu"), os.path.join(record, f"{s.name}.pt"))
    if record:
        write_shapes(record, env)
    say(f"harness: ok: {len(steps)} nodes on {device}")
    return 0


def boundary_env(kept, placeholders, example, attrs, inputs_dir, device):
    """The values kept steps read but no kept step makes: inputs, attributes, recordings."""
    import torch
    made = {s.name for s in kept}
    env = {}
    for name in sorted(needed_refs(kept) - made):
        if name in placeholders:
            env[name] = example[placeholders.index(name)]
        elif name in attrs:
            env[name] = attrs[name]
        else:
            if not inputs_dir:
                raise SystemExit(f"error: value {name!r} is made by a node that is not kept: pass --inputs")
            path = os.path.join(inputs_dir, f"{name}.pt")
            if not os.path.exists(path):
                raise SystemExit(f"error: --inputs: no recording {path} for value {name!r}")
            env[name] = torch.load(path, weights_only=False)
    return {k: to_device(v, device) for k, v in env.items()}


# ----------------------------------------------------------------------------------------------------
# The standalone repro.


def literal(a, names):
    """Python source for an argument; Refs become env lookups."""
    if isinstance(a, Ref):
        return f"env[{a.name!r}]"
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


def function_ref(fn, user_sources):
    """How repro.py names a function: torch and the standard library by import path; the user's own code by
    the source copied into repro.py."""
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if fn in vars(builtins).values():
        return name, None
    if mod in ("_operator", "operator"):
        return f"operator.{fn.__name__}", "operator"
    if mod.startswith("torch") or mod == "math":
        top = mod.split(".")[0]
        return f"{mod}.{name}", mod if top != "torch" else "torch"
    user_sources.append(fn)
    return fn.__name__, None


def user_source(fns):
    """Source of the user's functions the kept steps call, and of the globals they use that are functions,
    classes or Triton kernels from the same file: enough to run without the user's package."""
    out, seen, imports = [], set(), set()
    queue = [(fn, None) for fn in fns]
    while queue:
        fn, alias = queue.pop(0)
        key = id(fn)
        if key in seen:
            continue
        seen.add(key)
        target = getattr(fn, "fn", fn)  # a triton JITFunction wraps the Python function
        src = getattr(fn, "src", None) if type(fn).__name__ == "JITFunction" else None
        try:
            code = inspect.getsource(target)
        except (OSError, TypeError):
            continue
        if type(fn).__name__ == "JITFunction":
            imports.update({"import triton", "import triton.language as tl"})
            code = textwrap.dedent(code)
            if not code.lstrip().startswith("@"):
                code = "@triton.jit\n" + code
        code = textwrap.dedent(code)
        if alias and alias != getattr(target, "__name__", alias):
            # The caller names it differently (`kernel = triton.jit(store_kernel)`): keep that name too.
            code += f"\n\n{alias} = {target.__name__}\n"
        out.append(code)
        globs = getattr(target, "__globals__", {})
        for name in getattr(getattr(target, "__code__", None), "co_names", ()):
            g = globs.get(name)
            if g is None:
                continue
            if inspect.ismodule(g):
                if g.__name__.split(".")[0] in ("torch", "triton", "math", "numpy"):
                    imports.add(f"import {g.__name__} as {name}" if g.__name__ != name else f"import {name}")
                continue
            if type(g).__name__ == "JITFunction" or inspect.isfunction(g) or inspect.isclass(g):
                if getattr(g, "__module__", "").split(".")[0] in ("torch", "triton", "builtins"):
                    continue
                queue.append((g, name))
        del src
    return sorted(imports), out


def render_repro(kept, boundary_names, module_names, attr_names, title, device="cuda"):
    """repro.py's text: markers and a synchronise around every node, like the harness, so the classifier
    reads it the same way."""
    user_fns, lines, imports = [], [], {"import os", "import sys", "import torch"}
    for s in kept:
        args = ", ".join([literal(a, None) for a in (s.args[1:] if s.kind == "call_method" else s.args)]
                         + [f"{k}={literal(v, None)}" for k, v in s.kwargs.items()])
        if s.kind == "call_module":
            expr = f"modules[{s.target!r}]({args})"
        elif s.kind == "call_method":
            expr = f"{literal(s.args[0], None)}.{s.target}({args})"
        else:
            ref, imp = function_ref(s.target, user_fns)
            if imp:
                imports.add(f"import {imp}")
            expr = f"{ref}({args})"
        begin = MARKER.format(node=s.name, op=s.op.replace(" ", "_"), kernel=s.kernel, phase="begin")
        end = MARKER.format(node=s.name, op=s.op.replace(" ", "_"), kernel=s.kernel, phase="end")
        lines.append(f"    print({begin!r}, flush=True)\n"
                     f"    env[{s.name!r}] = {expr}\n"
                     f"    sync()\n"
                     f"    print({end!r}, flush=True)")
    extra_imports, sources = user_source(user_fns)
    imports.update(extra_imports)
    head = textwrap.dedent(f'''\
        #!/usr/bin/env python3
        """{title}

        Generated by cudabisect. Needs only torch{" and triton" if any("triton" in i for i in imports) else ""}.
        Run: CUDA_LAUNCH_BLOCKING=1 python repro.py   (exit status 1 and the CUDA error mean it reproduced)
        The tensors in repro_data.pt are the exact values the full model produced, not random stand-ins.
        """
        ''')
    body = "\n".join(sorted(imports)) + "\n\n"
    if sources:
        body += "# --- the model's own code that the kept nodes call, copied from its source ---\n\n"
        body += "\n\n".join(sources) + "\n\n"
    body += textwrap.dedent(f'''\
        DEVICE = os.environ.get("REPRO_DEVICE", {device!r})
        HERE = os.path.dirname(os.path.abspath(__file__))


        def to_device(v):
            if isinstance(v, torch.Tensor):
                return v.to(DEVICE)
            if isinstance(v, (list, tuple)):
                return type(v)(to_device(x) for x in v)
            if isinstance(v, dict):
                return {{k: to_device(x) for k, x in v.items()}}
            return v


        def sync():
            if DEVICE.startswith("cuda"):
                torch.cuda.synchronize()


        def main():
            data = torch.load(os.path.join(HERE, "repro_data.pt"), weights_only=False)
            # Inputs of the kept nodes that cut nodes made: {sorted(boundary_names)}
            env = to_device(data["values"])
            # Modules the kept nodes call (torch.nn modules with their exact parameters): {sorted(module_names)}
            modules = {{k: m.to(DEVICE) for k, m in data["modules"].items()}}
        ''')
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
    del attr_names
    return head + body


def extract(kept, root, env, out_dir, title, device):
    import torch
    os.makedirs(out_dir, exist_ok=True)
    modules = {}
    foreign = []
    for s in kept:
        if s.kind == "call_module":
            m = root.get_submodule(s.target).cpu()
            modules[s.target] = m
            if not type(m).__module__.startswith("torch."):
                foreign.append(f"{type(m).__module__}.{type(m).__name__}")
    if foreign:
        # Pickled by reference: loading them needs the user's package. Said in repro.py and on stderr.
        title += ("\n\nNOT STANDALONE: it unpickles the model's own module classes "
                  f"({', '.join(sorted(set(foreign)))}), so their package must be importable.")
        print(f"harness: repro.py needs the model's package for {', '.join(sorted(set(foreign)))}", file=sys.stderr)
    names = sorted(env)
    data = {"values": {k: to_device(env[k], "cpu") for k in names}, "modules": modules}
    torch.save(data, os.path.join(out_dir, "repro_data.pt"))
    text = render_repro(kept, names, list(modules), [], title, device)
    path = os.path.join(out_dir, "repro.py")
    with open(path, "w") as f:
        f.write(text)
    print(json.dumps({"repro": path, "nodes": [s.name for s in kept]}))


# ----------------------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(prog="torch_harness.py")
    p.add_argument("--model", required=True, help="module:factory returning the nn.Module")
    p.add_argument("--example-inputs", dest="example", required=True,
                   help="module:factory returning the model's example inputs")
    p.add_argument("--device", default="cuda")
    sub = p.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("describe")
    d.add_argument("--out", help="write the description here (the protocol's channel) instead of stdout")
    r = sub.add_parser("run")
    r.add_argument("--keep")
    r.add_argument("--recording", help="the recording boundary inputs come from")
    r.add_argument("--record")
    x = sub.add_parser("extract")
    x.add_argument("--keep", required=True)
    x.add_argument("--recording")
    x.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import torch
    torch.manual_seed(0)
    model = load_attr(a.model)()
    example = load_attr(a.example)()
    if not isinstance(example, (tuple, list)):
        example = (example,)
    model = model.to(a.device).eval()
    example = tuple(to_device(x, a.device) for x in example)
    steps, placeholders, attrs, (traced_by, root) = build_graph(model, example)
    root = root.to(a.device)
    if a.verb == "describe":
        text = json.dumps(describe(steps, placeholders), indent=1)
        if a.out:
            tmp = a.out + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, a.out)
        else:
            print(text)
        return 0
    keep = [k for k in (a.keep or "").split(",") if k] if a.verb in ("run", "extract") and a.keep else None
    if keep is not None:
        unknown = [k for k in keep if k not in {s.name for s in steps}]
        if unknown:
            raise SystemExit(f"error: --keep: no node {unknown[0]!r}")
        kept = [s for s in steps if s.name in keep]
    else:
        kept = steps
    say(f"harness: torch {torch.__version__}, {traced_by} graph, {len(kept)} of {len(steps)} nodes on {a.device}")
    with torch.no_grad():
        env = boundary_env(kept, placeholders, example, attrs, getattr(a, "recording", None), a.device)
        if a.verb == "extract":
            title = f"Minimal repro: {len(kept)} of {len(steps)} nodes of {a.model} ({', '.join(s.name for s in kept)})"
            extract(kept, root, env, a.out, title, a.device)
            return 0
        if a.record:
            os.makedirs(a.record, exist_ok=True)
        return run(kept, root, env, a.device, a.record)


if __name__ == "__main__":
    sys.exit(main())
