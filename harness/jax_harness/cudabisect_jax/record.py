"""Recording: one .npy per value, with its dtype in values.json (bfloat16 and PRNG keys as raw bits)."""

import json
import os


def to_numpy(v):
    import numpy as np

    try:
        import jax

        if isinstance(v, jax.Array) and jax.dtypes.issubdtype(v.dtype, jax.dtypes.extended):
            return np.asarray(jax.random.key_data(v)), {"key_impl": str(jax.random.key_impl(v))}
    except Exception:  # noqa: BLE001 - not a JAX value
        pass
    try:
        import keras

        arr = keras.ops.convert_to_numpy(v)
    except Exception:  # noqa: BLE001 - keras absent: a JAX or numpy value
        arr = np.asarray(v)
    meta = {"dtype": str(arr.dtype)}
    if arr.dtype.kind == "V" or arr.dtype.name not in np.sctypeDict:
        meta["bits"] = f"uint{arr.dtype.itemsize * 8}"
        arr = arr.view(meta["bits"])
    return arr, meta


def from_numpy(arr, meta):
    import jax
    import jax.numpy as jnp

    if "key_impl" in meta:
        return jax.random.wrap_key_data(arr, impl=meta["key_impl"])
    if "bits" in meta:
        import ml_dtypes  # noqa: F401 - registers bfloat16 and friends with numpy

        arr = arr.view(jnp.dtype(meta["dtype"]))
    return jnp.asarray(arr)


class Recording:
    def __init__(self, path):
        self.path = path
        self.meta = {}
        meta_file = os.path.join(path, "values.json")
        if os.path.exists(meta_file):
            with open(meta_file) as f:
                self.meta = json.load(f)

    def save(self, name, value):
        """Saves a value; one numpy cannot hold as itself (bfloat16, a PRNG key) is written to
        values.json at once, so a run that dies right after still leaves it readable."""
        import numpy as np

        arr, meta = to_numpy(value)
        np.save(os.path.join(self.path, f"{name}.npy"), arr, allow_pickle=False)
        if set(meta) != {"dtype"}:
            self.meta[name] = meta
            self.flush()

    def load(self, name):
        import numpy as np

        file = os.path.join(self.path, f"{name}.npy")
        if not os.path.exists(file):
            raise MissingValue(name)
        return from_numpy(np.load(file, allow_pickle=False), self.meta.get(name, {}))

    def flush(self):
        with open(os.path.join(self.path, "values.json"), "w") as f:
            json.dump(self.meta, f)


class MissingValue(Exception):
    pass
