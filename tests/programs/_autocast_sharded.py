"""Run in a subprocess with 8 host devices: autocast on sharded arrays, under jit and in shard_map
with its defaults. Prints one JSON line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import heddle

mesh = jax.make_mesh((8,), ("d",))
x = jax.device_put(jnp.full((8, 4096), 0.1, jnp.bfloat16), NamedSharding(mesh, P("d")))
out = {}

y = jax.jit(heddle.autocast(lambda x: x.cumsum(axis=1)))(x)
out["jit_shards"] = len(y.addressable_shards)
out["jit_spec"] = str(y.sharding.spec)
out["jit_last"] = float(np.asarray(y, np.float64)[0, -1])

f = jax.shard_map(
    lambda x: jax.lax.psum(x.sum(axis=1), "d"), mesh=mesh, in_specs=P("d"), out_specs=P()
)
with jax.set_mesh(mesh):
    z = jax.jit(heddle.autocast(f))(x)
    loss = heddle.autocast(lambda x: x.cumsum(axis=1).astype(jnp.float32).sum())
    w = jax.jit(jax.grad(loss))(x)
out["psum"] = float(np.asarray(z, np.float64).ravel()[0])
out["grad_shards"] = len(w.addressable_shards)
out["grad_first"] = float(np.asarray(w, np.float64)[0, 0])
print(json.dumps(out))
