"""The graph: one Step per node, values named by strings."""

import os
import re
from .protocol import INLINED

# This package: frames in it are the harness's own, never the user's.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Step:
    """One node the shrinker can keep or cut: `call(*inputs) -> list of outputs`."""

    def __init__(
        self, name, op, kernel, ins, outs, call, source=None, phase=None, launches=None, eqn=None, kernel_source=None
    ):
        self.name = name
        self.op = op
        self.kernel = kernel
        self.ins = ins  # ("var", name) or ("lit", value)
        self.outs = outs  # names (None for an output nothing reads)
        self.call = call
        self.source = source
        self.phase = phase
        self.launches = launches  # the kernel a Pallas node launches
        self.eqn = eqn  # the jaxpr equation, for extract
        self.kernel_source = kernel_source  # "file:line" of a Pallas kernel's Python function
        self.layer = None  # the Keras layer a layer node calls
        self.layer_path = ()  # its names from the model down (nested models)


class Program:
    def __init__(self):
        self.steps = []
        self.values = {}  # name -> value known before running (inputs, constants)
        self.avals = {}  # name -> (shape, dtype name)
        self.graph = ""
        self.jitted = None  # () -> outputs, the whole function jitted (for the jit-only check)
        self.factory = None  # the Keras model factory (pkg.mod:build)
        self.unrolled = 0  # scans unrolled into their iterations

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
            if not frame.file_name.startswith(PACKAGE_DIR) and "-packages/" not in frame.file_name:
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
    consts, carry, xs = ins[:nc], ins[nc : nc + ncarry], ins[nc + ncarry :]
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
        ys += synthetic(prog, "stack", parts, [((length, *shape), dtype)], lambda *v: jnp.stack(v), scope)
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
        if (
            prim == "scan"
            and eqn.params["length"] <= UNROLL_LENGTH
            and eqn.params["length"] * count_eqns(eqn.params["jaxpr"].jaxpr) <= UNROLL_STEPS
        ):
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
        prog.steps.append(
            Step(
                name=f"e{index:03d}_{scope}{prim}",
                op=prim,
                kernel=kernel,
                ins=ins,
                outs=out_names,
                call=eqn_call(eqn),
                source=user_source(eqn),
                phase=phase,
                launches=launches,
                eqn=eqn,
                kernel_source=ksrc,
            )
        )
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
