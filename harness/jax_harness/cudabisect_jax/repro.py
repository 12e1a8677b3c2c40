"""extract: the standalone repro.py, its data and the kept steps serialized with jax.export."""

import ast
import json
import os
import re
from .graph import bind_params
from .keras import keras_backend
from .record import Recording
from .run import layer_kernel


class ExtractError(Exception):
    pass


def literal_source(v):
    """Python source for a literal operand: a plain scalar as itself, an array as `np.array(…)`."""
    import numpy as np

    if isinstance(v, (bool, int, float)) and not isinstance(v, np.generic):
        return repr(v)
    arr = np.asarray(v)
    return f"np.array({arr.tolist()!r}, dtype={str(arr.dtype)!r})"


def key_impl_of(dtype):
    """The PRNG implementation's name of a key dtype (`key<fry>` -> `threefry2x32`), else None."""
    import jax

    try:
        if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
            return dtype._impl.name  # internal, like the jaxpr API itself; checked by the tests
    except Exception:  # noqa: BLE001 - not a dtype JAX knows: a plain value
        pass
    return None


def export_step(s, prog, env_avals):
    """The step serialized with jax.export (custom calls without a compatibility promise, such as a
    Pallas kernel's, allowed): bytes, or None with why."""
    import jax
    from jax import export

    ins = [a for a in s.ins if a[0] == "var"]
    specs, key_impls = [], []
    for _, name in ins:
        shape, dtype = env_avals[name]
        impl = key_impl_of(dtype)
        key_impls.append(impl)
        if impl is not None:
            # A PRNG key goes in as its raw data and is wrapped inside: exported code takes plain arrays.
            data = jax.random.key_data(jax.random.key(0, impl=impl))
            specs.append(jax.ShapeDtypeStruct((*shape, *data.shape), data.dtype))
        else:
            specs.append(jax.ShapeDtypeStruct(shape, dtype))
    lits = [(i, a[1]) for i, a in enumerate(s.ins) if a[0] == "lit"]
    out_keys = [key_impl_of(env_avals[o][1]) if o in env_avals else None for o in s.outs]

    def f(*vals):
        vals = [jax.random.wrap_key_data(v, impl=k) if k else v for v, k in zip(vals, key_impls)]
        it = iter(vals)
        full = [None] * len(s.ins)
        for i, v in lits:
            full[i] = v
        for i in range(len(full)):
            if s.ins[i][0] == "var":
                full[i] = next(it)
        if s.eqn is not None:
            subfuns, params = bind_params(s.eqn)
            out = s.eqn.primitive.bind(*subfuns, *full, **params)
            outs = list(out) if s.eqn.primitive.multiple_results else [out]
        else:
            outs = s.call(*full)
        return [jax.random.key_data(o) if k else o for o, k in zip(outs, out_keys)]

    disabled = []
    for _ in range(2):
        try:
            exp = export.export(jax.jit(f), disabled_checks=disabled)(*specs)
            return bytes(exp.serialize()), None
        except Exception as e:  # noqa: BLE001 - the reason goes into the repro and the report
            text = str(e)
            if disabled or "whose targets have no compatibility guarantees" not in text:
                return None, text.strip().splitlines()[0] if text.strip() else type(e).__name__
            # A custom call without a compatibility promise (a Pallas kernel's compiled Triton or Mosaic
            # call): allowed, since the repro runs on the jax that wrote it. The targets are in the text.
            targets = set(re.findall(r'call_target_name = "([^"]+)"', text)) or {"ALL"}
            disabled = [export.DisabledSafetyCheck.custom_call(t) for t in sorted(targets)]
    return None, "the custom calls could not be allowed"


def callback_source(s):
    """`jax.pure_callback(module.fn, …)` for a host-callback step whose function is importable."""
    cb = s.eqn.params.get("callback") if s.eqn is not None else None
    fn = getattr(cb, "callback_func", None) or getattr(cb, "__wrapped__", None) or cb
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", "")
    if not mod or "<" in qual or mod == "__main__":
        return None
    return mod, qual


