#!/usr/bin/env python3
"""cudabisect's JAX and Keras harness: speaks the harness protocol for a JAX function or a Keras 3 model.

    jax_harness.py --function pkg.mod:train_step --example-inputs pkg.mod:example_inputs VERB ...
    jax_harness.py --model pkg.mod:build --example-inputs pkg.mod:example_inputs [--train] VERB ...

VERB is one of
    describe --out FILE                       the graph as JSON in FILE
    run [--record DIR]                        run every node, synchronising and printing a marker around
                                              each; save every value to DIR/<name>.npy
    run --keep A,B --recording DIR            run only the kept nodes; values made by other nodes come
                                              from DIR (recorded, never random)
    extract --keep A,B --recording DIR --out DIR
                                              write a standalone repro.py (+ repro_data.npz and the kept
                                              steps serialized with jax.export) that needs only jax

A JAX function is split into the equations of its jaxpr (`jax.make_jaxpr`). Calls that only wrap another
jaxpr (`jit`/`pjit`, `closed_call`, `custom_jvp_call`, `custom_vjp_call`, `remat`) are inlined, so the
equations of a jitted training step (forward, `value_and_grad`'s backward, an optax update) are the nodes;
`pallas_call`, `scan`, `while` and `cond` stay one node each (a Pallas node names its kernel). Each node is
evaluated on its own (`Primitive.bind`) and synchronised (`jax.block_until_ready`) inside its markers.

A Keras 3 model is split into its layers: a functional model through its operation graph (nested
functional models descended), a Sequential one as its chain of layers. With `--train` (or a model that
cannot be split, on the JAX backend) the model's training step is traced as a JAX function instead: the
compiled model's own stateless `train_step` (loss, gradients and the optimizer's update), or
`value_and_grad` of `--loss` (default: the sum of the outputs). A model that cannot be split on another
backend is kept whole, and the description says so.

When the full run shows no fault equation by equation, the function is run once more jitted, with
`--xla_dump_to`: a fault that shows only there (inside an XLA fusion) is reported on a
`@@cudabisect jit-only dump=DIR` line, with the XLA dump of the faulting executable in DIR.
"""

import argparse
import ast
import importlib
import json
import os
import re
import subprocess
import sys
import traceback

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


# ----------------------------------------------------------------------------------------------------
# The graph: one Step per node, values named by strings.


class Step:
    """One node the shrinker can keep or cut: `call(*inputs) -> list of outputs`."""

    def __init__(self, name, op, kernel, ins, outs, call, source=None, phase=None, launches=None,
                 eqn=None, kernel_source=None):
        self.name = name
        self.op = op
        self.kernel = kernel
        self.ins = ins          # ("var", name) or ("lit", value)
        self.outs = outs        # names (None for an output nothing reads)
        self.call = call
        self.source = source
        self.phase = phase
        self.launches = launches  # the kernel a Pallas node launches
        self.eqn = eqn            # the jaxpr equation, for extract
        self.kernel_source = kernel_source  # "file:line" of a Pallas kernel's Python function
        self.layer = None       # the Keras layer a layer node calls
        self.layer_path = ()    # its names from the model down (nested models)


class Program:
    def __init__(self):
        self.steps = []
        self.values = {}     # name -> value known before running (inputs, constants)
        self.avals = {}      # name -> (shape, dtype name)
        self.graph = ""
        self.jitted = None   # () -> outputs, the whole function jitted (for the jit-only check)
        self.factory = None  # the Keras model factory (pkg.mod:build)
        self.unrolled = 0    # scans unrolled into their iterations

    def inputs(self, values):
        """Names the program's input values `in0`, `in1`, … and returns their atoms."""
        atoms = []
        for i, v in enumerate(values):
            name = f"in{i}"
            self.values[name] = v
            self.avals[name] = aval_of(v)
            atoms.append(("var", name))
        return atoms


