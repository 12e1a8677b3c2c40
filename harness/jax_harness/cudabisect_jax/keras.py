"""Keras 3 models."""

from .protocol import as_args, load_attr
from .graph import Program, Step, jax_program


def keras_backend():
    import keras

    return keras.backend.backend()


def is_functional(model):
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


def sync(values):
    """Waits for the values to be computed, so a device fault shows inside the node that caused it."""
    import jax

    for v in values:
        if isinstance(v, jax.Array):
            jax.block_until_ready(v)
        elif v is not None and hasattr(v, "shape"):
            import keras  # another Keras backend's tensor: reading it back waits for it

            keras.ops.convert_to_numpy(v)


def layer_call(op, node, in_ids):
    from keras import tree

    def call(*ins):
        tensors = dict(zip(in_ids, ins))
        args, kwargs = node.arguments.fill_in(tensors)
        return tree.flatten(op(*args, **kwargs))

    return call


def flatten_functional(prog, model, in_atoms, prefix, counter, path=()):
    """Appends `model`'s layers (nested functional models descended) to `prog.steps`; returns the atoms
    of its outputs. `in_atoms`: the atoms of its inputs, in `tree.flatten(model.inputs)` order."""
    from keras import tree

    # The inputs as the model takes them (a dict of named inputs, a list), flattened as Keras does.
    names = {id(t): a for t, a in zip(tree.flatten(getattr(model, "_inputs_struct", model.inputs)), in_atoms)}
    depths = sorted(model._nodes_by_depth.keys(), reverse=True)
    for depth in depths:
        for node in model._nodes_by_depth[depth]:
            op = node.operation
            if type(op).__name__ == "InputLayer":
                continue
            ins = [names[id(t)] for t in node.input_tensors]
            in_ids = [id(t) for t in node.input_tensors]
            outs = tree.flatten(node.outputs)
            if is_functional(op):
                inner = flatten_functional(prog, op, ins, f"{prefix}{op.name}.", counter, (*path, op.name))
                for t, a in zip(outs, inner):
                    names[id(t)] = a
                continue
            index = counter[0]
            counter[0] += 1
            out_names = []
            for k, t in enumerate(outs):
                name = f"t{index}_{k}"
                names[id(t)] = ("var", name)
                prog.avals[name] = (tuple(int(d) if d is not None else 0 for d in t.shape), str(t.dtype))
                out_names.append(name)
            prog.steps.append(
                Step(
                    name=f"l{index:02d}_{prefix}{op.name}".replace("/", "_"),
                    op=type(op).__name__,
                    kernel=type(op).__name__,
                    ins=ins,
                    outs=out_names,
                    call=layer_call(op, node, in_ids),
                )
            )
            prog.steps[-1].layer = op
            prog.steps[-1].layer_path = (*path, op.name)
    return [names[id(t)] for t in tree.flatten(model.outputs)]


def keras_chain(prog, model, in_atoms):
    """A Sequential model: its layers, each on the previous one's output."""
    atoms = list(in_atoms)
    for index, layer in enumerate(model.layers):
        name = f"t{index}_0"
        prog.avals[name] = ((), "")

        def call(*ins, layer=layer):
            return [layer(*ins)]

        prog.steps.append(
            Step(
                name=f"l{index:02d}_{layer.name}",
                op=type(layer).__name__,
                kernel=type(layer).__name__,
                ins=atoms,
                outs=[name],
                call=call,
            )
        )
        prog.steps[-1].layer = layer
        prog.steps[-1].layer_path = (layer.name,)
        atoms = [("var", name)]
    return atoms


def keras_train_function(model, loss_spec):
    """The model's training step as a pure function of its state and a batch (JAX backend)."""
    import jax
    import keras

    if loss_spec is None and getattr(model, "optimizer", None) is not None and hasattr(model, "train_step"):
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables],
            [v.value for v in model.metrics_variables],
        )

        def step(state, data):
            logs, new_state = model.train_step(state, data)
            return logs, new_state

        return step, state, "the compiled model's stateless train_step (loss, gradients, update)"
    loss = load_attr(loss_spec) if loss_spec else None
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def step(state, data):
        tv, ntv = state
        x = data[0] if isinstance(data, (tuple, list)) else data

        def objective(tv):
            out, _ = model.stateless_call(tv, ntv, x, training=True)
            if loss is not None:
                return loss(out)
            return sum(keras.ops.sum(o) for o in jax.tree_util.tree_leaves(out))

        return jax.value_and_grad(objective)(tv)

    why = f"value_and_grad of {loss_spec}" if loss_spec else "value_and_grad of the outputs' sum"
    return step, (trainable, non_trainable), why


def keras_program(a):
    import keras

    model = load_attr(a.model)()
    data = load_attr(a.example_inputs)()
    backend = keras_backend()
    split = is_functional(model) or isinstance(model, keras.Sequential)
    if a.train or not split:
        if backend != "jax":
            return keras_whole(
                model,
                data,
                f"kept whole: a {'training step' if a.train else 'subclassed model'} "
                f"is split only on the JAX backend (this is {backend})",
            )
        if a.train:
            step, state, why = keras_train_function(model, a.loss)
            return jax_program(step, (state, data), f"keras {type(model).__name__}, training step: {why}")
        x = as_args(data)
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def forward(tv, ntv, *x):
            return model.stateless_call(tv, ntv, *x)[0]

        return jax_program(
            forward, (tv, ntv, *x), f"keras {type(model).__name__} (subclassed: no layer graph), its stateless call"
        )
    prog = Program()
    x = as_args(data)
    atoms = prog.inputs(keras.tree.flatten(x))
    if is_functional(model):
        flatten_functional(prog, model, atoms, "", [0])
        how = "its operation graph, nested models descended"
    else:
        keras_chain(prog, model, atoms)
        how = "its chain of layers"
    prog.factory = a.model
    prog.graph = f"keras {type(model).__name__} on {backend}: {len(prog.steps)} layers from {how}"
    if backend == "jax":
        import jax

        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        jitted = jax.jit(lambda tv, ntv, *x: model.stateless_call(tv, ntv, *x)[0])
        prog.jitted = lambda: jitted(tv, ntv, *x)
    return prog


def keras_whole(model, data, why):
    prog = Program()
    x = as_args(data)
    atoms = prog.inputs(x)
    prog.avals["t0_0"] = ((), "")

    def call(*ins):
        return [model(*ins)]

    prog.steps.append(
        Step(
            name=f"l00_{model.name}",
            op=type(model).__name__,
            kernel=type(model).__name__,
            ins=atoms,
            outs=["t0_0"],
            call=call,
        )
    )
    prog.graph = why
    return prog


def build_program(a):
    if a.model:
        return keras_program(a)
    fn = load_attr(a.function)
    args = as_args(load_attr(a.example_inputs)())
    return jax_program(fn, args, f"jax function {a.function}")
