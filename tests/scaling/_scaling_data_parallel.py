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
from heddle.scaling import _transform

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
        value, grads, _ = scaling.backward_scaled(loss_fn, scaling.loss_scale(state))(
            per_device(params), x
        )
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
    """heddle.autodiff.grad inside shard_map with a collective in the loss, against float64."""
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
    x64, w64 = np.asarray(x0, np.float64), np.asarray(w, np.float64)
    exact = 2 * x64.T @ (x64 @ w64)  # d/dw sum((x w)^2) over all 32 rows
    return {
        "dtype": str(ours.dtype),
        "rel_err": float(np.max(np.abs(np.asarray(ours, np.float64) - exact) / np.abs(exact))),
        "jax_rel_err": float(
            np.max(np.abs(np.asarray(theirs, np.float64) - exact) / np.abs(exact))
        ),
    }


BAD = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


def checked(f):
    """Runs one check; an exception is recorded (so one failure does not hide the others)."""
    try:
        return f()
    except Exception as e:  # reported to the test, which fails on it
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def same_bits(a, b):
    return all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def grads_finite_sharded():
    """grads_finite of a 64-element array sharded over 8 devices, one bad element in each shard."""
    mesh = jax.make_mesh((8,), ("data",))
    f = jax.jit(scaling.grads_finite)
    out = {"all_finite": bool(f(jax.device_put(jnp.ones(64), NamedSharding(mesh, P("data")))))}
    for name, bad in BAD.items():
        flags = []
        for shard in range(8):
            x = np.ones(64, np.float32)
            x[8 * shard + 3] = bad
            flags.append(bool(f(jax.device_put(x, NamedSharding(mesh, P("data"))))))
        out[name] = flags
    return out


def fsdp_adam():
    """The reproducer: w sharded P("data"), loss sum(sqrt(w)) with one negative element (NaN), and
    gradients c with one inf or -inf element; Adam's state sharded like w."""
    mesh = jax.make_mesh((8,), ("data",))
    sh = NamedSharding(mesh, P("data"))
    opt = scaling.dynamic_loss_scale(optax.adam(0.1))
    out = {}
    for name, bad in BAD.items():
        w = np.linspace(1.0, 2.0, 64, dtype=np.float32)
        c = np.ones(64, np.float32)
        if name == "nan":
            w[37] = -1.0  # d sqrt(w) / dw at -1 is NaN
        else:
            c[37] = bad
        w, c = jax.device_put(w, sh), jax.device_put(c, sh)
        state = opt.init(w)

        @jax.jit
        def step(w, state, c):
            loss = lambda w: jnp.sum(jnp.sqrt(w) * c)
            _, grads, finite = scaling.backward_scaled(loss, scaling.loss_scale(state))(w)
            updates, new_state = opt.update(grads, state, w)
            return optax.apply_updates(w, updates), new_state, finite

        w2, s2, finite = step(w, state, c)
        out[name] = {
            "w_shards": len(w.addressable_shards),
            "finite": bool(finite),
            "skipped": int(s2.loss_scale.skipped),
            "nan_params": int(np.isnan(np.asarray(w2)).sum()),
            "params_bit_identical": same_bits(w2, w),
            "adam_bit_identical": same_bits(s2.inner_state, state.inner_state),
        }
    return out


def batch_sharded():
    """Replicated parameters, the batch sharded: one bad input row on device 5 (sum(x @ w))."""
    mesh = jax.make_mesh((8,), ("data",))
    opt = scaling.dynamic_loss_scale(optax.adam(0.1))
    params = jax.device_put({"w": jnp.full((6, 3), 0.1, F32)}, NamedSharding(mesh, P()))
    state = opt.init(params)

    @jax.jit
    def step(params, state, x):
        loss = lambda p, x: jnp.sum(x @ p["w"])
        _, grads, finite = scaling.backward_scaled(loss, scaling.loss_scale(state))(params, x)
        updates, new_state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), new_state, finite

    out = {}
    for name, bad in BAD.items():
        x = np.ones((32, 6), np.float32)
        x[5 * 4 + 1, 2] = bad
        p2, s2, finite = step(params, state, jax.device_put(x, NamedSharding(mesh, P("data"))))
        out[name] = {
            "finite": bool(finite),
            "skipped": int(s2.loss_scale.skipped),
            "bit_identical": same_bits((p2, s2.inner_state), (params, state.inner_state)),
        }
    return out


def per_device(params):
    """The replicated parameters typed as varying over "data", so that their gradients are each
    device's own (as with pmap). Without it, shard_map's default check_vma=True sums the gradients
    of replicated parameters across devices in the backward pass."""
    return jax.tree.map(lambda a: jax.lax.pcast(a, ("data",), to="varying"), params)


def shard_map_default_vma(path, local):
    """jax.shard_map with its defaults (check_vma=True), Adam, axis_name="data": one device's
    gradient is NaN, inf or -inf; every device must skip with the state bit-identical. ``path``
    is the skip mechanism used on CPU ("branch") or the accelerators' one ("select"); ``local``:
    per-device gradients, else the gradients shard_map sums over devices."""
    _transform._PATHS["cpu"] = getattr(_transform, f"_{path}")
    mesh = jax.make_mesh((8,), ("data",))
    opt = scaling.dynamic_loss_scale(optax.adam(0.1), init_scale=2.0**10, axis_name="data")
    params = {"w": jnp.full((6, 3), 0.1, F32)}
    state = opt.init(params)

    def local_step(params, state, x):
        loss = lambda p, x: jnp.sum(x @ p["w"])
        _, grads, _ = scaling.backward_scaled(loss, scaling.loss_scale(state))(
            per_device(params) if local else params, x
        )
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, jax.lax.pmean(updates, "data")), state

    step = jax.jit(
        jax.shard_map(
            lambda p, s, x: jax.tree.map(lambda a: a[None], local_step(p, s, x)),
            mesh=mesh,
            in_specs=(P(), P(), P("data")),
            out_specs=P("data"),
        )
    )
    out = {}
    try:
        for name, bad in [("finite", None), *BAD.items()]:
            x = np.ones((32, 6), np.float32)
            if bad is not None:
                x[5 * 4 + 1, 2] = bad
            p2, s2 = step(params, state, jax.device_put(x, NamedSharding(mesh, P("data"))))
            rows = [jax.tree.map(lambda a, i=i: np.asarray(a)[i], (p2, s2)) for i in range(8)]
            out[name] = {
                "skipped": np.asarray(s2.loss_scale.skipped).tolist(),
                "scales": np.asarray(s2.loss_scale.scale).tolist(),
                "bit_identical": [
                    same_bits((p, s.inner_state), (params, state.inner_state)) for p, s in rows
                ],
            }
    finally:
        _transform._PATHS["cpu"] = _transform._branch
    return out


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    print(
        json.dumps(
            {
                "sharded_jit": sharded_jit(),
                "shard_map_axis": shard_mapped("data"),
                "shard_map_per_replica": shard_mapped(None),
                "autodiff": autodiff_under_shard_map(),
                "grads_finite_sharded": checked(grads_finite_sharded),
                "fsdp_adam": checked(fsdp_adam),
                "batch_sharded": checked(batch_sharded),
                **{
                    f"shard_map_vma_{path}_{kind}": checked(
                        lambda path=path, kind=kind: shard_map_default_vma(path, kind == "local")
                    )
                    for path in ("branch", "select")
                    for kind in ("local", "summed")
                },
            }
        )
    )