def aval_of(v):
    """(shape, dtype) of a value; the dtype as JAX has it (a PRNG key's included), or a type name."""
    shape = tuple(int(d) for d in getattr(v, "shape", ()))
    dtype = getattr(v, "dtype", None)
    return shape, (dtype if dtype is not None else type(v).__name__)


def user_source(eqn):
    """The user's line that made an equation, as file:line."""
    try:
        from jax._src import source_info_util as si
        for frame in si.user_frames(eqn.source_info.traceback):
            # The first frame of the user's own code: not this harness, not an installed package.
            if frame.file_name != os.path.abspath(__file__) and "-packages/" not in frame.file_name:
                return f"{frame.file_name}:{frame.start_line}"
    except Exception:  # noqa: BLE001 - internal API; a missing source costs only the label
        pass
    return None


def pallas_kernel(eqn):
    """(kernel name, "file:line" of its Python function) of a pallas_call equation."""
    info = getattr(eqn.params.get("jaxpr"), "debug_info", None)
    text = getattr(info, "func_src_info", None) or ""
    m = re.match(r"(\S+) at (.+):(\d+)$", text)
    if m:
        return m.group(1), f"{m.group(2)}:{m.group(3)}"
    named = eqn.params.get("name_and_src_info") or eqn.params.get("name")
    name = getattr(named, "name", named)
    return (str(name) if name else "pallas_kernel"), None


def bind_params(eqn):
    """The parameters `bind` takes (the API returned `(subfuns, params)` before 0.11, `params` since)."""
    r = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], dict):
        return list(r[0]), r[1]
    return [], r


def eqn_call(eqn):
    def call(*ins):
        subfuns, params = bind_params(eqn)
        out = eqn.primitive.bind(*subfuns, *ins, **params)
        return list(out) if eqn.primitive.multiple_results else [out]
    return call


# A scan is unrolled into its iterations' equations when it is this short and its unrolled body this
# small; a longer one stays one node (so does a while loop, whose trip count is known only by running).
UNROLL_LENGTH = 64
UNROLL_STEPS = 4096


def count_eqns(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
        inner = INLINED.get(eqn.primitive.name)
        sub = eqn.params.get(inner) if inner else None
        body = getattr(sub, "jaxpr", sub)
        n += count_eqns(body) if hasattr(body, "eqns") else 1
    return n


def synthetic(prog, op, ins, out_avals, fn, scope):
    """A step of the harness's own making (a scan's slice of its inputs, the stack of its outputs)."""
    index = len(prog.steps)
    outs = []
    for k, aval in enumerate(out_avals):
        name = f"v{index}_{k}"
        prog.avals[name] = aval
        outs.append(name)

    def call(*vals):
        out = fn(*vals)
        return list(out) if isinstance(out, (list, tuple)) else [out]
    prog.steps.append(Step(name=f"e{index:03d}_{scope}{op}", op=op, kernel=op, ins=ins, outs=outs, call=call))
    return [("var", n) for n in outs]


def atom_aval(prog, atom):
    kind, v = atom
    return prog.avals[v] if kind == "var" else aval_of(v)


def unroll_scan(prog, eqn, ins, scope, phase):
    """The scan's iterations as steps: each iteration's slice of the scanned inputs, its body's
    equations, and at the end the stacked outputs. Returns the atoms of the scan's outputs."""
    import jax.numpy as jnp
    p = eqn.params
    body, nc, ncarry, length = p["jaxpr"], p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]
    order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
    ys_parts = {}
    for i in order:
        it = f"{scope}s{i}."
        x_i = []
        for x in xs:
            shape, dtype = atom_aval(prog, x)
            x_i += synthetic(prog, "index", [x], [(shape[1:], dtype)], lambda v, i=i: v[i], it)
        outs = flatten_jaxpr(prog, body.jaxpr, body.consts, consts + carry + x_i, it, phase)
        carry = outs[:ncarry]
        ys_parts[i] = outs[ncarry:]
    ys = []
    n_ys = len(eqn.outvars) - ncarry
    for k in range(n_ys):
        parts = [ys_parts[i][k] for i in range(length)]
        shape, dtype = atom_aval(prog, parts[0])
        ys += synthetic(prog, "stack", parts, [((length, *shape), dtype)],
                        lambda *v: jnp.stack(v), scope)
    return carry + ys


