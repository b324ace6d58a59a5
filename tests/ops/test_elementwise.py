"""Elementwise ops on narrow floats are rounded once, bit for bit (POLICY.md 4-5).

Reference: the float64 result (exact for products; for sums, quotients and square roots float64 has
more than 2p + 2 bits for every format here, so rounding the float64 result once more to the narrow
format gives the correctly rounded result), rounded once with ``_round.round_once``.

One backend property is carved out, and pinned by its own test: XLA's CPU (and GPU) float32 arithmetic
flushes float32 subnormals to zero. bfloat16 shares float32's exponent range, so bfloat16 operands or
results below 2**-126 in magnitude are flushed too (plain jax.numpy does exactly the same); float16 and
float8 subnormals are float32 normals and are exact.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _round import round_once, same_bits

import heddle.numpy as hnp

NARROW = [
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
]
IDS = [d.name for d in NARROW]

BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "true_divide": np.true_divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
UNARY = {
    "sqrt": np.sqrt,
    "square": np.square,
    "negative": np.negative,
    "abs": np.abs,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "rint": np.rint,
}


def _all_values(dtype):
    bits = dtype.itemsize * 8
    return np.arange(2**bits, dtype=np.uint16 if bits == 16 else np.uint8).view(dtype)


F32_TINY = 2.0**-126


def _flushed(dtype, *arrays):
    """Where float32 subnormal flushing can touch the result (bfloat16 only)."""
    if dtype != ml_dtypes.bfloat16:
        return np.zeros(np.shape(arrays[0]), bool)
    out = np.zeros(np.shape(arrays[0]), bool)
    for a in arrays:
        with np.errstate(invalid="ignore"):
            a = np.asarray(a, np.float64)
        out |= (a != 0) & (np.abs(a) < F32_TINY)
    return out


def _pairs(dtype, rng):
    values = _all_values(dtype)
    if dtype.itemsize == 1:  # every pair of 8-bit values
        a, b = np.meshgrid(values, values)
        return a.ravel(), b.ravel()
    return rng.choice(values, 1 << 17), rng.choice(values, 1 << 17)


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_rounds_once(transform, name, dtype):
    a, b = _pairs(dtype, np.random.default_rng(0))
    with np.errstate(all="ignore"):
        exact = BINARY[name](a.astype(np.float64), b.astype(np.float64))
    want = round_once(exact, dtype)
    got = np.asarray(transform(getattr(hnp, name))(a, b))
    assert got.dtype == dtype
    keep = ~_flushed(dtype, a, b, exact)
    if name in (
        "maximum",
        "minimum",
    ):  # IEEE leaves the order of -0 and +0 open here; NumPy and XLA differ
        got, want = got + np.zeros((), dtype), want + np.zeros((), dtype)
    assert same_bits(got[keep], want[keep]), name


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_rounds_once_on_every_value(transform, name, dtype):
    x = _all_values(dtype)
    with np.errstate(all="ignore"):
        want = round_once(UNARY[name](x.astype(np.float64)), dtype)
    got = np.asarray(transform(getattr(hnp, name))(x))
    assert got.dtype == dtype
    keep = ~_flushed(dtype, x, want)
    assert same_bits(got[keep], want[keep]), name


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_python_scalar_takes_the_array_dtype_rounded_once(transform, dtype):
    x = _all_values(dtype)
    got = np.asarray(transform(lambda v: hnp.multiply(v, 0.1))(x))
    with np.errstate(all="ignore"):
        tenth = round_once(np.float64(0.1), dtype).astype(np.float64)
        want = round_once(x.astype(np.float64) * tenth, dtype)
    assert got.dtype == dtype
    keep = ~_flushed(dtype, x, want)
    assert same_bits(got[keep], want[keep])


def test_bfloat16_subnormal_flush_is_the_backends(transform):
    import jax.numpy as jnp

    tiny = np.asarray([2.0**-130, -(2.0**-128)], ml_dtypes.bfloat16)
    one = np.asarray([0.0, 0.0], ml_dtypes.bfloat16)
    ours = np.asarray(transform(hnp.add)(tiny, one))
    plain = np.asarray(transform(jnp.add)(tiny, one))
    assert same_bits(ours, plain)


def test_mixed_float16_bfloat16_gives_float32(transform):
    a = np.asarray([1.5, 3.0], np.float16)
    b = np.asarray([0.1, 2.0], ml_dtypes.bfloat16)
    got = transform(hnp.add)(a, b)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got), a.astype(np.float64) + b.astype(np.float64))
