"""The PyTorch harness's code generation, without torch: repro.py's text for hand-built steps, Python custom
ops carried with their registration and kernels, what cannot be carried named in an extract error.

Runs under pytest, or alone (`python3 harness/tests/test_codegen.py`), which is how `cargo test` runs it.
"""

import importlib.util
import operator
from abc import abstractmethod
from functools import partial
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_harness_modules import h, repro  # noqa: E402

tl = types.SimpleNamespace(constexpr=int)  # only for the annotation below; triton is not needed here
BLOCK_SIZE = 1024


class JITFunction:
    """What triton.jit returns, as far as the harness looks."""

    def __init__(self, fn):
        self.fn = fn


def store_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


kernel = JITFunction(store_kernel)


def faulty_copy(x):
    out = torch.empty_like(x)  # noqa: F821 - torch is repro.py's import, not this test's
    kernel[(4096,)](x, out, x.numel(), BLOCK=BLOCK_SIZE)
    return out


def scale_rows(x, scale: float):
    """The custom op's Python kernel."""
    out = x.clone()
    kernel[(64,)](x, out, x.numel(), BLOCK=BLOCK_SIZE)
    return out * scale


def scale_rows_fake(x, scale):
    return x.new_empty(x.shape)


class FakeSchema:
    def __init__(self, text, arguments):
        self.text, self.arguments = text, arguments
        self.name = text.split("(")[0]

    def __str__(self):
        return self.text


class OpOverload:
    """What `torch.ops.ns.op.default` is, as far as the harness looks."""

    def __init__(self, qual, overload="default"):
        self._schema = FakeSchema(qual + "(Tensor x, float scale) -> Tensor", [])
        self._overloadname = overload


def fake_opdef():
    arg = types.SimpleNamespace(name="x", alias_info=None)
    schema = FakeSchema("mylib::scale_rows(Tensor x, float scale) -> Tensor", [arg])
    return types.SimpleNamespace(
        _init_fn=scale_rows,
        _opoverload=types.SimpleNamespace(_schema=schema),
        _backend_fns={None: scale_rows},
        _abstract_fn=scale_rows_fake,
    )


R = h.Ref


def raises(fn):
    try:
        fn()
    except h.ExtractError as e:
        return str(e)
    raise AssertionError("no ExtractError")


def test_repro_has_markers_calls_and_the_models_own_kernels():
    steps = [
        h.Step("relu", "ReLU", "ReLU", (R("x", None),), {}, "layer1.relu", "call_module"),
        h.Step("copy", "faulty_copy", "faulty_copy", (R("relu", "relu"),), {}, faulty_copy, "call_function"),
        h.Step("view", "Tensor.view", "view", (R("copy", "copy"), -1, slice(None, 4, None)), {}, "view", "call_method"),
        h.Step("add", "add", "add", (R("view", "view"), 1.5), {"alpha": 2}, operator.add, "call_function"),
    ]
    modules = [h.ModuleSpec("layer1.relu", "torch.nn.ReLU(inplace=False)")]
    text = h.render_repro(steps, ["x"], modules, "Minimal repro: test")
    for want in [
        "@@cudabisect node=copy op=faulty_copy kernel=faulty_copy begin",
        "env['copy'] = faulty_copy(env['relu'])",
        "env['view'] = env['copy'].view(-1, slice(None, 4, None))",
        "env['add'] = operator.add(env['view'], 1.5, alpha=2)",
        "env['relu'] = modules['layer1.relu'](env['x'])",
        "modules['layer1.relu'] = build('layer1.relu', torch.nn.ReLU(inplace=False))",
        "def store_kernel(",
        "@triton.jit",
        "def faulty_copy(",
        "kernel = store_kernel",
        "BLOCK_SIZE = 1024",
        "import triton",
        "import triton.language as tl",
        "import operator",
        'torch.load(os.path.join(HERE, "repro_data.pt"), weights_only=True)',
        "sync()",
        "sys.exit(1)",
    ]:
        assert want in text, (want, text)
    assert "weights_only=False" not in text and "NOT STANDALONE" not in text, text
    assert "import h" not in text and "spec_from_file_location" not in text, text


