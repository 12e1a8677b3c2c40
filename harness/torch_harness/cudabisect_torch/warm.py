"""Warm start: a server imports torch and the user's package and builds the model once; every request is
answered by a child forked from it, which initialises CUDA afresh (a sticky CUDA error dies with its
child). The client passes its own stdin, stdout and stderr and its process group, so the child's output
is the client's output and a timeout that kills the client's group kills the child too. The forking, the
wire and the client's side are `fork_server`'s (the one fork server, shared with the warm probes); this
module says what the server builds and what a child runs."""

import os
import sys
import traceback
from . import fork_server
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
    """Runs `argv` in the warm server at `path`; its exit status, or None when it must run cold here. The
    child joins this process's group, so a timeout that kills the group kills the child too."""
    timing("client started")
    req = {"argv": argv, "pgid": os.getpgrp(), "cwd": os.getcwd(), "env": dict(os.environ)}
    outcome, detail = fork_server.forward(path, req, forked=lambda: timing("child forked"))
    if outcome == "cold":
        print(f"harness: warm server: {detail}; running cold", file=sys.stderr, flush=True)
        return None
    if outcome == "gone":
        print(f"harness: {detail}", file=sys.stderr, flush=True)
        return 70
    timing("child exited")
    if os.WIFSIGNALED(detail):
        fork_server.end_as(detail)  # die of the same signal, so the driver sees a crash as a crash
    return os.waitstatus_to_exitcode(detail)


def hash_triton_kernels():
    """In the server, when the user's code uses Triton: computes what Triton hashes before its first launch
    in a process (the hash of Triton itself, and each loaded kernel's source key), all on the CPU, so every
    forked child inherits them instead of computing them again (measured on an H200: a Triton kernel's first
    launch in a child fell from about 0.48 s to 0.12 s). Never touches the device."""
    if "triton" not in sys.modules:
        return
    fork_server.hash_triton()
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
    # How torch asks whether CUDA is there is not a device setting: the server sets it for itself only.
    return {k: v for k, v in env.items() if k.startswith(DEVICE_ENV) and k != fork_server.NVML_CHECK}


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


def child(req, warm, app):
    """In the forked child, once it is the client's process: run the request, never return."""
    import signal

    code = 70
    try:
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
    """Why this server can no longer fork children that use CUDA, or None."""
    return fork_server.cuda_initialised("the server")


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


class Harness(fork_server.Service):
    """Serves harness calls from the model built once: each in a child of the server, or in a spare
    child that started the device while the server waited."""

    def __init__(self, a, app, warm, why, rebuild=False):
        self.a, self.app, self.warm, self.why = a, app, warm, why
        self.on_device = str(a.device).startswith("cuda")
        self.rebuild = rebuild  # the build failed here: each call's child builds again

    def admit(self, req):
        if self.warm is None and self.rebuild:
            touched = self.app.cuda_initialised() if self.on_device else None
            if not touched:
                return None
            self.rebuild, self.why = False, f"{touched}: a forked child could not use it"
        if self.warm is not None:
            preload(req, self.warm, self.app)
            touched = self.app.cuda_initialised() if self.on_device else None
            if touched:
                # From now on every request runs cold, and says why.
                self.warm, self.why = None, f"{touched}: a forked child could not use it"
                say(f"harness: warm server cold from now on: {self.why}")
        return None if self.warm is not None else (self.why, False)

    def run(self, req):
        child(req, self.warm, self.app)

    def spare(self):
        # Starting CUDA is most of what a forked child pays before it runs.
        return self.warm is not None and self.on_device

    def warm_spare(self):
        self.app.warm_device(self.a, getattr(self.warm, "root", None), getattr(self.warm, "device", None))

    def spare_takes(self, req):
        # Only a call under the device settings the spare started with.
        return device_env(req["env"]) == device_env(os.environ)


def serve(a, app):
    """The warm server: listens first (the driver waits for that line), then builds the model, then forks
    a child per request. Ends when its stdin closes (the driver is gone) or on SIGTERM."""
    listener = fork_server.listen(a.socket)
    # From here on stdout is the server's log, like stderr: the driver reads only the line above.
    os.dup2(2, 1)
    warm, why, rebuild = None, None, False
    fork_server.ask_nvml_for_devices()
    try:
        warm = app.prepare(a)
        hash_triton_kernels()
        if app.cuda_initialised():
            warm, why = None, "the model's factory initialised CUDA, which a forked child cannot use"
        elif not hasattr(os, "pidfd_open"):
            warm, why = None, "this Python has no os.pidfd_open"
    except BaseException as e:  # noqa: BLE001 - every request then builds again and reports it itself
        why = f"building the model failed: {type(e).__name__}: {e}"
        # Each call then builds it again in a child of its own, as a cold run would, on what the failed
        # build imported here: at a parent commit that lacks the code (`ModuleNotFoundError`) a call
        # fails at once instead of importing torch and the libraries again. Whether CUDA started here
        # is checked before every fork (`admit`).
        rebuild = hasattr(os, "pidfd_open")
    if warm:
        say("harness: warm server ready")
    elif rebuild:
        say(f"harness: warm server: {why}; every call builds it again in a child of its own")
    else:
        say(f"harness: warm server cold: {why}")
    fork_server.serve(listener, Harness(a, app, warm, why, rebuild))
