"""The PyTorch harness's warm start, without torch: a real server process and real client processes, with
the model-building and verb-running parts replaced by stand-ins that say who ran them. Checks that a request
runs in a child forked from the server (not cold), in the client's process group, cwd and environment, with
the child's exit status or signal handed back; that killing the client (its group, or the client alone)
kills the child; that several requests run at once; that a client that cannot reach a server runs cold; and
that the server ends when the driver closes its stdin.

Runs under pytest, or alone (`python3 harness/tests/test_warm_server.py`), which is how `cargo test` runs it.
"""

import os
import select
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS_DIR = os.path.join(HERE, "..", "torch_harness")

# The stand-in harness: the real main, serve and forward, handed stand-ins for prepare and execute.
DRIVER = f"""
import os, signal, sys, types
sys.path.insert(0, {HARNESS_DIR!r})
from cudabisect_torch import cli, warm as warm_server


def prepare(a):
    print(f"built in {{os.getpid()}} nvml={{os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')}}", flush=True)
    if os.environ.get("WARM_TEST_DIE_BUILDING") and sys.argv[-2] == "--socket":
        os._exit(9)  # the server dies while building the model (an out-of-memory, say)
    if os.environ.get("WARM_TEST_FAIL_BUILDING"):
        raise ModuleNotFoundError("No module named 'm.fused'")  # a commit without the model's code
    return types.SimpleNamespace(key=cli.prepare_key(a))


WARMED = [None]


def warm_device(a, root=None, captured=None):
    WARMED[0] = os.getpid()
    print(f"warmed in {{os.getpid()}}", flush=True)


def execute(a, w):
    what = a.keep
    print(f"ran {{what}} pid={{os.getpid()}} pgid={{os.getpgrp()}} cwd={{os.getcwd()}} "
          f"x={{os.environ.get('WARM_TEST_X')}} warmed={{WARMED[0] == os.getpid()}} "
          f"nvml={{os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')}}", flush=True)
    if what == "exit3":
        return 3
    if what == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "hang":
        sys.stdin.read()  # the client's stdin: a pipe nobody closes until the test kills the client
    return 0


def cuda_initialised():
    # Stands for a request that made the server touch the device (a library querying it while traced).
    flag = os.environ.get("WARM_TEST_TOUCHED")
    return "CUDA was initialised in the server (stand-in)" if flag and os.path.exists(flag) else None


def main(argv=None, warm=None):
    return cli.main(argv, warm, prepare=prepare, execute=execute, app=APP)


APP = warm_server.App(cli.parse_args, prepare, main, start_device=warm_device, cuda_state=cuda_initialised)
sys.exit(main())
"""

BASE = ["--model", "m:build", "--example-inputs", "m:inputs", "--device", "cpu"]


