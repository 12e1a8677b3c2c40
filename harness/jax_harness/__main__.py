"""Runs cudabisect's JAX and Keras harness: `python jax_harness/ VERB ...` (the folder, as the binary ships it).

The folder holds only this file and the `cudabisect_jax` package, so nothing here shadows a module of the
user's project on `sys.path`."""

import sys

from cudabisect_jax.cli import main

if __name__ == "__main__":
    sys.exit(main())
