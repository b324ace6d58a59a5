"""``autocast(f_jnp)`` equals ``f_heddle`` bit for bit: outputs and gradients, eagerly and under jit,
in bfloat16, float16 and float32 (eager float32 within a bound), and with x64 on (models in
tests/programs/_twins.py)."""

from __future__ import annotations

import _twins as T  # tests/programs is on sys.path (pytest rootdir-less import)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle
from heddle import autodiff

DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]
SLOW = pytest.mark.slow
# bfloat16 runs by default; float16 and float32 gradients, and eager float16/float32, are slow
QUICK_DTYPES = [
    jnp.bfloat16,
    pytest.param(jnp.float16, marks=SLOW),
    pytest.param(jnp.float32, marks=SLOW),
]


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and bool(jnp.array_equal(a, b, equal_nan=True))


def _loss(f):
    return lambda p, x: f(p, x).astype(jnp.float32).sum()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(T.MODELS))
def test_outputs_are_bit_identical_under_jit(name, dtype):
    f_jnp, f_heddle = T.MODELS[name]
    p, x = T.params(dtype), T.inputs(name, dtype)
    assert _same(jax.jit(heddle.autocast(f_jnp))(p, x), jax.jit(f_heddle)(p, x))


QUICK_MODELS = [
    "block",
    "embed",
    *(pytest.param(n, marks=SLOW) for n in sorted(T.MODELS) if n not in ("block", "embed")),
]


@pytest.mark.parametrize("dtype", QUICK_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", QUICK_MODELS)
def test_outputs_are_bit_identical_eagerly(name, dtype):
    f_jnp, f_heddle = T.MODELS[name]
    p, x = T.params(dtype), T.inputs(name, dtype)
    ours, theirs = heddle.autocast(f_jnp)(p, x), f_heddle(p, x)
    if dtype != jnp.float32:
        assert _same(ours, theirs)
        return
    # float32 has no rounding to a narrow dtype to absorb how XLA fuses an eager program: run op by
    # op, autocast's equations fuse differently from heddle's jitted ops (plain JAX's own eager and
    # jitted results of these models differ by up to 160 ulps), so float32 agrees within a bound
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=2**-13, atol=2**-13)


@pytest.mark.parametrize("dtype", QUICK_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", QUICK_MODELS)
def test_gradients_are_bit_identical(name, dtype):
    # heddle.autodiff.grad: float32 gradients, cotangent sums in float32, for both versions
    f_jnp, f_heddle = T.MODELS[name]
    p, x = T.params(dtype), T.inputs(name, dtype)
    g_ours = jax.jit(autodiff.grad(_loss(heddle.autocast(f_jnp))))(p, x)
    g_theirs = jax.jit(autodiff.grad(_loss(f_heddle)))(p, x)
    differ = [k for k in g_ours if not _same(g_ours[k], g_theirs[k])]
    assert not differ


def test_plain_jax_differs_where_the_policy_matters():
    # The equivalence is not vacuous: without autocast the same bfloat16 model computes otherwise.
    p, x = T.params(jnp.bfloat16), T.inputs("block", jnp.bfloat16)
    assert not _same(T.block_jnp(p, x), T.block_heddle(p, x))


@pytest.mark.parametrize(
    "name",
    ["embed", "layernorm", pytest.param("block", marks=SLOW), pytest.param("cnn", marks=SLOW)],
)
def test_bit_identical_with_x64(name):
    with jax.enable_x64(True):
        f_jnp, f_heddle = T.MODELS[name]
        p, x = T.params(jnp.bfloat16), T.inputs(name, jnp.bfloat16)
        assert _same(jax.jit(heddle.autocast(f_jnp))(p, x), jax.jit(f_heddle)(p, x))
