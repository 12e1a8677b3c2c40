"""Running the kept steps: each inside its markers, synchronised, its outputs recorded, a training step's
nodes in their phases."""

import os
import sys
from . import store
from .protocol import say, timing
from .training import TRAINING_KINDS, TrainRun, autocast
from .record import Recorder
from .node import MissingValue, call, markers, node_failed, to_device, write_shapes


def run(steps, root, env, device, record=None, prepared=None):
    """Runs `steps` in order on `env`, a marker and a synchronise around each; returns 0 clean, 1 when a
    step raised (the finding), 2 when a recorded value is missing. A recording run also records, through
    hooks, every call inside the modules kept whole (see `Recorder`). With training steps among them,
    forward steps run on fresh leaves so that each backward step is its node's own (see `TrainRun`); a
    kept backward step whose forward is not kept runs that forward first."""
    import torch

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    recorder = Recorder(root, steps, prepared.opaque if prepared else set(), record, sync) if record else None
    tr = None
    if any(s.kind in TRAINING_KINDS for s in steps):
        tr = TrainRun(root, env, prepared.training, device, record, prepared.forward_steps, prepared.attr_targets)
    current = [None]

    def plain(s):
        # A forward-only step runs under the autocast its captured step had (a training step's TrainRun
        # does the same for its forward and loss).
        with autocast(prepared.autocast if prepared else None, device):
            env[s.name] = call(s, root, env)

    def marked(s, fn):
        current[0] = s
        forward = s.kind not in TRAINING_KINDS
        begin, end = markers(s)
        say(begin)
        if recorder and forward:
            recorder.enter(s.name)
        fn(s)
        sync()
        if recorder and forward:
            recorder.leave()
        say(end)
        if record and forward:
            store.save(to_device(env[s.name], "cpu"), os.path.join(record, f"{s.name}.pt"))

    try:
        for s in steps:
            if s.kind == "loss":
                marked(s, tr.loss)
            elif s.kind == "backward":
                if s.target not in tr.graphs:
                    marked(tr.forward[s.target], tr.forward_step)
                marked(s, tr.backward_step)
            elif s.kind == "optimizer":
                marked(s, tr.optimizer_step)
            else:
                marked(s, tr.forward_step if tr else plain)
        say(f"harness: ok: {len(steps)} nodes on {device}")
        timing("ran")
        return 0
    except MissingValue as e:
        # Not a finding: the recording ends where the recorded run died.
        name = current[0].name if current[0] else "?"
        print(f"error: no recording of value {e} for node {name}", file=sys.stderr, flush=True)
        return 2
    except Exception:  # noqa: BLE001 - the failure is the finding; the classifier reads the text
        return node_failed(current[0].name if current[0] else "?")
    finally:
        if recorder:
            write_shapes(record, env, recorder.shapes)
            recorder.write()
