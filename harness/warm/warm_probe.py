"""Warm probes for Python repros: a server that has imported the heavy modules living outside the probe
worktree (torch, triton, numpy, ...) and never touched CUDA forks one child per repro run; a small client,
started where the repro would have been, hands it its argv, cwd, environment and standard streams, waits,
and exits the way the child did. The child runs the repro as a fresh interpreter would (`__main__`,
`sys.argv`, `sys.path` with the script's directory first, atexit, exit code, death by signal).

Whatever the server cannot serve (another interpreter, a command it does not know, CUDA initialised in the
server, a preloaded module's files changed) the client runs cold, by exec'ing the command itself, and says
so in the status file. Shipped inside cudabisect; stdlib only.

    python warm_probe.py serve [--preload a,b] --socket SOCKET   (ends when its stdin closes)
    python -S -E warm_probe.py client SOCKET STATUS_FILE -- python script.py args...
"""

import json
import os
import selectors
import signal
import socket
import sys
import time

MAX_MSG = 1 << 20
READY = "harness: listening"


def send_json(conn, obj, fds=()):
    data = json.dumps(obj).encode() + b"\n"
    if fds:
        socket.send_fds(conn, [data], list(fds))
    else:
        conn.sendall(data)


class Messages:
    """The JSON messages on a socket, one per line. One read can hold the end of a message and the next
    one whole (a child that exits at once: the server's `pid` and `status` arrive together), so what is
    read past a message is kept for the next."""

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""

    def next(self):
        """The next message, or None when the peer closed the connection."""
        while b"\n" not in self.buf:
            chunk = self.conn.recv(MAX_MSG)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


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


def cuda_initialised():
    """Why this server can no longer fork children that use CUDA, or None."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return "CUDA was initialised in the warm interpreter (torch)"
    except Exception:  # noqa: BLE001 - a torch without CUDA support: nothing initialised
        pass
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return None
    ctx = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 3:  # 3: CUDA_ERROR_NOT_INITIALIZED
        return "CUDA was initialised in the warm interpreter (the driver)"
    return None


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


def import_all(names):
    """Imports `names` into the server one by one; one that does not import is left out and said on
    stderr. Returns the first whose import started CUDA (a library that queries the device at import),
    after which this interpreter can fork no child that uses CUDA; None when none did."""
    failed = []
    for name in names:
        try:
            __import__(name)
        except BaseException as e:  # noqa: BLE001 - a module that does not import is not preloaded
            failed.append(f"{name}: {type(e).__name__}")
        if cuda_initialised():
            return name
    if failed:
        sys.stderr.write("not preloaded: " + ", ".join(failed) + "\n")
        sys.stderr.flush()
    return None


def serve(sock_path, preload):
    import atexit

    atexit.register(child_exit)  # before any preload registers its own: it must run after them
    tainted = import_all(preload)
    if tainted:
        # cudabisect starts another server without it; the repro imports it in its own child.
        sys.stdout.write(TAINTED + tainted + "\n")
        sys.stdout.flush()
        sys.exit(3)
    files = module_files()
    preloaded = sorted({m.split(".")[0] for m in sys.modules})
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(4)
    # The driver waits for this line; it comes once the preloads are in.
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(sys.stdin, selectors.EVENT_READ, "lifeline")
    while True:
        for key, _ in sel.select():
            if key.data == "lifeline":
                if not sys.stdin.buffer.read1(1024):
                    sys.exit(0)  # the driver is gone
                continue
            conn, _ = listener.accept()
            with conn:
                try:
                    handle(conn, listener, files, preloaded)
                except OSError as e:
                    # A client gone mid-request never takes the server down with it.
                    print(f"warm: a request ended early: {e}", file=sys.stderr, flush=True)


def handle(conn, listener, files, preloaded):
    msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 3)
    try:
        req = json.loads(msg)
    except ValueError:
        for fd in fds:
            os.close(fd)
        return
    more = [n for n in req.get("preload", []) if n not in sys.modules]
    tainted, rewritten = None, None
    if more:
        # What an earlier run taught: imported here once, instead of starting another server.
        known = set(files)
        tainted = import_all(more)
        # Only the new modules' files are recorded now: a preloaded module's record stays what it was
        # when it was imported, so a file rewritten since is still seen as changed.
        for path, mtime in module_files().items():
            files.setdefault(path, mtime)
        preloaded[:] = sorted({m.split(".")[0] for m in sys.modules})
        # A source written after its bytecode (by a run: the one that taught it, say) may have been
        # imported from that bytecode, which Python still takes for current when the size and the second
        # match: such a module is never served, not even once.
        rewritten = next((p for p in files if p not in known and newer_than_bytecode(p)), None)
    reason = (
        f"CUDA was initialised in the warm interpreter by preloading {tainted}"
        if tainted
        else cuda_initialised() or other_interpreter(req.get("interpreter", ""))
    )
    stale = None if reason else (rewritten or changed(files))
    if reason or stale or len(fds) != 3:
        why = reason or (f"{stale} changed since it was preloaded" if stale else "no streams")
        send_json(conn, {"cold": why})
        for fd in fds:
            os.close(fd)
        if stale or (reason and reason.startswith("CUDA")):
            sys.exit(0)  # this interpreter can serve no one any more; cudabisect starts another
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        run_child(req, fds, preloaded)  # never returns
    for fd in fds:
        os.close(fd)
    try:
        send_json(conn, {"pid": pid})
    except OSError:
        # The client was stopped while the child was forked (its answer no longer mattered): the child
        # goes with it, and the server serves the next one.
        kill_group(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return
    supervise(conn, pid)


def supervise(conn, pid):
    """Waits for the child, passing on the client's signals; a client that is gone takes the child along."""
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ, "client")
    sel.register(pidfd, selectors.EVENT_READ, "child")
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "child":
                    _, status = os.waitpid(pid, 0)
                    try:
                        send_json(conn, {"status": status})
                    except OSError:
                        pass
                    return
                data = conn.recv(64)
                if not data:
                    # The client was killed (SIGKILL, a timeout's last resort): so is the child's group.
                    kill_group(pid, signal.SIGKILL)
                    sel.unregister(conn)
                    continue
                for word in data.decode(errors="replace").split():
                    if word.startswith("signal:"):
                        kill_group(pid, int(word[7:]))
    finally:
        os.close(pidfd)


