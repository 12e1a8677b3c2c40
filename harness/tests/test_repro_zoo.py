"""The code generator over a zoo of real models (CI installs torch and transformers; these tests fail
without them): a `transformers` GPT-2 built from a config (keyword inputs, a ModelOutput, FX cannot trace
it), nested modules of the user's own with long docstrings, quotes and backslashes, a model in bf16. Every
node the harness describes is extracted, alone and with its backward, and every `repro.py` written must
compile and pass the generator's own lint: a refusal may only be a reason (a function it cannot carry),
never a defect of the generator."""

import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_harness_modules import h  # noqa: E402

ZOO = "cudabisect_zoo"


class Inner(torch.nn.Module):
    """A block with a docstring that would break a naive generator: \"\"\"quotes\"\"\", a backslash \\ and
    indentation that does not match the rest.
    """

    def __init__(self, dim):
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.scale = 0.5

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(x)) * self.scale


class Middle(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.inner = Inner(dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x + self.inner(x))


class Nested(torch.nn.Module):
    """Three levels of the user's own modules."""

    def __init__(self, dim=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Middle(dim), Middle(dim)])
        self.head = torch.nn.Linear(dim, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def nested():
    torch.manual_seed(0)
    return Nested()


def nested_inputs():
    return (torch.randn(2, 8),)


def nested_bf16():
    return nested().to(torch.bfloat16)


def nested_bf16_inputs():
    return (torch.randn(2, 8, dtype=torch.bfloat16),)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))


def gpt2_inputs():
    ids = torch.randint(0, 32, (1, 6))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class OptionalBias(torch.nn.Module):
    """Traceable, with an argument left None by its caller (as transformers' embeddings take
    `token_type_ids=None`): FX specialises `if bias is None` on what it traced."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, bias=None):
        if bias is None:
            bias = torch.zeros_like(x)
        return self.lin(x) + bias


class Branchy(torch.nn.Module):
    """Its own forward branches on a tensor's value: kept whole, and the recorded run descends into it."""

    def __init__(self):
        super().__init__()
        self.inner = OptionalBias()

    def forward(self, x):
        if x.sum() > 1e9:
            x = x * 0
        return self.inner(x)


def branchy():
    torch.manual_seed(0)
    return Branchy()


def branchy_inputs():
    return (torch.randn(2, 4),)


sys.modules[ZOO] = sys.modules[__name__]


def extract_every_node(tmp_path, model, inputs, train):
    argv = ["--model", f"{ZOO}:{model}", "--example-inputs", f"{ZOO}:{inputs}", "--device", "cpu"]
    if train:
        argv.append("--train")
    warm = h.prepare(h.parse_args(argv + ["describe"]))
    record = tmp_path / "record"
    assert h.main(argv + ["run", "--record", str(record)], warm=warm) == 0
    nodes = json.loads(describe(argv, warm, tmp_path))["nodes"]
    written = 0
    for node in nodes:
        out = tmp_path / "x" / node["id"]
        code = h.main(
            argv + ["extract", "--keep", node["id"], "--recording", str(record), "--out", str(out)], warm=warm
        )
        rejected = out / "repro.py.rejected"
        assert not rejected.exists(), rejected.read_text()
        if code == 0:
            text = (out / "repro.py").read_text()
            compile(text, "repro.py", "exec")
            assert h.lint(text) is None, text
            written += 1
    return nodes, written


def describe(argv, warm, tmp_path):
    path = tmp_path / "describe.json"
    assert h.main(argv + ["describe", "--out", str(path)], warm=warm) == 0
    return path.read_text()


@pytest.mark.parametrize(
    "model,inputs,train",
    [
        ("nested", "nested_inputs", False),
        ("nested", "nested_inputs", True),
        ("nested_bf16", "nested_bf16_inputs", True),
        ("gpt2", "gpt2_inputs", False),
        ("gpt2", "gpt2_inputs", True),
    ],
)
def test_every_node_of_a_real_model_extracts_to_a_repro_that_compiles(tmp_path, model, inputs, train):
    pytest.importorskip("transformers") if model == "gpt2" else None
    nodes, written = extract_every_node(tmp_path, model, inputs, train)
    assert written == len(nodes), f"{written} of {len(nodes)}"


def test_a_model_called_with_keyword_inputs_runs_as_called(tmp_path):
    argv = ["--model", f"{ZOO}:gpt2", "--example-inputs", f"{ZOO}:gpt2_inputs", "--device", "cpu"]
    warm = h.prepare(h.parse_args(argv + ["describe"]))
    assert warm.traced_by.startswith("whole")
    step = warm.steps[0]
    assert set(step.kwargs) == {"input_ids", "attention_mask"}, step.kwargs
    assert h.main(argv + ["run"], warm=warm) == 0


def test_a_call_that_leaves_an_argument_none_runs_in_the_recorded_descent(tmp_path):
    argv = ["--model", f"{ZOO}:branchy", "--example-inputs", f"{ZOO}:branchy_inputs", "--device", "cpu"]
    warm = h.prepare(h.parse_args(argv + ["describe"]))
    assert warm.traced_by.startswith("whole")
    record = tmp_path / "record"
    assert h.main(argv + ["run", "--record", str(record)], warm=warm) == 0
    calls = json.loads((record / h.HOOKS_FILE).read_text())["calls"]
    assert any(c.get("none_args") == ["bias"] for c in calls), calls
