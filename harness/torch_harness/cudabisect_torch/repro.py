"""The standalone repro: `repro.py` and its data, generated from the kept steps. Needs no torch to
generate (torch is imported lazily), so it is tested without torch."""

import ast
import builtins
import collections
import enum
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Optional
from . import store
from .protocol import timing
from .graph import Ref, refs_in
from .node import LAUNCH, announce_triton_launches, is_triton_kernel, markers, python_function, to_device
from .training import (
    GRADS_VALUE,
    TRAINING_KINDS,
    add_grads,
    count_generated,
    cut,
    grad_name,
    loss_callable,
    node_backward,
    optimizer_from_spec,
    regenerate,
    run_loss_call,
    step_is_inplace,
    with_generated,
)
from .record import load_recorded


def literal(a, names):
    """Python source for an argument; Refs become env lookups (or `names`, a format of `name`)."""
    if isinstance(a, Ref):
        return names.format(name=a.name) if names else f"env[{a.name!r}]"
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


# Where torch itself defines ops: nothing to carry for these.
TORCH_NAMESPACES = {
    "aten",
    "prims",
    "prim",
    "quantized",
    "_quantized",
    "c10d",
    "_c10d_functional",
    "_c10d_functional_autograd",
    "_dtensor",
    "higher_order",
    "profiler",
    "rngprims",
    "debugprims",
    "inductor",
    "_inductor_test",
    "mkldnn",
    "onednn",
    "_test",
}
# Packages a repro may import by name: torch and triton are its only requirements.
IMPORTABLE = ("torch", "triton", "math", "operator", "builtins", "_operator")


class ExtractError(Exception):
    """What keeps repro.py from being standalone: names the op or function; `text` is the generated code
    that was refused, when the generator itself failed."""

    def __init__(self, message, text=None):
        super().__init__(message)
        self.text = text


@dataclass
class Needs:
    """What the kept steps call beyond torch: gathered while writing the calls, rendered after."""

    user_fns: list = field(default_factory=list)  # the user's Python functions, copied as source
    custom_ops: dict = field(default_factory=dict)  # "ns::op" -> the op's Python definition (a CustomOpDef)
    imports: set = field(default_factory=set)  # extra import lines
    notes: list = field(default_factory=list)  # what the repro needs beyond torch and triton
    missing: list = field(default_factory=list)  # what could not be carried, for the extract error
    optimizer_ref: str = "None"  # how repro.py names the optimizer's class
    requires: list = field(default_factory=list)  # what must be installed: torch, triton, packages
    project: list = field(default_factory=list)  # the project's own modules the copied code imports
    generated: int = 0  # recorded values repro.py generates instead of loading
    loss_ref: Optional[str] = None  # how repro.py names the user's own loss, when captured
    loss_module: Optional[object] = None  # the loss's module object, when repro.py revives it (LOSS_MODULE)
    autocast: Optional[dict] = None  # the autocast the captured step ran under


def op_path(fn):
    """(namespace, op, overload or None) of a `torch.ops` callable, else None."""
    kind = type(fn).__name__
    if kind == "OpOverload":
        qual, overload = fn._schema.name, fn._overloadname
    elif kind == "OpOverloadPacket":
        qual, overload = fn._qualified_op_name, None
    else:
        return None
    ns, _, op = qual.partition("::")
    return ns, op, overload


def python_custom_op(qualname):
    """The CustomOpDef behind a `torch.library.custom_op`, when the op was defined in Python."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    return OPDEFS.get(qualname)


def extension_for(ns):
    """Import lines for the compiled extension that defines ops in namespace `ns`: a loaded extension
    module named after it, or the package that loaded a library through `torch.ops.load_library`."""
    found = []
    libs = []
    try:
        import torch

        libs = [os.path.realpath(p) for p in getattr(torch.ops, "loaded_libraries", ())]
    except ImportError:
        pass
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None) or ""
        top = name.split(".")[0]
        if not path or top in IMPORTABLE or top.startswith("_"):
            continue
        if path.endswith((".so", ".pyd")) and ns in name.split("."):
            found.append(f"import {name}")
        elif path.endswith("__init__.py") and "." not in name:
            pkg_dir = os.path.dirname(os.path.realpath(path)) + os.sep
            if any(lib.startswith(pkg_dir) for lib in libs) and (ns == name or ns.startswith(name)):
                found.append(f"import {name}")
    return sorted(set(found))


def function_ref(fn, needs):
    """How repro.py names a callable: torch and the standard library by import path, `torch.ops` by op
    name, the user's own Python code by the source copied into repro.py, a compiled extension's function by
    importing the extension."""
    path = op_path(fn)
    if path:
        ns, op, overload = path
        if ns not in TORCH_NAMESPACES:
            qual = f"{ns}::{op}"
            opdef = python_custom_op(qual)
            if opdef is not None:
                needs.custom_ops[qual] = opdef
            else:
                lines = extension_for(ns)
                if lines:
                    needs.imports.update(lines)
                    needs.notes.append(
                        f"{qual} comes from a compiled extension: "
                        f"{', '.join(line.split()[-1] for line in lines)} must be importable"
                    )
                else:
                    needs.missing.append(
                        f"custom op {qual}: neither a torch.library.custom_op defined in "
                        "Python nor a loaded compiled extension that defines it"
                    )
        return f"torch.ops.{ns}.{op}" + (f".{overload}" if overload else "")
    owner = getattr(fn, "__self__", None)
    if inspect.isclass(owner) and getattr(fn, "__name__", "") == "apply" and owner.__module__.split(".")[0] != "torch":
        # A user's torch.autograd.Function, applied: its class is carried, as a function's source is.
        needs.user_fns.append(owner)
        return f"{owner.__name__}.apply"
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if fn in vars(builtins).values():
        return name
    if mod in ("_operator", "operator"):
        needs.imports.add("import operator")
        return f"operator.{fn.__name__}"
    if mod.startswith("torch") or mod == "math":
        needs.imports.add(f"import {mod}" if mod.split(".")[0] != "torch" else "import torch")
        return f"{mod}.{name}"
    if (inspect.isbuiltin(fn) or type(fn).__name__ == "builtin_function_or_method") and mod:
        # A function of a compiled extension: there is no Python source to copy.
        needs.imports.add(f"import {mod}")
        needs.notes.append(f"{mod}.{name} comes from a compiled extension: {mod} must be importable")
        return f"{mod}.{name}"
    needs.user_fns.append(fn)
    return fn.__name__


def strip_decorators(code):
    """`code` (one def or class) from its `def`/`class` line on: repro.py writes registrations itself."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return code
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.decorator_list:
        return "".join(code.splitlines(keepends=True)[node.lineno - 1 :])
    return code


