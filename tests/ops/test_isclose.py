"""heddle.numpy.isclose / allclose: ``|a - b| <= atol + rtol |b|`` decided exactly for narrow floats.

The tolerances are rounded to the operands' dtype (as jax.numpy rounds them); the difference and the
bound are float32, exact for bfloat16 and float16 operands, where ``jnp.isclose`` of bfloat16 rounds
``|a - b|`` to bfloat16 first. The reference is float64 NumPy on every bit pattern; autocast of
``jnp.isclose`` gives the same answers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.numpy as hnp

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
TOLERANCES = [(1e-5, 1e-8), (1e-2, 1e-2), (0.3, 0.05)]


def _exact(x: np.ndarray, y: np.ndarray, rtol: float, atol: float, d: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        r = float(np.asarray(rtol, np.float32).astype(d))
        a = float(np.asarray(atol, np.float32).astype(d))
        return (x64 == y64) | (np.isfinite(y64) & (np.abs(x64 - y64) <= a + r * np.abs(y64)))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_isclose_is_exact_on_every_pattern(dtype):
    # before: 5 of these (pattern, y, tolerance) answers were wrong in bfloat16 (|a - b| rounded)
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    with np.errstate(all="ignore"):
        normal = np.isfinite(x.astype(np.float64)) & (
            (np.abs(x.astype(np.float64)) >= float(np.finfo(dtype).tiny)) | (x == 0)
        )  # XLA:CPU flushes subnormals
    jitted = jax.jit(hnp.isclose, static_argnames=("rtol", "atol"))
    wrong = 0
    for yv in (1.0, 3.0, 1e-3, -7.5):
        y = np.full_like(x, yv)
        for rtol, atol in TOLERANCES:
            want = _exact(x, y, rtol, atol, dtype)
            got = np.asarray(jitted(x, y, rtol=rtol, atol=atol))
            auto = jax.jit(heddle.autocast(lambda a, b: jnp.isclose(a, b, rtol=rtol, atol=atol)))
            wrong += np.count_nonzero((got != want)[normal])
            np.testing.assert_array_equal(np.asarray(auto(x, y)), got)
    assert wrong == 0


def test_isclose_eagerly_and_allclose():
    a = jnp.asarray([1.0, 1.0078125, 2.0], jnp.bfloat16)
    b = jnp.asarray([1.0, 1.0, 2.0], jnp.bfloat16)
    assert hnp.isclose(a, b, rtol=0.0, atol=0.0078125).tolist() == [True, True, True]
    assert hnp.isclose(a, b, rtol=0.0, atol=0.0078).tolist() == [True, True, True]  # 0.0078 rounds
    assert not bool(hnp.allclose(a, b, rtol=0.0, atol=0.004))
    assert bool(hnp.allclose(a, b, rtol=0.0, atol=0.0078125))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int8])
def test_wider_and_integer_operands_are_jaxs(dtype):
    x = jnp.asarray([1, 2, 3], dtype)
    y = jnp.asarray([1, 2, 4], dtype)
    assert hnp.isclose(x, y).tolist() == jnp.isclose(x, y).tolist()
