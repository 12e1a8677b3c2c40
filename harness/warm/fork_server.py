"""The one warm fork server of cudabisect, and its client. A server has done the slow part once (imported
the heavy modules, built a model) and never touched CUDA; it forks one child per request, and the child
becomes the client's process (its stdin, stdout and stderr, cwd, environment and process group) and runs
the request, so a sticky CUDA error dies with its child. Used by the warm probes (`warm_probe.py`) and by
the PyTorch harness's warm start (`cudabisect_torch.warm`), which say what a request runs. Stdlib only.

On the wire (a Unix socket): the client sends one request, 8 bytes of length and the JSON, with its stdin,
stdout and stderr passed as descriptors. The server answers in JSON lines: `{"cold": why}` when it cannot
serve the request (nothing ran; the client runs it itself), else `{"pid": n}` once the child is forked and
`{"status": waitstatus}` when it ended. A client may send `signal:N ` words, which the server passes on to
the child; a client that hangs up takes its child along. A forked child may tell its server something
while it runs (`tell_server`, JSON lines on a pipe of its own), which the service hears (`told`).
"""

import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

# What a server prints on stdout once it listens: cudabisect waits for this line.
READY = "harness: listening"


# ---------------------------------------------------------------------------------------------- the wire


def send_request(sock, req, fds=(0, 1, 2)):
    """A request on the wire: its length, its JSON, and the caller's stdin, stdout and stderr."""
    payload = json.dumps(req).encode()
    data = struct.pack("!Q", len(payload)) + payload
    sent = socket.send_fds(sock, [data], list(fds))
    if sent < len(data):
        # (Only the rest: an empty send to a peer that already read everything and closed is EPIPE.)
        sock.sendall(data[sent:])


def recv_request(conn, timeout=30):
    """The request a client sent and its three descriptors; OSError or ValueError for a broken one."""
    conn.settimeout(timeout)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    try:
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
    except BaseException:
        close_all(fds)
        raise


def send_json(conn, obj):
    conn.sendall(json.dumps(obj).encode() + b"\n")


def tell(conn, obj):
    """Sends `obj` to a client that may be gone already (killed by a timeout): then nobody is waiting."""
    try:
        send_json(conn, obj)
    except OSError:
        pass