def kernel_text(loc):
    """The Python source of a Pallas kernel's function at `file:line`, for reading in repro.py."""
    if not loc:
        return None
    path, _, line = loc.rpartition(":")
    try:
        with open(path) as f:
            text = f.read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        inside = node.lineno <= int(line) <= (node.end_lineno or 0) if hasattr(node, "end_lineno") else False
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and inside:
            return ast.get_source_segment(text, node)
    return None


def step_line(s, outs, call, args):
    """The repro.py line that runs step `s` inside its markers and keeps its outputs."""
    return f"for k, o in zip([{outs}], step({s.name!r}, {s.op!r}, {s.kernel!r}, {s.launches!r}, {call}, {args})):"


REPRO_HEAD = '''#!/usr/bin/env python3
"""Minimal repro written by cudabisect: {title}

Runs the kept {what} one by one on the recorded values in repro_data.npz, synchronising after
each, with the marker line the harness printed around it: the last marker without an `end` is where the
fault is. Each step is the equation as JAX compiled it, serialized with jax.export (steps/*.jaxexport),
so this needs only jax (and jaxlib with the same platform). Run it with CUDA_LAUNCH_BLOCKING=1.
"""
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", {backend!r})  # a project layer this imports: the model's backend

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = np.load(os.path.join(HERE, "repro_data.npz"), allow_pickle=False)
with open(os.path.join(HERE, "repro_values.json")) as f:
    META = json.load(f)


def value(name):
    arr, meta = DATA[name], META.get(name, {{}})
    # A PRNG key stays its raw data here: the exported steps take and give keys that way.
    if "bits" in meta and "key_impl" not in meta:
        import ml_dtypes  # noqa: F401
        arr = arr.view(np.dtype(meta["dtype"]))
    return jax.numpy.asarray(arr)


def exported(name):
    with open(os.path.join(HERE, "steps", name + ".jaxexport"), "rb") as f:
        return export.deserialize(bytearray(f.read())).call


def step(node, op, kernel, launches, fn, *args):
    print(f"@@cudabisect node={{node}} op={{op}} kernel={{kernel}} begin", flush=True)
    if launches:
        print(f"@@cudabisect launch kernel={{launches}}", flush=True)
    out = fn(*args)
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    jax.block_until_ready(out)
    print(f"@@cudabisect node={{node}} op={{op}} kernel={{kernel}} end", flush=True)
    return out

'''