def source_of(fn):
    """The dedented source of a function, a class or a Triton kernel, or None when it cannot be read."""
    target = python_function(fn)
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        src = getattr(fn, "src", None)  # Triton keeps the kernel's text even when the file is gone
        return textwrap.dedent(src) if isinstance(src, str) else None


def user_source(fns, missing=None, carried_ops=None):
    """Source of the user's functions the kept steps call, and of the globals they use that are functions,
    classes, Triton kernels, Python custom ops (those not in `carried_ops` already) or plain constants from
    the user's code: enough to run without the user's package. What cannot be read is appended to
    `missing`."""
    missing = [] if missing is None else missing
    carried_ops = set() if carried_ops is None else carried_ops
    out, seen, imports = [], set(), set()
    queue = [f if isinstance(f, tuple) else (f, None) for f in fns]
    while queue:
        fn, alias = queue.pop(0)
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if type(fn).__name__ == "CustomOpDef":
            # A custom op the copied code calls by its Python name (a backward calling another op).
            qual = f"{fn._namespace}::{fn._name}"
            if qual not in carried_ops:
                carried_ops.add(qual)
                src, deps = custom_op_source(qual, fn, missing)
                if src:
                    var = fn._init_fn.__name__
                    out.append((fn, src + (f"\n\n{alias} = {var}\n" if alias and alias != var else "")))
                    for dep in deps:
                        queue.extend(globals_used(dep, imports))
            continue
        if isinstance(fn, Assigned):
            # A global written as a statement of its own (`_CONFIGS = [triton.Config(...) ...]`), once.
            if (fn.code, id(fn.globs)) in seen:
                continue
            seen.add((fn.code, id(fn.globs)))
            out.append((fn, fn.code))
            queue.extend(named_globals(all_names(fn.code), fn.globs, imports))
            continue
        target = python_function(fn)
        code = source_of(fn)
        if code is None:
            missing.append(
                f"function {getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}: "
                "its source cannot be read"
            )
            continue
        if is_triton_kernel(fn):
            imports.update({"import triton", "import triton.language as tl"})
            if not code.lstrip().startswith("@"):
                code = "@triton.jit\n" + code
        if alias and alias != getattr(target, "__name__", alias):
            # The caller names it differently (`kernel = triton.jit(store_kernel)`): keep that name too.
            code += f"\n\n{alias} = {target.__name__}\n"
        if inspect.isclass(target):
            # State the program kept on the class (a step counter, a flag) as it was in the captured step,
            # not as the class body first set it.
            state = [
                f"{target.__name__}.{k} = {v!r}"
                for k, v in vars(target).items()
                if not k.startswith("_") and plain_literal(v)
            ]
            if state:
                code += "\n\n" + "\n".join(state) + "\n"
        out.append((target, code))
        imports.update(body_imports(code, getattr(target, "__module__", None)))
        queue.extend(globals_used(target, imports))
    return sorted(imports), definitions_first(out)


def definitions_first(copied):
    """The copied definitions in the order found, except that a definition comes after the copied ones its
    statement runs: a class after its bases, a kernel after the function its
    `@triton.autotune(configs=...)` calls and everything that function calls in turn (a library's
    autotune decorator builds its own autotuner class), a function after the constant its default names."""
    defined = [top_level_names(code) for _, code in copied]
    statement = [set(definition_names(code)) for _, code in copied]
    body = [all_names(code) for _, code in copied]
    done, reached, out = set(), set(), []

    def named(reads, i):
        return [j for j, names in enumerate(defined) if j != i and reads & names]

    def emit(i):
        if i in done:
            return
        done.add(i)
        for j in named(statement[i], i):
            reach(j)
        out.append(copied[i][1])

    def reach(j):
        # `j` runs while a statement runs: it, and what it reads when called, are defined first.
        if j in reached:
            return
        reached.add(j)
        emit(j)
        for k in named(body[j], j):
            reach(k)

    for i in range(len(copied)):
        emit(i)
    return out