def flatten_jaxpr(prog, jaxpr, consts, in_names, scope, phase=None):
    """Appends the equations of `jaxpr` (inlining calls that only wrap another jaxpr, unrolling short
    scans) to `prog.steps`; returns the atoms of its outputs. `scope` prefixes the names of the steps
    (a scan's iteration: `s3.`)."""
    from jax.extend.core import Literal
    env = {}
    for var, c in zip(jaxpr.constvars, consts):
        name = f"c{len(prog.values)}"
        prog.values[name] = c
        prog.avals[name] = aval_of(c)
        env[var] = ("var", name)
    for var, atom in zip(jaxpr.invars, in_names):
        env[var] = atom

    def read(a):
        if isinstance(a, Literal):
            return ("lit", a.val)
        return env[a]

    for eqn in jaxpr.eqns:
        ins = [read(a) for a in eqn.invars]
        prim = eqn.primitive.name
        inner = INLINED.get(prim)
        sub = eqn.params.get(inner) if inner else None
        if sub is not None and hasattr(getattr(sub, "jaxpr", sub), "eqns"):
            closed = hasattr(sub, "consts")
            body = sub.jaxpr if closed else sub
            outs = flatten_jaxpr(prog, body, sub.consts if closed else [], ins, scope, phase)
            for var, atom in zip(eqn.outvars, outs):
                env[var] = atom
            continue
        if (prim == "scan" and eqn.params["length"] <= UNROLL_LENGTH
                and eqn.params["length"] * count_eqns(eqn.params["jaxpr"].jaxpr) <= UNROLL_STEPS):
            prog.unrolled += 1
            outs = unroll_scan(prog, eqn, ins, scope, phase)
            for var, atom in zip(eqn.outvars, outs):
                if type(var).__name__ != "DropVar":
                    env[var] = atom
            continue
        index = len(prog.steps)
        out_names = []
        for var in eqn.outvars:
            if type(var).__name__ == "DropVar":
                out_names.append(None)
                continue
            name = f"v{index}_{len(out_names)}"
            env[var] = ("var", name)
            prog.avals[name] = (tuple(int(d) for d in var.aval.shape), var.aval.dtype)
            out_names.append(name)
        kernel, launches, ksrc = prim, None, None
        if prim == "pallas_call":
            launches, ksrc = pallas_kernel(eqn)
            kernel = launches
        prog.steps.append(Step(
            name=f"e{index:03d}_{scope}{prim}", op=prim, kernel=kernel, ins=ins, outs=out_names,
            call=eqn_call(eqn), source=user_source(eqn), phase=phase, launches=launches, eqn=eqn,
            kernel_source=ksrc))
    return [read(v) for v in jaxpr.outvars]


def jax_program(fn, args, graph):
    import jax
    leaves, tree = jax.tree_util.tree_flatten(args)
    # Arrays are the function's inputs; anything else (a config object, a Python flag) is closed over,
    # as a static argument of a jitted function would be.
    dynamic = [i for i, leaf in enumerate(leaves) if hasattr(leaf, "shape") and hasattr(leaf, "dtype")]
    flat = [leaves[i] for i in dynamic]

    def flat_fn(*vals):
        full = list(leaves)
        for i, v in zip(dynamic, vals):
            full[i] = v
        return fn(*jax.tree_util.tree_unflatten(tree, full))

    closed = jax.make_jaxpr(flat_fn)(*flat)
    prog = Program()
    flatten_jaxpr(prog, closed.jaxpr, closed.consts, prog.inputs(flat), "")
    prog.graph = graph + f": {len(prog.steps)} equations of its jaxpr, calls inlined"
    if prog.unrolled:
        prog.graph += f", {prog.unrolled} scan(s) unrolled into their iterations"
    kept_whole = sorted({s.op for s in prog.steps if s.op in ("scan", "while", "cond")})
    if kept_whole:
        prog.graph += f"; kept whole: {', '.join(kept_whole)}"
    jitted = jax.jit(flat_fn)
    prog.jitted = lambda: jitted(*flat)
    return prog