def test_imports_inside_copied_code_are_carried_and_what_they_need_is_said():
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        pkg = os.path.join(tmp, "projmod_cb")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write("")
        with open(os.path.join(pkg, "ops.py"), "w") as f:
            f.write("def fused(x):\n    return x\n")
        with open(os.path.join(pkg, "model.py"), "w") as f:
            f.write(
                "import json as js\n\n\ndef forward(x):\n"
                "    from projmod_cb.ops import fused\n    from . import ops\n"
                "    return ops.fused(fused(x)), js.dumps(1)\n"
            )
        sys.path.insert(0, tmp)
        try:
            model = importlib.import_module("projmod_cb.model")
            steps = [h.Step("f", "forward", "forward", (R("x", None),), {}, model.forward, "call_function")]
            text = h.render_repro(steps, ["x"], [], "t")
            for want in [
                "from projmod_cb.ops import fused",
                "from projmod_cb import ops",
                "import json as js",
                "# cudabisect-needs-project: projmod_cb",
                "the project under test at the culprit commit",
            ]:
                assert want in text, (want, text)
            assert h.requirement("json") is None and h.requirement("projmod_cb") == "project"
        finally:
            sys.path.remove(tmp)
            for name in [m for m in sys.modules if m.startswith("projmod_cb")]:
                del sys.modules[name]


def test_modules_of_the_users_own_classes_are_pickled_and_flagged():
    steps = [h.Step("blk", "Block", "Block", (R("x", None),), {}, "blk", "call_module")]
    text = h.render_repro(steps, ["x"], [h.ModuleSpec("blk", None)], "t")
    assert "NOT STANDALONE" in text and "repro_modules.pt" in text, text
    assert "modules['blk'] = pickled['blk'].to(DEVICE)" in text, text


def test_a_python_custom_op_is_called_by_name_and_carried_with_its_registration():
    saved = repro.python_custom_op
    repro.python_custom_op = lambda qual: fake_opdef() if qual == "mylib::scale_rows" else None
    try:
        steps = [
            h.Step(
                "scaled",
                "scale_rows",
                "scale_rows",
                (R("x", None), 2.0),
                {},
                OpOverload("mylib::scale_rows"),
                "call_function",
            )
        ]
        text = h.render_repro(steps, ["x"], [], "t")
    finally:
        repro.python_custom_op = saved
    for want in [
        "env['scaled'] = torch.ops.mylib.scale_rows.default(env['x'], 2.0)",
        "def scale_rows(x, scale: float):",
        "scale_rows = torch.library.custom_op('mylib::scale_rows', mutates_args=(), device_types=None, "
        "schema='(Tensor x, float scale) -> Tensor')(scale_rows)",
        "scale_rows.register_fake(scale_rows_fake)",
        "def store_kernel(",
        "kernel = store_kernel",
        "from __future__ import annotations",
    ]:
        assert want in text, (want, text)
    assert "torch._ops" not in text, text


def test_an_op_with_no_definition_to_carry_is_an_extract_error_naming_it():
    steps = [h.Step("y", "fused", "fused", (R("x", None),), {}, OpOverload("nowhere_lib::fused"), "call_function")]
    message = raises(lambda: h.render_repro(steps, ["x"], [], "t"))
    assert "nowhere_lib::fused" in message, message


def test_ops_of_torch_itself_need_nothing():
    steps = [h.Step("y", "add", "add", (R("x", None), 1), {}, OpOverload("aten::add", "Tensor"), "call_function")]
    text = h.render_repro(steps, ["x"], [], "t")
    assert "torch.ops.aten.add.Tensor(env['x'], 1)" in text, text


def test_a_function_without_readable_source_is_an_extract_error_naming_it():
    namespace = {}
    exec("def made_at_runtime(x):\n    return x\n", namespace)  # noqa: S102 - no file behind it, on purpose
    fn = namespace["made_at_runtime"]
    steps = [h.Step("y", "made_at_runtime", "made_at_runtime", (R("x", None),), {}, fn, "call_function")]
    message = raises(lambda: h.render_repro(steps, ["x"], [], "t"))
    assert "made_at_runtime" in message and "source cannot be read" in message, message


def test_decorators_are_stripped_from_copied_definitions():
    code = "@torch.library.custom_op('a::b', mutates_args=())\n@other\ndef b(x):\n    return x\n"
    assert h.strip_decorators(code) == "def b(x):\n    return x\n"
    assert h.strip_decorators("def c():\n    pass\n") == "def c():\n    pass\n"