def all_names(code):
    """Every name `code` reads anywhere."""
    try:
        return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def top_level_names(code):
    """The names a copied piece of code binds at its top level (its `def`s, `class`es and assignments)."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return set()
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def body_imports(code, module):
    """The imports a copied definition makes inside its body (`from mylib.ops import fused` in a
    forward), as import lines for the top of repro.py: what they need is then said there, and a missing
    one fails at once. A relative import names the definition's own package, absolutely."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    package = (module or "").rpartition(".")[0]
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines.update(f"import {a.name}" + (f" as {a.asname}" if a.asname else "") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name != "*":
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(p for p in parts + ([node.module] if node.module else []) if p)
            if base and base != "__future__":
                names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
                lines.add(f"from {base} import {names}")
    return lines


def import_top(line):
    """The top-level module an import line loads, or None for a constant line."""
    words = line.split()
    if len(words) >= 2 and words[0] in ("import", "from"):
        return words[1].split(".")[0]
    return None


def requirement(top):
    """What running repro.py asks of the machine for module `top`: None (torch, triton, the standard
    library), "project" (the project under test: a module of the worktree the harness runs in) or
    "package" (something else that must be installed)."""
    if top in ("torch", "triton", "__future__") or top in getattr(sys, "stdlib_module_names", ()):
        return None
    mod = sys.modules.get(top)
    path = getattr(mod, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        path = getattr(spec, "origin", None)
    here = os.path.realpath(os.getcwd()) + os.sep
    real = os.path.realpath(path) if path else ""
    # An environment inside the checkout (`.venv/`) holds installed packages, not the project.
    installed = any(part in ("site-packages", "dist-packages") for part in real.split(os.sep))
    if real.startswith(here) and not installed:
        return "project"
    return "package"


def globals_used(target, imports):
    """The user-code globals a function (or each method and base of a class) reads, as (value, name) to
    copy; imports for the library ones."""
    if inspect.isclass(target):
        found = []
        for v in vars(target).values():
            fn = getattr(v, "__func__", v)
            if inspect.isfunction(fn):
                # torch wraps some methods in place (an optimizer's `step`): the user's own is inside.
                fn = inspect.unwrap(fn)
                # torch's, Triton's and the standard library's own (an Enum's machinery) are not copied.
                if requirement((getattr(fn, "__module__", "") or "").split(".")[0]) is None:
                    continue
                found.extend(globals_used(fn, imports))
        module = sys.modules.get(target.__module__)
        code = source_of(target)
        if module is not None and code is not None:
            # Its bases, and what its body reads outside the methods' code (decorators, class attributes).
            found.extend(named_globals(definition_names(code), vars(module), imports))
        return found
    names = code_names(getattr(target, "__code__", None))
    code = source_of(target)
    if code is not None:
        # A copied `def` keeps its decorators and defaults, which read names its body may not.
        names += definition_names(code)
    return named_globals(names, getattr(target, "__globals__", {}), imports)


def code_names(code):
    """The global names a function's code reads, its nested functions' and lambdas' included (a
    decorator factory's inner `decorator` and `wrapper` read what the outer code never names)."""
    if code is None:
        return []
    names = list(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names += code_names(const)
    return names


def definition_names(code):
    """The names a `def` or `class` statement reads when it runs, apart from what its functions' bodies read
    (their code is read apart): its decorators (`@triton.autotune(configs=tuning_configs())`), its
    arguments' defaults, and for a class its bases (`nn` for `nn.Module`), its methods' decorators and
    defaults and its class attributes' values (`@abstractmethod`, `x = SOME_CONSTANT`)."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return []
    parts = list(getattr(node, "decorator_list", []))

    def defaults(fn):
        return list(fn.args.defaults) + [d for d in fn.args.kw_defaults if d is not None]

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        parts += defaults(node)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        parts.append(node.value)  # a copied global's own statement runs its value
    elif isinstance(node, ast.ClassDef):
        parts += node.bases + [k.value for k in node.keywords]
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parts += item.decorator_list + defaults(item)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)) and item.value is not None:
                parts.append(item.value)
    return [n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)]


def named_globals(names, globs, imports):
    found = []
    for name in names:
        if name not in globs:
            continue
        g = globs[name]
        if inspect.ismodule(g):
            # Any module the copied code reads: torch and the standard library as they are, others (the
            # project's own modules, packages) declared at the top of repro.py as what it needs.
            imports.add(f"import {g.__name__} as {name}" if g.__name__ != name else f"import {name}")
            continue
        if type(g).__name__ == "CustomOpDef":
            found.append((g, name))  # carried with its registration
            continue
        if isinstance(g, enum.Enum) and "." not in type(g).__qualname__:
            cls = type(g).__qualname__
            if library_attribute(type(g), cls):
                # A library's or the standard library's enum member (`EJECT` from `enum`): named, not copied.
                imports.update({f"from {type(g).__module__} import {cls}", f"{name} = {cls}.{g.name}"})
            else:
                # The project's own: its class is copied, the member named after it.
                found.append((Assigned(f"{name} = {cls}.{g.name}\n", globs), name))
            continue
        if isinstance(g, logging.Logger):
            # `logger = logging.getLogger(__name__)`: the same logger by name.
            imports.update({"import logging", f"{name} = logging.getLogger({g.name!r})"})
            continue
        if partial_of_library(g):
            # `autocast_custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")`.
            func = g.func
            args = [repr(a) for a in g.args] + [f"{k}={v!r}" for k, v in g.keywords.items()]
            imports.update({"import functools", f"import {func.__module__}"})
            imports.add(f"{name} = functools.partial({func.__module__}.{func.__qualname__}, {', '.join(args)})")
            continue
        if type(g).__name__ == "constexpr" and plain_literal(getattr(g, "value", None)):
            # A Triton kernel's global (`BLOCK = tl.constexpr(64)`): Triton reads only constexpr globals.
            imports.add("import triton.language")
            imports.add(f"{name} = triton.language.constexpr({g.value!r})")
            continue
        inner = python_function(g)
        if is_triton_kernel(g) or inspect.isfunction(inner) or inspect.isclass(g):
            mod = getattr(inner, "__module__", "") or ""
            real = getattr(inner, "__name__", name)
            if library_attribute(g, real, mod):
                # A library's function or class the user imported by name (`from torch.library import
                # wrap_triton`, `from functools import partial`, `from packaging.version import Version`):
                # imported the same way, and an installed package is named in what repro.py needs.
                imports.add(f"from {mod} import {real}" + (f" as {name}" if real != name else ""))
                continue
            found.append((g, name))
        elif plain_literal(g):
            imports.add(f"{name} = {g!r}")
        elif library_attribute(g, name):
            # A library's object imported by name (`from typing import Callable`).
            imports.add(f"from {g.__module__} import {name}")
        else:
            statement = assignment_source(globs, name)
            if statement is not None:
                found.append((Assigned(*statement), name))
    return found


def library_attribute(g, name, module=None):
    """Whether `g` is what a library's module (not the project's) holds as `name`: its own `__module__`,
    or `module`."""
    module = module or getattr(g, "__module__", None)
    if not isinstance(module, str) or not module or requirement(module.split(".")[0]) == "project":
        return False
    try:
        return getattr(sys.modules.get(module), name, None) is g
    except Exception:  # noqa: BLE001 - a lazy module attribute that fails to load: not this
        return False


@dataclass(eq=False)
class Assigned:
    """A global of the user's module that repro.py writes as a statement: the module's own assignment of it
    (a list of `triton.Config`s, a table of kernels), or a project enum's member named after its class.
    `globs` is the module's namespace, where the names the statement reads are found."""

    code: str
    globs: dict


def assignment_source(globs, name, depth=0):
    """The source of the last top-level `name = ...` statement in the module whose namespace is `globs`,
    with the namespace it reads from; followed through `from module import name` (a table that
    `liger_kernel.ops.utils` defines and the op's module imports). None where there is no such file or
    `name` is bound another way."""
    path = globs.get("__file__")
    if depth > 4 or not path or not path.endswith(".py"):
        return None
    try:
        with open(path) as f:
            text = f.read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    found, imported = None, None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            targets = []
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        found, imported = None, (node, alias.name)
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found, imported = node, None
    if found is not None:
        return textwrap.dedent(ast.get_source_segment(text, found) or "") + "\n", globs
    if imported is None:
        return None
    node, original = imported
    try:
        module = importlib.util.resolve_name("." * node.level + (node.module or ""), globs.get("__package__"))
    except (ImportError, ValueError):
        return None
    source = sys.modules.get(module)
    got = assignment_source(vars(source), original, depth + 1) if source is not None else None
    if got is None:
        return None
    code, where = got
    return (code + (f"{name} = {original}\n" if original != name else "")), where


def partial_of_library(g):
    """Whether `g` is a `functools.partial` of a library's top-level function with literal arguments,
    which repro.py can write as one line."""
    import functools

    if type(g) is not functools.partial:
        return False
    return (
        library_attribute(g.func, getattr(g.func, "__qualname__", ""))
        and all(plain_literal(a) for a in g.args)
        and all(plain_literal(v) for v in g.keywords.values())
    )


def plain_literal(v, depth=0):
    """Whether `v` is written back exactly by its repr: a number, string, bool or None, or a (small) dict,
    list, tuple or set of those (a flag table the copied code reads)."""
    # Exactly these types: a subclass's repr (an IntEnum's or a StrEnum's `<Flag.X: 'x'>`) is no literal.
    if type(v) in (bool, int, float, str) or v is None:
        return not (type(v) is float and v != v) and v not in (float("inf"), float("-inf"))
    if depth > 4 or type(v) not in (dict, list, tuple, set) or len(v) > 256:
        return False
    items = list(v.items()) if isinstance(v, dict) else [(x, None) for x in v]
    return all(plain_literal(k, depth + 1) and plain_literal(x, depth + 1) for k, x in items)


def custom_op_source(qual, opdef, missing):
    """repro.py's definition of a Python custom op: its kernels' source without decorators, registered
    again under the same name and schema, so `torch.ops.<ns>.<op>` means the same thing."""
    init = opdef._init_fn
    code = source_of(init)
    if code is None:
        missing.append(f"custom op {qual}: the source of {getattr(init, '__qualname__', init)} cannot be read")
        return None, []
    var = init.__name__
    schema = str(opdef._opoverload._schema)
    schema = schema[schema.index("(") :]
    mutates = tuple(
        a.name for a in opdef._opoverload._schema.arguments if a.alias_info is not None and a.alias_info.is_write
    )
    backends = dict(getattr(opdef, "_backend_fns", {}) or {})
    devices = sorted((d for d, f in backends.items() if f is init and d is not None), key=str)
    device_types = None if not backends or None in backends else (devices or None)
    parts = [
        strip_decorators(code),
        f"{var} = torch.library.custom_op({qual!r}, mutates_args={mutates!r}, "
        f"device_types={device_types!r}, schema={schema!r})({var})",
    ]
    deps = [init]
    for device, fn in sorted(backends.items(), key=lambda kv: str(kv[0])):
        if fn is init or device is None:
            continue
        src = source_of(fn)
        if src is None:
            missing.append(f"custom op {qual}: the source of its {device} kernel cannot be read")
            continue
        parts += [strip_decorators(src), f"{var}.register_kernel({device!r}, {fn.__name__})"]
        deps.append(fn)
    fake = getattr(opdef, "_abstract_fn", None)
    fake_src = source_of(fake) if fake is not None else None
    if fake_src is not None and fake.__name__ != "<lambda>":
        # Only tracing needs the fake; carried so the repro also works under torch.compile.
        parts += [strip_decorators(fake_src), f"{var}.register_fake({fake.__name__})"]
    # Its backward (register_autograd): a backward node of a training step runs it.
    backward, setup = getattr(opdef, "_backward_fn", None), getattr(opdef, "_setup_context_fn", None)
    if backward is not None:
        for fn in (setup, backward):
            if fn is None:
                continue
            src = source_of(fn)
            if src is None:
                missing.append(
                    f"custom op {qual}: the source of its autograd function "
                    f"{getattr(fn, '__qualname__', fn)} cannot be read"
                )
                continue
            parts.append(strip_decorators(src))
            deps.append(fn)
        context = f", setup_context={setup.__name__}" if setup is not None else ""
        parts.append(f"{var}.register_autograd({backward.__name__}{context})")
    return "\n\n".join(parts) + "\n", deps


@dataclass
class ModuleSpec:
    """A module the kept steps call: built from code (`ctor`) with its state dict, or pickled whole. For a
    module of the user's own class, `cls` is that class (or the classes of it and its children), whose
    source repro.py carries."""

    name: str
    ctor: Optional[str]
    cls: Optional[type] = None


PLAIN = (bool, int, float, str, type(None))


def revived_ctor(name, m, prefix="", classes=None):
    """For a module of the user's own class whose attributes are plain values and whose children are
    torch.nn modules or such modules themselves: source that makes an instance without running its
    __init__ (whose arguments are unknown), sets those attributes, builds its children the same way and
    registers its parameters and buffers from the saved state dict (of module `name`, under `prefix`).
    The user's classes it needs are appended to `classes`. None when that cannot be done."""
    if source_of(type(m)) is None:
        return None
    attrs = {k: v for k, v in vars(m).items() if not k.startswith("_") and k != "training"}
    plain = all(
        isinstance(v, PLAIN) or (isinstance(v, tuple) and all(isinstance(x, PLAIN) for x in v)) for v in attrs.values()
    )
    if not plain:
        return None
    found = [] if classes is None else classes
    children = []
    for child_name, child in m.named_children():
        import torch

        ctor = checked_ctor(child, torch) or revived_ctor(name, child, f"{prefix}{child_name}.", found)
        if ctor is None:
            return None
        children.append(f"{child_name!r}: {ctor}")
    found.append(type(m))
    params = [k for k, v in m._parameters.items() if v is not None]
    buffers = [k for k, v in m._buffers.items() if v is not None]
    more = f", {prefix!r}, {{{', '.join(children)}}}" if prefix or children else ""
    return f"revive({type(m).__name__}, {attrs!r}, {params!r}, {buffers!r}, data['states'][{name!r}]{more})"


def module_ctor(m, nn):
    """Python source that builds a module of the same class and configuration as `m` (not its weights),
    for torch.nn leaf modules whose repr is their constructor call and for Sequential/ModuleList of those;
    None otherwise."""
    cls = type(m)
    if getattr(nn, cls.__name__, None) is not cls:
        return None
    children = list(m.named_children())
    if cls.__name__ in ("Sequential", "ModuleList"):
        parts = [module_ctor(c, nn) for _, c in children]
        if any(p is None for p in parts):
            return None
        if [n for n, _ in children] == [str(i) for i in range(len(children))]:
            inner = ", ".join(parts)
            if cls.__name__ == "Sequential":
                return f"torch.nn.Sequential({inner})"
            return f"torch.nn.ModuleList([{inner}])"
        if cls.__name__ == "Sequential":
            pairs = ", ".join(f"({n!r}, {p})" for (n, _), p in zip(children, parts))
            return f"torch.nn.Sequential(collections.OrderedDict([{pairs}]))"
        return None
    if children:
        return None
    text = repr(m)
    if "\n" in text or not text.startswith(cls.__name__ + "("):
        return None
    return "torch.nn." + text


def checked_ctor(m, torch):
    """`module_ctor`, kept only when what it builds has `m`'s class, repr and state-dict layout."""
    ctor = module_ctor(m, torch.nn)
    if ctor is None:
        return None
    try:
        built = eval(ctor, {"__builtins__": {}, "torch": torch, "collections": collections})  # noqa: S307 - our own text
    except Exception:  # noqa: BLE001 - any failure means: this module is pickled instead
        return None
    want = {k: (tuple(v.shape), v.dtype) for k, v in m.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in built.state_dict().items()}
    if type(built) is not type(m) or repr(built) != repr(m) or got != {k: s for k, (s, _) in want.items()}:
        return None
    return ctor


# repro.py's training runtime when it keeps backward or optimizer nodes: the harness's own arithmetic
# (cut, add_grads, node_backward, optimizer_from_spec: copied from their source, so repro.py computes
# exactly what the harness did) and the state it keeps between nodes.
TRAINING_GLUE = """\
LEAVES, GRAPHS, GRADS, CONTRIBUTED = [], {}, {}, set()


def forward_done(name, out, module):
    params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    GRAPHS[name] = (list(LEAVES), params, out)
    LEAVES.clear()


def give_grad(name, grads):
    add_grads(GRADS, name, grads)
    CONTRIBUTED.add(name)


def backward(name, recorded):
    # Node `name`'s own backward, on the gradient the nodes after it passed back (else the recorded one).
    leaves, params, out = GRAPHS[name]
    grads = GRADS.get(name, {}) if name in CONTRIBUTED else {i: g.to(DEVICE) for i, g in (recorded or {}).items()}
    leaf_grads, _ = node_backward(leaves, params, out, grads)
    for producer, i, g in leaf_grads:
        give_grad(producer, {i: g})


def update(optimizer_class, spec, params_state, grads):
    # The optimizer rebuilt over the recorded parameters, with its recorded state, on the recorded grads.
    params = {n: torch.nn.Parameter(t.to(DEVICE)) for n, t in params_state.items()}
    for n, p in params.items():
        g = grads.get(n)
        p.grad = None if g is None else g.to(device=DEVICE, dtype=p.dtype)
    optimizer_from_spec(optimizer_class, spec, params).step()
"""


def launch_helpers():
    """repro.py's announcement of each Triton launch (the harness's own), indented like the template."""
    text = "# --- every Triton launch says its kernel, as in the harness's runs ---\n"
    text += f"LAUNCH = {LAUNCH!r}\n\n\n" + inspect.getsource(announce_triton_launches) + "\n\n"
    return textwrap.indent(text, "        ").lstrip()


def generation_helpers():
    """repro.py's generator of the values it does not ship, indented like the template."""
    text = "# --- values generated from their recorded shape, dtype and range ---\n"
    text += "\n\n".join(inspect.getsource(f) for f in (regenerate,)) + "\n\n"
    return textwrap.indent(text, "        ").lstrip()


def training_helpers():
    """repro.py's training runtime, indented like the template it goes into."""
    shared = [inspect.getsource(f) for f in (cut, add_grads, node_backward, optimizer_from_spec, run_loss_call)]
    text = "# --- the training step: forward nodes on fresh leaves, each backward node alone, the update ---\n"
    text += "\n\n".join(shared + [TRAINING_GLUE])
    return textwrap.indent(text, "        ").lstrip()


def training_call(s, needs):
    """repro.py's lines for a loss, backward or optimizer node."""
    begin, end = markers(s)
    if s.kind == "loss":
        body = ""
        if needs.loss_ref:
            # The user's own loss, forward and backward, on the inputs it had in the captured step.
            body = (
                f"    with autocast():\n"
                f"        run_loss_call({needs.loss_ref}, data['loss_call']['args'], data['loss_call']['kwargs'], "
                "DEVICE)\n"
            )
        body += (
            "    for name, g in data['output_grads'].items():\n"
            "        give_grad(name, {i: x.to(DEVICE) for i, x in g.items()})\n"
        )
    elif s.kind == "backward":
        body = f"    backward({s.target!r}, data['grads'].get({s.target!r}))\n"
    else:
        body = f"    update({needs.optimizer_ref}, data['optimizer'], data['params'], data['param_grads'])\n"
    return f"    print({begin!r}, flush=True)\n{body}    sync()\n    print({end!r}, flush=True)"


def docstring_text(text):
    """`text` safe inside a triple-quoted docstring at column 0: every line's own indentation removed,
    backslashes and triple quotes escaped."""
    lines = [line.strip() for line in text.replace("\r", "").split("\n")]
    return "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def render_repro(kept, boundary_names, modules, title, device="cuda", needs=None):
    """repro.py's text: markers and a synchronise around every node, like the harness, so the classifier
    reads it the same way. Raises ExtractError naming what it could not carry."""
    needs = needs or Needs()
    needs.imports.update({"import contextlib", "import os", "import sys", "import torch", "import torch.utils._pytree"})
    lines = []
    differentiated = {s.target for s in kept if s.kind == "backward"}
    for s in kept:
        if s.kind in TRAINING_KINDS:
            lines.append(training_call(s, needs))
            continue
        fmt = None
        if s.name in differentiated:
            # Its inputs become fresh leaves, so its backward is its own alone.
            fmt = "cut(env[{name!r}], {name!r}, LEAVES" + (", clone=True)" if s.inplace else ")")
        args = ", ".join(
            [literal(a, fmt) for a in (s.args[1:] if s.kind == "call_method" else s.args)]
            + [f"{k}={literal(v, fmt)}" for k, v in s.kwargs.items()]
        )
        prelude = ""
        if s.kind == "call_recorded":
            # A call found by descending into a module kept whole: its recorded (args, kwargs), cut into
            # fresh leaves once when its backward is kept (as the harness's forward step does).
            prelude = f"    rec = {literal(s.args[0], fmt)}\n"
            rec = "rec"
            if s.via == "call_module":
                expr = f"modules[{s.target!r}](*{rec}[0], **{rec}[1])"
            elif s.via == "call_method":
                expr = f"getattr({rec}[0][0], {s.target!r})(*{rec}[0][1:], **{rec}[1])"
            else:
                expr = f"{function_ref(s.target, needs)}(*{rec}[0], **{rec}[1])"
        elif s.kind == "call_module":
            expr = f"modules[{s.target!r}]({args})"
        elif s.kind == "call_method":
            expr = f"{literal(s.args[0], fmt)}.{s.target}({args})"
        else:
            expr = f"{function_ref(s.target, needs)}({args})"
        begin, end = markers(s)
        done = ""
        if s.name in differentiated:
            module = f"modules[{s.module!r}]" if s.module is not None else "None"
            done = f"    forward_done({s.name!r}, env[{s.name!r}], {module})\n"
        lines.append(
            f"    print({begin!r}, flush=True)\n"
            f"{prelude}"
            f"    with autocast():\n"
            f"        env[{s.name!r}] = {expr}\n"
            f"{done}"
            f"    sync()\n"
            f"    print({end!r}, flush=True)"
        )
    # The user's own module classes that repro.py revives from code.
    for spec in modules:
        if spec.ctor and spec.cls is not None:
            needs.user_fns.extend(spec.cls if isinstance(spec.cls, tuple) else (spec.cls,))
    op_sources, op_deps = [], []
    for qual, opdef in needs.custom_ops.items():
        src, deps = custom_op_source(qual, opdef, needs.missing)
        if src:
            op_sources.append(src)
            # What the op's kernels call (Triton kernels, helpers, constants), copied like any user code.
            for fn in deps:
                op_deps.extend(globals_used(fn, needs.imports))
    # (value, name) pairs keep the names the op's kernels use (`kernel = triton.jit(...)`).
    extra_imports, sources = user_source(op_deps + needs.user_fns, needs.missing, set(needs.custom_ops))
    if needs.missing:
        raise ExtractError("; ".join(dict.fromkeys(needs.missing)))
    needs.imports.update(extra_imports)
    if any(s.ctor and "collections." in s.ctor for s in modules):
        needs.imports.add("import collections")
    pickled = [s.name for s in modules if s.ctor is None]
    triton = any("triton" in i for i in needs.imports)
    tops = sorted({t for t in map(import_top, needs.imports) if t})
    packages = [t for t in tops if requirement(t) == "package"]
    project = [t for t in tops if requirement(t) == "project"]
    needs.project = project
    needs.requires = ["torch"] + (["triton"] if triton else []) + packages
    if packages:
        needs.notes.append(f"these installed packages: {', '.join(packages)}")
    if project:
        needs.notes.append(
            f"the project under test at the culprit commit on PYTHONPATH (the copied code imports "
            f"{', '.join(project)}); reproduce.sh checks it out"
        )
    notes = "".join(f"\nNeeds: {n}." for n in needs.notes)
    if needs.generated:
        values_text = (
            f"{needs.generated} large recorded values are generated from their recorded shape, dtype\n"
            "and range (extremes in place: the fault was checked to show that way); the rest of\n"
            "repro_data.pt is exact;"
        )
    else:
        values_text = "The tensors in repro_data.pt are the exact values the full model produced, not random stand-ins;"
    base = "torch and triton" if triton else "torch"
    needs_text = f"{base}, and what follows" if packages or project else f"only {base}"
    # The template is dedented before anything is put in it: a title or note of several lines (at any
    # indentation) can never change how the rest is indented.
    doc = docstring_text(
        f"{title}\n\nGenerated by cudabisect. Needs {needs_text}.{notes}\n"
        "Run: CUDA_LAUNCH_BLOCKING=1 python repro.py   (exit status 1 and the CUDA error mean it "
        f"reproduced)\n{values_text}\n"
        "it loads with weights_only=True (no code runs when it is opened)."
    )
    head = (
        "#!/usr/bin/env python3\n"
        f'"""{doc}\n"""\n'
        "from __future__ import annotations\n"
        f"# cudabisect-needs-project: {', '.join(project)}\n"
    )
    plain = sorted(i for i in needs.imports if i.startswith(("import ", "from ")))
    consts = sorted(i for i in needs.imports if not i.startswith(("import ", "from ")))
    body = "\n".join(plain) + "\n\n"
    if consts:
        body += "\n".join(consts) + "\n\n"
    if sources or op_sources:
        body += "# --- the model's own code that the kept nodes call, copied from its source ---\n\n"
        body += "\n\n".join(sources + op_sources) + "\n\n"
    body += textwrap.dedent(f"""\
        DEVICE = os.environ.get("REPRO_DEVICE", {device!r})
        HERE = os.path.dirname(os.path.abspath(__file__))


        def to_device(v):
            return torch.utils._pytree.tree_map(lambda x: x.to(DEVICE) if isinstance(x, torch.Tensor) else x, v)


        def sync():
            if DEVICE.startswith("cuda"):
                torch.cuda.synchronize()


        # The autocast the captured step ran its forward and loss under (None: none).
        AUTOCAST = {needs.autocast!r}


        def autocast():
            if not AUTOCAST:
                return contextlib.nullcontext()
            kind = "cuda" if DEVICE.startswith("cuda") else "cpu"
            return torch.autocast(device_type=kind, dtype=getattr(torch, AUTOCAST["dtype"]))


        def revive(cls, attrs, params, buffers, state, prefix="", children=None):
            # A module of the model's own class, without its __init__: plain attributes, its children
            # (built the same way), then its tensors (under `prefix` in the state dict).
            module = cls.__new__(cls)
            torch.nn.Module.__init__(module)
            for k, v in attrs.items():
                setattr(module, k, v)
            for k, child in (children or {{}}).items():
                setattr(module, k, child)
            for k in params:
                module.register_parameter(k, torch.nn.Parameter(state[prefix + k]))
            for k in buffers:
                module.register_buffer(k, state[prefix + k])
            return module


        {training_helpers() if any(s.kind in TRAINING_KINDS for s in kept) else ""}
        {generation_helpers() if needs.generated else ""}
        {launch_helpers()}
        def main():
            announce_triton_launches()
            data = torch.load(os.path.join(HERE, "repro_data.pt"), weights_only=True)
            {"data = regenerate(data, DEVICE)" if needs.generated else ""}
            # Inputs of the kept nodes that cut nodes made: {sorted(boundary_names)}
            env = to_device(data["values"])

            def build(name, module):
                # The module's exact parameters and buffers, in their own dtypes.
                module.load_state_dict(data["states"][name], assign=True)
                return module.train(data["training"][name]).to(DEVICE)

            modules = {{}}
        """)
    for spec in modules:
        if spec.ctor:
            body += f"    modules[{spec.name!r}] = build({spec.name!r}, {spec.ctor})\n"
    if pickled:
        body += (
            "    # NOT STANDALONE: the model's own module classes, pickled whole; opening this file runs\n"
            "    # code from their package, which must be importable.\n"
            '    pickled = torch.load(os.path.join(HERE, "repro_modules.pt"), weights_only=False)\n'
        )
        for name in pickled:
            body += f"    modules[{name!r}] = pickled[{name!r}].to(DEVICE)\n"
    body += "\n".join(lines) + "\n"
    body += textwrap.dedent("""\
            print("repro: ran clean", flush=True)


        if __name__ == "__main__":
            try:
                main()
            except Exception:
                import traceback
                traceback.print_exc(file=sys.stdout)
                sys.exit(1)
        """)
    text = head + body
    timing("extract: text made")
    problem = lint(text)
    if problem:
        raise ExtractError(f"a defect of cudabisect's code generator: the repro.py it generated {problem}", text)
    return text


def lint(text):
    """Why generated code must not be written (it does not compile, or pyflakes, when installed, finds a
    name it never defines), else None."""
    try:
        compile(text, "repro.py", "exec")
    except SyntaxError as e:
        return f"does not compile: {e}"
    try:
        from pyflakes import api, reporter
    except ImportError:
        return None
    import io

    out = io.StringIO()
    api.check(text, "repro.py", reporter.Reporter(out, out))
    # repro.py never evaluates an annotation (`from __future__ import annotations`): a copied
    # `def decorator(func: F) -> F` may name a TypeVar it does not carry.
    annotations = annotation_names(text)
    undefined = [
        line
        for line in out.getvalue().splitlines()
        if "undefined name" in line and (line.split(":")[1], line.rsplit("'", 2)[-2]) not in annotations
    ]
    return f"uses a name it never defines: {undefined[0]}" if undefined else None


def annotation_names(text):
    """(line as text, name) for every name read inside an annotation of `text`."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        parts = []
        if isinstance(node, ast.arg):
            parts.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        for part in parts:
            for n in ast.walk(part) if part is not None else ():
                if isinstance(n, ast.Name):
                    found.add((str(n.lineno), n.id))
                elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                    # A string annotation: its names, on its own line.
                    try:
                        inner = ast.parse(n.value, mode="eval")
                    except SyntaxError:
                        continue
                    found.update((str(n.lineno), m.id) for m in ast.walk(inner) if isinstance(m, ast.Name))
    return found


def optimizer_spec(opt, root):
    """An optimizer as plain data: its class, its groups by parameter name, its state dict."""
    names = {id(p): n for n, p in root.named_parameters()}
    groups = []
    for g in opt.param_groups:
        group = {k: v for k, v in g.items() if k != "params"}
        group["params"] = [names[id(p)] for p in g["params"] if id(p) in names]
        groups.append(group)
    cls = type(opt)
    return {"cls": f"{cls.__module__}.{cls.__qualname__}", "groups": groups, "state": opt.state_dict()}


def repro_steps(kept, w):
    """The kept steps with each kept backward node's forward run first when it is not kept itself."""
    forward = {s.name: s for s in w.forward_steps}
    out, done = [], set()
    for s in kept:
        if s.kind == "backward" and s.target not in done and s.target in forward:
            out.append(forward[s.target])
            done.add(s.target)
        if s.name not in done:
            out.append(s)
            done.add(s.name)
    return out


def safe_value(v):
    """`v` in the types repro_data.pt may hold (it loads with weights_only=True): a model's output object
    (a `ModelOutput`, a dataclass, any dict subclass) as a plain dict of its fields, recursively, and
    objects of other types left out."""
    import dataclasses

    if isinstance(v, dict):
        return {k: safe_value(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: safe_value(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, list):
        return [safe_value(x) for x in v]
    if isinstance(v, tuple):
        return tuple(safe_value(x) for x in v)
    import torch

    if v is None or isinstance(
        v,
        (
            bool,
            int,
            float,
            complex,
            str,
            bytes,
            slice,
            torch.Tensor,
            torch.dtype,
            torch.device,
            torch.Size,
            torch.memory_format,
            torch.layout,
        ),
    ):
        return v
    return None  # an object of the library's own (a key-value cache): no kept node reads it from here


# The name repro.py's `modules` gives a loss that is a module object of the user's own class.
LOSS_MODULE = "cudabisect_loss"


def loss_reference(spec, needs):
    """How repro.py names the captured loss: a function by `function_ref`, a method of the user's class
    (an autograd.Function's apply) by the class's copied source, a torch.nn module by its constructor, a
    module of the user's own class revived like the model's (`revived_ctor`, under LOSS_MODULE); an
    object's method it cannot carry."""
    fn = spec["fn"]
    if "qualname" in fn:
        return function_ref(loss_callable(spec), needs)
    owner = fn["object"]
    if isinstance(owner, type):
        if owner.__module__.split(".")[0] == "torch":
            needs.imports.add("import torch")
            return f"{owner.__module__}.{owner.__qualname__}.{fn['method']}"
        needs.user_fns.append(owner)
        return f"{owner.__name__}.{fn['method']}"
    ctor = checked_ctor(owner, importlib.import_module("torch")) if hasattr(owner, "state_dict") else None
    if ctor:
        return f"{ctor}.{fn['method']}"
    if hasattr(owner, "state_dict") and revived_ctor(LOSS_MODULE, owner) is not None:
        needs.loss_module = owner
        return f"modules[{LOSS_MODULE!r}].{fn['method']}"
    raise ExtractError(
        f"the loss is the {fn['method']} of a {type(owner).__qualname__} object, which repro.py "
        "cannot rebuild from code"
    )


def training_data(kept, w, env, recording, needs):
    """What repro.py's training nodes read: recorded gradients, the optimizer, the parameters."""
    data = {"grads": {}, "output_grads": {}}

    def recorded(name):
        path = os.path.join(recording or "", f"{name}.pt")
        return load_recorded(path) if recording and os.path.exists(path) else None

    for s in kept:
        if s.kind == "backward":
            g = env.get(grad_name(s.target)) or recorded(grad_name(s.target))
            if g is not None:
                data["grads"][s.target] = to_device(g, "cpu")
        elif s.kind == "loss":
            spec = w.training.loss_call
            if spec is not None:
                needs.loss_ref = loss_reference(spec, needs)
                data["loss_call"] = {
                    "args": to_device(list(spec["args"]), "cpu"),
                    "kwargs": to_device(dict(spec["kwargs"]), "cpu"),
                }
            for r in refs_in(s.args):
                g = recorded(grad_name(r.name))
                if g is not None:
                    data["output_grads"][r.name] = to_device(g, "cpu")
        elif s.kind == "optimizer":
            spec = w.training.optimizer
            if not isinstance(spec, dict):
                spec = optimizer_spec(spec(w.root), w.root)
            module, _, name = spec["cls"].rpartition(".")
            if module.split(".")[0] == "torch":
                needs.optimizer_ref = spec["cls"]
            else:
                cls = importlib.import_module(module)
                for part in name.split("."):
                    cls = getattr(cls, part)
                needs.user_fns.append(cls)
                needs.optimizer_ref = cls.__name__
            data["optimizer"] = to_device(spec, "cpu")
            data["params"] = {n: p.detach().cpu() for n, p in w.root.named_parameters()}
            grads = (
                w.training.param_grads
                if w.training.param_grads is not None
                else (env.get(GRADS_VALUE) or recorded(GRADS_VALUE) or {})
            )
            data["param_grads"] = to_device(grads, "cpu")
    return data


def extract(kept, root, env, out_dir, title, device, w=None, recording=None, generate_over=None, autocast=None):
    """Writes repro.py, repro_data.pt (safe to open) and, only for the model's own module classes,
    repro_modules.pt (a full pickle); returns what it wrote, for the protocol's answer. With `w` (a
    training graph) it also writes the backward and update nodes it keeps."""
    import torch

    timing("extract: start")
    specs, states, training, pickled = [], {}, {}, {}
    needs = Needs(autocast=autocast)
    extra = {}
    if w is not None:
        kept = repro_steps(kept, w)
        for s in kept:
            s.inplace = s.kind not in TRAINING_KINDS and step_is_inplace(s, root)
        extra = training_data(kept, w, env, recording, needs)
        timing("extract: training data")
    for s in kept:
        if s.module is None or s.module in states or s.module in pickled:
            continue
        m = root.get_submodule(s.module).cpu()
        ctor = checked_ctor(m, torch)
        own = None
        if ctor is None:
            classes = []
            ctor = revived_ctor(s.module, m, classes=classes)
            own = tuple(classes) if ctor else None
        specs.append(ModuleSpec(s.module, ctor, own))
        if ctor:
            states[s.module] = m.state_dict()
            training[s.module] = m.training
        else:
            pickled[s.module] = m
    if needs.loss_module is not None:
        # The loss's module, built like a kept module of the model's own class.
        m, classes = needs.loss_module, []
        specs.append(ModuleSpec(LOSS_MODULE, revived_ctor(LOSS_MODULE, m, classes=classes), tuple(classes)))
        states[LOSS_MODULE] = to_device(m.state_dict(), "cpu")
        training[LOSS_MODULE] = m.training
    foreign = sorted({f"{type(m).__module__}.{type(m).__name__}" for m in pickled.values()})
    if foreign:
        title += (
            "\n\nNOT STANDALONE: it unpickles the model's own module classes "
            f"({', '.join(foreign)}) from repro_modules.pt, so their package must be importable."
        )
        print(f"harness: repro.py needs the model's package for {', '.join(foreign)}", file=sys.stderr)
    timing("extract: modules")
    names = sorted(env)
    data = {"values": {k: safe_value(to_device(env[k], "cpu")) for k in names}, "states": states, "training": training}
    data.update(extra)
    generated = 0
    if generate_over is not None:
        for key in ("values", "grads", "output_grads", "param_grads"):
            if key in data:
                data[key] = with_generated(data[key], generate_over)
        generated = count_generated(data)
    needs.generated = generated
    timing("extract: values")
    os.makedirs(out_dir, exist_ok=True)
    try:
        text = render_repro(kept, names, specs, title, device, needs)
    except ExtractError as e:
        if e.text:
            # The text that failed, for the defect report.
            rejected = os.path.join(out_dir, "repro.py.rejected")
            with open(rejected, "w") as f:
                f.write(e.text)
            raise ExtractError(f"{e} (the text: {rejected})") from e
        raise
    timing("extract: repro.py rendered")
    data_path = os.path.join(out_dir, "repro_data.pt")
    torch.save(data, data_path)
    timing("extract: data saved")
    try:
        store.load(data_path, weights_only=True)  # mapped: what is checked is that it unpickles safely
    except Exception as e:  # whatever torch refuses, the bundle would not open safely
        raise ExtractError(f"a recorded value cannot be saved in a safe form: {e}") from e
    if pickled:
        torch.save(pickled, os.path.join(out_dir, "repro_modules.pt"))
    path = os.path.join(out_dir, "repro.py")
    with open(path, "w") as f:
        f.write(text)
    return {
        "repro": path,
        "nodes": [s.name for s in kept],
        "standalone": not pickled and not needs.project,
        "pickled_modules": sorted(pickled),
        "requires": needs.requires,
        "project": needs.project,
        "generated": generated,
        "bytes": os.path.getsize(data_path),
    }