# ----------------------------------------------------------------------------------------------------
# Keras 3 models.


def keras_backend():
    import keras
    return keras.backend.backend()


def is_functional(model):
    from keras.src.models.functional import Functional
    return isinstance(model, Functional)


def sync(values):
    """Waits for the values to be computed, so a device fault shows inside the node that caused it."""
    import jax
    for v in values:
        if isinstance(v, jax.Array):
            jax.block_until_ready(v)
        elif v is not None and hasattr(v, "shape"):
            import keras  # another Keras backend's tensor: reading it back waits for it
            keras.ops.convert_to_numpy(v)


def layer_call(op, node, in_ids):
    from keras import tree

    def call(*ins):
        tensors = dict(zip(in_ids, ins))
        args, kwargs = node.arguments.fill_in(tensors)
        return tree.flatten(op(*args, **kwargs))
    return call


def flatten_functional(prog, model, in_atoms, prefix, counter, path=()):
    """Appends `model`'s layers (nested functional models descended) to `prog.steps`; returns the atoms
    of its outputs. `in_atoms`: the atoms of its inputs, in `tree.flatten(model.inputs)` order."""
    from keras import tree
    # The inputs as the model takes them (a dict of named inputs, a list), flattened as Keras does.
    names = {id(t): a for t, a in zip(tree.flatten(getattr(model, "_inputs_struct", model.inputs)), in_atoms)}
    depths = sorted(model._nodes_by_depth.keys(), reverse=True)
    for depth in depths:
        for node in model._nodes_by_depth[depth]:
            op = node.operation
            if type(op).__name__ == "InputLayer":
                continue
            ins = [names[id(t)] for t in node.input_tensors]
            in_ids = [id(t) for t in node.input_tensors]
            outs = tree.flatten(node.outputs)
            if is_functional(op):
                inner = flatten_functional(prog, op, ins, f"{prefix}{op.name}.", counter, (*path, op.name))
                for t, a in zip(outs, inner):
                    names[id(t)] = a
                continue
            index = counter[0]
            counter[0] += 1
            out_names = []
            for k, t in enumerate(outs):
                name = f"t{index}_{k}"
                names[id(t)] = ("var", name)
                prog.avals[name] = (tuple(int(d) if d is not None else 0 for d in t.shape), str(t.dtype))
                out_names.append(name)
            prog.steps.append(Step(
                name=f"l{index:02d}_{prefix}{op.name}".replace("/", "_"), op=type(op).__name__,
                kernel=type(op).__name__, ins=ins, outs=out_names, call=layer_call(op, node, in_ids)))
            prog.steps[-1].layer = op
            prog.steps[-1].layer_path = (*path, op.name)
    return [names[id(t)] for t in tree.flatten(model.outputs)]


def keras_chain(prog, model, in_atoms):
    """A Sequential model: its layers, each on the previous one's output."""
    atoms = list(in_atoms)
    for index, layer in enumerate(model.layers):
        name = f"t{index}_0"
        prog.avals[name] = ((), "")

        def call(*ins, layer=layer):
            return [layer(*ins)]
        prog.steps.append(Step(name=f"l{index:02d}_{layer.name}", op=type(layer).__name__,
                               kernel=type(layer).__name__, ins=atoms, outs=[name], call=call))
        prog.steps[-1].layer = layer
        prog.steps[-1].layer_path = (layer.name,)
        atoms = [("var", name)]
    return atoms


