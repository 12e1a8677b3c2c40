"""cudabisect's PyTorch harness: speaks the harness protocol for an nn.Module.

    python torch_harness/ --model pkg.mod:build --example-inputs pkg.mod:example_inputs [--device cuda] VERB ...

VERB is one of
    describe [--recording DIR] --out FILE     the graph as JSON in FILE; with a recording, descended along
                                              the recorded fault into the modules kept whole
    run [--record DIR]                        run every node, synchronising and printing a marker around
                                              each; save node outputs to DIR/<node>.pt
    run --keep A,B --recording DIR            run only the kept nodes; values made by other nodes come
                                              from DIR/<node>.pt (recorded, never random)
    extract --keep A,B --recording DIR --out DIR
                                              write a standalone repro.py (+ repro_data.pt) that needs
                                              nothing but torch (and triton, if a kept op uses it)
    serve --socket PATH                       a warm server: import torch and the user's package and
                                              build the model on the CPU once, then answer every request
                                              with a child forked from it (`--via PATH` before the verb)

Bundles are safe to open: repro_data.pt holds tensors, plain values and module state dicts, loaded with
`weights_only=True`; repro.py rebuilds torch.nn modules from code. Only modules of the user's own classes
are pickled whole (repro_modules.pt), and then repro.py says NOT STANDALONE. Custom ops (`torch.ops.<ns>`)
are called by their op name; repro.py carries a Python custom op's registration and kernels (Triton ones
too), or imports the compiled extension that defines it. repro.py is compiled before it is written.

Layer-by-layer descent: the model is traced with torch.fx, and a module whose own forward FX cannot trace
(Python control flow on tensor values, data-dependent shapes) is kept whole as one node while everything
around it is traced op by op (a model whose own forward cannot be traced is kept whole). The recorded run
then descends into what was kept whole through forward hooks: every call inside it records its actual
inputs and output and prints its own markers, and modules FX can trace below it run op by op through an FX
interpreter. `describe --recording` replaces each call on the way to the fault by the calls it made, so
the fault is pinned to one op or one leaf module; a level whose calls pass each one's output to the next
(checked on the recorded values) is used as a chain. The description's `graph` says how every level was
obtained (fx, hooks, chain).

Warm start: with `--via`, the verb runs in a child forked from a server that already imported torch and
built the model; the child initialises CUDA itself, so a sticky CUDA error dies with it. The client hands
the child its stdin, stdout, stderr and process group: its output and its timeout are the client's.
Nothing here needs a package index beyond the user's own torch. The code generation part
imports torch lazily, so it can be tested without torch.
"""
