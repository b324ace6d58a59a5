"""max/min propagate NaN on every sharding, as on one device (heddle/ops/_nanprop.py).

XLA:CPU's cross-device max/min combiner drops NaN (``jnp.max`` of an 8-way sharded array holding one
NaN is its largest other value under ``jax.jit``). The references are NumPy's, in float64.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _common import BF16, F16, F32  # tests/ops is on sys.path

import heddle
import heddle.lax as hlax
import heddle.numpy as hnp
from heddle import autodiff


@pytest.mark.slow
def test_max_and_min_propagate_nan_on_8_devices(on_8_devices):
    """max/min/amax/amin, nanmax/nanmin (NaN only for all-NaN slices), autocast's reduce_max and
    reduce_min and heddle.lax.reduce_max/min: rows and a 2x4 mesh; float32 and bfloat16; axis=,
    keepdims=, initial=, where=; NaN in the first and the last shard, +-inf; eager and jitted; bit
    for bit against NumPy (the slow test adds columns, replicated and float16)."""
    r = on_8_devices(pathlib.Path(__file__).with_name("_nanprop_devices.py"), "--quick")
    assert r["devices"] == 8
    assert r["checks"] > 400
    assert r["bad"] == []


@pytest.mark.slow
def test_max_and_min_propagate_nan_on_8_devices_every_sharding_and_dtype(on_8_devices):
    """The same on rows, columns, a 2x4 mesh and replicated, float32, bfloat16 and float16."""
    r = on_8_devices(pathlib.Path(__file__).with_name("_nanprop_devices.py"))
    assert r["devices"] == 8
    assert r["checks"] > 1000
    assert r["bad"] == []


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", ["max", "min", "amax", "amin"])
def test_values_and_gradients_are_jax_s_own(transform, name, dtype):
    x = jnp.asarray((np.arange(24.0).reshape(4, 6) % 7 - 3).astype(dtype))
    for kw in ({}, {"axis": 0}, {"axis": 1, "keepdims": True}):
        got, want = (
            transform(lambda v, kw=kw: getattr(hnp, name)(v, **kw))(x),
            getattr(jnp, name)(x, **kw),
        )
        assert got.dtype == dtype
        assert np.array_equal(
            np.atleast_1d(np.asarray(got)).view(np.uint8),
            np.atleast_1d(np.asarray(want)).view(np.uint8),
        )

        def loss(v, fn, kw=kw):
            return jnp.sum(fn(v, **kw).astype(F32))

        g = transform(autodiff.grad(lambda v: loss(v, getattr(hnp, name))))(x)
        ref = jax.grad(lambda v: loss(v.astype(F32), getattr(jnp, name)))(x.astype(F32))
        assert np.array_equal(np.asarray(g), np.asarray(ref))


def test_nan_in_one_device_input_and_integers():
    x = np.array([[1.0, np.nan, -np.inf], [np.inf, 2.0, 3.0]], F32)
    assert np.isnan(np.asarray(hnp.max(x))) and np.isnan(np.asarray(hnp.min(x, axis=1)))[0]
    assert np.asarray(hnp.max(x, axis=1))[1] == np.inf
    assert np.isnan(np.asarray(hnp.max(np.ones(3, F32), initial=np.float32(np.nan))))
    i = jnp.arange(6, dtype=jnp.int8).reshape(2, 3)
    assert hnp.max(i).dtype == jnp.int8 and int(hnp.max(i, axis=0)[2]) == 5
    assert np.isnan(np.asarray(hlax.reduce_max(x, (0, 1))))
    assert np.isnan(np.asarray(heddle.autocast(jnp.min)(x)))


def test_pmax_and_pmin_propagate_nan_across_8_devices(on_8_devices):
    """heddle.lax.pmax/pmin and autocast's pmax/pmin give NaN on every device where one device's
    value is NaN (jax.lax.pmax drops it on CPU), and JAX's values elsewhere."""
    r = on_8_devices(pathlib.Path(__file__).with_name("_pmax_devices.py"))
    assert r["checks"] == 36 and not r["bad"], r
