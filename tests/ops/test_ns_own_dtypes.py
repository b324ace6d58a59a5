"""broadcast_arrays and meshgrid: each output keeps its own operand's dtype and bits (as jax.numpy),
while a narrow float's backward pass still sums its cotangents in float32."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import autodiff

DTYPES = [
    np.dtype(np.bool_),
    np.dtype(np.int8),
    np.dtype(np.uint8),
    np.dtype(np.uint32),
    np.dtype(np.int32),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float16),
    np.dtype(np.float32),
]


def _values(d: np.dtype, n: int, seed: int) -> np.ndarray:
    """``n`` values of ``d`` from random bit patterns (floats: finite ones plus -0, inf and NaN)."""
    rng = np.random.default_rng(seed)
    if d == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if d.kind in "iu":
        info = np.iinfo(d)
        return rng.integers(int(info.min), int(info.max), n, endpoint=True, dtype=np.int64).astype(
            d
        )
    bits = np.dtype(f"u{d.itemsize}")
    x = rng.integers(0, np.iinfo(bits).max, n, endpoint=True, dtype=np.uint64).astype(bits).view(d)
    x = np.where(np.isfinite(x.astype(np.float32)), x, np.zeros((), d))
    x[:3] = np.array([-0.0, np.inf, np.nan]).astype(d)
    return x


def _bits(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype != np.bool_ else x


def _same(out, want) -> None:
    assert len(out) == len(want)
    for o, w in zip(out, want, strict=True):
        assert o.dtype == w.dtype, (o.dtype, w.dtype)
        assert o.shape == w.shape
        np.testing.assert_array_equal(_bits(np.asarray(o)), _bits(w))


@pytest.mark.parametrize("da,db", list(itertools.product(DTYPES, DTYPES)), ids=str)
def test_broadcast_arrays_keeps_each_dtype_and_value(da, db, transform):
    a, b = _values(da, 7, 1).reshape(7, 1), _values(db, 5, 2).reshape(1, 5)
    out = transform(hnp.broadcast_arrays)(jnp.asarray(a), jnp.asarray(b))
    _same(out, np.broadcast_arrays(a, b))
    assert [o.dtype for o in out] == [o.dtype for o in jnp.broadcast_arrays(a, b)]


@pytest.mark.parametrize("da,db", list(itertools.product(DTYPES, DTYPES)), ids=str)
@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid_keeps_each_dtype_and_value(da, db, indexing, transform):
    a, b = _values(da, 4, 3), _values(db, 6, 4)
    f = transform(lambda x, y: hnp.meshgrid(x, y, indexing=indexing))
    _same(f(jnp.asarray(a), jnp.asarray(b)), np.meshgrid(a, b, indexing=indexing))


def test_three_operands_and_sparse_meshgrid(transform):
    a = _values(np.dtype(np.uint32), 3, 5)
    b = _values(np.dtype(np.int8), 4, 6)
    c = _values(np.dtype(ml_dtypes.bfloat16), 3, 7)
    f = transform(lambda x, y, z: hnp.meshgrid(x, y, z, sparse=True))
    _same(f(*map(jnp.asarray, (a, b, c))), np.meshgrid(a, b, c, sparse=True))
    g = transform(hnp.broadcast_arrays)
    _same(
        g(*map(jnp.asarray, (a[:, None, None], b[:, None], c[:1]))),
        np.broadcast_arrays(a[:, None, None], b[:, None], c[:1]),
    )


def test_uint32_with_int8_without_x64_does_not_promote():
    """uint32 and int8 promote to int64, which x32 lacks; the copies never needed the promotion."""
    assert not jax.config.read("jax_enable_x64")
    a, b = jnp.arange(3, dtype=jnp.uint32), jnp.full((2, 1), -3, jnp.int8)
    x, y = hnp.broadcast_arrays(a, b)
    assert (x.dtype, y.dtype) == (np.uint32, np.int8)
    np.testing.assert_array_equal(np.asarray(y), np.full((2, 3), -3, np.int8))


@pytest.mark.parametrize("n", [65536, 65474])
@pytest.mark.parametrize("op", ["broadcast_arrays", "meshgrid"])
@pytest.mark.parametrize("other", [ml_dtypes.bfloat16, np.float16, np.int8])
def test_narrow_float_cotangents_sum_in_float32(n, op, other, transform):
    """bfloat16 holds 65536 but a bfloat16 running sum of ones stops at 256; 65474 it cannot hold."""
    y = jnp.ones((n,), other)

    def loss(b):
        if op == "broadcast_arrays":
            out = hnp.broadcast_arrays(b, y)[0]
        else:
            out = hnp.meshgrid(b, y)[0]
        assert out.dtype == jnp.bfloat16
        return hnp.sum(hnp.astype(out, jnp.float32))

    b = jnp.ones((1,), jnp.bfloat16)
    g = transform(autodiff.grad(loss))(b)
    assert g.dtype == jnp.float32 and float(g[0]) == n
