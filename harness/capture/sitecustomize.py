"""cudabisect's capture of a faulting training step from the user's own script, with no change to it.

Python imports `sitecustomize` at start-up; cudabisect puts this directory first on PYTHONPATH for two runs
of the repro command, and this file does nothing unless CUDABISECT_CAPTURE is set (like coverage.py's
process start-up hook). A run served by a warm interpreter (which imported `sitecustomize` long before)
names this directory in CUDABISECT_CAPTURE_HOOK instead, and its forked child loads this file before the
script runs:

    CUDABISECT_CAPTURE=find     note the step, the phase (forward, loss, backward, optimizer) and the module
                                and Triton kernel that were running when the run failed: fault.json
    CUDABISECT_CAPTURE=replay   the same run again (same seeds); at the start of the faulting step's model
                                call, save what the harness needs to run that step alone: the model (a
                                pickle, the script's own classes through cudabisect_main.py), the batch, the
                                optimizer's class, groups and state, then the gradient that reached the
                                model's output and the gradients the optimizer saw: capture.json and *.pt

Everything goes to CUDABISECT_CAPTURE_DIR. Only the first process of the run captures (not data-loader
workers), and of several ranks only CUDABISECT_FAULT_RANK (default 0).
"""

import ast
import atexit
import json
import os
import sys
import weakref

MODE = os.environ.get("CUDABISECT_CAPTURE")
OUT = os.environ.get("CUDABISECT_CAPTURE_DIR")


def _mine():
    if MODE not in ("find", "replay") or not OUT:
        return False
    if os.environ.get("CUDABISECT_CAPTURE_PID", str(os.getpid())) != str(os.getpid()):
        return False  # a child process (a data-loader worker): the first process captures
    rank = os.environ.get("RANK")
    return rank is None or rank == os.environ.get("CUDABISECT_FAULT_RANK", "0")


STATE = {
    "step": 1,
    "phase": "setup",
    "depth": 0,
    "call": 0,
    "module": None,
    "kernel": None,
    "exception": None,
    "forward_trace": None,
    "saved": False,
    "notes": [],
}
OPTIMIZERS = weakref.WeakSet()
ROOT = [None]


def _write_json(name, value):
    tmp = os.path.join(OUT, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, default=str)
    os.replace(tmp, os.path.join(OUT, name))


def _mark(name):
    try:
        open(os.path.join(OUT, "started-" + name), "w").close()
    except OSError:
        pass


def _fault():
    keys = ("step", "phase", "call", "module", "kernel", "exception", "forward_trace", "framework", "function")
    return {k: STATE[k] for k in keys if k in STATE}


def _seen(exc, module=None):
    """The first failure of the run, with where the step was."""
    if STATE["exception"] is not None:
        return
    STATE["exception"] = f"{type(exc).__name__}: {exc}"[:2000]
    STATE["module"] = module
    _write_json("fault.json", _fault())


def _main_script():
    """The running script's path, when it is a file."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.abspath(path) if path and os.path.exists(path) else None


def _main_module_source():
    """The script's definitions without its statements: what unpickling the script's own classes needs.
    Every kept line stays on its own line number (the rest is blank), so the harness can compile it under
    the script's own name: a fault in a class the script defines is then met at the script's own line,
    as in the user's run."""
    path = _main_script()
    if path is None:
        return None
    with open(path) as f:
        text = f.read()
    tree = ast.parse(text)
    keep = []
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            keep.append(node)
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id in defined
        ):
            # A registration on the script's own op or function (`op.register_autograd(backward)`,
            # `fn.defvjp(fwd, bwd)`): part of its definitions. A plain call (`main()`) is a statement.
            keep.append(node)
        elif isinstance(node, ast.Assign):
            try:
                ast.literal_eval(node.value)
                keep.append(node)
            except ValueError:
                pass
    lines = text.splitlines()
    kept = [""] * len(lines)
    for node in keep:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        for i in range(first - 1, node.end_lineno):
            kept[i] = lines[i]
    blanked = "\n".join(kept) + "\n"
    try:
        compile(blanked, path, "exec")
        return blanked
    except SyntaxError:  # a kept statement sharing a line with a dropped one: the definitions alone
        return ast.unparse(ast.Module(body=keep, type_ignores=[]))


