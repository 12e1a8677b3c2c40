"""The harness's own files (captured steps, recordings): saved without the zip's checksums and loaded
memory-mapped. Both are what makes a multi-gigabyte input cheap: the checksums cost seconds a gigabyte
and torch.load does not need them; a mapped file is read only where used, and a warm server's forked
children share its pages. A repro's files for maintainers (repro.py's data) keep torch's defaults."""

import os


def save(value, path):
    """torch.save without checksums where this torch can leave them out."""
    import torch

    ser = torch.serialization
    if not hasattr(ser, "set_crc32_options"):
        torch.save(value, path)
        return
    before = ser.get_crc32_options()
    ser.set_crc32_options(False)
    try:
        torch.save(value, path)
    finally:
        ser.set_crc32_options(before)


def load(path, weights_only):
    """torch.load on the CPU, memory-mapped (copy on write: a value changed in place never changes the
    file) where this torch and the file allow it."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    except TypeError:  # a torch without mmap
        pass
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
    return torch.load(path, map_location="cpu", weights_only=weights_only)


def exists_then_load(path, weights_only=False):
    """`load(path)`, or None when there is no such file."""
    return load(path, weights_only) if os.path.exists(path) else None
