"""Warm start: a server imports torch and the user's package and builds the model once; every request is
answered by a child forked from it, which initialises CUDA afresh (a sticky CUDA error dies with its
child). The client passes its own stdin, stdout and stderr and its process group, so the child's output
is the client's output and a timeout that kills the client's group kills the child too."""

import json
import os
import sys
import traceback
from .protocol import say, timing
from .record import boundary_env, descended
from .node import resolve_device


def without_via(argv):
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--via":
            skip = True
        elif not x.startswith("--via="):
            out.append(x)
    return out


def forward(path, argv):
    """Runs `argv` in the warm server at `path`; its exit status, or None when it must run cold here."""
    import signal
    import socket

    timing("client started")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        print(f"harness: warm server unavailable ({e}); running cold", file=sys.stderr, flush=True)
        return None
    req = {"argv": argv, "pgid": os.getpgrp(), "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        send_request(s, req, [0, 1, 2])
    except OSError as e:
        print(f"harness: warm server unavailable ({e}); running cold", file=sys.stderr, flush=True)
        return None
    forked = False
    for line in s.makefile("rb"):
        word, _, rest = line.decode("ascii", "replace").strip().partition(" ")
        if word == "forked":
            forked = True
            timing("child forked")
            continue
        if word == "cold":
            print(f"harness: warm server cannot serve ({rest}); running cold", file=sys.stderr, flush=True)
            return None
        if word == "exit":
            timing("child exited")
            return int(rest)
        if word == "signal":
            # Die of the same signal, so the driver sees a crash as a crash.
            sig = int(rest)
            sys.stdout.flush()
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return 128 + sig
    if not forked:
        # The server died before it started this call (while building the model, say): nothing ran.
        print("harness: the warm server went away before the run; running cold", file=sys.stderr, flush=True)
        return None
    print("harness: the warm server went away during the run", file=sys.stderr, flush=True)
    return 70


def send_request(sock, req, fds):
    """A request on the wire: its length, its JSON, and the caller's stdin, stdout and stderr."""
    import socket
    import struct

    payload = json.dumps(req).encode()
    data = struct.pack("!Q", len(payload)) + payload
    sent = socket.send_fds(sock, [data], fds)
    if sent < len(data):
        # (Only the rest: an empty send to a peer that already read everything and closed is EPIPE.)
        sock.sendall(data[sent:])


def recv_request(conn, timeout=30):
    import socket
    import struct

    conn.settimeout(timeout)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 8:
        more = conn.recv(1 << 16)
        if not more:
            raise OSError("short request")
        data += more
    (size,) = struct.unpack("!Q", data[:8])
    body = data[8:]
    while len(body) < size:
        more = conn.recv(1 << 20)
        if not more:
            raise OSError("short request")
        body += more
    conn.settimeout(None)
    if len(fds) != 3:
        raise OSError(f"expected 3 file descriptors, got {len(fds)}")
    return json.loads(body), fds


def hash_triton_kernels():
    """In the server, when the user's code uses Triton: computes what Triton hashes before its first launch
    in a process (the hash of Triton itself, and each loaded kernel's source key), all on the CPU, so every
    forked child inherits them instead of computing them again (measured on an H200: a Triton kernel's first
    launch in a child fell from about 0.48 s to 0.12 s). Never touches the device."""
    if "triton" not in sys.modules:
        return
    try:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:
            from triton.compiler.compiler import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - only a head start
        pass
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001
        return
    # Only the user's own modules (not installed packages, whose attributes may be lazy hooks), and only
    # Triton's own wrappers are looked into.
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if not path or "-packages/" in path or "/lib/python3" in path:
            continue
        for value in list(getattr(module, "__dict__", {}).values()):
            # @triton.autotune and @triton.heuristics wrap the kernel: its JITFunction is under `.fn`.
            for _ in range(3):
                if isinstance(value, JITFunction):
                    try:
                        _ = value.cache_key  # the property computes and keeps it
                    except Exception:  # noqa: BLE001
                        pass
                    break
                if not type(value).__module__.startswith("triton."):
                    break
                value = getattr(value, "fn", None)


def warm_device(a, root=None, captured=None):
    """In a spare child, before any request: start the device and the libraries the model will call
    (cuBLAS for matrix products, cuDNN for convolutions and norms, Triton's driver when the user's code
    imported Triton), so the run it serves does not wait for them. A spare serves one run only, so
    nothing it warms can leak into another."""
    import torch

    nn = torch.nn
    device = resolve_device(a.device, captured)
    if not device.startswith("cuda"):
        return
    dev = torch.device(device)
    x = torch.ones(8, 8, device=dev)
    modules = list(root.modules()) if isinstance(root, nn.Module) else []
    uses = lambda *types: any(isinstance(m, types) for m in modules)  # noqa: E731
    if not modules or uses(nn.Linear, nn.MultiheadAttention, nn.modules.conv._ConvNd, nn.RNNBase):
        x @ x
    if torch.backends.cudnn.is_available() and uses(nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm):
        nn.functional.conv2d(x.view(1, 1, 8, 8), torch.ones(1, 1, 3, 3, device=dev))
    if "triton" in sys.modules:
        try:
            sys.modules["triton"].runtime.driver.active.get_current_device()
        except Exception:  # noqa: BLE001 - only a head start; the run starts Triton itself otherwise
            pass
    torch.cuda.synchronize(dev)


# Variables the device reads when it starts: a spare child that started it under other values cannot
# serve a request that asks for these.
DEVICE_ENV = ("CUDA_", "NVIDIA", "PYTORCH", "TORCH", "TRITON", "NCCL", "LD_", "CUBLAS", "CUDNN")


def device_env(env):
    return {k: v for k, v in env.items() if k.startswith(DEVICE_ENV)}


def preload(req, warm, app):
    """Loads the request's recorded boundary values in the server, so that every child inherits them
    instead of reading them again. Best effort: the child reports any problem itself."""
    try:
        a = app.parse_args(req["argv"])
        if getattr(a, "recording", None) and a.verb in ("run", "extract"):
            steps, _, _ = descended(warm, a.recording)
            keep = set((a.keep or "").split(","))
            kept = [s for s in steps if s.name in keep] if a.keep else steps
            boundary_env(kept, warm.placeholders, warm.example, warm.attrs, a.recording, "cpu")
    except BaseException:  # noqa: BLE001 - the child will say what is wrong
        pass


def child(req, fds, warm, inherited, app):
    """In the forked child: become the client's process, run the request, never return."""
    code = 70
    try:
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.setpgid(0, int(req["pgid"]))
        except OSError:
            os.setpgid(0, 0)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        code = app.main(req["argv"], warm=warm)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - whatever it was goes to the client's output
        traceback.print_exc()
        code = 1
    finally:
        timing("child exiting")
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def cuda_initialised():
    """Why this process can no longer fork children that use CUDA, or None: torch initialised it, or the
    driver was (a library that queried the device through it). Checked before every fork: a request can
    make the server import or trace code that touches the device."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised in the server (torch)"
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return None  # the driver library is not even loaded
    ctx = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 3:  # 3: CUDA_ERROR_NOT_INITIALIZED
        return "CUDA was initialised in the server (the driver)"
    return None


class App:
    """What the server runs: the harness's own callables (`cli.APP`), or a test's stand-ins.

    `parse_args(argv)` reads a request's arguments, `prepare(a)` builds the warm state once in the server,
    `main(argv, warm)` answers one request in a forked child, `warm_device(a, root)` starts the device in a
    spare child, and `cuda_initialised()` says why the server can no longer fork children that use CUDA."""

    def __init__(self, parse_args, prepare, main, start_device=warm_device, cuda_state=cuda_initialised):
        self.parse_args = parse_args
        self.prepare = prepare
        self.main = main
        self.warm_device = start_device
        self.cuda_initialised = cuda_state


def serve(a, app):
    """The warm server: listens first (the driver waits for that line), then builds the model, then forks
    a child per request. Ends when its stdin closes (the driver is gone) or on SIGTERM."""
    import selectors
    import signal
    import socket

    try:
        os.unlink(a.socket)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(a.socket)
    srv.listen(128)
    say("harness: listening")
    # From here on stdout is the server's log, like stderr: the driver reads only the line above.
    os.dup2(2, 1)
    warm, why = None, None
    try:
        warm = app.prepare(a)
        hash_triton_kernels()
        if app.cuda_initialised():
            warm, why = None, "the model's factory initialised CUDA, which a forked child cannot use"
        elif not hasattr(os, "pidfd_open"):
            warm, why = None, "this Python has no os.pidfd_open"
    except BaseException as e:  # noqa: BLE001 - every request then runs cold and reports it itself
        why = f"building the model failed: {type(e).__name__}: {e}"
    say(f"harness: warm server {'ready' if warm else 'cold: ' + why}")
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, ("accept", None))
    sel.register(0, selectors.EVENT_READ, ("parent", None))
    jobs = {}  # pid -> (conn, pidfd)
    watching = set()  # children whose client connection is still watched for a hang-up
    # A spare: a child that started the device while the server waited, and now waits for one request
    # (pid, socket to it, pidfd). Starting CUDA is most of what a forked child pays before it runs.
    spare = None

    def open_fds():
        fds = [srv.fileno()] + [fd for c, p in jobs.values() for fd in (c.fileno(), p)]
        if spare:
            fds += [spare[1].fileno(), spare[2]]
        if hasattr(sel, "fileno"):
            fds.append(sel.fileno())
        return fds

    def start_spare():
        if warm is None or not str(a.device).startswith("cuda"):
            return None
        mine, theirs = socket.socketpair()
        closing = open_fds() + [mine.fileno()]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for fd in closing:
                try:
                    os.close(fd)
                except OSError:
                    pass
            try:
                app.warm_device(a, getattr(warm, "root", None), getattr(warm, "device", None))
                req, fds = recv_request(theirs, timeout=None)
            except BaseException:  # noqa: BLE001 - a spare that cannot start is simply not used
                os._exit(0)
            child(req, fds, warm, [theirs.fileno()], app)
        theirs.close()
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ, ("spare", pid))
        return (pid, mine, pidfd)

    def shutdown(*_):
        for pid in list(jobs) + ([spare[0]] if spare else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.unlink(a.socket)
        except OSError:
            pass
        os._exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    spare = start_spare()
    while True:
        for key, _ in sel.select():
            kind, data = key.data
            if kind == "parent":
                if not os.read(0, 4096):
                    shutdown()
            elif kind == "accept":
                conn, _ = srv.accept()
                try:
                    req, fds = recv_request(conn)
                except (OSError, ValueError) as e:
                    say(f"harness: bad request: {e}")
                    conn.close()
                    continue
                if warm is not None:
                    preload(req, warm, app)
                    touched = app.cuda_initialised() if str(a.device).startswith("cuda") else None
                    if touched:
                        # From now on every request runs cold, and says why.
                        warm, why = None, f"{touched}: a forked child could not use it"
                        say(f"harness: warm server cold from now on: {why}")
                if warm is None:
                    for fd in fds:
                        os.close(fd)
                    try:
                        conn.sendall(f"cold {why}\n".encode())
                    except OSError:
                        pass
                    conn.close()
                    continue
                pid = None
                if spare is not None and device_env(req["env"]) == device_env(os.environ):
                    # The spare takes it: it started the device under the same settings.
                    spid, mine, spfd = spare
                    spare = None
                    sel.unregister(spfd)
                    try:
                        send_request(mine, req, fds)
                        pid, pidfd = spid, spfd
                    except OSError:
                        os.kill(spid, signal.SIGKILL)
                        os.waitpid(spid, 0)
                        os.close(spfd)
                    mine.close()
                if pid is None:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    inherited = [0] + open_fds()
                    pid = os.fork()
                    if pid == 0:
                        child(req, fds, warm, inherited + [conn.fileno()], app)
                    pidfd = os.pidfd_open(pid)
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"forked {pid}\n".encode())
                except OSError:
                    pass  # the client is gone already; its hang-up is seen below
                jobs[pid] = (conn, pidfd)
                sel.register(pidfd, selectors.EVENT_READ, ("child", pid))
                sel.register(conn, selectors.EVENT_READ, ("client", pid))
                watching.add(pid)
                if spare is None:
                    spare = start_spare()
            elif kind == "spare":
                # The spare ended before it was used (it could not start the device): requests fork as
                # before until the next one starts. (An event of a spare handed a request earlier in this
                # batch is stale: that process is a job now.)
                if spare is None or spare[0] != data:
                    continue
                spid, mine, spfd = spare
                spare = None
                sel.unregister(spfd)
                os.waitpid(spid, 0)
                os.close(spfd)
                mine.close()
            elif kind == "child":
                pid = data
                conn, pidfd = jobs.pop(pid)
                _, status = os.waitpid(pid, 0)
                sel.unregister(pidfd)
                os.close(pidfd)
                if pid in watching:
                    watching.discard(pid)
                    sel.unregister(conn)
                if os.WIFSIGNALED(status):
                    answer = f"signal {os.WTERMSIG(status)}\n"
                else:
                    answer = f"exit {os.WEXITSTATUS(status)}\n"
                try:
                    conn.sendall(answer.encode())
                except OSError:
                    pass  # the client was killed (a timeout): nobody is waiting
                conn.close()
            elif kind == "client":
                # The client hung up before its child ended (killed by a timeout or Ctrl-C): the child
                # goes too, whether or not it could join the client's process group.
                pid = data
                if pid not in watching:
                    continue  # its child ended in this same batch of events: already answered
                watching.discard(pid)
                sel.unregister(jobs[pid][0])
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