def _save(torch, name, value):
    # Without the zip's checksums (torch.load does not need them; they cost seconds a gigabyte of batch):
    # the harness's store.save does the same, but this hook runs inside the user's program and imports
    # nothing of the harness.
    ser = torch.serialization
    before = ser.get_crc32_options() if hasattr(ser, "set_crc32_options") else None
    if before is not None:
        ser.set_crc32_options(False)
    try:
        torch.save(value, os.path.join(OUT, name))
    finally:
        if before is not None:
            ser.set_crc32_options(before)


def _pickle_model(torch, module):
    """Pickles the model, and the program's state its code reads (see `_program_state`); classes defined
    in the script itself are pickled as cudabisect_main's, whose source is the script's definitions."""
    if not _write_main_source() and any(type(m).__module__ == "__main__" for m in module.modules()):
        raise RuntimeError("the model's classes are defined in a script whose source cannot be read")
    with _as_cudabisect_main():
        _save(torch, "model.pt", module)
        _save(torch, "program_state.pt", _program_state(torch))


def _write_main_source():
    """Writes the script's definitions beside the capture as cudabisect_main.py, the module its own
    classes and functions are pickled as; False when its source cannot be read."""
    src = _main_module_source()
    if src is None:
        return False
    with open(os.path.join(OUT, "cudabisect_main.py"), "w") as f:
        f.write(src)
    sys.modules["cudabisect_main"] = sys.modules.get("__main__")
    return True


class _as_cudabisect_main:
    """While pickling: the script's own classes are cudabisect_main's (the script's definitions, written
    beside the capture), so the harness can unpickle them."""

    def __enter__(self):
        main = sys.modules.get("__main__")
        self.moved = (
            [v for v in vars(main).values() if isinstance(v, type) and v.__module__ == "__main__"] if main else []
        )
        for cls in self.moved:
            cls.__module__ = "cudabisect_main"

    def __exit__(self, *exc):
        for cls in self.moved:
            cls.__module__ = "__main__"
        return False


# Values of the program's state that are not saved: the model, optimizers and the like are saved on their
# own, and code is carried as source.
SKIPPED_STATE = ("Module", "Optimizer", "DataLoader", "Dataset", "Generator")
STATE_LIMIT = 16 << 20


def _picklable(value, torch):
    import pickle
    import types

    if isinstance(
        value,
        (
            types.ModuleType,
            types.FunctionType,
            types.BuiltinFunctionType,
            type,
            types.MethodType,
            classmethod,
            staticmethod,
            property,
        ),
    ):
        return False
    if any(c.__name__ in SKIPPED_STATE for c in type(value).__mro__):
        return False
    if isinstance(value, torch.Tensor) and value.numel() * value.element_size() > STATE_LIMIT:
        return False
    # Sized before pickled: a data set kept at module level (a large array, a long list) is not state.
    if getattr(value, "nbytes", 0) > STATE_LIMIT:
        return False
    try:
        if len(value) > 10000:
            return False
    except Exception:  # noqa: BLE001 - no length: a scalar or a plain object
        pass
    try:
        return len(pickle.dumps(value)) <= STATE_LIMIT
    except Exception:  # noqa: BLE001 - whatever cannot be pickled is not part of the replay
        return False


def _project_modules():
    """The script and the modules of the project (under the working directory, not installed ones)."""
    root = os.path.abspath(os.getcwd()) + os.sep
    for name, m in list(sys.modules.items()):
        path = getattr(m, "__file__", None) or ""
        if name == "__main__" or (path and os.path.abspath(path).startswith(root) and "-packages" + os.sep not in path):
            yield ("cudabisect_main" if name == "__main__" else name), m


