"""Loads the PyTorch harness package from the source tree, and one namespace of all its parts (`h`) for
tests that call functions of several."""

import os
import sys
import types

HARNESS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_harness")
if HARNESS_DIR not in sys.path:
    sys.path.insert(0, HARNESS_DIR)

from cudabisect_torch import cli, graph, node, protocol, record, repro, run, training, warm  # noqa: E402

MODULES = (protocol, graph, node, training, record, run, repro, warm, cli)
h = types.SimpleNamespace(**{k: v for m in MODULES for k, v in vars(m).items() if not k.startswith("__")})