def test_torch_nn_constructors_are_rebuilt_from_repr_only_for_torch_nn_classes():
    class Linear:
        def named_children(self):
            return iter(())

        def __repr__(self):
            return "Linear(in_features=4, out_features=8, bias=True)"

    class Sequential:
        def __init__(self, *children):
            self.children = children

        def named_children(self):
            return ((str(i), c) for i, c in enumerate(self.children))

    nn = types.SimpleNamespace(Linear=Linear, Sequential=Sequential)
    assert h.module_ctor(Linear(), nn) == "torch.nn.Linear(in_features=4, out_features=8, bias=True)"
    assert h.module_ctor(Sequential(Linear(), Linear()), nn) == (
        "torch.nn.Sequential(torch.nn.Linear(in_features=4, out_features=8, bias=True), "
        "torch.nn.Linear(in_features=4, out_features=8, bias=True))"
    )

    class Mine(Linear):
        pass

    assert h.module_ctor(Mine(), nn) is None
    assert h.module_ctor(Sequential(Linear(), Mine()), nn) is None


class Module:
    """Stands in for torch.nn.Module: the user's class below derives from it."""


# A module object, as torch.nn is: the generator imports it by name instead of copying it.
nn = types.ModuleType("torch.nn")
nn.Module = Module


class GatedRelu(nn.Module):
    def forward(self, x):
        if self.flag and x.is_cuda:
            return faulty_copy(x)
        return x


def test_a_users_own_module_class_is_revived_from_its_source():
    spec = h.ModuleSpec(
        "layer3.1.relu", "revive(GatedRelu, {'flag': True}, [], [], data['states']['layer3.1.relu'])", GatedRelu
    )
    steps = [h.Step("g", "GatedRelu", "GatedRelu", (R("x", None),), {}, "layer3.1.relu", "call_module")]
    text = h.render_repro(steps, ["x"], [spec], "t")
    for want in [
        "class GatedRelu(nn.Module):",
        "def faulty_copy(",
        "def store_kernel(",
        "def revive(",
        "modules['layer3.1.relu'] = build('layer3.1.relu', revive(GatedRelu, {'flag': True}",
    ]:
        assert want in text, (want, text)
    assert "NOT STANDALONE" not in text and "weights_only=False" not in text, text


SCALES = (2.0,)


class LossBase(nn.Module):
    @abstractmethod
    def score(self, x):
        pass


class ScaledLoss(LossBase):
    FACTORS = SCALES

    def score(self, x):
        return partial(operator.mul, self.FACTORS[0])(x)


def test_copied_classes_come_after_their_bases_with_what_their_bodies_read():
    text_imports, sources = h.user_source([ScaledLoss])
    text = "\n".join(text_imports) + "\n" + "\n\n".join(sources)
    # The base comes first (a class statement needs it), the decorator and partial are imported from the
    # standard library, not copied, and the class attribute's value is carried.
    assert text.index("class LossBase") < text.index("class ScaledLoss"), text
    for want in ["from abc import abstractmethod", "from functools import partial", "SCALES = (2.0,)"]:
        assert want in text, (want, text)
    assert "class partial" not in text, text
    namespace = {"nn": nn, "operator": operator}
    exec(compile(text, "repro.py", "exec"), namespace)  # noqa: S102 - the generated text itself
    assert namespace["ScaledLoss"]().score(3.0) == 6.0


TUNED_KERNELS = """import triton
import triton.language as tl


def tuning_configs():
    return [triton.Config({"BLOCK": 64}, num_warps=4)]


@triton.autotune(configs=tuning_configs(), key=["n"])
@triton.jit
def tuned_copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.heuristics({"EVEN": lambda args: args["n"] % 64 == 0})
@triton.jit
def guided_copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def launch(x, out):
    tuned_copy[(4,)](x, out, x.numel())
    guided_copy[(4,)](x, out, x.numel(), BLOCK=64)
    return out
"""


KERNEL_GLOBALS = """import functools

import triton
import triton.language as tl
from triton.language.extra import libdevice

BLOCK = tl.constexpr(64)


@triton.jit
def _twice(x):
    return x * 2


@triton.jit(do_not_specialize=["n"])
def exp_twice(x_ptr, out_ptr, n):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, libdevice.exp(_twice(v)), mask=offs < n)


@functools.lru_cache(maxsize=None)
def grid_for(n):
    return (triton.cdiv(n, 64),)


def launch(x, out):
    exp_twice[grid_for(x.numel())](x, out, x.numel())
    return out
"""