def _code_values(module):
    """What a project module's own code gives its module-level and class-level names: {name: literal}
    for names its source assigns a literal, and the names it assigns anything else (computed at import:
    a fresh import computes them again, at whichever commit it runs). Only values the run itself changed
    are the program's state; the rest belong to the commit."""
    path = getattr(module, "__file__", None)
    literals, computed = {}, set()
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, TypeError, SyntaxError, ValueError):
        return literals, computed

    def scan(body, prefix):
        for node in body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                else []
            )
            for t in targets:
                if isinstance(t, ast.Name):
                    try:
                        if isinstance(node, ast.AugAssign) or node.value is None:
                            raise ValueError
                        literals[prefix + t.id] = ast.literal_eval(node.value)
                    except (ValueError, TypeError, SyntaxError, RecursionError):
                        computed.add(prefix + t.id)
            if isinstance(node, ast.ClassDef) and not prefix:
                scan(node.body, node.name + ".")

    scan(tree.body, "")
    return literals, computed


def _changed_by_the_run(name, value, code):
    literals, computed = code
    if name in computed:
        return False
    if name in literals:
        try:
            return bool(literals[name] != value)
        except Exception:  # noqa: BLE001 - not comparable: keep it
            return True
    return True  # set from outside the module (the script setting a library's flag)


class _NoTorch:
    """Stands in for torch where there is none (a JAX program): nothing is a tensor."""

    class Tensor:
        pass


def _program_state_plain():
    try:
        import torch
    except ImportError:
        torch = _NoTorch
    return _program_state(torch)


def _program_state(torch):
    """The program's own state at the start of the captured step, which the model's code may read: the
    module-level values of the script and of the project's modules (flags, constants, config read at
    import), and the plain attributes of their classes (a step counter kept on a class). The harness
    puts them back before it runs anything."""
    state = {}
    for name, m in _project_modules():
        values, classes = {}, {}
        # The script is replayed from its own definitions, so all of its state is kept; a project module
        # keeps only what the run changed (see `_code_values`), so the check at the parent commit runs
        # that commit's own constants.
        code = None if name == "cudabisect_main" else _code_values(m)

        def changed(k, v, code=code):
            return code is None or _changed_by_the_run(k, v, code)

        for k, v in list(vars(m).items()):
            if k.startswith("__"):
                continue
            if isinstance(v, type) and v.__module__ in (m.__name__, "cudabisect_main"):
                attrs = {
                    a: x
                    for a, x in vars(v).items()
                    if not a.startswith("__") and _picklable(x, torch) and changed(f"{k}.{a}", x)
                }
                if attrs:
                    classes[k] = attrs
            elif _picklable(v, torch) and changed(k, v):
                values[k] = v
        if values or classes:
            state[name] = {"globals": values, "classes": classes}
    return state


def _unwrap(module):
    kind = type(module).__name__
    if kind in ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel") and hasattr(module, "module"):
        return module.module, None
    if kind == "OptimizedModule" and hasattr(module, "_orig_mod"):
        return module._orig_mod, "torch.compile"
    return module, None


def _optimizer_spec(opt, names):
    groups = []
    for g in opt.param_groups:
        group = {k: v for k, v in g.items() if k != "params"}
        group["params"] = [names[id(p)] for p in g["params"] if id(p) in names]
        groups.append(group)
    cls = type(opt)
    return {"cls": f"{cls.__module__}.{cls.__qualname__}", "groups": groups, "state": opt.state_dict()}


def _autocast_spec(torch):
    """The autocast the step runs under, {device_type, dtype}, for the harness to run it the same way;
    None without."""
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                return {"device_type": device, "dtype": str(torch.get_autocast_dtype(device)).replace("torch.", "")}
        except (TypeError, RuntimeError, AttributeError):
            pass
    return None


def _device_of(torch, module, args, kwargs):
    """The device the step ran on: its parameters', else its first input tensor's."""
    from torch.utils._pytree import tree_leaves

    for t in list(module.parameters()) + [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]:
        d = t.device
        return d.type if d.index in (None, 0) else str(d)
    return None