def keras_train_function(model, loss_spec):
    """The model's training step as a pure function of its state and a batch (JAX backend)."""
    import jax
    import keras
    if loss_spec is None and getattr(model, "optimizer", None) is not None and hasattr(model, "train_step"):
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables],
            [v.value for v in model.metrics_variables],
        )

        def step(state, data):
            logs, new_state = model.train_step(state, data)
            return logs, new_state
        return step, state, "the compiled model's stateless train_step (loss, gradients, update)"
    loss = load_attr(loss_spec) if loss_spec else None
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def step(state, data):
        tv, ntv = state
        x = data[0] if isinstance(data, (tuple, list)) else data

        def objective(tv):
            out, _ = model.stateless_call(tv, ntv, x, training=True)
            if loss is not None:
                return loss(out)
            return sum(keras.ops.sum(o) for o in jax.tree_util.tree_leaves(out))
        return jax.value_and_grad(objective)(tv)
    why = f"value_and_grad of {loss_spec}" if loss_spec else "value_and_grad of the outputs' sum"
    return step, (trainable, non_trainable), why


def keras_program(a):
    import keras
    model = load_attr(a.model)()
    data = load_attr(a.example_inputs)()
    backend = keras_backend()
    split = is_functional(model) or isinstance(model, keras.Sequential)
    if a.train or not split:
        if backend != "jax":
            return keras_whole(model, data, f"kept whole: a {'training step' if a.train else 'subclassed model'} "
                                            f"is split only on the JAX backend (this is {backend})")
        if a.train:
            step, state, why = keras_train_function(model, a.loss)
            return jax_program(step, (state, data), f"keras {type(model).__name__}, training step: {why}")
        x = as_args(data)
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def forward(tv, ntv, *x):
            return model.stateless_call(tv, ntv, *x)[0]
        return jax_program(forward, (tv, ntv, *x),
                           f"keras {type(model).__name__} (subclassed: no layer graph), its stateless call")
    prog = Program()
    x = as_args(data)
    atoms = prog.inputs(keras.tree.flatten(x))
    if is_functional(model):
        flatten_functional(prog, model, atoms, "", [0])
        how = "its operation graph, nested models descended"
    else:
        keras_chain(prog, model, atoms)
        how = "its chain of layers"
    prog.factory = a.model
    prog.graph = f"keras {type(model).__name__} on {backend}: {len(prog.steps)} layers from {how}"
    if backend == "jax":
        import jax
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        jitted = jax.jit(lambda tv, ntv, *x: model.stateless_call(tv, ntv, *x)[0])
        prog.jitted = lambda: jitted(tv, ntv, *x)
    return prog


def keras_whole(model, data, why):
    prog = Program()
    x = as_args(data)
    atoms = prog.inputs(x)
    prog.avals["t0_0"] = ((), "")

    def call(*ins):
        return [model(*ins)]
    prog.steps.append(Step(name=f"l00_{model.name}", op=type(model).__name__, kernel=type(model).__name__,
                           ins=atoms, outs=["t0_0"], call=call))
    prog.graph = why
    return prog


def build_program(a):
    if a.model:
        return keras_program(a)
    fn = load_attr(a.function)
    args = as_args(load_attr(a.example_inputs)())
    return jax_program(fn, args, f"jax function {a.function}")


# ----------------------------------------------------------------------------------------------------
# Recording: one .npy per value, with its dtype in values.json (bfloat16 and PRNG keys as raw bits).


def to_numpy(v):
    import numpy as np
    try:
        import jax
        if isinstance(v, jax.Array) and jax.dtypes.issubdtype(v.dtype, jax.dtypes.extended):
            return np.asarray(jax.random.key_data(v)), {"key_impl": str(jax.random.key_impl(v))}
    except Exception:  # noqa: BLE001 - not a JAX value
        pass
    try:
        import keras
        arr = keras.ops.convert_to_numpy(v)
    except Exception:  # noqa: BLE001 - keras absent: a JAX or numpy value
        arr = np.asarray(v)
    meta = {"dtype": str(arr.dtype)}
    if arr.dtype.kind == "V" or arr.dtype.name not in np.sctypeDict:
        meta["bits"] = f"uint{arr.dtype.itemsize * 8}"
        arr = arr.view(meta["bits"])
    return arr, meta


