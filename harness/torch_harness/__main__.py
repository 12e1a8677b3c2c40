"""Runs cudabisect's PyTorch harness: `python torch_harness/ VERB ...` (the folder, as the binary ships it).

The folder holds only this file and the `cudabisect_torch` package, so nothing here shadows a module of
the user's project on `sys.path`."""

import sys

from cudabisect_torch.cli import main

if __name__ == "__main__":
    sys.exit(main())
