"""The warm probe runner against cold runs: every scripted repro must behave through the warm interpreter
exactly as a fresh `python3 script.py` does (exit status, death by signal, argv, environment, cwd, stdin,
output, children it spawns, atexit), a worktree module shadowing a preloaded name is the worktree's, a
preloaded module whose file changes sends the run cold, and a killed client takes its child along."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "warm" / "warm_probe.py"


def fork_server():
    """The fork server module the runner uses, loaded from beside it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fork_server", RUNNER.parent / "fork_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runner():
    """The warm runner as a module (it imports `fork_server` from beside it)."""
    import importlib.util

    sys.modules.setdefault("fork_server", fork_server())
    spec = importlib.util.spec_from_file_location("warm_probe", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed(where, *names):
    """A file listing module names, as cudabisect hands a server what to import."""
    path = where / ("names-" + "-".join(names) + ".json")
    path.write_text(json.dumps(list(names)))
    return str(path)


def listening(tmp_path, sock, env, *preload):
    """A warm server preloading `preload`, once it listens on `sock`."""
    proc = subprocess.Popen(
        [sys.executable, str(RUNNER), "--preload-file", listed(tmp_path, *preload), "serve", "--socket", str(sock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout.readline().decode().strip() == "harness: listening"
    return proc


@pytest.fixture()
def server(tmp_path):
    """A warm server preloading `json` and a module `sharedlib` from a site directory outside the
    worktree; yields (socket, site dir, worktree)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sharedlib.py").write_text("VALUE = 'preloaded'\n")
    work = tmp_path / "work"
    work.mkdir()
    sock = tmp_path / "s.sock"
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = listening(tmp_path, sock, env, "json", "sharedlib")
    yield sock, site, work, env
    proc.stdin.close()
    proc.wait(timeout=10)


def both(server, script, args=(), stdin=b"", extra_env=None, name="repro.py"):
    """Runs `script` cold and warm; returns the two (returncode, stdout, stderr, status) tuples."""
    sock, _, work, env = server
    (work / name).write_text(textwrap.dedent(script))
    env = dict(env, **(extra_env or {}))
    cmd = ["python3", name, *args]
    cold = subprocess.run(cmd, cwd=work, env=env, input=stdin, capture_output=True, timeout=60)
    status = work.parent / "status"
    warm = subprocess.run(
        [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", *cmd],
        cwd=work,
        env=env,
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    return (
        (cold.returncode, cold.stdout, cold.stderr),
        (warm.returncode, warm.stdout, warm.stderr),
        status.read_text().strip(),
    )


CASES = {
    "exit code": ("import sys\nprint('x')\nsys.exit(7)\n", ()),
    "exception": ("def f():\n    raise ValueError('boom')\n\nf()\n", ()),
    "syntax error": ("def f(:\n", ()),
    "argv, name and cwd": (
        "import os, sys\nprint(sys.argv, __name__, os.path.basename(os.getcwd()), sys.path[0].endswith('work'))\n",
        ("a", "--b", "c d"),
    ),
    "the interpreter's own argv": ("import sys\nprint(sys.orig_argv)\n", ("x", "--y")),
    "environment": ("import os\nprint(os.environ.get('PROBE_X'), os.environ.get('CUDABISECT_COMMIT'))\n", ()),
    "stdin": ("import sys\nprint(sys.stdin.read().upper())\n", ()),
    "death by signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", ()),
    # What the kernel's OOM killer, a cgroup limit or `timeout -s KILL` does: no handler can be set for it.
    "death by SIGKILL": ("import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n", ()),
    "SIGKILL from another process": (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen(['sh', '-c', f'kill -9 {os.getpid()}'])\n"
        "time.sleep(30)\nsys.exit(3)\n",
        (),
    ),
    "a child it spawns": (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-c', 'print(41+1)'], capture_output=True, text=True)\n"
        "print(r.stdout.strip())\nsys.exit(3)\n",
        (),
    ),
    "sys.exit in atexit": (
        "import atexit, sys\natexit.register(lambda: print('bye', flush=True))\nprint('main')\nsys.exit(5)\n",
        (),
    ),
    "sys.exit inside an atexit handler": (
        "import atexit, sys\natexit.register(sys.exit, 7)\nprint('main')\n",
        (),
    ),
    "a thread still running at the end": (
        "import threading, time\n"
        "def late():\n    time.sleep(0.3)\n    print('thread done', flush=True)\n"
        "threading.Thread(target=late).start()\nprint('main done')\n",
        (),
    ),
    "buffered output never flushed": ("import sys\nsys.stdout.write('no newline, no flush')\n", ()),
    "stderr and stdout": ("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(1)\n", ()),
    "preloaded module": ("import sharedlib, json\nprint(sharedlib.VALUE, json.dumps([1]))\n", ()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_warm_run_is_a_cold_run(server, case):
    script, args = CASES[case]
    cold, warm, status = both(
        server, script, args, stdin=b"hello", extra_env={"PROBE_X": "7", "CUDABISECT_COMMIT": "abc"}
    )
    assert status == "warm"
    assert warm[0] == cold[0], (warm, cold)
    assert warm[1] == cold[1]
    # The same traceback, frame for frame: the runner's own frames are left out.
    assert warm[2] == cold[2]


def test_a_worktree_module_shadowing_a_preloaded_name_is_the_worktrees(server):
    _, _, work, _ = server
    (work / "sharedlib.py").write_text("VALUE = 'from the worktree'\n")
    cold, warm, status = both(server, "import sharedlib\nprint(sharedlib.VALUE)\n")
    assert status == "warm"
    assert cold[1] == warm[1] == b"from the worktree\n"


def test_a_preloaded_module_that_changed_runs_cold_and_says_why(server):
    _, site, _, _ = server
    time.sleep(0.01)
    (site / "sharedlib.py").write_text("VALUE = 'new'\n")
    cold, warm, status = both(server, "import sharedlib\nprint(sharedlib.VALUE)\n")
    assert status.startswith("cold:") and "changed since it was preloaded" in status, status
    assert cold == warm


def test_a_preloaded_module_a_run_rewrote_is_not_served_after_the_server_learns_more(server):
    # The review's WP13: the server preloaded `sharedlib`; the first run rewrites it and imports another
    # module; the next run, taught to preload that one too, must not be served the old `sharedlib`.
    sock, site, work, env = server
    (site / "otherlib.py").write_text("VALUE = 'other'\n")
    (work / "bump.py").write_text(
        "import sharedlib, otherlib\nprint(sharedlib.VALUE, flush=True)\n"
        "open(sharedlib.__file__, 'w').write('VALUE = %r\\n' % (sharedlib.VALUE + '+'))\n"
    )
    status = work.parent / "status"
    client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "bump.py"]
    first = subprocess.run(client, cwd=work, env=env, capture_output=True, timeout=60)
    assert first.stdout == b"preloaded\n", first
    taught = dict(env, CUDABISECT_WARM_PRELOAD=listed(work.parent, "otherlib", "sharedlib"))
    second = subprocess.run(client, cwd=work, env=taught, capture_output=True, timeout=60)
    assert second.stdout == b"preloaded+\n", second
    assert status.read_text().startswith("cold:") and "sharedlib.py changed" in status.read_text()


def test_the_learning_file_is_the_runners_not_a_variable_the_repro_sees(server):
    sock, _, work, env = server
    learn = work.parent / "learned.json"
    (work / "env.py").write_text("import os\nprint(sorted(k for k in os.environ if 'WARM' in k))\n")
    status = work.parent / "status"
    client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "env.py"]
    run = subprocess.run(
        client, cwd=work, env=dict(env, CUDABISECT_WARM_LEARN=str(learn)), capture_output=True, timeout=60
    )
    assert status.read_text().strip() == "warm"
    assert run.stdout == b"[]\n", run
    assert learn.exists(), "the child still wrote what it imported"


def test_a_learned_module_a_run_rewrote_is_never_served_warm(server):
    # The repro of the review: a run rewrites a module it imports, keeping its size, in the same second its
    # bytecode records, so Python takes the old bytecode for current. The next run, taught to preload the
    # module, must not be served from what the server imported then.
    sock, site, work, env = server
    src = site / "relmod.py"
    src.write_text("COUNTER = 0\n")
    second = (time.time_ns() // 10**9 - 10) * 10**9
    os.utime(src, ns=(second, second))
    writes = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(["python3", "-c", "import relmod"], env=writes, cwd=work, check=True)
    pyc = site / "__pycache__" / f"relmod.{sys.implementation.cache_tag}.pyc"
    os.utime(pyc, ns=(second + 10**8, second + 10**8))
    src.write_text("COUNTER = 1\n")
    os.utime(src, ns=(second + 5 * 10**8, second + 5 * 10**8))
    (work / "show.py").write_text("import relmod\nprint('COUNTER', relmod.COUNTER, flush=True)\n")
    status = work.parent / "status"
    client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "show.py"]
    taught = dict(env, CUDABISECT_WARM_PRELOAD=listed(work.parent, "relmod"))
    run = subprocess.run(client, cwd=work, env=taught, capture_output=True, timeout=60)
    assert run.returncode == 0, run
    assert status.read_text().startswith("cold:") and "relmod.py changed" in status.read_text(), status.read_text()


def test_a_learned_preload_is_imported_into_the_running_server_not_handed_to_the_repro(server):
    _, site, work, _ = server
    (site / "otherlib.py").write_text("VALUE = 'other'\n")
    script = "import os, sys\nprint('otherlib' in sys.modules, os.environ.get('CUDABISECT_WARM_PRELOAD'))\n"
    names = listed(work.parent, "otherlib", "json")
    cold, warm, status = both(server, script, extra_env={"CUDABISECT_WARM_PRELOAD": names})
    assert status == "warm"
    # Warm, the server imported it before forking; the repro never sees the variable. Cold (a fresh
    # interpreter, given the variable by this test alone) has nothing preloaded.
    assert warm[1] == b"True None\n", warm
    assert cold[1] == f"False {names}\n".encode(), cold


def taught_run(server, script, learn=True):
    """Runs `python3 script` (in the worktree) warm, as a learning run unless `learn` is False: returns the
    run, how it ran, and the names it taught (None when it did not learn)."""
    sock, _, work, env = server
    learned = work.parent / "learned.json"
    learned.unlink(missing_ok=True)
    status = work.parent / "status"
    client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", script]
    env = dict(env, CUDABISECT_WARM_LEARN=str(learned)) if learn else env
    run = subprocess.run(client, cwd=work, env=env, capture_output=True, timeout=60)
    taught = json.loads(learned.read_text()) if learn else None
    return run, status.read_text().strip(), taught


def test_what_a_run_imported_is_in_the_server_before_the_next_run_without_being_asked(server):
    # A probe that faults early imports less than one that trains a whole step (an optimizer step imports
    # `torch._dynamo`, a submodule `import torch` leaves out): every run teaches, submodules included, and
    # the server imports it once the run has ended, so no later run pays for it again.
    _, site, work, _ = server
    (site / "biglib").mkdir()
    (site / "biglib" / "__init__.py").write_text("")
    (site / "biglib" / "deep.py").write_text("VALUE = 'deep'\n")
    (work / "step.py").write_text("import sys\nprint('biglib.deep' in sys.modules, flush=True)\nimport biglib.deep\n")
    first, _, taught = taught_run(server, "step.py")
    assert first.stdout == b"False\n", first
    # The submodule, in the order of import; not the package it implies, not the repro's own modules.
    assert "biglib.deep" in taught and "biglib" not in taught and "step" not in taught, taught
    second, status, _ = taught_run(server, "step.py", learn=False)
    assert status == "warm"
    assert second.stdout == b"True\n", second


def standin_torch(site):
    """A stand-in `torch` in `site` with what the runner uses of PyTorch's CUDA start: `torch.cuda._lazy_call`
    queues a call, `torch.cuda.init()` (the device's start) runs the queue."""
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("from torch import cuda\n")
    (site / "torch" / "cuda.py").write_text(
        "_queued_calls = []\n"
        "def _lazy_call(fn):\n    _queued_calls.append((fn, []))\n"
        "def init():\n    for fn, _ in _queued_calls:\n        fn()\n"
    )


def test_what_a_run_imported_before_it_started_the_device_is_in_the_server_while_the_run_goes_on(server):
    # A library that imports a heavy dependency at its first use (Liger-Kernel's `infer_device()` imports
    # transformers: 8 s on a GPU machine) is only seen by the run: the server learned it when the run
    # ended, and the next fork waited for it. Now the run tells the server as it starts the device, and
    # the server imports it in a thread while the run goes on. CUDA cannot start here, so `torch` is a
    # stand-in with the two calls of PyTorch's that the runner uses (the next test holds real PyTorch to
    # them). `heavylib`, imported in the server (not in the run: the run's environment says so), opens a
    # FIFO that the run reads: the run ends only once the server has imported it, and without the early
    # lesson it never would (the test's timeout).
    _, site, work, _ = server
    standin_torch(site)
    fifo = work.parent / "imported"
    os.mkfifo(fifo)
    (site / "heavylib.py").write_text(
        f"import os\nif not os.environ.get('IN_RUN'):\n    open({str(fifo)!r}, 'w').write(str(os.getpid()))\n"
    )
    (work / "train.py").write_text(
        "import os, sys, torch, heavylib\ntorch.cuda.init()\n"
        f"server = open({str(fifo)!r}).read()\n"
        "print(int(server) == os.getppid(), flush=True)\n"  # the server that forked this run
    )
    sock, _, _, env = server
    learned = work.parent / "learned.json"
    status = work.parent / "status"
    client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "train.py"]
    run = subprocess.run(
        client, cwd=work, env=dict(env, IN_RUN="1", CUDABISECT_WARM_LEARN=str(learned)), capture_output=True, timeout=30
    )
    assert run.returncode == 0 and run.stdout == b"True\n", run
    assert "heavylib" in json.loads(Path(str(learned) + ".early").read_text())
    (work / "again.py").write_text("import sys\nprint('heavylib' in sys.modules, flush=True)\n")
    again, status, _ = taught_run(server, "again.py", learn=False)
    assert status == "warm" and again.stdout == b"True\n", again


def test_a_module_that_cannot_be_imported_in_the_lessons_thread_is_imported_after_the_run(server):
    # A library that installs a signal handler at import can only be imported in a main thread: in the
    # thread that imports a run's early lesson it fails. It is not given up on: the server imports it in
    # its own thread once the run has ended, so the next run finds it preloaded, its handler in place.
    _, site, work, _ = server
    standin_torch(site)
    (site / "sighandling.py").write_text(
        "import signal\ndef on_alarm(*_):\n    pass\nsignal.signal(signal.SIGALRM, on_alarm)\n"
    )
    (work / "train.py").write_text("import torch, sighandling\ntorch.cuda.init()\n")
    first, status, _ = taught_run(server, "train.py")
    assert first.returncode == 0 and status == "warm", first
    assert "sighandling" in json.loads(Path(str(work.parent / "learned.json") + ".early").read_text())
    (work / "again.py").write_text(
        "import signal, sys\nm = sys.modules.get('sighandling')\n"
        "print(m is not None and signal.getsignal(signal.SIGALRM) is m.on_alarm, flush=True)\n"
    )
    again, status, _ = taught_run(server, "again.py", learn=False)
    assert status == "warm" and again.stdout == b"True\n", again


def test_pytorch_queues_a_call_for_when_cuda_starts_as_the_runner_expects():
    # What the early lesson relies on, held against the real PyTorch installed here (no GPU: CUDA never
    # starts, so the call stays queued).
    import torch

    def lesson():
        pass

    assert not torch.cuda.is_initialized()
    torch.cuda._lazy_call(lesson)
    assert any(call is lesson for call, *_ in torch.cuda._queued_calls)


def warm_and_cold(tmp_path, env, preload, script="repro.py"):
    """`python3 script` in `tmp_path/work`, run warm through a server preloading `preload` and cold (a fresh
    interpreter): (warm run, cold run, how the warm one ran)."""
    sock = tmp_path / "wc.sock"
    proc = listening(tmp_path, sock, env, *preload)
    try:
        status = tmp_path / "status"
        client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--"]
        warm = subprocess.run(
            [*client, "python3", script], cwd=tmp_path / "work", env=env, capture_output=True, timeout=60
        )
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    cold = subprocess.run(["python3", script], cwd=tmp_path / "work", env=env, capture_output=True, timeout=60)
    return warm, cold, status.read_text().strip()


def test_a_server_that_preloaded_triton_hands_its_children_tritons_hash_of_itself(tmp_path):
    # Every process hashes Triton's own files once, at its first kernel launch (0.35 s here): computed in
    # the server that preloaded Triton, each probe's child inherits it. Real Triton, no kernel launched.
    work = tmp_path / "work"
    work.mkdir()
    (work / "repro.py").write_text(
        "from triton.runtime.cache import triton_key\nprint(triton_key.cache_info().currsize, flush=True)\n"
    )
    warm, cold, status = warm_and_cold(tmp_path, dict(os.environ), ["triton"])
    assert status == "warm"
    assert cold.stdout == b"0\n", cold
    assert warm.stdout == b"1\n", warm


def test_a_module_imported_after_the_repro_changed_its_environment_is_not_taught(server):
    # A training script sets a library's knob in its own environment, then imports the library's config
    # module, which reads the knob at import (as `torch._inductor.config` reads `TORCHINDUCTOR_*`).
    # Preloaded, that module would keep the value from before the change: the run would not be the run a
    # fresh interpreter makes. So it is not taught; its package still is.
    _, site, work, _ = server
    (site / "knoblib").mkdir()
    (site / "knoblib" / "__init__.py").write_text("")
    (site / "knoblib" / "conf.py").write_text("import os\nKNOB = os.environ.get('KNOB')\n")
    (site / "knoblib" / "early.py").write_text("")
    (work / "train.py").write_text(
        "import os\nimport knoblib.early\nos.environ['KNOB'] = 'set by the script'\n"
        "import knoblib.conf\nprint(knoblib.conf.KNOB, flush=True)\n"
    )
    first, _, taught = taught_run(server, "train.py")
    assert first.stdout == b"set by the script\n", first
    assert "knoblib.early" in taught and "knoblib.conf" not in taught, taught
    second, status, _ = taught_run(server, "train.py")
    assert status == "warm"
    assert second.stdout == b"set by the script\n", second


def test_code_a_library_generated_and_loaded_from_its_cache_is_not_taught(server):
    _, _, work, _ = server
    cache = work.parent / "kernel-cache"
    cache.mkdir()
    (cache / "c0ffee.py").write_text("GENERATED = True\n")
    (work / "gen.py").write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('c0ffee', {str(cache / 'c0ffee.py')!r})\n"
        "mod = importlib.util.module_from_spec(spec)\nsys.modules['c0ffee'] = mod\nspec.loader.exec_module(mod)\n"
        "import json\nprint(mod.GENERATED)\n"
    )
    run, _, taught = taught_run(server, "gen.py")
    assert run.stdout == b"True\n", run
    assert "c0ffee" not in taught and any(n.split(".")[0] == "json" for n in taught), taught


def test_a_module_that_started_cuda_leaves_out_its_package_or_its_siblings_but_not_more():
    never = ["devlib", "torch._probe.query"]
    names = ["devlib", "devlib.core", "devlibx", "torch", "torch.nn", "torch._probe.query", "numpy"]
    out = [n for n in names if runner().left_out(never, n)]
    assert out == ["devlib", "devlib.core", "torch.nn", "torch._probe.query"]


def test_another_interpreter_or_command_runs_cold(server):
    sock, _, work, env = server
    status = work.parent / "status"
    client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--"]
    out = subprocess.run(
        [*client, "sh", "-c", "echo hi; exit 4"],
        cwd=work,
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert (out.returncode, out.stdout) == (4, b"hi\n")
    assert status.read_text().startswith("cold:")


def test_a_signal_handler_a_preloaded_library_installed_at_import_is_the_runs_as_in_a_fresh_interpreter(tmp_path):
    # A library that handles SIGUSR1 or SIGTERM itself (a stack dump, a checkpoint on preemption) installs
    # its handler at import. Preloaded, the import ran in the server: the child must still have the
    # handler, not the server's own (SIGTERM shuts the server down) nor the default (death by the signal).
    site = tmp_path / "site"
    site.mkdir()
    (site / "handlers.py").write_text(
        "import signal\n"
        "def on(sig, _):\n    print('handled', signal.Signals(sig).name, flush=True)\n"
        "signal.signal(signal.SIGUSR1, on)\nsignal.signal(signal.SIGTERM, on)\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "repro.py").write_text(
        "import os, signal, sys\nimport handlers\n"
        "print('preloaded' if 'handlers' in sys.modules else 'fresh', file=sys.stderr)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\nos.kill(os.getpid(), signal.SIGTERM)\nprint('after', flush=True)\n"
    )
    warm, cold, status = warm_and_cold(tmp_path, dict(os.environ, PYTHONPATH=str(site)), ["handlers"])
    assert status == "warm" and warm.stderr.startswith(b"preloaded"), warm
    assert cold.returncode == 0 and cold.stdout == b"handled SIGUSR1\nhandled SIGTERM\nafter\n", cold
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout), warm


def test_a_killed_client_takes_its_child_along(server):
    sock, _, work, env = server
    pidfile = work / "child.pid"
    (work / "hang.py").write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    status = work.parent / "status"
    client = subprocess.Popen(
        [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "hang.py"],
        cwd=work,
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline, "the child never started"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    # SIGTERM is passed on to the child: the client then ends as the child did.
    os.killpg(client.pid, signal.SIGTERM)
    assert client.wait(timeout=30) == -signal.SIGTERM
    # And SIGKILL of a client (a timeout's last resort) takes the child along too.
    pidfile.unlink()
    client = subprocess.Popen(
        [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "hang.py"],
        cwd=work,
        env=env,
        start_new_session=True,
    )
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline + 30, "the child never started"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    os.killpg(client.pid, signal.SIGKILL)
    client.wait(timeout=30)
    for _ in range(200):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        # A zombie waiting to be reaped by the server counts as gone, and so does one reaped meanwhile.
        try:
            if "zombie" in Path(f"/proc/{child}/status").read_text().lower():
                break
        except (FileNotFoundError, ProcessLookupError):  # reaped between the open and the read: ESRCH
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"child {child} outlived its killed client")


def fake_cuda_site(tmp_path):
    """A stand-in torch whose CUDA state `devlib` flips at import, as a library that queries the device
    at import does (the real one needs a GPU)."""
    site = tmp_path / "cudasite"
    (site / "torch").mkdir(parents=True)
    (site / "devlib").mkdir()
    (site / "torch" / "__init__.py").write_text(
        "class cuda:\n    started = False\n\n"
        "    @staticmethod\n    def is_initialized():\n        return cuda.started\n"
    )
    (site / "devlib" / "__init__.py").write_text("import torch\n\ntorch.cuda.started = True\n")
    return site


def test_a_preload_that_starts_cuda_is_named_instead_of_listening(tmp_path):
    site = fake_cuda_site(tmp_path)
    out = subprocess.run(
        [
            *(sys.executable, str(RUNNER), "--preload-file", listed(tmp_path, "json", "torch", "devlib")),
            *("serve", "--socket", str(tmp_path / "s.sock")),
        ],
        stdin=subprocess.PIPE,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(site)),
        timeout=60,
    )
    assert out.returncode == 3, out
    assert out.stdout.decode().strip() == "harness: CUDA initialised by preloading devlib", out


def test_a_learned_preload_that_starts_cuda_sends_that_run_cold_and_names_it(tmp_path):
    site = fake_cuda_site(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(site))
    sock = tmp_path / "s.sock"
    proc = subprocess.Popen(
        [sys.executable, str(RUNNER), "--preload-file", listed(tmp_path, "torch"), "serve", "--socket", str(sock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout.readline().decode().strip() == "harness: listening"
        work = tmp_path / "work"
        work.mkdir()
        (work / "repro.py").write_text("import devlib\nprint('ran')\n")
        status = tmp_path / "status"
        run = subprocess.run(
            [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "repro.py"],
            cwd=work,
            env=dict(env, CUDABISECT_WARM_PRELOAD=listed(tmp_path, "devlib")),
            capture_output=True,
            timeout=60,
        )
        # The run itself still happens (cold), and says why; the server, unusable now, has gone.
        assert run.stdout == b"ran\n", run
        assert status.read_text().strip() == "cold: CUDA was initialised in the warm interpreter by preloading devlib"
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


def test_a_library_asking_at_import_whether_cuda_is_there_is_preloaded_and_the_run_stays_warm(tmp_path):
    # The stand-in torch answers `cuda.is_available()` as the real one does: through NVML where
    # PYTORCH_NVML_BASED_CUDA_CHECK=1, else by starting the driver (cudaGetDeviceCount), after which the
    # server could fork no child that uses CUDA. Liger-Kernel's `infer_device()` asks at import.
    site = fake_cuda_site(tmp_path)
    (site / "torch" / "__init__.py").write_text(
        "import os\n\n\nclass cuda:\n    started = False\n\n"
        "    @staticmethod\n    def is_initialized():\n        return cuda.started\n\n"
        "    @staticmethod\n    def is_available():\n"
        "        if os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK') != '1':\n            cuda.started = True\n"
        "        return True\n"
    )
    (site / "asklib").mkdir()
    (site / "asklib" / "__init__.py").write_text(
        "import torch\n\nDEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    sock = tmp_path / "s.sock"
    proc = listening(tmp_path, sock, env, "torch", "asklib")
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "repro.py").write_text(
            "import os, asklib, torch\n"
            "print(asklib.DEVICE, torch.cuda.started, os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))\n"
        )
        status = tmp_path / "status"
        run = subprocess.run(
            [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status)]
            + ["--", sys.executable, "repro.py"],
            cwd=work,
            env=env,
            capture_output=True,
            timeout=60,
        )
        # Preloaded, warm, and the repro sees its own environment (torch's later answers come from the driver).
        assert status.read_text().strip() == "warm", status.read_text()
        assert run.stdout == b"cuda False None\n", run
    finally:
        proc.stdin.close()
        proc.kill()


def test_two_messages_in_one_read_are_both_read():
    # A child that exits at once: the server's `pid` and `status` can reach the client in one read.
    import socket

    w = fork_server()
    a, b = socket.socketpair()
    try:
        a.sendall(b'{"pid": 7}\n{"status": 0}\n{"par')
        a.sendall(b'tial": 1}\n')
        a.close()
        m = w.Messages(b)
        assert m.next() == {"pid": 7}
        assert m.next() == {"status": 0}
        assert m.next() == {"partial": 1}
        assert m.next() is None
    finally:
        b.close()


def test_a_client_gone_before_its_child_is_announced_leaves_the_server_serving(server):
    """A probe the search stops while its child is being forked (its answer no longer mattered) closes
    the connection before the server says the child's pid: the server kills that child and serves on."""
    import socket

    sock, _, work, env = server
    (work / "slow.py").write_text("import time\ntime.sleep(30)\n")
    for _ in range(3):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock))
        req = {
            "mode": "script",
            "target": "slow.py",
            "args": [],
            "argv": ["python3", "slow.py"],
            "learn": None,
            "cwd": str(work),
            "env": env,
            "interpreter": "python3",
            "preload": [],
        }
        with open(os.devnull, "rb") as i, open(os.devnull, "wb") as o:
            fork_server().send_request(conn, req, [i.fileno(), o.fileno(), o.fileno()])
        conn.close()
    cold, warm, status = both(server, "print('still serving')\n")
    assert warm == cold
    assert status == "warm"


def test_a_server_stopped_with_sigterm_takes_its_running_children_along(tmp_path):
    """A child runs in a session of its own, so a signal to the server's group does not reach it: the
    server kills its running children itself before it ends, and their clients end too."""
    import select

    work = tmp_path / "work"
    work.mkdir()
    (work / "hang.py").write_text("import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    sock = tmp_path / "s.sock"
    server = subprocess.Popen(
        [sys.executable, str(RUNNER), "--preload-file", listed(tmp_path, "json"), "serve", "--socket", str(sock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout.readline().decode().strip() == "harness: listening"
        status = tmp_path / "status"
        client = subprocess.Popen(
            [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "hang.py"],
            cwd=work,
            stdout=subprocess.PIPE,
        )
        child = int(client.stdout.readline())  # the child runs: it said its pid
        assert status.read_text().strip() == "warm"
        pidfd = os.pidfd_open(child)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        ready, _, _ = select.select([pidfd], [], [], 30)
        os.close(pidfd)
        assert ready, "the child outlived its server"
        assert client.wait(timeout=30) != 0  # its run did not end: the client does not say it passed
        client.stdout.close()
    finally:
        server.kill()
        server.wait()


def test_a_child_signalled_before_it_took_its_own_handlers_back_leaves_the_server_serving(tmp_path):
    """A probe the search stops just as its child is forked sends SIGTERM to the client's group, which the
    child has joined but whose handlers are still the server's: the child ends as a fresh interpreter
    would, and the server's socket stays, so the worker's next run is still warm."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "ran.py").write_text("print('ran')\n")
    sock = tmp_path / "s.sock"
    # The server as cudabisect starts it, with one change: a child whose run asks for it is sent SIGTERM
    # at the start of `become`, before it has its own handlers back, and then runs Python code (where an
    # interpreter runs the handler of a signal it took in).
    wrapper = tmp_path / "signalled_server.py"
    wrapper.write_text(
        textwrap.dedent(
            f"""
            import os, runpy, signal, sys
            sys.path.insert(0, {str(RUNNER.parent)!r})
            import fork_server
            plain = fork_server.become
            def become(req, fds, closing):
                if req["env"].get("SIGNAL_EARLY"):
                    os.kill(os.getpid(), signal.SIGTERM)
                    sum(range(100000))
                return plain(req, fds, closing)
            fork_server.become = become
            sys.argv = [{str(RUNNER)!r}] + sys.argv[1:]
            runpy.run_path({str(RUNNER)!r}, run_name="__main__")
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(wrapper), "--preload-file", listed(tmp_path, "json"), "serve", "--socket", str(sock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout.readline().decode().strip() == "harness: listening"
        env = dict(os.environ)
        client = [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(tmp_path / "status"), "--"]
        signalled = subprocess.run(
            [*client, "python3", "ran.py"],
            cwd=work,
            env=dict(env, SIGNAL_EARLY="1"),
            capture_output=True,
            timeout=60,
        )
        assert (tmp_path / "status").read_text().strip() == "warm"
        assert signalled.returncode == -signal.SIGTERM, signalled
        assert b"ran" not in signalled.stdout
        cold, warm, status = both((sock, None, work, env), "print('still serving')\n")
        assert (status, warm) == ("warm", cold)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_a_run_whose_server_went_away_says_so_instead_of_passing_for_the_runs_end(tmp_path):
    """A server killed while its child runs leaves the client without the run's end: the client exits
    non-zero and its status says the server was lost, which cudabisect reads as the machine failing."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "hang.py").write_text("import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    sock = tmp_path / "s.sock"
    server = listening(tmp_path, sock, dict(os.environ), "json")
    status = tmp_path / "status"
    client = subprocess.Popen(
        [sys.executable, "-S", "-E", str(RUNNER), "client", str(sock), str(status), "--", "python3", "hang.py"],
        cwd=work,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        int(client.stdout.readline())  # the child runs: it said its pid
        assert status.read_text().strip() == "warm"
        server.kill()
        server.wait()
        assert client.wait(timeout=30) == 1
        assert status.read_text().strip() == "lost: the warm server went away during the run"
    finally:
        try:
            os.killpg(client.pid, signal.SIGKILL)  # the child, should it outlive its server
        except ProcessLookupError:
            pass
        client.wait()
        client.stdout.close()