def extract(prog, keep, recording, out_dir, title):
    import numpy as np

    kept = [s for s in prog.steps if s.name in keep]
    if len(kept) != len(set(keep)):
        raise ExtractError("unknown nodes in --keep")
    src = Recording(recording)
    os.makedirs(os.path.join(out_dir, "steps"), exist_ok=True)
    made = {o for s in kept for o in s.outs if o}
    boundary = []
    for s in kept:
        for kind, name in s.ins:
            if kind == "var" and name not in made and name not in boundary:
                boundary.append(name)
    arrays, meta = {}, {}
    for name in boundary:
        file = os.path.join(recording, f"{name}.npy")
        if not os.path.exists(file):
            raise ExtractError(f"the recording has no value {name}")
        arrays[name] = np.load(file, allow_pickle=False)
        meta[name] = src.meta.get(name, {})
    avals = dict(prog.avals)
    # Every value the kept steps read, as the recorded run had it (a Keras tensor's batch dimension is
    # unknown before running).
    for name in {a[1] for st in kept for a in st.ins if a[0] == "var"}:
        if os.path.exists(os.path.join(recording, f"{name}.npy")):
            v = src.load(name)
            avals[name] = (tuple(v.shape), v.dtype)
    lines = []
    needs = set()
    kernels = []
    for s in kept:
        if s.layer is not None and s.launches is None:
            vals = [src.load(a[1]) if a[0] == "var" else a[1] for a in s.ins]
            s.launches = layer_kernel(s, vals) or None
        args = ", ".join(literal_source(a[1]) if a[0] == "lit" else f"v[{a[1]!r}]" for a in s.ins)
        var_args = ", ".join(f"v[{a[1]!r}]" for a in s.ins if a[0] == "var")
        outs = ", ".join(repr(o) for o in s.outs)
        if s.source:
            lines.append(f"# {s.name}: made at {s.source}")
        if s.kernel_source and all(k[0] != s.launches for k in kernels):
            kernels.append((s.launches, s.kernel_source, kernel_text(s.kernel_source)))
        data, why = export_step(s, prog, avals)
        if data is not None:
            with open(os.path.join(out_dir, "steps", s.name + ".jaxexport"), "wb") as f:
                f.write(data)
            call = f"exported({s.name!r})"
            lines.append(step_line(s, outs, call, var_args))
        elif s.layer is not None and prog.factory:
            # A layer JAX cannot serialize (it calls back into Python): rebuilt from the project's model
            # factory, with the recorded weights.
            mod, _, fn = prog.factory.partition(":")
            needs.add(mod)
            for k, w in enumerate(s.layer.get_weights()):
                arrays[f"{s.name}.w{k}"] = np.asarray(w)
            path = ".".join(f"get_layer({p!r})" for p in s.layer_path)
            lines.append(f"# {s.name}: the project's layer ({why}); its weights are the recorded ones")
            lines.append(f"layer = __import__('importlib').import_module({mod!r}).{fn}().{path}")
            lines.append(f"layer.set_weights([DATA[f'{s.name}.w{{k}}'] for k in range({len(s.layer.get_weights())})])")
            lines.append(step_line(s, outs, "lambda *a: [layer(*a)]", args))
        else:
            cb = callback_source(s) if s.op in ("pure_callback", "io_callback") else None
            if cb is None:
                raise ExtractError(f"node {s.name} ({s.op}) cannot be written standalone: {why}")
            mod, qual = cb
            needs.add(mod)
            shapes = ", ".join(f"jax.ShapeDtypeStruct({avals[o][0]!r}, {str(avals[o][1])!r})" for o in s.outs if o)
            call = (
                f"lambda *a: jax.pure_callback(__import__('importlib').import_module({mod!r}).{qual}, [{shapes}], *a)"
            )
            lines.append(f"# {s.name} calls back into the project ({mod}.{qual}): it is imported, not carried")
            lines.append(step_line(s, outs, call, args))
        lines.append("    v[k] = o")
    np.savez(os.path.join(out_dir, "repro_data.npz"), **arrays)
    with open(os.path.join(out_dir, "repro_values.json"), "w") as f:
        json.dump(meta, f)
    what = "layers" if prog.steps and prog.steps[0].eqn is None else "equations"
    backend = keras_backend() if prog.factory else "jax"
    text = REPRO_HEAD.format(title=title, what=what, backend=backend)
    if needs:
        note = (
            "# cudabisect-needs-project: " + " ".join(sorted(needs)) + "\n"
            "# NOT STANDALONE: it imports the project (a host callback, or a layer JAX cannot serialize).\n"
        )
        text = text.replace('"""\nimport json', '"""\n' + note + "import json", 1)
    for name, loc, body in kernels:
        text += f"# The Pallas kernel {name} ({loc}), as written; the steps below run it as compiled:\n"
        for ln in (body or "(source not found)").splitlines():
            text += f"#     {ln}\n"
        text += "\n"
    text += "v = {name: value(name) for name in DATA.files}\n"
    text += "\n".join(lines) + "\n"
    text += 'print("repro: finished without a fault", flush=True)\n'
    compile(text, "repro.py", "exec")
    with open(os.path.join(out_dir, "repro.py"), "w") as f:
        f.write(text)
    if not os.listdir(os.path.join(out_dir, "steps")):
        os.rmdir(os.path.join(out_dir, "steps"))
    return 0