def close_all(fds):
    for fd in fds:
        os.close(fd)


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
            chunk = self.conn.recv(1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


# ------------------------------------------------------------------------------------------- the server


NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def ask_nvml_for_devices():
    """In a server, before it imports anything: torch answers `torch.cuda.is_available()` through NVML
    instead of starting the CUDA driver (`cudaGetDeviceCount`), which would leave the server unable to fork
    children that use CUDA. Libraries ask it at import, to pick a device or a block size (Liger-Kernel's
    `infer_device()`, transformers); NVML gives the same answer and torch falls back to the driver where
    NVML is missing. A child takes its client's environment (`become`), so the repro's own calls are
    answered as in a fresh process. A value the user set is kept."""
    os.environ.setdefault(NVML_CHECK, "1")


def hash_triton():
    """In a server where Triton is imported: computes Triton's hash of itself (every file of the package
    and its compiler library: about 0.35 s), which each process computes once, at its first kernel launch,
    and keeps. Computed here, every forked child inherits it. On the CPU only; never fails."""
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


def cuda_initialised(where="the warm interpreter"):
    """Why this process can no longer fork children that use CUDA, or None: torch initialised it, or the
    driver was (a library that queried the device through it). Checked before every fork: a request can
    make the server import or trace code that touches the device."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return f"CUDA was initialised in {where} (torch)"
    except Exception:  # noqa: BLE001 - a torch without CUDA support: nothing initialised
        pass
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return None  # the driver library is not even loaded
    ctx = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 3:  # 3: CUDA_ERROR_NOT_INITIALIZED
        return f"CUDA was initialised in {where} (the driver)"
    return None


# In a forked child: the write end of its pipe to the server (`tell_server`); None in the server.
TO_SERVER = None


def tell_server(obj):
    """In a forked child: sends `obj` to the server that forked it, which hears it while the child runs.
    Never fails: a server that is gone, or a child without a pipe (a spare), hears nothing."""
    if TO_SERVER is None:
        return
    try:
        os.write(TO_SERVER, json.dumps(obj).encode() + b"\n")
    except (OSError, TypeError, ValueError):
        pass


def kill_group(pid, sig):
    """Signals the group `pid` leads, or `pid` alone when it leads none (a child that joined its client's
    group, or one just forked whose setsid has not run yet)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def listen(path, backlog=128):
    """Binds the server's socket and says so on stdout (cudabisect waits for that line)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(backlog)
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    return listener


class Service:
    """What a server serves; the warm probes and the PyTorch harness each subclass it.

    `admit(req)`, in the server before each fork: None to fork, or `(why, ends)` to answer cold (`ends`:
    this server can serve no one any more and ends once its running children are answered).
    `run(req)`, in the child once it is the client's process: runs the request and never returns.
    `spare()`: True when the server keeps a spare child that started the device before any request;
    `warm_spare()` runs in it, and `spare_takes(req)` says whether a request may go to it. `ended(req)`
    runs in the server when a child has ended and may hand back work for after its client's answer.
    `told(req, msg)` runs in the server when the child running `req` told it `msg` (`tell_server`);
    `settle()` runs before every fork: work a service started in a thread of its own ends there, since a
    process forked while another thread runs may inherit a lock that thread held."""

    def admit(self, req):
        return None

    def run(self, req):
        raise NotImplementedError

    def spare(self):
        return False

    def warm_spare(self):
        pass

    def spare_takes(self, req):
        return False

    def ended(self, req):
        """In the server, once the child that ran `req` has ended, before its client is answered: None, or
        work to do right after the answer (the time between runs), as a function."""
        return None

    def told(self, req, msg):
        pass

    def settle(self):
        pass


# The handlers the server replaced with its own (SIGTERM: shut down), by signal: a forked child gets them
# back, as a fresh interpreter has them (inherited, or installed at import by a preloaded library). The
# server's other dispositions are left to the child as they are, for the same reason.
RESTORE = {}


# The signals a forked child must not take in before it has its own handlers back: the server's SIGTERM
# handler, run in the child, would remove the server's socket (every later client then finds no server) and
# kill the server's other children. The server holds them while it forks; the child lets them in once its
# handlers are its own.
HELD = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}


def fork_holding_signals():
    """`os.fork()` with the signals of `HELD` held across it (the streams flushed first, so neither side
    writes the other's buffered output): the server lets them in again at once (one sent meanwhile is
    delivered then); the child (0) holds them until `take_back_signals`, once its handlers are its own."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    pid = None
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
    return pid


def take_back_signals():
    """In a forked child: the handlers the server replaced are back (SIGINT raises KeyboardInterrupt, as in
    a fresh interpreter), then the signals held since the fork are delivered to them."""
    for sig, handler in RESTORE.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def become(req, fds, closing):
    """In a forked child: the server's own descriptors closed, the client's process group joined (`pgid`
    in the request) or a session of its own started (the server then signals its group), the client's
    streams, cwd and environment taken."""
    for fd in closing:
        try:
            os.close(fd)
        except OSError:
            pass
    if "pgid" in req:
        try:
            os.setpgid(0, int(req["pgid"]))
        except OSError:
            os.setpgid(0, 0)
    else:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    take_back_signals()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])


