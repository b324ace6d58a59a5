"""Backward passes of heddle.lax's collective sums on 8 host devices; run by test_collective_backward.py.

Each device holds ``ROWS`` rows that ``jax.vmap`` maps over with the axis name ``"b"``; the collective
adds over the rows (``"b"``), then over the devices (``"i"``), so every gradient is a sum of
``8 * ROWS`` cotangents. Prints one JSON line: for each case, the dtype and the first value of the
gradient.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import heddle.lax as hlax
import heddle.numpy as hnp
from heddle import autodiff

ROWS = 12500
F32 = jnp.float32


def _summary(g: jax.Array) -> list:
    v = np.asarray(g, np.float64)
    return [str(g.dtype), float(v.reshape(-1)[0]), bool((v == v.reshape(-1)[0]).all())]


def main() -> None:
    mesh = jax.make_mesh((8,), ("i",))
    out: dict[str, list] = {"devices": [len(jax.devices())]}
    for dt in (jnp.bfloat16, jnp.float16):
        x = jax.device_put(jnp.full((8 * ROWS, 1), 0.5, dt), NamedSharding(mesh, P("i")))
        xp = jnp.full((8, ROWS, 1), 0.5, dt)
        for name in ("psum", "pmean"):
            fn = getattr(hlax, name)

            def rows(v, fn=fn):
                return fn(jax.vmap(lambda r: fn(r, "b"), axis_name="b")(v), "i")

            # vmap's named axis inside a checked shard_map is refused by JAX itself
            body = jax.shard_map(
                rows, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False
            )

            def loss(v, body=body):
                return hnp.sum(body(v), dtype=F32)

            out[f"{name}/shard_map/{dt.__name__}"] = _summary(jax.jit(autodiff.grad(loss))(x))

            mapped = jax.pmap(rows, axis_name="i")

            def ploss(v, mapped=mapped):
                return hnp.sum(mapped(v), dtype=F32)

            out[f"{name}/pmap/{dt.__name__}"] = _summary(autodiff.grad(ploss)(xp))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
