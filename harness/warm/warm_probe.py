"""Warm probes for Python repros: a server that has imported the heavy modules living outside the probe
worktree (torch, triton, numpy, ...) and never touched CUDA forks one child per repro run; a small client,
started where the repro would have been, hands it its argv, cwd, environment and standard streams, waits,
and exits the way the child did. The child runs the repro as a fresh interpreter would (`__main__`,
`sys.argv`, `sys.path` with the script's directory first, atexit, exit code, death by signal).

Whatever the server cannot serve (another interpreter, a command it does not know, CUDA initialised in the
server, a preloaded module's files changed) the client runs cold, by exec'ing the command itself, and says
so in the status file. The forking, the wire and the client's side are `fork_server.py`'s, the one fork
server cudabisect has; this file says what a request runs. Shipped inside cudabisect, beside
`fork_server.py`; stdlib only.

    python warm_probe.py serve [--preload-file NAMES.json] [--never a,b] --socket SOCKET
        (ends when its stdin closes; --never: modules that started CUDA here before, never imported)
    python -S -E warm_probe.py client SOCKET STATUS_FILE -- python script.py args...
"""

import json
import os
import signal
import sys

import fork_server

# ---------------------------------------------------------------------------------------------- parsing


def parse_command(argv):
    """(interpreter, mode, target, args) for `python [-u|-B|-O] script.py args`, `python -m mod args`
    and `pytest args` (as `python -m pytest`); None for anything else (it runs cold)."""
    if not argv:
        return None
    prog = os.path.basename(argv[0])
    if prog in ("pytest", "py.test"):
        return (sys.executable, "module", "pytest", argv[1:])
    if not prog.startswith("python"):
        return None
    i = 1
    while i < len(argv) and argv[i] in ("-u", "-B", "-O"):
        i += 1
    if i >= len(argv):
        return None
    if argv[i] == "-m" and i + 1 < len(argv):
        return (argv[0], "module", argv[i + 1], argv[i + 2 :])
    if argv[i].startswith("-"):
        return None  # -c, -X, -W...: not worth imitating
    return (argv[0], "script", argv[i], argv[i + 1 :])


# ----------------------------------------------------------------------------------------------- server


def other_interpreter(name):
    """Why a request for interpreter `name` is not this one's, or None."""
    import shutil

    found = shutil.which(name) if name else None
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return None
    return f"the repro runs {name or 'another interpreter'}, the warm interpreter is {sys.executable}"