def kill_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        # A child just forked may not lead its own group yet (its setsid comes first thing): the child
        # itself then.
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------------ child


def run_child(req, fds, preloaded):
    code = 1
    try:
        os.setsid()  # its own group, which the server signals as a whole
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        if os.environ.get("PYTHONUNBUFFERED"):
            sys.stdout.reconfigure(write_through=True)
        mode, target, args = req["mode"], req["target"], req["args"]
        first = os.path.dirname(os.path.abspath(target)) if mode == "script" else os.getcwd()
        sys.path[0] = first
        forget_shadowed(preloaded, first)
        announce_triton_launches()
        # The interpreter's own command line, as a fresh `python …` of this command has it (a repro
        # that starts itself again from sys.orig_argv must not start the server).
        sys.orig_argv = list(req.get("argv") or [req.get("interpreter") or sys.executable, target, *args])
        learn = req.get("learn")
        if learn:
            import atexit

            atexit.register(write_learned, learn, first)
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
            or (os.path.realpath(filename) == os.path.realpath(__file__))
        )

    tb = e.__traceback__
    while tb is not None and ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
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
    jit = sys.modules.get("triton.runtime.jit")
    if jit is not None:
        patch_jit(jit)
        return
    import importlib.abc
    import importlib.util

    class AfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "triton.runtime.jit":
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                patch_jit(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, AfterImport())


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


def write_learned(path, first):
    """The top-level modules this run imported from outside its worktree: what the next server preloads."""
    roots = {os.path.realpath(first), os.path.realpath(os.getcwd())}
    worktree = os.environ.get("CUDABISECT_WORKTREE")
    if worktree:
        roots.add(os.path.realpath(worktree))
    names = set()
    for name, mod in list(sys.modules.items()):
        top = name.split(".")[0]
        if top in ("__main__", "__mp_main__") or top.startswith("_"):
            continue
        file = getattr(mod, "__file__", None)
        if not file:
            continue
        real = os.path.realpath(file)
        if any(real.startswith(r + os.sep) for r in roots):
            continue
        names.add(top)
    try:
        with open(path, "w") as f:
            json.dump(sorted(names), f)
    except OSError:
        pass


# ----------------------------------------------------------------------------------------------- client


def client(sock_path, status_path, argv):
    def cold(why):
        try:
            with open(status_path, "w") as f:
                f.write("cold: " + why + "\n")
        except OSError:
            pass
        os.execvp(argv[0], argv)

    parsed = parse_command(argv)
    if parsed is None:
        cold("not a Python command the warm interpreter serves")
    interpreter, mode, target, args = parsed
    if mode == "script" and not os.path.isfile(target):
        cold("no such script (the interpreter says so itself)")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + float(os.environ.get("CUDABISECT_WARM_WAIT", "0.5"))
    while True:
        try:
            conn.connect(sock_path)
            break
        except OSError:
            if time.monotonic() > deadline:
                cold("no warm interpreter listening")
            time.sleep(0.01)
    env = dict(os.environ)
    # What the server should have imported, as cudabisect learned it: for the server, not the repro.
    preload = [n for n in env.pop("CUDABISECT_WARM_PRELOAD", "").split(",") if n]
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
    try:
        send_json(conn, req, fds=(0, 1, 2))
        messages = Messages(conn)
        first = messages.next()
    except OSError as e:
        first = {"cold": f"the warm interpreter did not answer ({e})"}
    if not first or "cold" in first:
        conn.close()
        cold((first or {}).get("cold", "the warm interpreter closed the connection"))
    with open(status_path, "w") as f:
        f.write("warm\n")

    def forward(sig, _frame):
        try:
            conn.sendall(f"signal:{sig} ".encode())
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    while True:
        try:
            done = messages.next()
            break
        except InterruptedError:
            continue
    if done is None:
        os._exit(1)
    status = done["status"]
    if os.WIFSIGNALED(status):
        # End as the child did. SIGKILL and SIGSTOP take no handler (and need none): the kill alone does.
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def main():
    args = sys.argv[1:]
    if "serve" in args and "--socket" in args:
        preload = []
        if "--preload" in args:
            preload = [p for p in args[args.index("--preload") + 1].split(",") if p]
        serve(args[args.index("--socket") + 1], preload)
    elif args[:1] == ["client"] and "--" in args:
        cut = args.index("--")
        client(args[1], args[2], args[cut + 1 :])
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
