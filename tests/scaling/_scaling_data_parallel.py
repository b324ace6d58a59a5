"""Data-parallel loss scaling on 8 host devices; run as a script by test_scaling_data_parallel.py.

Prints one JSON line with what each check observed.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from heddle import autodiff, scaling

F16, F32 = jnp.float16, jnp.float32


def loss_fn(params, x):
    h = jnp.tanh(x @ params["w"].astype(F16))
    return jnp.mean(h.astype(F32) ** 2)


def batch(bad_shard=None, n=8, rows=4):
    x = np.linspace(-1.0, 1.0, n * rows * 6, dtype=np.float32).reshape(n * rows, 6)
    if bad_shard is not None:
        x[bad_shard * rows + 1, 2] = np.inf
    return x.astype(np.float16)


def replicas_equal(a):
    shards = [np.asarray(s.data) for s in a.addressable_shards]
    return all(s.tobytes() == shards[0].tobytes() for s in shards), shards[0]


def sharded_jit():
    mesh = jax.make_mesh((8,), ("data",))
    rep, row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), init_scale=2.0**10)
    params = jax.device_put({"w": jnp.full((6, 3), 0.1, F32)}, rep)
    state = jax.device_put(opt.init(params), rep)

    @jax.jit
    def step(params, state, x):
        value, grads, finite = scaling.backward_scaled(loss_fn, scaling.loss_scale(state))(
            params, x
        )
        updates, state = opt.update(grads, state, params, value=value)
        return optax.apply_updates(params, updates), state, finite

    out = {}
    for name, bad in (("finite", None), ("bad_shard_5", 5)):
        x = jax.device_put(jnp.asarray(batch(bad)), row)
        p, s, finite = step(params, state, x)
        eq_scale, scale = replicas_equal(s.loss_scale.scale)
        eq_w, w = replicas_equal(p["w"])
        out[name] = {
            "x_shards": len(x.addressable_shards),
            "finite": bool(finite),
            "scale": float(scale),
            "replicas_agree": eq_scale and eq_w,
            "params_unchanged": bool(np.array_equal(w, np.asarray(params["w"]))),
            "skipped": int(s.loss_scale.skipped),
        }
    return out


def shard_mapped(axis_name):
    mesh = jax.make_mesh((8,), ("data",))
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), init_scale=2.0**10, axis_name=axis_name)
    params = {"w": jnp.full((6, 3), 0.1, F32)}
    state = opt.init(params)

    def local_step(params, state, x):
        value, grads, _ = scaling.backward_scaled(loss_fn, scaling.loss_scale(state))(params, x)
        # The trap being guarded against: the optimiser sees this replica's own gradients (the
        # finiteness check runs before any averaging).
        updates, state = opt.update(grads, state, params, value=value)
        grads_mean = jax.lax.pmean(grads, "data")
        return optax.apply_updates(params, jax.lax.pmean(updates, "data")), state, grads_mean

    # The state comes back per device (out_specs P("data")) so that disagreement is visible.
    step = jax.jit(
        jax.shard_map(
            lambda p, s, x: jax.tree.map(lambda a: a[None], local_step(p, s, x)),
            mesh=mesh,
            in_specs=(P(), P(), P("data")),
            out_specs=P("data"),
            check_vma=False,
        )
    )
    x = jax.device_put(jnp.asarray(batch(5)), NamedSharding(mesh, P("data")))
    p, s, _ = step(params, state, x)
    scales = np.asarray(s.loss_scale.scale).tolist()
    skipped = np.asarray(s.loss_scale.skipped).tolist()
    return {
        "scales": scales,
        "skipped": skipped,
        "w_finite": bool(np.isfinite(np.asarray(p["w"])).all()),
    }


def autodiff_under_shard_map():
    """heddle.autodiff.grad inside shard_map with a collective in the loss, against jax.grad."""
    mesh = jax.make_mesh((8,), ("data",))
    x0 = jnp.linspace(-1.0, 1.0, 8 * 4 * 6, dtype=F32).reshape(32, 6).astype(jnp.bfloat16)
    x = x0
    w = jnp.full((6, 3), 0.5, jnp.bfloat16)

    def local(w, x):
        y = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=F32)
        return jax.lax.psum(jnp.sum(y * y), "data")

    def grads(g):
        return jax.jit(
            jax.shard_map(g(local), mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
        )(w, x)

    x = jax.device_put(x, NamedSharding(mesh, P("data")))
    ours, theirs = grads(autodiff.grad), grads(jax.grad)
    return {
        "dtype": str(ours.dtype),
        "max_abs_diff": float(jnp.max(jnp.abs(ours - theirs.astype(F32)))),
    }


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    print(
        json.dumps(
            {
                "sharded_jit": sharded_jit(),
                "shard_map_axis": shard_mapped("data"),
                "shard_map_per_replica": shard_mapped(None),
                "autodiff": autodiff_under_shard_map(),
            }
        )
    )