def from_numpy(arr, meta):
    import jax
    import jax.numpy as jnp
    if "key_impl" in meta:
        return jax.random.wrap_key_data(arr, impl=meta["key_impl"])
    if "bits" in meta:
        import ml_dtypes  # noqa: F401 - registers bfloat16 and friends with numpy
        arr = arr.view(jnp.dtype(meta["dtype"]))
    return jnp.asarray(arr)


class Recording:
    def __init__(self, path):
        self.path = path
        self.meta = {}
        meta_file = os.path.join(path, "values.json")
        if os.path.exists(meta_file):
            with open(meta_file) as f:
                self.meta = json.load(f)

    def save(self, name, value):
        """Saves a value; one numpy cannot hold as itself (bfloat16, a PRNG key) is written to
        values.json at once, so a run that dies right after still leaves it readable."""
        import numpy as np
        arr, meta = to_numpy(value)
        np.save(os.path.join(self.path, f"{name}.npy"), arr, allow_pickle=False)
        if set(meta) != {"dtype"}:
            self.meta[name] = meta
            self.flush()

    def load(self, name):
        import numpy as np
        file = os.path.join(self.path, f"{name}.npy")
        if not os.path.exists(file):
            raise MissingValue(name)
        return from_numpy(np.load(file, allow_pickle=False), self.meta.get(name, {}))

    def flush(self):
        with open(os.path.join(self.path, "values.json"), "w") as f:
            json.dump(self.meta, f)


class MissingValue(Exception):
    pass


# ----------------------------------------------------------------------------------------------------
# describe / run


def describe(prog, out):
    producer = {}
    for s in prog.steps:
        for o in s.outs:
            if o:
                producer[o] = s.name

    def tensor(name):
        shape, dtype = prog.avals.get(name, ((), ""))
        known = dtype is not None and str(dtype) != ""
        return {"name": name, "shape": list(shape) if known else None, "dtype": str(dtype) if known else None,
                "producer": producer.get(name)}
    nodes = []
    for s in prog.steps:
        node = {"id": s.name, "op": s.op, "kernel": s.launches or s.kernel,
                "inputs": [tensor(a[1]) for a in s.ins if a[0] == "var"],
                "outputs": [tensor(o) for o in s.outs if o]}
        if s.source:
            node["source"] = s.source
        if s.phase:
            node["phase"] = s.phase
        nodes.append(node)
    with open(out, "w") as f:
        json.dump({"protocol": PROTOCOL_VERSION, "harness": "jax", "graph": prog.graph, "nodes": nodes}, f)
    return 0


def pallas_kernels(jaxpr, found):
    """The Pallas kernels a jaxpr launches, nested jaxprs (jit, cond branches, scan bodies) included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.add(pallas_kernel(eqn))
            continue
        for v in eqn.params.values():
            for sub in v if isinstance(v, (list, tuple)) else (v,):
                body = getattr(sub, "jaxpr", sub)
                if hasattr(body, "eqns"):
                    pallas_kernels(body, found)
    return found


def layer_kernel(s, ins):
    """The Pallas kernel a Keras layer launches, when it launches exactly one (traced on the JAX backend
    on its actual inputs): the layer node then names it, as an equation node does, and carries its
    source's place. "" when none or several, or when the layer cannot be traced."""
    try:
        import jax
        found = pallas_kernels(jax.make_jaxpr(lambda *v: s.call(*v))(*ins).jaxpr, set())
    except Exception:  # noqa: BLE001 - another backend, or a layer JAX cannot trace: no name
        return ""
    if len({name for name, _ in found}) != 1:
        return ""
    name, src = found.pop()
    s.kernel_source = s.kernel_source or src
    return name


