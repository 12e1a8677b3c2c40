"""The harness's own files: saved without checksums, loaded memory-mapped, and a value changed in place
after loading (a training step updates parameters in place) never changes the file.

Runs under pytest, or alone (`python3 harness/tests/test_store.py`).
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_harness_modules  # noqa: E402,F401 - puts the harness package on sys.path
from cudabisect_torch import store  # noqa: E402


def test_a_loaded_value_changed_in_place_leaves_the_file_as_saved():
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.pt")
        before = torch.serialization.get_crc32_options()
        store.save({"args": [torch.arange(1000, dtype=torch.float32)]}, path)
        assert torch.serialization.get_crc32_options() == before, "the option is put back"
        first = store.load(path, weights_only=True)
        first["args"][0].add_(1)  # copy on write: the mapping is private
        again = store.load(path, weights_only=False)
        assert torch.equal(again["args"][0], torch.arange(1000, dtype=torch.float32))
        assert store.exists_then_load(os.path.join(tmp, "none.pt")) is None


def test_a_file_torch_cannot_map_is_read_whole():
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "legacy.pt")
        torch.save(torch.ones(3), path, _use_new_zipfile_serialization=False)
        assert torch.equal(store.load(path, weights_only=True), torch.ones(3))


if __name__ == "__main__":
    test_a_loaded_value_changed_in_place_leaves_the_file_as_saved()
    test_a_file_torch_cannot_map_is_read_whole()
    print("ok")