def _save_step(torch, module, args, kwargs):
    """At the start of the faulting step's model call: the model, the batch, the optimizer."""
    root, compiled = _unwrap(module)
    ROOT[0] = root
    notes = []
    if compiled:
        notes.append(
            "the model is torch.compile'd: the harness runs its original module eagerly, so a fault "
            "inside compiled code may not show"
        )
    autocast = _autocast_spec(torch)
    # The random state at the start of the step (dropout and the like draw from it).
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    _save(torch, "rng.pt", rng)
    _pickle_model(torch, root)
    cpu = lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v  # noqa: E731
    from torch.utils._pytree import tree_map

    _save(torch, "batch.pt", {"args": tree_map(cpu, list(args)), "kwargs": tree_map(cpu, dict(kwargs))})
    names = {id(p): n for n, p in root.named_parameters()}
    for opt in list(OPTIMIZERS):
        if any(id(p) in names for g in opt.param_groups for p in g["params"]):
            _save(torch, "optimizer.pt", _optimizer_spec(opt, names))
            break
    STATE["notes"] = notes
    _write_json(
        "capture.json",
        dict(
            _fault(),
            notes=notes,
            model=f"{type(root).__module__}.{type(root).__qualname__}",
            device=_device_of(torch, root, args, kwargs),
            autocast=autocast,
            script=_main_script(),
        ),
    )


