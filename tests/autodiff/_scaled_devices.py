"""``contractions="scaled"`` on 8 host devices: batch-sharded inputs under an explicit mesh (JAX's
default axis type) and an auto one, FSDP-style sharded weights; run as a script by
test_ad_scaled.py. The reference is the float32 contractions' gradient (the default), which the
scaled one must match to the narrow cotangent's precision. Prints one JSON line."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from heddle import autodiff


def loss(w, x):
    h = jnp.tanh(jnp.matmul(x, w["a"].astype(x.dtype), preferred_element_type=jnp.float32))
    y = jnp.matmul(h.astype(x.dtype), w["b"].astype(x.dtype))  # a narrow-output contraction
    return jnp.mean(y.astype(jnp.float32) ** 2)


def main() -> None:
    rng = np.random.default_rng(0)
    w64 = {"a": rng.standard_normal((16, 32)) / 4, "b": rng.standard_normal((32, 8)) / 6}
    x64 = rng.standard_normal((64, 16))
    results = {}
    for types in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((8,), ("data",), axis_types=(types,))
        for dtype in (jnp.bfloat16, jnp.float16):
            for wspec in (P(), P("data")):  # replicated, and FSDP-style sharded weights
                x = jax.device_put(jnp.asarray(x64, dtype), NamedSharding(mesh, P("data")))
                w = {
                    k: jax.device_put(jnp.asarray(v, jnp.float32), NamedSharding(mesh, wspec))
                    for k, v in w64.items()
                }
                name = f"{types.name}-{jnp.dtype(dtype).name}-{'fsdp' if wspec else 'repl'}"
                try:
                    with jax.set_mesh(mesh):
                        want = jax.jit(autodiff.grad(loss))(w, x)
                        got = jax.jit(autodiff.grad(loss, contractions="scaled"))(w, x)
                    err = max(
                        float(np.abs(np.asarray(got[k]) - np.asarray(want[k])).max())
                        / float(np.abs(np.asarray(want[k])).max())
                        for k in w64
                    )
                    results[name] = err
                except Exception as e:  # reported, so the test shows what failed
                    results[name] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(results))


if __name__ == "__main__":
    main()
