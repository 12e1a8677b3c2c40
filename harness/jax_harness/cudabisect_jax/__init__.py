"""cudabisect's JAX and Keras harness: speaks the harness protocol for a JAX function or a Keras 3 model.

    python jax_harness/ --function pkg.mod:train_step --example-inputs pkg.mod:example_inputs VERB ...
    python jax_harness/ --model pkg.mod:build --example-inputs pkg.mod:example_inputs [--train] VERB ...

VERB is one of
    describe --out FILE                       the graph as JSON in FILE
    run [--record DIR]                        run every node, synchronising and printing a marker around
                                              each; save every value to DIR/<name>.npy
    run --keep A,B --recording DIR            run only the kept nodes; values made by other nodes come
                                              from DIR (recorded, never random)
    extract --keep A,B --recording DIR --out DIR
                                              write a standalone repro.py (+ repro_data.npz and the kept
                                              steps serialized with jax.export) that needs only jax

A JAX function is split into the equations of its jaxpr (`jax.make_jaxpr`). Calls that only wrap another
jaxpr (`jit`/`pjit`, `closed_call`, `custom_jvp_call`, `custom_vjp_call`, `remat`) are inlined, so the
equations of a jitted training step (forward, `value_and_grad`'s backward, an optax update) are the nodes;
`pallas_call`, `scan`, `while` and `cond` stay one node each (a Pallas node names its kernel). Each node is
evaluated on its own (`Primitive.bind`) and synchronised (`jax.block_until_ready`) inside its markers.

A Keras 3 model is split into its layers: a functional model through its operation graph (nested
functional models descended), a Sequential one as its chain of layers. With `--train` (or a model that
cannot be split, on the JAX backend) the model's training step is traced as a JAX function instead: the
compiled model's own stateless `train_step` (loss, gradients and the optimizer's update), or
`value_and_grad` of `--loss` (default: the sum of the outputs). A model that cannot be split on another
backend is kept whole, and the description says so.

When the full run shows no fault equation by equation, the function is run once more jitted, with
`--xla_dump_to`: a fault that shows only there (inside an XLA fusion) is reported on a
`@@cudabisect jit-only dump=DIR` line, with the XLA dump of the faulting executable in DIR.
"""