def _install_common():
    """What every capture does, whatever the framework: seeds, the record of the first failure."""
    os.environ["CUDABISECT_CAPTURE_PID"] = str(os.getpid())
    os.makedirs(OUT, exist_ok=True)
    # Marks for the driver: a run that recorded no failure is explained by which of them are missing
    # (no Python program started, or none imported torch or JAX).
    _mark("python")
    import random

    random.seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass
    hook = sys.excepthook

    def excepthook(kind, value, tb):
        _seen(value)
        return hook(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(lambda: STATE["exception"] and _write_json("fault.json", _fault()))


class _AfterImport:
    """A finder that lets the real one import `torch` or `jax`, then instruments it: a script that never
    imports one pays nothing for it (JAX would take the GPU's memory the moment it started)."""

    def __init__(self, installers):
        self.installers = installers

    def find_spec(self, name, path=None, target=None):
        if name not in self.installers:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, install = spec.loader.exec_module, self.installers.pop(name)

        def exec_module(module):
            run(module)
            _installed(name, install)

        spec.loader.exec_module = exec_module
        return spec


def _installed(name, install):
    try:
        install()
    except Exception as e:  # noqa: BLE001 - the run goes on uncaptured; the driver says what was missing
        print(f"cudabisect capture: not installed for {name}: {type(e).__name__}: {e}", file=sys.stderr)


def _install():
    _install_common()
    installers = {"torch": _install_torch, "jax": _install_jax}
    # Armed in a child of a warm interpreter (after the fork, before the script runs), a framework the
    # interpreter imported already is instrumented now; in a fresh one, right after its import.
    for name in [n for n in installers if n in sys.modules]:
        _installed(name, installers.pop(name))
    sys.meta_path.insert(0, _AfterImport(installers))


def _install_torch():
    import torch

    _mark("torch")

    STATE.setdefault("framework", "torch")
    torch.manual_seed(0)
    want_step = int(os.environ.get("CUDABISECT_CAPTURE_STEP", "0") or 0)
    want_call = int(os.environ.get("CUDABISECT_CAPTURE_CALL", "0") or 0)
    if MODE == "find":
        # The forward line that created a failing backward node (anomaly mode prints it as a warning).
        torch.autograd.set_detect_anomaly(True, check_nan=False)
        import warnings

        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            text = str(message)
            if "Traceback of forward call" in text and STATE["forward_trace"] is None:
                STATE["forward_trace"] = text[-4000:]
            return shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning

    call = torch.nn.Module.__call__

    def module_call(self, *args, **kwargs):
        top = STATE["depth"] == 0
        if top and any(True for _ in self.parameters()):
            STATE["call"] += 1
            STATE["phase"] = "forward"
            if MODE == "replay" and STATE["step"] == want_step and STATE["call"] == want_call:
                _save_step(torch, self, args, kwargs)
                STATE["saved"] = True
        STATE["depth"] += 1
        try:
            out = call(self, *args, **kwargs)
        except Exception as e:
            _seen(e, type(self).__name__)
            raise
        finally:
            STATE["depth"] -= 1
        if top and STATE["phase"] == "forward":
            STATE["phase"] = "loss"
            if MODE == "replay" and STATE["saved"] and STATE["step"] == want_step and STATE["call"] == want_call:
                _hook_output(torch, out)
                _watch_loss(torch, out, sys._getframe(1))
        return out

    torch.nn.Module.__call__ = module_call
    MODULE_CALL[0] = module_call.__code__

    backward = torch.autograd.backward

    def autograd_backward(*args, **kwargs):
        STATE["phase"] = "backward"
        _stop_watching_loss()
        try:
            return backward(*args, **kwargs)
        except Exception as e:
            _seen(e)
            raise

    torch.autograd.backward = autograd_backward

    init = torch.optim.Optimizer.__init__

    def optimizer_init(self, *args, **kwargs):
        OPTIMIZERS.add(self)
        return init(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = optimizer_init

    def pre(opt, args, kwargs):
        STATE["phase"] = "optimizer"
        if MODE == "replay" and STATE["saved"] and STATE["step"] == want_step and ROOT[0] is not None:
            names = {id(p): n for n, p in ROOT[0].named_parameters()}
            grads = {
                names[id(p)]: p.grad.detach().cpu()
                for g in opt.param_groups
                for p in g["params"]
                if id(p) in names and p.grad is not None
            }
            _save(torch, "param_grads.pt", grads)
            _save(torch, "optimizer.pt", _optimizer_spec(opt, names))

    def post(opt, args, kwargs):
        STATE["step"] += 1
        STATE["call"] = 0
        STATE["phase"] = "data"

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)
    _hook_triton()


def _hook_output(torch, out):
    """Saves the gradient that reaches each of the model's outputs (what the user's loss passed back)."""
    from torch.utils._pytree import tree_leaves

    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    grads = {}

    def keep(i):
        def hook(g):
            grads[i] = g.detach().cpu()
            _save(torch, "output_grads.pt", [grads.get(j) for j in range(len(tensors))])

        return hook

    for i, t in enumerate(tensors):
        if t.requires_grad:
            t.register_hook(keep(i))


LOSS_WATCH = {"previous": None, "on": False}


def _stop_watching_loss():
    if LOSS_WATCH["on"]:
        LOSS_WATCH["on"] = False
        sys.setprofile(LOSS_WATCH["previous"])


def _watch_loss(torch, out, step_frame):
    """After the faulting step's model call: the first call the step's own code makes that takes a
    tensor needing a gradient (the model's output or what it made of it) and returns one, or raises
    (the loss faulted), is the user's loss; so is a call on tensors that need none (a detached copy of
    the output, the batch) that raises: the step's own code faulted there. Its function and inputs are
    saved (loss_call.pt), the inputs taken from the model's output marked with their place in it, so the
    harness runs the loss phase as a node of its own. Watched with a profile function from the model's
    return to the start of the backward pass, in this thread only."""
    from torch.utils._pytree import tree_leaves

    outputs = {id(t): i for i, t in enumerate(x for x in tree_leaves(out) if isinstance(x, torch.Tensor))}
    pending = {}

    def grad_tensor(v):
        return any(isinstance(x, torch.Tensor) and x.requires_grad for x in tree_leaves(v))

    def profile(frame, event, arg):
        if event == "call" and frame.f_back is step_frame and not pending:
            try:
                spec = _call_spec(torch, frame, outputs)
            except Exception:  # noqa: BLE001 - a call whose inputs cannot be read is not the loss
                spec = None
            if spec is not None:
                pending[frame] = spec
        elif event == "return" and frame in pending:
            spec = pending.pop(frame)
            # A call on tensors that need no gradient (a detached copy of the output, the batch) is the
            # loss phase's only when it raised: the step's own code faulted there, beside the loss.
            grad = spec.pop("grad")
            if (grad and (arg is None or grad_tensor(arg))) or (not grad and arg is None and _raised(frame)):
                _stop_watching_loss()
                try:
                    with _as_cudabisect_main():
                        _save(torch, "loss_call.pt", spec)
                except Exception as e:  # noqa: BLE001 - the harness then uses the recorded gradients
                    STATE["notes"].append(f"the loss ({spec['name']}) could not be saved: {type(e).__name__}: {e}")

    LOSS_WATCH.update(previous=sys.getprofile(), on=True)
    sys.setprofile(profile)


def _raised(frame):
    """Whether a frame that is returning is unwinding an exception: its last instruction is not a return
    (the profile function sees None returned either way)."""
    import dis

    try:
        return not dis.opname[frame.f_code.co_code[frame.f_lasti]].startswith("RETURN")
    except (IndexError, AttributeError):
        return False


def _call_spec(torch, frame, outputs):
    """The function a frame runs and the arguments it was called with, when one of them is a tensor;
    `grad`: whether one needs a gradient. None when no argument is a tensor."""
    from torch.utils._pytree import tree_leaves

    code, local = frame.f_code, frame.f_locals
    n, kw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames[:n]
    args = [local[k] for k in names]
    kwargs = {k: local[k] for k in code.co_varnames[n : n + kw]}
    at = n + kw
    if code.co_flags & 0x04:  # *args
        args += list(local[code.co_varnames[at]])
        at += 1
    if code.co_flags & 0x08:  # **kwargs
        kwargs.update(local[code.co_varnames[at]])
    if code is MODULE_CALL[0]:
        fn = {"object": local["self"], "method": "__call__"}
        args, kwargs = list(local["args"]), dict(local["kwargs"])
    elif names and names[0] in ("self", "cls"):
        fn = {"object": args[0], "method": code.co_name}
        args = args[1:]
    else:
        module = frame.f_globals.get("__name__")
        fn = {"module": "cudabisect_main" if module == "__main__" else module, "qualname": code.co_qualname}
    tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    if not tensors:
        return None
    grad = any(x.requires_grad for x in tensors)

    def saved(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu()
            if id(x) in outputs:
                return {"__cudabisect__": "output", "index": outputs[id(x)], "tensor": t}
            if x.requires_grad:
                return {"__cudabisect__": "leaf", "tensor": t}
            return t
        if isinstance(x, dict):
            return {k: saved(v) for k, v in x.items()}
        if isinstance(x, list):
            return [saved(v) for v in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(saved(v) for v in x)
        return x

    name = fn.get("qualname") or f"{type(fn['object']).__name__}.{fn['method']}"
    return {"fn": fn, "args": saved(args), "kwargs": saved(kwargs), "name": name, "grad": grad}


MODULE_CALL = [None]


# JAX: a training script's jitted functions. Each top-level call of one is counted; the first that
# fails (its result is waited for inside the call, so an asynchronous fault surfaces there) is noted as
# the function and its call number; the replay saves that call's arguments, and the module
# cudabisect_jax_capture.py names the function and loads them, for the JAX harness to split into its
# equations like a function named by factories.

JAX_CALLS = {"depth": 0, "counts": {}}


def _function_name(fun):
    fun = getattr(fun, "__wrapped__", fun)
    module = getattr(fun, "__module__", None) or "?"
    return f"{'cudabisect_main' if module == '__main__' else module}:{getattr(fun, '__qualname__', '?')}"


def _install_jax():
    import jax

    _mark("jax")
    target = None
    if MODE == "replay":
        try:
            with open(os.path.join(OUT, "fault-found.json")) as f:
                target = json.load(f).get("function")
        except (OSError, ValueError):
            target = None
    want = int(os.environ.get("CUDABISECT_CAPTURE_STEP", "0") or 0)
    original = jax.jit

    def jit(fun=None, *jit_args, **jit_kwargs):
        if fun is None:
            return lambda f: jit(f, *jit_args, **jit_kwargs)
        return _Jitted(original(fun, *jit_args, **jit_kwargs), fun, target, want)

    jax.jit = jit


class _Jitted:
    """A jitted function, counted and watched (see above); everything else is the jitted object's."""

    def __init__(self, jitted, fun, target, want):
        self._jitted, self._fun = jitted, fun
        self._name, self._target, self._want = _function_name(fun), target, want
        self.__wrapped__ = fun
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            try:
                setattr(self, attr, getattr(fun, attr))
            except (AttributeError, TypeError):
                pass

    def __getattr__(self, name):
        return getattr(self._jitted, name)

    def __get__(self, obj, objtype=None):
        import functools

        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args, **kwargs):
        import jax

        if JAX_CALLS["depth"]:
            return self._jitted(*args, **kwargs)
        n = JAX_CALLS["counts"][self._name] = JAX_CALLS["counts"].get(self._name, 0) + 1
        if MODE == "replay" and self._name == self._target and n == self._want and not STATE["saved"]:
            _save_jax_call(self, args, kwargs)
            STATE["saved"] = True
        JAX_CALLS["depth"] += 1
        try:
            out = self._jitted(*args, **kwargs)
            return jax.block_until_ready(out)
        except Exception as e:
            if STATE["exception"] is None:
                STATE.update(step=n, call=1, phase="jit", function=self._name, framework="jax")
            _seen(e, self._name)
            raise
        finally:
            JAX_CALLS["depth"] -= 1


def _save_jax_call(jitted, args, kwargs):
    """The arguments of the faulting call on the host, the program's state, and the module that hands
    them to the JAX harness."""
    import pickle

    import jax

    _write_main_source()
    with _as_cudabisect_main():
        with open(os.path.join(OUT, "jax_call.pkl"), "wb") as f:
            pickle.dump(
                {"function": jitted._name, "args": jax.device_get(list(args)), "kwargs": jax.device_get(dict(kwargs))},
                f,
            )
        try:
            state = _program_state_plain()
            with open(os.path.join(OUT, "program_state.pkl"), "wb") as f:
                pickle.dump(state, f)
        except Exception as e:  # noqa: BLE001 - the replay may not need it; say so in the notes
            STATE["notes"].append(f"the program's state was not saved: {type(e).__name__}: {e}")
    with open(os.path.join(OUT, "cudabisect_jax_capture.py"), "w") as f:
        f.write(JAX_CAPTURE_MODULE)
    _write_json(
        "capture.json",
        dict(_fault(), framework="jax", function=jitted._name, step=STATE.get("step", 1), notes=STATE["notes"]),
    )


JAX_CAPTURE_MODULE = '''"""The faulting call of a jitted function, captured by cudabisect from the training
script: `function` is the function, `inputs` its arguments as the call had them (on the host), for the
JAX harness."""

import importlib
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
with open(os.path.join(HERE, "jax_call.pkl"), "rb") as _f:
    _CALL = pickle.load(_f)


def _restore_state():
    path = os.path.join(HERE, "program_state.pkl")
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        state = pickle.load(f)
    for name, saved in state.items():
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that no longer imports: the replay may not need it
            continue
        for k, v in saved.get("globals", {}).items():
            setattr(module, k, v)
        for cls_name, attrs in saved.get("classes", {}).items():
            cls = getattr(module, cls_name, None)
            for k, v in attrs.items():
                setattr(cls, k, v)


def _resolve(spec):
    module, qualname = spec.split(":", 1)
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return getattr(target, "__wrapped__", target)


_restore_state()
_FUN = _resolve(_CALL["function"])


def function(*args):
    return _FUN(*args, **_CALL["kwargs"])


def inputs():
    return tuple(_CALL["args"])
'''


def _hook_triton():
    """Every Triton launch notes its kernel (the last one launched is the one that faulted)."""
    try:
        import triton  # noqa: F401
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001 - no Triton: nothing to note
        return
    original = JITFunction.run

    def run(self, *args, **kwargs):
        STATE["kernel"] = getattr(getattr(self, "fn", None), "__name__", None)
        return original(self, *args, **kwargs)

    JITFunction.run = run


if _mine():
    try:
        _install()
    except Exception as e:  # noqa: BLE001 - the run goes on uncaptured; the driver says what was missing
        print(f"cudabisect capture: not installed: {type(e).__name__}: {e}", file=sys.stderr)