def module_files():
    """The source files of every module loaded now, with their modification times."""
    out = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path and os.path.isfile(path):
            try:
                out[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass
    return out


def newer_than_bytecode(path):
    """Whether `path`'s source was written after its cached bytecode (what an import may have run)."""
    import importlib.util

    try:
        return os.stat(path).st_mtime_ns > os.stat(importlib.util.cache_from_source(path)).st_mtime_ns
    except (OSError, ValueError, NotImplementedError):
        return False


def changed(files):
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None


# What the server says, instead of listening, when a preload started CUDA: the module to leave out.
TAINTED = "harness: CUDA initialised by preloading "

# Where the server started: `site` made sys.path absolute against it (PYTHONPATH's relative entries too).
SERVER_CWD = os.getcwd()


def import_all(names, failed=None):
    """Imports `names` into the server one by one; one that does not import is left out, said on stderr
    and added to `failed` (not tried again). Returns the first whose import started CUDA (a library that
    queries the device at import), after which this interpreter can fork no child that uses CUDA; None
    when none did."""
    said = []
    for name in names:
        try:
            __import__(name)
        except BaseException as e:  # noqa: BLE001 - a module that does not import is not preloaded
            said.append(f"{name}: {type(e).__name__}")
            if failed is not None:
                failed.add(name)
        if fork_server.cuda_initialised():
            return name
    if said:
        sys.stderr.write("not preloaded: " + ", ".join(said) + "\n")
        sys.stderr.flush()
    return None


def left_out(never, name):
    """Whether `name` is never imported here: a module in `never` started CUDA when preloaded; its package
    is then left out whole, or, for a submodule, the package's other submodules (the package itself is
    still imported): so a server starts again once per package, not once per submodule."""
    for bad in never:
        package = bad.split(".")[0]
        if name == bad or (name != package and name.startswith(package + ".")):
            return True
    return False


def serve(sock_path, preload, never=()):
    import atexit

    atexit.register(child_exit)  # before any preload registers its own: it must run after them
    fork_server.ask_nvml_for_devices()
    tainted = import_all([n for n in preload if not left_out(never, n)])
    if tainted:
        # cudabisect starts another server without it; the repro imports it in its own child.
        sys.stdout.write(TAINTED + tainted + "\n")
        sys.stdout.flush()
        sys.exit(3)
    fork_server.hash_triton()
    files = module_files()
    preloaded = sorted({m.split(".")[0] for m in sys.modules})
    # The driver waits for the listening line; it comes once the preloads are in.
    fork_server.serve(fork_server.listen(sock_path), Repros(files, preloaded, never))


class Repros(fork_server.Service):
    """Serves repro runs: each request is a `python` command run as a fresh interpreter would."""

    def __init__(self, files, preloaded, never=()):
        self.files = files  # the preloaded modules' files, as they were when imported
        self.never = list(never)  # what started CUDA in an earlier server: never imported here
        self.preloaded = preloaded  # their top-level names
        self.tainted = None  # the module whose import here started CUDA, once one did
        self.rewritten = None  # a taught module imported from bytecode older than its source
        self.failed = set()  # taught names that did not import here: not tried again
        self.lesson = None  # the thread importing what a running child taught early, while it runs

    def take(self, names):
        """Imports what `names` lists and this interpreter lacks: what a run taught, imported here once,
        instead of in every child or by another server; a name that does not import is never tried again."""
        self.settle()
        self.take_now(names, self.failed)

    def take_now(self, names, failed):
        """`take` without waiting for an early lesson's thread (it is that thread's work): names that do not
        import go to `failed`."""
        more = [n for n in names if n not in sys.modules and n not in self.failed and not left_out(self.never, n)]
        if not more or self.tainted:
            return
        files = self.files
        known = set(files)
        self.tainted = import_all(more, failed)
        fork_server.hash_triton()
        # Only the new modules' files are recorded now: a preloaded module's record stays what it was
        # when it was imported, so a file rewritten since is still seen as changed.
        for path, mtime in module_files().items():
            files.setdefault(path, mtime)
        self.preloaded[:] = sorted({m.split(".")[0] for m in sys.modules})
        # A source written after its bytecode (by a run: the one that taught it, say) may have been
        # imported from that bytecode, which Python still takes for current when the size and the second
        # match: such a module is never served, not even once.
        self.rewritten = self.rewritten or next((p for p in files if p not in known and newer_than_bytecode(p)), None)

    def ended(self, req):
        """A child's run has ended: what it taught (every module it imported from outside the worktree) is
        read now, before the answer lets cudabisect reuse the file, and imported right after it, while the
        worker is between probes, not before the next fork."""
        learn = (req or {}).get("learn")
        names = read_names(learn) if learn else []
        return (lambda: self.take(names)) if names else None

    def told(self, req, msg):
        """A running child's early lesson (what it had imported once it reached the device): imported here
        in a thread while the child goes on, so the next fork does not wait for it. A name that fails to
        import in that thread (a module that sets signal handlers at import) is tried again after the run,
        in the server's own thread."""
        path = (msg or {}).get("lesson")
        if not path or path != early_lesson_path((req or {}).get("learn")) or self.lesson is not None:
            return
        import threading

        names = read_names(path)
        self.lesson = threading.Thread(target=self.take_now, args=(names, set()), daemon=True)
        self.lesson.start()

    def settle(self):
        if self.lesson is not None:
            self.lesson.join()
            self.lesson = None

    def admit(self, req):
        self.take(req.get("preload", []))
        tainted = self.tainted
        reason = (
            f"CUDA was initialised in the warm interpreter by preloading {tainted}"
            if tainted
            else fork_server.cuda_initialised() or other_interpreter(req.get("interpreter", ""))
        )
        stale = None if reason else (self.rewritten or changed(self.files))
        if not reason and not stale:
            return None
        # This interpreter can serve no one any more when a file changed or CUDA started in it;
        # cudabisect starts another.
        ends = bool(stale) or reason.startswith("CUDA")
        return (reason or f"{stale} changed since it was preloaded", ends)

    def run(self, req):
        run_child(req, self.preloaded)


# ------------------------------------------------------------------------------------------------ child


def run_child(req, preloaded):
    """In the forked child, once it is the client's process (its own session, which the server signals
    as a whole): runs the repro as `python` would, and ends the way it would."""
    code = 1
    try:
        if os.environ.get("PYTHONUNBUFFERED"):
            sys.stdout.reconfigure(write_through=True)
        mode, target, args = req["mode"], req["target"], req["args"]
        first = os.path.dirname(os.path.abspath(target)) if mode == "script" else os.getcwd()
        sys.path[0] = first
        place_pythonpath(os.getcwd())
        forget_shadowed(preloaded, first)
        announce_triton_launches()
        arm_capture()
        # The interpreter's own command line, as a fresh `python …` of this command has it (a repro
        # that starts itself again from sys.orig_argv must not start the server).
        sys.orig_argv = list(req.get("argv") or [req.get("interpreter") or sys.executable, target, *args])
        learn = req.get("learn")
        if learn:
            import atexit

            watch = EnvironmentWatch()
            sys.meta_path.insert(0, watch)
            atexit.register(write_learned, learn, first, watch)
            teach_early(early_lesson_path(learn), first, watch)
        import runpy

        if mode == "script":
            sys.argv = [target] + args
            run_script(target)
        else:
            sys.argv = [target] + args  # runpy puts the module's file here, as `python -m` does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    except KeyboardInterrupt as e:
        print_as_fresh(e)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as e:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        print_as_fresh(e)
        code = 1
    # Leave as the interpreter does: threads joined, atexit handlers run, streams flushed. The last
    # handler to run is the runner's own (registered before anything was preloaded), which then exits
    # without the teardown of every module's globals: with torch loaded that takes most of a second,
    # and nothing a repro can observe depends on it (Python does not promise `__del__` at exit).
    global CHILD_EXIT
    CHILD_EXIT = code
    raise SystemExit(code)


def early_lesson_path(learn):
    """Where a learning run writes what it taught early, beside the file of its whole lesson."""
    return learn + ".early" if learn else None


def teach_early(path, first, watch):
    """Tells the server what this run has imported once it starts the device (PyTorch's CUDA start), not
    only when it ends: a training script has imported its libraries by then, and the server imports them
    while the run goes on, so its next fork does not wait for them (seconds a round, with a library that
    imports transformers at its first use). Said once; what the run imports later is taught at its end."""

    def lesson():
        try:
            write_learned(path, first, watch)
            fork_server.tell_server({"lesson": path})
        except BaseException:  # noqa: BLE001 - a lesson that cannot be given never stops the repro
            pass

    def at_device_start(cuda):
        try:
            # Queued until CUDA starts, run by torch inside its start (at once when it has started).
            cuda._lazy_call(lesson)
        except BaseException:  # noqa: BLE001 - a torch without it: the run teaches at its end
            pass

    cuda = sys.modules.get("torch.cuda")
    if cuda is not None:
        at_device_start(cuda)
    else:
        after_import("torch.cuda", at_device_start)


def after_import(name, then):
    """Calls `then(module)` each time the run imports module `name` (a finder on `sys.meta_path` that
    wraps the module's loader), or at once when it already has."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    import importlib.abc
    import importlib.util

    class AfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                # Kept: a module the run drops from `sys.modules` and imports again is seen again.
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                then(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, AfterImport())


def arm_capture():
    """A run of cudabisect's capture (CUDABISECT_CAPTURE set): the hook a fresh interpreter would import at
    start-up as `sitecustomize` from the directory CUDABISECT_CAPTURE_HOOK names, loaded here, in the child,
    before the script runs. It instruments the frameworks this interpreter preloaded at once."""
    hook = os.environ.get("CUDABISECT_CAPTURE_HOOK")
    if not hook or not os.environ.get("CUDABISECT_CAPTURE"):
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("cudabisect_capture_hook", os.path.join(hook, "sitecustomize.py"))
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def place_pythonpath(here):
    """Puts PYTHONPATH's entries where a fresh `python` started in `here` has them, right after the
    script's directory: the server resolved the relative ones (`PYTHONPATH=.`, `src`) in its own
    directory when it started, and `site` dropped those that matched its own script's directory."""
    entries = [e for e in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if e]
    if not entries:
        return
    was = {os.path.abspath(os.path.join(SERVER_CWD, e)) for e in entries}
    now = []
    for entry in entries:
        path = os.path.abspath(os.path.join(here, entry))
        if path not in now and path != sys.path[0]:
            now.append(path)
    rest = [p for p in sys.path[1:] if p not in was and p not in now]
    sys.path[:] = [sys.path[0], *now, *rest]


# The status a forked child leaves with, once its repro has run; None in the server.
CHILD_EXIT = None


def child_exit():
    """The first atexit handler registered, so the last to run: in a child, the end of the exit."""
    if CHILD_EXIT is None:
        return
    code = CHILD_EXIT
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe: the interpreter exits 120 then
            code = 120
    os._exit(code)


def run_script(target):
    """Runs a script as `python script.py` does: a fresh `__main__` module whose `__file__` is the
    absolute path, `sys.argv[0]` as given, the code compiled under that path."""
    import importlib.machinery
    import types

    path = os.path.abspath(target)
    with open(path, "rb") as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - running the repro script is the point


def print_as_fresh(e):
    """The traceback a fresh interpreter prints: the runner's and runpy's own frames left out, so the
    innermost frames (the ones a fault is classified by) are the repro's."""
    import traceback

    def ours(filename):
        # runpy is frozen in recent interpreters (`<frozen runpy>`).
        return (
            filename == "<frozen runpy>"
            or filename.endswith("runpy.py")
            or os.path.realpath(filename) in (os.path.realpath(__file__), os.path.realpath(fork_server.__file__))
        )

    tb = e.__traceback__
    while tb is not None and ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if sys.excepthook is not sys.__excepthook__:
        # The repro's own hook (or the capture's), which a fresh interpreter hands an uncaught exception.
        try:
            sys.excepthook(type(e), e, tb)
        except BaseException:  # noqa: BLE001 - a hook that fails: the interpreter prints as usual then
            traceback.print_exception(type(e), e, tb)
    else:
        traceback.print_exception(type(e), e, tb)
    sys.stderr.flush()


LAUNCH = "@@cudabisect launch kernel={kernel}"
LAUNCH_WRAPPER = """
def launch(self, *args, **kwargs):
    name = getattr(getattr(self, "fn", None), "__name__", None) or "triton_kernel"
    print(LAUNCH.format(kernel=name), flush=True)
    return original(self, *args, **kwargs)
"""


def announce_triton_launches():
    """Every Triton launch says its kernel's name first (a wrapper around JITFunction.run, the path
    autotuned, heuristic and plain kernels all take): with synchronous launches the last name before a
    fault is the kernel that faulted, so no sanitizer run is needed to tell two Triton bugs apart. When
    Triton is not imported yet, it is patched as soon as the run imports it."""
    after_import("triton.runtime.jit", patch_jit)


def patch_jit(jit):
    cls = getattr(jit, "JITFunction", None)
    if cls is None or getattr(cls.run, "_cudabisect", False):
        return
    # The wrapper's code is compiled under a name that is no file: in a traceback its frame reads as a
    # library's, so the innermost frame of the user's is the same as in a cold run.
    namespace = {"original": cls.run, "print": print, "LAUNCH": LAUNCH, "getattr": getattr}
    exec(  # noqa: S102 - a fixed wrapper, compiled under a non-file name
        compile(LAUNCH_WRAPPER, "<cudabisect launch hook>", "exec"), namespace
    )
    launch = namespace["launch"]
    launch._cudabisect = True
    cls.run = launch


def exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def forget_shadowed(preloaded, first):
    """A preloaded name that the script's directory (or the cwd) also provides is the worktree's: it is
    dropped from `sys.modules`, so the import finds the worktree's file, as in a fresh interpreter."""
    for base in {first, os.getcwd()}:
        for name in preloaded:
            if os.path.exists(os.path.join(base, name + ".py")) or os.path.isdir(os.path.join(base, name)):
                for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                    del sys.modules[mod]


class EnvironmentWatch:
    """On `sys.meta_path` of a learning run, finding nothing: notes which modules were imported after the
    repro changed its own environment (`os.environ[...] = ...` at the top of a training script). Such a
    module may have read the changed value at import (`torch._inductor.config` reads `TORCHINDUCTOR_*`
    then), so it is not taught: preloaded, it would have read the value from before the change."""

    def __init__(self):
        self.start = dict(os.environ)
        self.before = None  # the modules imported before the first change, once there is one

    def find_spec(self, name, path=None, target=None):
        if self.before is None and dict(os.environ) != self.start:
            self.before = set(sys.modules)
        return None

    def after_change(self, name):
        return self.before is not None and name not in self.before


def write_learned(path, first, watch=None):
    """The modules this run imported from outside its worktree, submodules included (`import torch` does
    not import `torch._dynamo`, which an optimizer step does), in the order they were imported: what the
    server imports before the next fork. A module whose submodule is listed is left out (importing the
    submodule imports it); so is one no `sys.path` entry provides (code a library generated and loaded
    from its cache); of a module imported after the run changed its environment, only its top-level
    package is taught."""
    roots = {os.path.realpath(first), os.path.realpath(os.getcwd())}
    worktree = os.environ.get("CUDABISECT_WORKTREE")
    if worktree:
        roots.add(os.path.realpath(worktree))
    on_path = [os.path.realpath(p) + os.sep for p in sys.path if p]
    real_dirs = {}
    names, seen = [], set()
    for name, mod in list(sys.modules.items()):
        top = name.split(".")[0]
        if top in ("__main__", "__mp_main__") or top.startswith("_"):
            continue
        file = getattr(mod, "__file__", None)
        if not file:
            continue
        here = os.path.dirname(file)
        if here not in real_dirs:
            real_dirs[here] = os.path.realpath(here) + os.sep
        if any(real_dirs[here].startswith(r + os.sep) for r in roots):
            continue
        if not any(real_dirs[here].startswith(p) for p in on_path):
            continue
        if watch is not None and watch.after_change(name):
            name = top
        if name not in seen:
            seen.add(name)
            names.append(name)
    parents = {n.rsplit(".", 1)[0] for n in names if "." in n}
    try:
        with open(path, "w") as f:
            json.dump([n for n in names if n not in parents], f)
    except OSError:
        pass


def read_names(path):
    """A JSON list of module names from `path`; none when it cannot be read."""
    try:
        with open(path) as f:
            names = json.load(f)
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


# ----------------------------------------------------------------------------------------------- client


def client(sock_path, status_path, argv):
    def cold(why):
        try:
            with open(status_path, "w") as f:
                f.write("cold: " + why + "\n")
        except OSError:
            pass
        hook = os.environ.get("CUDABISECT_CAPTURE_HOOK")
        if hook and os.environ.get("CUDABISECT_CAPTURE"):
            # A capture run gone cold: its hook is found at start-up, as in cudabisect's own cold runs.
            path = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = hook + (os.pathsep + path if path else "")
            os.environ.setdefault("PYTHONHASHSEED", "0")
        os.execvp(argv[0], argv)

    parsed = parse_command(argv)
    if parsed is None:
        cold("not a Python command the warm interpreter serves")
    interpreter, mode, target, args = parsed
    if mode == "script" and not os.path.isfile(target):
        cold("no such script (the interpreter says so itself)")
    env = dict(os.environ)
    # What the server should have imported, as cudabisect learned it: for the server, not the repro.
    listed = env.pop("CUDABISECT_WARM_PRELOAD", None)
    preload = read_names(listed) if listed else []
    # Where the child writes what it imported: the runner's business, not a variable the repro sees.
    learn = env.pop("CUDABISECT_WARM_LEARN", None)
    req = {
        "mode": mode,
        "target": target,
        "args": args,
        "argv": argv,
        "learn": learn,
        "cwd": os.getcwd(),
        "env": env,
        "interpreter": interpreter,
        "preload": preload,
    }

    def forked():
        with open(status_path, "w") as f:
            f.write("warm\n")

    wait = float(os.environ.get("CUDABISECT_WARM_WAIT", "0.5"))
    # The child runs in a session of its own: this client passes its signals on.
    outcome, detail = fork_server.forward(sock_path, req, wait=wait, pass_signals=True, forked=forked)
    if outcome == "cold":
        cold(detail)
    if outcome == "gone":
        # The run's end is unknown (the child may have gone with its server): cudabisect reads this as the
        # machine failing under the run, never as what the commit did.
        try:
            with open(status_path, "w") as f:
                f.write(f"lost: {detail}\n")
        except OSError:
            pass
        os._exit(1)
    fork_server.end_as(detail)


def main():
    args = sys.argv[1:]
    if "serve" in args and "--socket" in args:
        preload = []
        if "--preload-file" in args:
            preload = read_names(args[args.index("--preload-file") + 1])
        never = args[args.index("--never") + 1].split(",") if "--never" in args else []
        serve(args[args.index("--socket") + 1], preload, [n for n in never if n])
    elif args[:1] == ["client"] and "--" in args:
        cut = args.index("--")
        client(args[1], args[2], args[cut + 1 :])
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
