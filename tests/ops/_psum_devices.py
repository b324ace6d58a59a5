"""heddle.lax collectives on 8 host devices; run as a script by test_lax.py.

Prints one JSON line with what each check observed.
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

BF16, F32 = jnp.bfloat16, jnp.float32


def main() -> None:
    mesh = jax.make_mesh((8,), ("i",))
    # device d holds 1 + 2**-7 * (d % 2): the exact sum, 8.03125, is not a bfloat16 value
    x = jnp.asarray(1 + 2.0**-7 * (np.arange(8) % 2), BF16)
    x = jax.device_put(x, NamedSharding(mesh, P("i")))

    def on_devices(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P()))

    summed = on_devices(lambda v: hlax.psum(v, "i"))(x)
    narrow = on_devices(lambda v: jax.lax.psum(v, "i"))(x)
    tree = on_devices(lambda v: hlax.psum({"a": v, "b": (v.astype(F32), 2 * v)}, "i"))(x)
    mean = on_devices(lambda v: hlax.pmean(v, "i"))(x)
    wide = on_devices(lambda v: hlax.psum(v.astype(F32), "i"))(x)
    scattered = jax.jit(
        jax.shard_map(
            lambda v: hlax.psum_scatter(v, "i", tiled=True),
            mesh=mesh,
            in_specs=P(),
            out_specs=P("i"),
        )
    )(jax.device_put(jnp.ones(8, BF16), NamedSharding(mesh, P())))

    # the gradient of a replicated bfloat16 parameter inside shard_map: heddle.autodiff makes it
    # float32, so the all-reduce that shard_map's transpose inserts adds in float32
    def loss(w, v):
        return hnp.sum(hnp.multiply(w, v), dtype=F32)

    def step(v):
        return autodiff.grad(loss)(jnp.ones((1,), BF16), v)

    grad_sum = on_devices(step)(x)
    plain = on_devices(lambda v: jax.grad(loss)(jnp.ones((1,), BF16), v))(x)
    print(
        json.dumps(
            {
                "devices": len(jax.devices()),
                "summed": [str(summed.dtype), float(np.asarray(summed)[0])],
                "narrow": [str(narrow.dtype), float(np.asarray(narrow)[0])],
                "tree": [[str(v.dtype), float(np.asarray(v)[0])] for v in jax.tree.leaves(tree)],
                "mean": [str(mean.dtype), float(np.asarray(mean)[0])],
                "wide": [str(wide.dtype), float(np.asarray(wide)[0])],
                "scattered": [str(scattered.dtype), float(np.asarray(scattered)[0])],
                "grad_sum": [str(grad_sum.dtype), float(np.asarray(grad_sum)[0])],
                "plain_grad_sum": [str(plain.dtype), float(np.asarray(plain)[0])],
            }
        )
    )


if __name__ == "__main__":
    main()