def copied(source, module, entry):
    """The text user_source copies for `entry` of `module`, whose source is `source` (or of a package:
    `source` maps paths to their text): imports, then constants, then definitions, as repro.py lays them
    out (annotations are not evaluated there either)."""
    import tempfile

    files = source if isinstance(source, dict) else {f"{module}.py": source}
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        sys.path.insert(0, tmp)
        try:
            text_imports, sources = h.user_source([getattr(importlib.import_module(module), entry)])
        finally:
            sys.path.remove(tmp)
            top = module.split(".")[0]
            for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                del sys.modules[name]
    plain = [i for i in text_imports if i.startswith(("import ", "from "))]
    consts = [i for i in text_imports if i not in plain]
    return "\n".join(["from __future__ import annotations", *plain, *consts]) + "\n\n" + "\n\n".join(sources)


def run_as_a_file(text):
    """What running `text` as repro.py defines (triton.jit reads a kernel's source from its file)."""
    import runpy
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "repro.py")
        with open(path, "w") as f:
            f.write(text)
        return runpy.run_path(path)


def carried(source, module, entry, wants):
    """Copies `entry` as repro.py would, checks that the text holds each of `wants`, passes the lint, and
    runs as a file; returns the text and what it defined."""
    text = copied(source, module, entry)
    for want in wants:
        assert want in text, (want, text)
    assert h.lint(text) is None, text
    return text, run_as_a_file(text)


def test_autotuned_and_heuristic_triton_kernels_are_copied_with_their_decorators_not_imported():
    # Real Triton (CI's torch brings it): an autotuned kernel's own `__module__` is the autotuner's, and
    # repro.py once imported the user's kernel from `triton.runtime.autotuner`, an ImportError.
    wants = [
        '@triton.autotune(configs=tuning_configs(), key=["n"])\n@triton.jit\ndef tuned_copy(',
        "@triton.heuristics(",
        "def guided_copy(",
        "def tuning_configs(",
        "import triton.language as tl",
    ]
    text, defined = carried(TUNED_KERNELS, "tunedmod_cb", "launch", wants)
    assert "triton.runtime" not in text, text
    assert type(defined["tuned_copy"]).__name__ == "Autotuner"


def test_a_kernels_constexpr_globals_helpers_and_a_cached_grid_function_are_carried():
    # What Triton code reads besides the kernel: a `tl.constexpr` global (Triton reads no other kind), a
    # `@triton.jit` helper, `libdevice`, and a grid function behind `functools.lru_cache` (a wrapper, not a
    # function: once left out, so repro.py named a function it never defined).
    wants = [
        "BLOCK = triton.language.constexpr(64)",
        "import triton.language.extra.libdevice as libdevice",
        "def _twice(",
        "@functools.lru_cache(maxsize=None)\ndef grid_for(",
        "import functools",
    ]
    _, defined = carried(KERNEL_GLOBALS, "kernelglobals_cb", "launch", wants)
    assert defined["grid_for"](130) == (3,) and defined["BLOCK"].value == 64


LIBRARY_IDIOMS = """import enum
import functools
import logging
from typing import Callable, TypeVar

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

logger = logging.getLogger("idioms_cb")
F = TypeVar("F", bound=Callable)
custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
BOUNDARY = enum.FlagBoundary.EJECT


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


MODE = Mode.FAST
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4) for b in (32, 64)]


class CachedTuner(Autotuner):
    \"\"\"A library's own autotuner.\"\"\"


def cached_autotune(configs, key):
    def decorator(fn: F) -> F:
        return CachedTuner(fn, fn.arg_names, configs, key, None, None)

    return decorator


@cached_autotune(configs=CONFIGS, key=["n"])
@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def guard(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        logger.debug("%s %s", MODE, BOUNDARY)
        return fn(*args, **kwargs)

    return wrapper


class Scale(torch.autograd.Function):
    @staticmethod
    @guard
    @custom_fwd
    def forward(ctx, x):
        scale[(1,)](x, x.numel())
        return x
"""


