"""A model written against jax.numpy runs with the module swapped: jit, forward and backward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle.examples import block, cast_tree, init_block, init_mlp, mlp

BF16 = ml_dtypes.bfloat16


def _f64(tree):
    return {k: np.asarray(v).astype(np.float64) for k, v in tree.items()}


def _err(got, ref):
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("model", ["mlp", "block"])
def test_forward_matches_float64_reference(model):
    rng = np.random.default_rng(0)
    if model == "mlp":
        params, x, fn = (
            cast_tree(init_mlp(rng), BF16),
            rng.standard_normal((32, 64)).astype(BF16),
            mlp,
        )
    else:
        params, x, fn = (
            cast_tree(init_block(rng), BF16),
            rng.standard_normal((2, 16, 32)).astype(BF16),
            block,
        )
    ref = fn(np, _f64(params), np.asarray(x, np.float64))  # the same bfloat16 values, in float64
    got = jax.jit(lambda p, v: fn(hnp, p, v))(params, x)
    assert got.dtype == BF16
    # each op rounds once to bfloat16 (2**-8 relative); a handful of roundings in sequence
    assert _err(got, ref) < 0.03


def test_backward_runs_under_jit_with_heddle_ops():
    rng = np.random.default_rng(1)
    params, x = cast_tree(init_block(rng), BF16), rng.standard_normal((2, 16, 32)).astype(BF16)

    def loss(p):
        return hnp.mean(hnp.square(block(hnp, p, x)))

    grads = jax.jit(jax.grad(loss))(params)
    assert set(grads) == set(params)
    for g in grads.values():
        assert g.dtype == BF16 and bool(jnp.isfinite(g.astype(jnp.float32)).all())


def test_sharded_over_8_devices_keeps_sharding_and_values():
    code = textwrap.dedent(
        """
        import jax, numpy as np, ml_dtypes
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import heddle.numpy as hnp
        from heddle.examples import mlp, init_mlp, cast_tree
        assert jax.device_count() == 8
        rng = np.random.default_rng(0)
        params = cast_tree(init_mlp(rng), ml_dtypes.bfloat16)
        x = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
        mesh = Mesh(np.array(jax.devices()), ("data",))
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        f = jax.jit(lambda p, v: mlp(hnp, p, v))
        out, plain = f(params, xs), f(params, x)
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 2), out.sharding
        np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))
        y = hnp.multiply(xs, 0.5)  # eager op on a sharded array
        assert y.sharding.is_equivalent_to(xs.sharding, 2), y.sharding
        g = jax.jit(jax.grad(lambda p: hnp.sum(mlp(hnp, p, xs).astype("float32"))))(params)
        assert all(bool(np.isfinite(np.asarray(v, np.float32)).all()) for v in g.values())
        print("ok")
        """
    )
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_importing_heddle_changes_no_global_jax_setting():
    code = textwrap.dedent(
        """
        import jax
        names = sorted(n for n in dir(jax.config) if n.startswith("jax_"))
        before = {n: repr(getattr(jax.config, n)) for n in names}
        import heddle, heddle.numpy, heddle.policy
        after = {n: repr(getattr(jax.config, n)) for n in names}
        changed = {n for n in names if before[n] != after[n]}
        assert not changed, changed
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
