"""describe and run: the nodes described as the protocol wants them, and run one by one inside their
markers on recorded or fresh values; the jit-only check."""

import json
import os
import subprocess
import sys
import traceback
from .protocol import HARNESS_ERROR, HARNESS_ERROR_EXIT, JIT_ONLY, LAUNCH, MARKER, PROTOCOL_VERSION, say
from .graph import pallas_kernel
from .keras import sync
from .record import MissingValue, Recording


def describe(prog, out):
    producer = {}
    for s in prog.steps:
        for o in s.outs:
            if o:
                producer[o] = s.name

    def tensor(name):
        shape, dtype = prog.avals.get(name, ((), ""))
        known = dtype is not None and str(dtype) != ""
        return {
            "name": name,
            "shape": list(shape) if known else None,
            "dtype": str(dtype) if known else None,
            "producer": producer.get(name),
        }

    nodes = []
    for s in prog.steps:
        node = {
            "id": s.name,
            "op": s.op,
            "kernel": s.launches or s.kernel,
            "inputs": [tensor(a[1]) for a in s.ins if a[0] == "var"],
            "outputs": [tensor(o) for o in s.outs if o],
        }
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
    # The harness folder (its __main__.py), run again as it was run.
    harness = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, harness] + without_verb(a) + ["jitted"]
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
    for flag, v in (
        ("--function", a.function),
        ("--model", a.model),
        ("--example-inputs", a.example_inputs),
        ("--loss", a.loss),
        ("--device", a.device),
    ):
        if v:
            argv += [flag, v]
    if a.train:
        argv.append("--train")
    return argv