def test_what_real_kernel_libraries_define_at_module_level_is_carried():
    # Idioms of real kernel libraries (flash-linear-attention's among them): a logger, a functools.partial
    # of torch's, enum members (the standard library's and the module's own), a list of triton.Configs, a
    # library's own Autotuner subclass built by its own decorator at definition time, a decorator whose
    # inner function reads globals and annotates with a TypeVar. Each once left repro.py naming something
    # it never defined, or defining it too late.
    wants = [
        "logger = logging.getLogger('idioms_cb')",
        "custom_fwd = functools.partial(torch.amp.autocast_mode.custom_fwd, device_type='cuda')",
        "BOUNDARY = FlagBoundary.EJECT",
        "MODE = Mode.FAST",
        "CONFIGS = [triton.Config(",
        "class CachedTuner(Autotuner):",
    ]
    _, defined = carried(LIBRARY_IDIOMS, "idioms_cb", "Scale", wants)
    assert type(defined["scale"]).__name__ == "CachedTuner" and defined["MODE"].name == "FAST"


def test_an_installed_packages_class_is_imported_and_a_table_another_module_defines_is_copied():
    # An installed package's class is imported by name, not copied (packaging's `Version` once brought
    # 1,000 lines of it into repro.py); a table the op's module imports from the project's other module
    # is found where it is assigned (Liger-Kernel's `torch_to_triton_dtype`), under the name the op uses.
    files = {
        "tablepkg_cb/__init__.py": "",
        "tablepkg_cb/utils.py": "import triton.language as tl\n\nDOWNCAST = {tl.float32: tl.float16}\n",
        "tablepkg_cb/ops.py": (
            "from packaging.version import Version\n\nfrom .utils import DOWNCAST as TABLE\n\n\n"
            "def pick(dtype):\n    return TABLE.get(dtype), Version('1.0')\n"
        ),
    }
    wants = ["from packaging.version import Version", "DOWNCAST = {tl.float32: tl.float16}", "TABLE = DOWNCAST"]
    text, defined = carried(files, "tablepkg_cb.ops", "pick", wants)
    assert "class Version" not in text and "tablepkg_cb" not in text, text
    assert len(defined["TABLE"]) == 1


def test_unknown_shapes_are_unknown_not_empty():
    steps = [h.Step("y", "relu", "relu", (R("x", None),), {}, "relu", "call_method")]
    d = h.describe(steps, ["x"])
    assert d["nodes"][0]["inputs"][0]["shape"] is None
    assert d["nodes"][0]["outputs"][0]["shape"] is None


def test_recorded_calls_are_saved_as_plain_containers():
    class Frozen(dict):  # what FX's interpreter passes as kwargs: a dict subclass torch will not load safely
        pass

    class FrozenList(list):
        pass

    import collections

    Point = collections.namedtuple("Point", "x y")
    v = h.plain(((1, FrozenList([2, Frozen(a=3)])), Frozen(b=Point(4, 5))))
    assert v == ((1, [2, {"a": 3}]), {"b": Point(4, 5)})
    assert type(v[0][1]) is list and type(v[0][1][1]) is dict and type(v[1]) is dict
    assert type(v[1]["b"]) is Point


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from standalone import run_all

    run_all(globals())


def test_a_title_of_several_lines_quotes_and_backslashes_still_compiles():
    # The NOT STANDALONE note made the title two paragraphs; docstrings of real models carry quotes,
    # backslashes and their own indentation.
    title = (
        "Minimal repro: 1 of 4 nodes of a captured training step (model__backward)\n\n"
        "NOT STANDALONE: it unpickles the model's own module classes (train.Net) from repro_modules.pt.\n"
        '        indented """ quoted """ C:\\path\\to\\it'
    )
    steps = [h.Step("y", "relu", "relu", (R("x", None),), {}, "relu", "call_method")]
    text = h.render_repro(steps, ["x"], [], title)
    compile(text, "repro.py", "exec")
    assert "NOT STANDALONE: it unpickles" in text
    assert h.lint(text) is None


def test_generated_code_that_does_not_compile_is_refused_with_its_text():
    assert "does not compile" in h.lint("def f(:\n    pass\n")
    try:
        import pyflakes  # noqa: F401
    except ImportError:
        return
    assert "never defines" in h.lint("def f():\n    return undefined_thing\n")


def test_source_paths_name_the_project_or_the_package_never_this_machine():
    here = os.getcwd()
    assert h.readable_path(os.path.join(here, "pkg", "model.py")) == os.path.join("pkg", "model.py")
    lib = "/opt/venv/lib/python3.12/site-packages/transformers/utils/generic.py"
    assert h.readable_path(lib) == "transformers/utils/generic.py"
    assert h.readable_path("/elsewhere/tool.py") == "tool.py"