def markers(s):
    return dict(node=s.name, op=s.op, kernel=s.kernel)


def node_failed(s):
    """Prints the failure of node `s`: 1 when it is the model's (the finding), HARNESS_ERROR_EXIT when
    the harness failed by itself (a recorded value it could not read)."""
    etype, e, _ = sys.exc_info()
    if isinstance(e, MissingValue):
        say(f"{HARNESS_ERROR}: node {s.name} needs {e} that the recording does not have")
        return HARNESS_ERROR_EXIT
    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()
    return 1


def execute(prog, keep=None, recording=None, record=None):
    rec = Recording(record) if record else None
    src = Recording(recording) if recording else None
    env = dict(prog.values) if keep is None else {}
    steps = prog.steps if keep is None else [s for s in prog.steps if s.name in keep]
    if keep is not None:
        unknown = set(keep) - {s.name for s in steps}
        if unknown:
            say(f"{HARNESS_ERROR}: no such nodes: {', '.join(sorted(unknown))}")
            return HARNESS_ERROR_EXIT
    if rec:
        os.makedirs(record, exist_ok=True)
        for name, v in prog.values.items():
            rec.save(name, v)
        rec.flush()

    def value(atom):
        kind, v = atom
        if kind == "lit":
            return v
        if v not in env:
            if src is None:
                raise MissingValue(v)
            env[v] = src.load(v)
        return env[v]

    for s in steps:
        say(MARKER.format(**markers(s), phase="begin"))
        try:
            ins = [value(a) for a in s.ins]
            if s.layer is not None and s.launches is None:
                s.launches = layer_kernel(s, ins)
            if s.launches:
                say(LAUNCH.format(kernel=s.launches))
            outs = s.call(*ins)
            sync(outs)
        except BaseException:  # noqa: BLE001 - the model's failure is the finding
            return node_failed(s)
        say(MARKER.format(**markers(s), phase="end"))
        for name, v in zip(s.outs, outs):
            if name:
                env[name] = v
                if rec:
                    rec.save(name, v)
    return 0


def jit_check(a, record):
    """After a clean equation-by-equation run: the function jitted, in a child with the XLA dump on."""
    dump = os.path.join(record, "xla_dump")
    argv = [sys.executable, os.path.abspath(__file__)] + without_verb(a) + ["jitted"]
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
    run = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode == 0:
        return 0
    sys.stdout.write(run.stdout)
    say(JIT_ONLY.format(dump=dump))
    say("harness: the fault does not show equation by equation; jitted (inside an XLA fusion) it does")
    return run.returncode


def without_verb(a):
    argv = []
    for flag, v in (("--function", a.function), ("--model", a.model), ("--example-inputs", a.example_inputs),
                    ("--loss", a.loss), ("--device", a.device)):
        if v:
            argv += [flag, v]
    if a.train:
        argv.append("--train")
    return argv


# ----------------------------------------------------------------------------------------------------
# extract: repro.py


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
            call = (f"lambda *a: jax.pure_callback(__import__('importlib').import_module({mod!r}).{qual}, "
                    f"[{shapes}], *a)")
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
        note = ("# cudabisect-needs-project: " + " ".join(sorted(needs)) + "\n"
                "# NOT STANDALONE: it imports the project (a host callback, or a layer JAX cannot serialize).\n")
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


# ----------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(prog="jax_harness.py")
    p.add_argument("--function")
    p.add_argument("--model")
    p.add_argument("--example-inputs", required=True)
    p.add_argument("--train", action="store_true")
    p.add_argument("--loss")
    p.add_argument("--device", default="cuda")
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
    """JAX's platform from the harness's device (cuda/gpu, or cpu), before jax is imported."""
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


if __name__ == "__main__":
    sys.exit(main())