class _Server:
    """The state of one `serve` loop: the listener, the running children and the spare."""

    def __init__(self, listener, service, lifeline):
        self.listener, self.service, self.lifeline = listener, service, lifeline
        self.pid = os.getpid()  # the server's: a forked child that runs its SIGTERM handler is not it
        self.path = listener.getsockname()  # kept: a server that stops listening still removes it
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, ("accept", None))
        self.sel.register(lifeline, selectors.EVENT_READ, ("lifeline", None))
        self.jobs = {}  # pid -> (conn, pidfd)
        self.pipes = {}  # pid -> the read end of what its child tells the server
        self.requests = {}  # pid -> the request its child runs
        self.watching = set()  # children whose client connection is still watched for a hang-up
        self.spare = None  # (pid, socket to it, pidfd)
        self.ending = False

    def own_fds(self):
        """The server's descriptors, which no child keeps."""
        fds = [self.lifeline, self.listener.fileno()]
        fds += [fd for conn, pidfd in self.jobs.values() for fd in (conn.fileno(), pidfd)]
        fds += list(self.pipes.values())
        if self.spare:
            fds += [self.spare[1].fileno(), self.spare[2]]
        if hasattr(self.sel, "fileno"):
            fds.append(self.sel.fileno())
        return [fd for fd in fds if fd >= 0]

    def fork(self, req, fds, closing):
        """Forks the child that runs `req`: (pid, the read end of what it tells the server)."""
        self.service.settle()
        told, telling = os.pipe()
        pid = fork_holding_signals()
        if pid == 0:
            global TO_SERVER
            TO_SERVER = telling
            # A server that stopped reading never holds the child up: what does not fit is dropped.
            os.set_blocking(telling, False)
            try:
                become(req, fds, closing + [told])
            except BaseException:  # noqa: BLE001 - a child that cannot become the client's runs nothing
                os._exit(70)
            self.service.run(req)
            os._exit(70)
        os.close(telling)
        return pid, told

    def start_spare(self):
        if self.ending or not self.service.spare():
            return None
        self.service.settle()
        mine, theirs = socket.socketpair()
        closing = self.own_fds() + [mine.fileno()]
        pid = fork_holding_signals()
        if pid == 0:
            # Until a request comes, the spare ends on a signal as a fresh interpreter would.
            take_back_signals()
            for fd in closing:
                try:
                    os.close(fd)
                except OSError:
                    pass
            try:
                self.service.warm_spare()
                req, fds = recv_request(theirs, timeout=None)
                become(req, fds, [theirs.fileno()])
            except BaseException:  # noqa: BLE001 - a spare that cannot start is simply not used
                os._exit(0)
            self.service.run(req)
            os._exit(70)
        theirs.close()
        pidfd = os.pidfd_open(pid)
        self.sel.register(pidfd, selectors.EVENT_READ, ("spare", pid))
        return (pid, mine, pidfd)

    def drop_spare(self):
        pid, mine, pidfd = self.spare
        self.spare = None
        self.sel.unregister(pidfd)
        return pid, mine, pidfd

    def shutdown(self, *_):
        if os.getpid() != self.pid:
            # A child run by a SIGTERM the server had taken in just before it forked: the child ends as
            # SIGTERM ends a fresh interpreter; the socket and the other children are the server's.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(128 + signal.SIGTERM)
        for pid in list(self.jobs) + ([self.spare[0]] if self.spare else []):
            kill_group(pid, signal.SIGKILL)
        try:
            os.unlink(self.path)
        except (OSError, TypeError):
            pass
        os._exit(0)

    def loop(self):
        RESTORE[signal.SIGTERM] = signal.signal(signal.SIGTERM, self.shutdown)
        self.spare = self.start_spare()
        while True:
            for key, _ in self.sel.select():
                kind, pid = key.data
                if kind == "lifeline":
                    if not os.read(self.lifeline, 4096):
                        self.shutdown()  # the driver is gone
                elif kind == "accept":
                    self.accept()
                elif kind == "spare":
                    self.spare_ended(pid)
                elif kind == "child":
                    self.child_ended(pid)
                elif kind == "client":
                    self.client_data(pid)
                elif kind == "told":
                    self.child_told(pid)
            if self.ending and not self.jobs:
                self.shutdown()

    def accept(self):
        conn, _ = self.listener.accept()
        try:
            req, fds = recv_request(conn)
        except (OSError, ValueError) as e:
            print(f"harness: bad request: {e}", file=sys.stderr, flush=True)
            conn.close()
            return
        refused = self.service.admit(req)
        if refused is not None:
            why, ends = refused
            close_all(fds)
            tell(conn, {"cold": why})
            conn.close()
            if ends:
                # Nobody is served from here on: cudabisect starts another server.
                self.ending = True
                self.sel.unregister(self.listener)
                self.listener.close()
            return
        taken = self.to_spare(req, fds)
        if taken is None:
            pid, told = self.fork(req, fds, self.own_fds() + [conn.fileno()])
            self.pipes[pid] = told
            self.sel.register(told, selectors.EVENT_READ, ("told", pid))
            taken = (pid, os.pidfd_open(pid))
        pid, pidfd = taken
        close_all(fds)
        tell(conn, {"pid": pid})  # a client gone already: its hang-up is seen below
        self.jobs[pid] = (conn, pidfd)
        self.requests[pid] = req
        self.sel.register(pidfd, selectors.EVENT_READ, ("child", pid))
        self.sel.register(conn, selectors.EVENT_READ, ("client", pid))
        self.watching.add(pid)
        if self.spare is None:
            self.spare = self.start_spare()

    def to_spare(self, req, fds):
        """Hands the request to the spare when it may take it: (pid, pidfd), or None."""
        if self.spare is None or not self.service.spare_takes(req):
            return None
        pid, mine, pidfd = self.drop_spare()
        try:
            send_request(mine, req, fds)
            return pid, pidfd
        except OSError:
            kill_group(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(pidfd)
            return None
        finally:
            mine.close()

    def spare_ended(self, pid):
        # The spare ended before it was used (it could not start the device): requests fork as before
        # until the next one starts. (An event of a spare handed a request earlier in this batch is
        # stale: that process is a job now.)
        if self.spare is None or self.spare[0] != pid:
            return
        pid, mine, pidfd = self.drop_spare()
        os.waitpid(pid, 0)
        os.close(pidfd)
        mine.close()

    def child_told(self, pid):
        told = self.pipes.get(pid)
        if told is None:
            return  # its child ended in this same batch of events: its pipe is closed
        data = os.read(told, 1 << 16)
        if not data:
            self.close_pipe(pid)
            return
        for line in data.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            try:
                self.service.told(self.requests.get(pid), msg)
            except Exception as e:  # noqa: BLE001 - nothing a child says may stop the server
                print(f"harness: told by a child: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def close_pipe(self, pid):
        told = self.pipes.pop(pid, None)
        if told is not None:
            self.sel.unregister(told)
            os.close(told)

    def child_ended(self, pid):
        conn, pidfd = self.jobs.pop(pid)
        _, status = os.waitpid(pid, 0)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        # What it told and was not heard yet is dropped: `ended` hears the whole run.
        self.close_pipe(pid)
        if pid in self.watching:
            self.watching.discard(pid)
            self.sel.unregister(conn)
        req = self.requests.pop(pid, None)
        after = None if self.ending else self.service.ended(req)
        tell(conn, {"status": status})
        conn.close()
        if after is not None:
            # After the answer: the client, and so the probe, does not wait for it. Work that fails is
            # said and dropped; the server goes on serving.
            try:
                after()
            except Exception as e:  # noqa: BLE001 - nothing done between runs may stop the server
                print(f"harness: after a run: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def client_data(self, pid):
        if pid not in self.watching:
            return  # its child ended in this same batch of events: already answered
        conn = self.jobs[pid][0]
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:
            # The client hung up before its child ended (killed by a timeout or Ctrl-C): the child goes
            # too, whether or not it could join the client's process group.
            self.watching.discard(pid)
            self.sel.unregister(conn)
            kill_group(pid, signal.SIGKILL)
            return
        for word in data.decode(errors="replace").split():
            if word.startswith("signal:"):
                kill_group(pid, int(word[7:]))


def serve(listener, service, lifeline=0):
    """Serves requests on `listener` until `lifeline` (the server's stdin) closes: the driver is gone,
    or SIGTERM. Either way the running children are killed first."""
    _Server(listener, service, lifeline).loop()


# ------------------------------------------------------------------------------------------- the client


def forward(path, req, wait=0.0, pass_signals=False, forked=None):
    """Runs `req` in the server at `path` as this process: `("cold", why)` when it was not run there
    (no server, or it cannot serve it), `("status", waitstatus)` when its child ended, `("gone", why)`
    when the server went away during the run. `wait`: how long a server not listening yet is waited
    for. `pass_signals`: this process's signals are passed on to the child (one in a session of its
    own). `forked()` is called once the child runs."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + wait
    while True:
        try:
            conn.connect(path)
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                conn.close()
                return ("cold", f"no warm server listening ({e})")
            time.sleep(0.01)
    try:
        send_request(conn, req)
        messages = Messages(conn)
        first = messages.next()
    except OSError as e:
        first = {"cold": f"the warm server did not answer ({e})"}
    if first is None or "cold" in first:
        # Nothing ran there: a server that died before it forked (while building the model, say).
        conn.close()
        return ("cold", (first or {}).get("cold", "the warm server went away before the run"))
    if forked is not None:
        forked()
    if pass_signals:

        def passed_on(sig, _frame):
            try:
                conn.sendall(f"signal:{sig} ".encode())
            except OSError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, passed_on)
    done = messages.next()
    if done is None:
        return ("gone", "the warm server went away during the run")
    return ("status", done["status"])


def end_as(status):
    """Ends this process as a child with wait status `status` ended: the same exit code, or death by the
    same signal (so the driver sees a crash as a crash)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe: nothing more to say
            pass
    if os.WIFSIGNALED(status):
        # SIGKILL and SIGSTOP take no handler (and need none): the kill alone does.
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))
