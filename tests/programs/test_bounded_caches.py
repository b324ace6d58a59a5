"""autocast's cache of rewritten sharded-jit bodies holds an entry only while JAX holds the body: a
fresh jitted closure per step over new weights leaves nothing behind (it held every body and its
weights, up to 4,096 of them)."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

import heddle
from heddle.programs import _higher


def _sharded_matmul(w):
    s = SingleDeviceSharding(jax.devices()[0])
    return jax.jit(lambda x: x @ w, in_shardings=s, out_shardings=s)


def test_a_fresh_sharded_closure_per_step_leaves_no_cache_entry_behind():
    before = len(_higher._RETRACED)
    x = jnp.ones((4, 64), jnp.bfloat16)
    for i in range(6):
        w = jnp.full((64, 64), i, jnp.bfloat16)
        out = heddle.autocast(_sharded_matmul(w))(x)
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.full((4, 64), 64.0 * i))
    del w, out
    gc.collect()
    assert len(_higher._RETRACED) <= before


def test_a_body_that_is_kept_is_rewritten_once():
    x = jnp.ones((4, 64), jnp.bfloat16)
    f = _sharded_matmul(jnp.full((64, 64), 2, jnp.bfloat16))
    g = heddle.autocast(f)
    first = g(x)
    n = len(_higher._RETRACED)
    second = g(x)
    assert len(_higher._RETRACED) == n  # the second call found the first's rewrite
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    assert jax.jit(g)(x).dtype == jnp.bfloat16
