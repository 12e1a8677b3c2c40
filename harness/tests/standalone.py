"""Runs a test file's `test_*` functions without pytest, in name order, printing `ok <name>` for each and
`N passed` at the end: how `cargo test` runs the harness's torch-free tests (it checks the count)."""

import sys


def run_all(namespace):
    tests = [(n, f) for n, f in sorted(namespace.items()) if n.startswith("test_") and callable(f)]
    for name, fn in tests:
        fn()
        print(f"ok {name}")
    print(f"{len(tests)} passed")
    sys.exit(0)
