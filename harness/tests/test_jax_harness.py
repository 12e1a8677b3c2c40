"""The JAX harness with a real JAX and Keras 3 on the CPU (CI installs them; these tests fail without
them): nested jit calls are inlined into one flat list of equations, a recording round-trips the values
numpy cannot hold (bfloat16, PRNG keys), a kept subset runs on recorded values, a fault that shows only
jitted is reported with its XLA dump, a subclassed Keras model falls back to its jaxpr, and the
harness's own failures are said as such."""

import json
import os
import subprocess
import sys
import textwrap
import types

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "..", "jax_harness")
sys.path.insert(0, HARNESS)
from cudabisect_jax import cli, graph, keras, protocol, record, repro, run  # noqa: E402

# One namespace of all the harness's parts, for tests that call functions of several.
MODULES = (protocol, graph, keras, record, run, repro, cli)
h = types.SimpleNamespace(**{k: v for m in MODULES for k, v in vars(m).items() if not k.startswith("__")})


def project(tmp_path, source):
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "mod.py").write_text(textwrap.dedent(source))
    return pkg


def harness(cwd, *args, env=None):
    run = subprocess.run(
        [sys.executable, HARNESS, *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    return run.returncode, run.stdout


def test_nested_jit_calls_are_inlined_into_one_list_of_equations():
    @jax.jit
    def inner(x):
        return jnp.sin(x) * 2

    def outer(x, y):
        return inner(x) + jax.jit(lambda z: z @ z.T)(y).sum()

    prog = h.jax_program(outer, (jnp.ones(3), jnp.ones((2, 2))), "t")
    ops = [s.op for s in prog.steps]
    assert "pjit" not in ops and "jit" not in ops, ops
    assert ops[:2] == ["sin", "mul"], ops
    assert "dot_general" in ops, ops
    # Every step's inputs are the flattened arguments, a constant, or another step's output.
    made = {o for s in prog.steps for o in s.outs if o} | set(prog.values)
    for s in prog.steps:
        for kind, name in s.ins:
            assert kind == "lit" or name in made, (s.name, name)


def test_a_recording_round_trips_bfloat16_and_prng_keys(tmp_path):
    rec = h.Recording(str(tmp_path))
    x = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3)
    key = jax.random.key(3)
    rec.save("x", x)
    rec.save("key", key)
    rec.flush()
    again = h.Recording(str(tmp_path))
    y = again.load("x")
    assert y.dtype == jnp.bfloat16 and bool((y == x).all())
    k = again.load("key")
    assert jax.random.key_data(k).tolist() == jax.random.key_data(key).tolist()
    assert jax.random.uniform(k).item() == jax.random.uniform(key).item()


def test_kept_equations_run_on_recorded_values_and_a_missing_one_is_the_harness(tmp_path, capsys):
    def f(x):
        return jnp.tanh(jnp.exp(x) + 1.0)

    prog = h.jax_program(f, (jnp.ones(4),), "t")
    rec = str(tmp_path / "rec")
    assert h.execute(prog, record=rec) == 0
    last = prog.steps[-1].name
    assert h.execute(h.jax_program(f, (jnp.ones(4),), "t"), keep={last}, recording=rec) == 0
    out = capsys.readouterr().out
    assert f"node={last} op=tanh kernel=tanh end" in out
    # Without the recording, the kept node's input is missing: the harness says so, exit 4.
    assert h.execute(h.jax_program(f, (jnp.ones(4),), "t"), keep={last}, recording=str(tmp_path)) == 4
    assert h.HARNESS_ERROR in capsys.readouterr().out


def test_a_fault_only_the_jitted_function_shows_is_reported_with_its_xla_dump(tmp_path):
    # The planted fault raises only in a process that dumps XLA: the harness's jitted check, never the
    # equation-by-equation run.
    pkg = project(
        tmp_path,
        """
        import os
        import jax
        import jax.numpy as jnp
        import numpy as np

        def check(x):
            if "xla_dump_to" in os.environ.get("XLA_FLAGS", ""):
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return np.asarray(x)

        def f(x):
            y = jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2)
            return jnp.sin(y)

        def g(x):
            return jnp.sin(x * 2)

        def inputs():
            return (jnp.ones(3),)
    """,
    )
    rec = tmp_path / "rec"
    code, out = harness(
        pkg, "--function", "mod:f", "--example-inputs", "mod:inputs", "--device", "cpu", "run", "--record", str(rec)
    )
    assert code != 0, out
    assert h.JIT_ONLY.format(dump=rec / "xla_dump") in out, out
    assert "illegal memory access" in out
    assert any((rec / "xla_dump").iterdir()), "the XLA dump is written"
    # A function without the fault passes both ways and says nothing of jit.
    code, out = harness(
        pkg,
        "--function",
        "mod:g",
        "--example-inputs",
        "mod:inputs",
        "--device",
        "cpu",
        "run",
        "--record",
        str(tmp_path / "rec2"),
    )
    assert code == 0, out
    assert "jit-only" not in out, out


def test_a_subclassed_keras_model_falls_back_to_its_stateless_calls_jaxpr(tmp_path):
    pkg = project(
        tmp_path,
        """
        import keras
        import numpy as np

        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.a = keras.layers.Dense(4)
                self.b = keras.layers.Dense(2)

            def call(self, x):
                return self.b(keras.activations.relu(self.a(x)))

        def build():
            m = Net()
            m(np.zeros((1, 3), "float32"))
            return m

        def inputs():
            return np.ones((2, 3), "float32")
    """,
    )
    out_file = tmp_path / "d.json"
    code, out = harness(
        pkg,
        "--model",
        "mod:build",
        "--example-inputs",
        "mod:inputs",
        "--device",
        "cpu",
        "describe",
        "--out",
        str(out_file),
    )
    assert code == 0, out
    d = json.loads(out_file.read_text())
    assert "subclassed" in d["graph"] and "stateless call" in d["graph"], d["graph"]
    assert [n["op"] for n in d["nodes"]].count("dot_general") == 2, d["nodes"]


def test_factories_that_fail_are_the_harness_failure_not_the_models(tmp_path):
    pkg = project(
        tmp_path,
        """
        def f(x):
            return x

        def inputs():
            raise ValueError("no data")
    """,
    )
    code, out = harness(
        pkg,
        "--function",
        "mod:f",
        "--example-inputs",
        "mod:inputs",
        "--device",
        "cpu",
        "describe",
        "--out",
        str(tmp_path / "d.json"),
    )
    assert code == h.HARNESS_ERROR_EXIT, out
    assert f"{h.HARNESS_ERROR}: could not build the program: ValueError: no data" in out, out


def test_a_short_scan_is_unrolled_into_its_iterations_with_the_same_values(tmp_path):
    import numpy as np

    class Config:  # not an array: closed over, as a static argument would be
        scale = 3.0

    def f(w, xs, cfg):
        def body(c, x):
            return jnp.tanh(c @ w + x) * cfg.scale, (c * 2).sum()

        return jax.lax.scan(body, jnp.zeros(4), xs)

    args = (jnp.full((4, 4), 0.1), jnp.ones((3, 4)), Config())
    prog = h.jax_program(f, args, "t")
    assert "1 scan(s) unrolled" in prog.graph, prog.graph
    names = [s.name for s in prog.steps]
    assert any(n.endswith("_s2.tanh") for n in names), names
    assert "scan" not in {s.op for s in prog.steps}
    rec = str(tmp_path / "rec")
    assert h.execute(prog, record=rec) == 0
    carry, ys = f(*args)
    stacked = prog.steps[-1].outs[0]
    assert np.allclose(np.load(f"{rec}/{stacked}.npy"), np.asarray(ys))
    # A long scan stays one node, and the description says so.
    long = h.jax_program(f, (jnp.full((4, 4), 0.1), jnp.ones((h.UNROLL_LENGTH + 1, 4)), Config()), "t")
    assert "kept whole: scan" in long.graph, long.graph


def test_an_equation_on_a_prng_key_is_extracted_into_a_repro_that_runs(tmp_path):
    pkg = project(
        tmp_path,
        """
        import jax
        import jax.numpy as jnp

        def f(x, key):
            k1, k2 = jax.random.split(key)
            return x * jax.random.uniform(k1, x.shape) + jax.random.normal(k2, x.shape)

        def inputs():
            return jnp.ones(4), jax.random.key(7)
    """,
    )
    args = ["--function", "mod:f", "--example-inputs", "mod:inputs", "--device", "cpu"]
    rec = tmp_path / "rec"
    code, out = harness(pkg, *args, "run", "--record", str(rec))
    assert code == 0, out
    d = tmp_path / "d.json"
    harness(pkg, *args, "describe", "--out", str(d))
    nodes = [n["id"] for n in json.loads(d.read_text())["nodes"]]
    keep = ",".join(nodes[:4])  # the split and the first draws: keys in, keys and bits out
    code, out = harness(pkg, *args, "extract", "--keep", keep, "--recording", str(rec), "--out", str(tmp_path / "min"))
    assert code == 0, out
    run = subprocess.run(
        [sys.executable, str(tmp_path / "min" / "repro.py")],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "repro: finished without a fault" in run.stdout


def test_a_keras_model_with_named_inputs_is_split_and_written_standalone(tmp_path):
    pkg = project(
        tmp_path,
        """
        import keras
        import numpy as np

        def build():
            a = keras.Input((8,), name="a")
            b = keras.Input((4,), name="b")
            h = keras.layers.Concatenate()([keras.layers.Dense(8)(a), b])
            return keras.Model({"a": a, "b": b}, keras.layers.Dense(2)(h))

        def inputs():
            return {"a": np.ones((3, 8), "float32"), "b": np.ones((3, 4), "float32")}
    """,
    )
    args = ["--model", "mod:build", "--example-inputs", "mod:inputs", "--device", "cpu"]
    d = tmp_path / "d.json"
    code, out = harness(pkg, *args, "describe", "--out", str(d))
    assert code == 0, out
    nodes = json.loads(d.read_text())["nodes"]
    assert [n["op"] for n in nodes] == ["Dense", "Concatenate", "Dense"], nodes
    assert [i["name"] for i in nodes[1]["inputs"]] == ["t0_0", "in1"], nodes
    rec = tmp_path / "rec"
    assert harness(pkg, *args, "run", "--record", str(rec))[0] == 0
    keep = ",".join(n["id"] for n in nodes[1:])
    code, out = harness(pkg, *args, "extract", "--keep", keep, "--recording", str(rec), "--out", str(tmp_path / "min"))
    assert code == 0, out
    repro = (tmp_path / "min" / "repro.py").read_text()
    assert "cudabisect-needs-project" not in repro
    run = subprocess.run(
        [sys.executable, str(tmp_path / "min" / "repro.py")],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_keras_layer_that_launches_one_pallas_kernel_names_it(tmp_path):
    pkg = project(
        tmp_path,
        """
        import jax
        import keras
        import numpy as np
        from jax.experimental import pallas as pl

        def double_kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        class Double(keras.layers.Layer):
            def call(self, x):
                return pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      interpret=True)(x)

        def build():
            x = keras.Input((8,), batch_size=2)
            return keras.Model(x, keras.layers.Dense(4)(Double(name="double")(x)))

        def inputs():
            return np.ones((2, 8), "float32")
    """,
    )
    args = ["--model", "mod:build", "--example-inputs", "mod:inputs", "--device", "cpu"]
    rec = tmp_path / "rec"
    code, out = harness(pkg, *args, "run", "--record", str(rec))
    assert code == 0, out
    lines = out.splitlines()
    begin = lines.index("@@cudabisect node=l00_double op=Double kernel=Double begin")
    assert lines[begin + 1] == "@@cudabisect launch kernel=double_kernel", out
    # The Dense layer launches no Pallas kernel: no launch line names one for it.
    dense = lines.index("@@cudabisect node=l01_dense op=Dense kernel=Dense begin")
    assert not lines[dense + 1].startswith("@@cudabisect launch"), out
    code, out = harness(
        pkg, *args, "extract", "--keep", "l00_double", "--recording", str(rec), "--out", str(tmp_path / "min")
    )
    assert code == 0, out
    repro = (tmp_path / "min" / "repro.py").read_text()
    assert "#     def double_kernel(x_ref, o_ref):" in repro, repro


def test_a_keras_model_on_the_torch_backend_is_split_and_run_on_recorded_values(tmp_path):
    pkg = project(
        tmp_path,
        """
        import keras
        import numpy as np

        def build():
            return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                     keras.layers.Dense(4)])

        def inputs():
            return np.ones((3, 8), "float32")
    """,
    )
    args = ["--model", "mod:build", "--example-inputs", "mod:inputs", "--device", "cpu"]
    env = {"KERAS_BACKEND": "torch"}
    d = tmp_path / "d.json"
    code, out = harness(pkg, *args, "describe", "--out", str(d), env=env)
    assert code == 0, out
    assert "on torch" in json.loads(d.read_text())["graph"]
    rec = tmp_path / "rec"
    assert harness(pkg, *args, "run", "--record", str(rec), env=env)[0] == 0
    code, out = harness(pkg, *args, "run", "--keep", "l01_dense_1", "--recording", str(rec), env=env)
    assert code == 0, out
    assert "@@cudabisect node=l01_dense_1 op=Dense kernel=Dense end" in out
    code, out = harness(
        pkg, *args, "extract", "--keep", "l01_dense_1", "--recording", str(rec), "--out", str(tmp_path / "min"), env=env
    )
    assert code == 0, out
    assert "'torch'" in (tmp_path / "min" / "repro.py").read_text()
