# The regression question's repro: moe_repro.py where the fused MoE kernels exist, and a clean exit where
# they do not yet (nothing to test there), as a user's `git bisect run` script would do. It runs in the
# checkout (the library's `src/` on PYTHONPATH).
import os
import runpy
import sys

if not os.path.exists(os.path.join("src", "liger_kernel", "ops", "fused_moe.py")):
    print("no fused MoE kernels at this commit")
    sys.exit(0)
runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_repro.py"),
    run_name="__main__",
)