class Server:
    def __init__(self, tmp, device="cpu", env=None):
        self.base = [*BASE[:-1], device]
        self.driver = os.path.join(tmp, "driver.py")
        with open(self.driver, "w") as f:
            f.write(DRIVER)
        self.socket = os.path.join(tmp, "h.sock")
        self.log = open(os.path.join(tmp, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, self.driver, *self.base, "serve", "--socket", self.socket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            process_group=0,
            env=env,
        )
        first = self.proc.stdout.readline().decode()
        assert first.strip() == "harness: listening", first

    def client(self, verb_args, via=None, **kw):
        via = self.socket if via is None else via
        return subprocess.Popen(
            [sys.executable, self.driver, *self.base, "--via", via, "run", *verb_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
            **kw,
        )

    def stop(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        self.log.seek(0)
        return self.log.read()


def wait_gone(pid, timeout=30):
    """Waits for a process that is not our child to end (pidfd: no polling, no sleep)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)


def field(line, name):
    return line.split(f"{name}=")[1].split()[0]


def test_requests_run_in_children_forked_from_the_built_model():
    with tempfile.TemporaryDirectory() as tmp:
        s = Server(tmp)
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        env = dict(os.environ, WARM_TEST_X="from-client")
        env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        c = s.client(["--keep", "ok"], cwd=work, env=env)
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == 0, out
        ran = [line for line in out.splitlines() if line.startswith("ran ok")]
        assert ran and "built in" not in out, out  # nothing was built cold
        line = ran[0]
        assert int(field(line, "pid")) != c.pid, out  # a forked child, not the client
        assert int(field(line, "pgid")) == c.pid, out  # in the client's process group
        assert field(line, "cwd") == os.path.realpath(work) or field(line, "cwd") == work, out
        assert field(line, "x") == "from-client", out
        # The server built the model asking NVML, not the driver, whether CUDA is there (a library that asks
        # at import would otherwise start the driver and leave every call cold); the child has the client's
        # environment, as a fresh process does.
        assert field(line, "nvml") == "None", out
        c = s.client(["--keep", "exit3"])
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == 3, out
        c = s.client(["--keep", "segv"])
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == -signal.SIGSEGV, (c.returncode, out)
        log = s.stop()
        assert log.count("built in") == 1 and "nvml=1" in log and "warm server ready" in log, log


def hanging_child(s):
    c = s.client(["--keep", "hang"], stdin=subprocess.PIPE)
    line = c.stdout.readline().decode()
    assert line.startswith("ran hang"), line
    return c, int(field(line, "pid"))


def test_killing_the_client_kills_its_child_and_requests_run_at_once():
    with tempfile.TemporaryDirectory() as tmp:
        s = Server(tmp)
        # Three at once: each child is running while the others are.
        running = [hanging_child(s) for _ in range(3)]
        assert len({pid for _, pid in running}) == 3
        (c1, p1), (c2, p2), (c3, p3) = running
        # A timeout kills the client's whole group: the child is in it.
        os.killpg(c1.pid, signal.SIGKILL)
        c1.wait(timeout=30)
        assert wait_gone(p1), "the child outlived its client's group"
        # A client killed alone: the server sees the hang-up and kills the child.
        c2.kill()
        c2.wait(timeout=30)
        assert wait_gone(p2), "the child outlived its client"
        # The third is still running, untouched, until its own client goes.
        os.kill(p3, 0)
        os.killpg(c3.pid, signal.SIGKILL)
        c3.wait(timeout=30)
        assert wait_gone(p3)
        for c in (c1, c2, c3):
            c.stdin.close()
            c.stdout.close()
        s.stop()


def test_a_client_that_cannot_reach_a_server_runs_cold():
    with tempfile.TemporaryDirectory() as tmp:
        s = Server(tmp)
        c = s.client(["--keep", "ok"], via=os.path.join(tmp, "nothing.sock"))
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == 0, out
        assert "running cold" in out and "built in" in out and "ran ok" in out, out
        s.stop()
        # With the server gone, its socket is gone too, and clients still run.
        assert not os.path.exists(s.socket)


def test_a_server_that_dies_before_a_call_started_leaves_the_call_to_run_cold():
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["WARM_TEST_DIE_BUILDING"] = "1"
        try:
            s = Server(tmp)
            c = s.client(["--keep", "ok"], env={k: v for k, v in os.environ.items() if k != "WARM_TEST_DIE_BUILDING"})
            out = c.communicate(timeout=60)[0].decode()
        finally:
            del os.environ["WARM_TEST_DIE_BUILDING"]
        assert c.returncode == 0, out
        # Whether the client connected before the server died (then it saw no `forked` line) or after
        # (then nobody listened), nothing had run there: the call runs cold, here.
        assert "running cold" in out and "ran ok" in out and out.count("ran ok") == 1, out
        assert s.proc.wait(timeout=30) == 9


def test_a_server_whose_build_failed_has_each_call_build_again_in_a_child_of_its_own():
    # A commit without the model's code (the check at the culprit's parent): each call fails as a cold
    # run would, with the build's own error, but in a child forked from the server, on its imports.
    with tempfile.TemporaryDirectory() as tmp:
        failing = dict(os.environ, WARM_TEST_FAIL_BUILDING="1")
        s = Server(tmp, env=failing)
        c = s.client(["--keep", "ok"], env=failing)
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode != 0, out
        assert "No module named 'm.fused'" in out and "running cold" not in out, out
        built = [line for line in out.splitlines() if line.startswith("built in")]
        assert built and int(built[0].split()[2]) != c.pid, out  # built again, in a forked child
        # The child builds afresh: a call whose environment lets the build through runs there too.
        plain = {k: v for k, v in os.environ.items() if k != "WARM_TEST_FAIL_BUILDING"}
        c = s.client(["--keep", "ok"], env=plain)
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == 0, out
        ran = [line for line in out.splitlines() if line.startswith("ran ok")]
        assert ran and int(field(ran[0], "pid")) != c.pid and "running cold" not in out, out
        log = s.stop()
        assert "every call builds it again in a child of its own" in log, log


def test_a_spare_child_that_started_the_device_takes_the_next_call():
    with tempfile.TemporaryDirectory() as tmp:
        s = Server(tmp, device="cuda")
        pids = []
        for _ in range(2):
            c = s.client(["--keep", "ok"])
            out = c.communicate(timeout=60)[0].decode()
            assert c.returncode == 0, out
            line = [x for x in out.splitlines() if x.startswith("ran ok")][0]
            # Run by a spare that had started the device before the call came, in the client's group.
            assert field(line, "warmed") == "True", out
            assert int(field(line, "pgid")) == c.pid, out
            pids.append(int(field(line, "pid")))
        assert pids[0] != pids[1], "a spare serves one call only"
        # A call asking for other device settings than the spare started with gets a fresh child.
        c = s.client(["--keep", "ok"], env=dict(os.environ, CUDA_TEST_OTHER="1"))
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == 0 and "warmed=False" in out, out
        # A spare's child dies with its client's group like any other.
        c, pid = hanging_child(s)
        os.killpg(c.pid, signal.SIGKILL)
        c.wait(timeout=30)
        assert wait_gone(pid)
        c.stdin.close()
        c.stdout.close()
        log = s.stop()
        assert log.count("warmed in") >= 3, log


def test_a_server_that_touched_cuda_forks_no_more_and_every_later_call_runs_cold():
    with tempfile.TemporaryDirectory() as tmp:
        flag = os.path.join(tmp, "touched")
        os.environ["WARM_TEST_TOUCHED"] = flag
        try:
            s = Server(tmp, device="cuda")
        finally:
            del os.environ["WARM_TEST_TOUCHED"]
        c = s.client(["--keep", "ok"])
        out = c.communicate(timeout=60)[0].decode()
        assert c.returncode == 0 and "built in" not in out, out  # forked warm
        with open(flag, "w"):
            pass  # from here on the server's CUDA is initialised
        for _ in range(2):
            c = s.client(["--keep", "ok"])
            out = c.communicate(timeout=60)[0].decode()
            assert c.returncode == 0, out
            assert "built in" in out and "ran ok" in out, out  # the client ran it cold itself
        log = s.stop()
        assert "cold from now on: CUDA was initialised in the server (stand-in)" in log, log


def test_the_server_ends_with_its_driver_and_takes_running_children_along():
    with tempfile.TemporaryDirectory() as tmp:
        s = Server(tmp)
        c, pid = hanging_child(s)
        s.stop()
        assert wait_gone(pid), "a child outlived the server"
        c.kill()
        c.wait(timeout=30)
        c.stdin.close()
        c.stdout.close()


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from standalone import run_all

    run_all(globals())
