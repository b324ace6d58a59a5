"""One of two processes training an FSDP-sharded MLP with dynamic loss scaling, on localhost.

Run by tests/scaling/test_multiprocess_training.py as
``python _multiprocess_train.py PROCESS_ID PORT CKPT_DIR NAN_STEP INF_STEP`` with
``JAX_PLATFORMS=cpu`` and two host devices per process: a global mesh of 4 devices, the weight
rows split over all 4 (FSDP), the batch split over them too (each process feeds its own half).
At ``NAN_STEP`` process 1's half of the batch holds a NaN; at ``INF_STEP`` the gradient of a row
of ``w1`` that lives on process 1 gets an inf. Prints one JSON line per step and a final one with
hashes of the gathered parameters and of the checkpoint restored from ``CKPT_DIR``.
"""

from __future__ import annotations

import hashlib
import json
import sys

import jax

PID, PORT, CKPT, NAN_STEP, INF_STEP = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    sys.argv[3],
    int(sys.argv[4]),
    int(sys.argv[5]),
)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{PORT}",
    num_processes=2,
    process_id=PID,
    initialization_timeout=60,
)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import heddle  # noqa: E402
from heddle import scaling  # noqa: E402

STEPS = 6
BATCH, D_IN, D_HID, D_OUT = 16, 8, 16, 4


def emit(**kw):
    print(json.dumps({"process": PID, **kw}), flush=True)


def digest(tree) -> str:
    """sha256 of every leaf's bytes (gathered to full arrays on every process), in tree order."""
    full = multihost_utils.process_allgather(tree, tiled=True)
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(full):
        a = np.asarray(leaf)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def local_digest(tree) -> str:
    """sha256 of the shards this process holds (no communication)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        for s in sorted(leaf.addressable_shards, key=lambda s: s.device.id):
            h.update(np.asarray(s.data).tobytes())
    return h.hexdigest()


def local_value(x) -> float:
    return float(np.asarray(x.addressable_shards[0].data))


assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
mesh = jax.make_mesh((4,), ("d",), devices=jax.devices())
rows = NamedSharding(mesh, P("d", None))  # FSDP: the rows of each weight over all 4 devices
rep = NamedSharding(mesh, P())
batch_sh = NamedSharding(mesh, P("d", None))

# The first row of w1 whose device belongs to process 1: where the inf is put.
owner = {d.id: d.process_index for d in mesh.devices.ravel()}
per = D_IN // 4
inf_row = next(i for i in range(D_IN) if owner[mesh.devices.ravel()[i // per].id] == 1)

rng = np.random.default_rng(0)
host_params = {
    "w1": rng.standard_normal((D_IN, D_HID)).astype(np.float32) / 3,
    "b1": np.zeros((D_HID,), np.float32),
    "w2": rng.standard_normal((D_HID, D_OUT)).astype(np.float32) / 4,
    "b2": np.zeros((D_OUT,), np.float32),
}
shardings = {"w1": rows, "b1": rep, "w2": rows, "b2": rep}
params = {
    k: jax.make_array_from_callback(v.shape, shardings[k], lambda idx, v=v: v[idx])
    for k, v in host_params.items()
}


def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    out = h @ p["w2"] + p["b2"]
    return jnp.mean((out - y) ** 2)


loss_bf16 = heddle.autocast(loss_fn, precision="mixed_bfloat16")
opt = scaling.dynamic_loss_scale(
    optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.05)), init_scale=2.0**10
)
opt_state = opt.init(params)


@jax.jit
def train_step(p, state, x, y, poke):
    scale = scaling.loss_scale(state)
    value, grads, finite = scaling.backward_scaled(loss_bf16, scale)(p, x, y)
    grads = {**grads, "w1": grads["w1"] + poke}  # inf on one process's rows at INF_STEP
    agreed = scaling.grads_finite(grads)
    updates, state = opt.update(grads, state, p, value=value)
    return optax.apply_updates(p, updates), state, value, finite, agreed


def local_batch(step):
    """This process's half of the global batch (rows PID*8 .. PID*8+7)."""
    r = np.random.default_rng(100 + step)
    x = r.standard_normal((BATCH, D_IN)).astype(np.float32)
    y = np.sin(x[:, :D_OUT]).astype(np.float32)
    half = slice(PID * BATCH // 2, (PID + 1) * BATCH // 2)
    x, y = x[half].copy(), y[half]
    if step == NAN_STEP and PID == 1:
        x[3, 2] = np.nan
    return x, y


def poke_for(step):
    g = np.zeros((D_IN, D_HID), np.float32)
    if step == INF_STEP:
        g[inf_row, 5] = np.inf
    return jax.make_array_from_callback(g.shape, rows, lambda idx: g[idx])


for step in range(STEPS):
    xl, yl = local_batch(step)
    x = jax.make_array_from_process_local_data(batch_sh, xl, (BATCH, D_IN))
    y = jax.make_array_from_process_local_data(batch_sh, yl, (BATCH, D_OUT))
    before_local, before = local_digest(params), digest(params)
    scale_before = local_value(scaling.loss_scale(opt_state))
    params, opt_state, value, finite, agreed = train_step(params, opt_state, x, y, poke_for(step))
    ls = scaling.loss_scale_state(opt_state)
    emit(
        step=step,
        finite=bool(local_value(agreed)),
        backward_finite=bool(local_value(finite)),
        scale_before=scale_before,
        scale=local_value(ls.scale),
        skipped=int(local_value(ls.skipped)),
        unchanged_local=local_digest(params) == before_local,
        unchanged=digest(params) == before,
        loss=local_value(value),
        params_hash=digest(params),
    )

final_params_hash = digest(params)
final_state_hash = digest(opt_state)

# Both processes write one checkpoint to the same directory, then restore it with the same
# shardings, as NamedTuples (the optimiser's own state as the target).
ckptr = ocp.StandardCheckpointer()
ckptr.save(f"{CKPT}/step", {"params": params, "opt_state": opt_state})
ckptr.wait_until_finished()
target = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
    {"params": params, "opt_state": opt_state},
)
restored = ckptr.restore(f"{CKPT}/step", target)
ckptr.close()
same_shardings = all(
    r.sharding.is_equivalent_to(a.sharding, a.ndim)
    for r, a in zip(
        jax.tree.leaves(restored),
        jax.tree.leaves({"params": params, "opt_state": opt_state}),
        strict=True,
    )
)
emit(
    final=True,
    inf_row=inf_row,
    params_hash=final_params_hash,
    state_hash=final_state_hash,
    restored_params_hash=digest(restored["params"]),
    restored_state_hash=digest(restored["opt_state"]),
    restored_scale=local_value(scaling.loss_scale(restored["opt_state"])),
    same_shardings=same_shardings,
    local_params_hash=local_digest(params),
    restored_local_params_hash=local_digest(restored["params"]),
)
jax.distributed.shutdown()
