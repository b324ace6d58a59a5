"""Scalar-range, promotion and precision errors raised through the ops, and the fixes they suggest."""

from __future__ import annotations

import re

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.numpy as hnp
from heddle import policy


def _suggested_dtype(message: str) -> str:
    m = re.search(r"heddle\.astype\(x, '([a-z0-9_]+)'\)", message)
    assert m, message
    return m.group(1)


@pytest.mark.parametrize(
    ("dtype", "scalar", "error"),
    [
        (np.uint8, -2, policy.ScalarRangeError),
        (np.int8, 1000, policy.ScalarRangeError),
        (ml_dtypes.bfloat16, 1e39, policy.ScalarRangeError),
        (ml_dtypes.float8_e4m3fn, 464.0, policy.ScalarRangeError),  # 448 + half an ulp
    ],
)
def test_scalar_out_of_range_through_ops(transform, dtype, scalar, error):
    x = np.ones(3, dtype)
    with pytest.raises(error) as e:
        transform(hnp.add)(x, scalar) if transform is not jax.jit else hnp.add(x, scalar)
    msg = str(e.value)
    assert (np.dtype(dtype).name in msg and repr(scalar) in msg) or str(scalar) in msg
    assert isinstance(e.value, OverflowError) and isinstance(e.value, policy.PolicyError)
    fix = policy.dtype(_suggested_dtype(msg))
    with jax.enable_x64(fix.itemsize == 8):  # the fix the message names works
        assert hnp.add(heddle.astype(x, fix), scalar).dtype == fix


def test_scalar_in_range_at_the_edge_passes():
    assert hnp.add(np.ones(3, np.uint8), 254).dtype == np.uint8
    assert hnp.add(np.ones(3, ml_dtypes.float8_e4m3fn), 463.0).dtype == ml_dtypes.float8_e4m3fn


@pytest.mark.parametrize(
    ("a", "b"), [("float8_e4m3fn", "float8_e5m2"), ("float8_e3m4", "float8_e4m3")]
)
def test_promotion_error_through_ops(transform, a, b):
    x, y = np.ones(2, policy.dtype(a)), np.ones(2, policy.dtype(b))
    with pytest.raises(policy.PromotionError) as e:
        transform(hnp.multiply)(x, y)
    msg = str(e.value)
    assert a in msg and b in msg and isinstance(e.value, TypeError)
    fix = _suggested_dtype(msg)
    out = transform(hnp.multiply)(heddle.astype(x, fix), heddle.astype(y, fix))
    assert out.dtype == policy.dtype(fix)


def test_uint64_with_signed_is_an_error_with_x64():
    with jax.enable_x64(True):
        with pytest.raises(policy.PromotionError, match="uint64"):
            hnp.add(np.ones(2, np.uint64), np.ones(2, np.int8))


def test_float64_without_x64_is_a_precision_error():
    with jax.enable_x64(False):
        with pytest.raises(policy.PrecisionError) as e:
            hnp.add(np.ones(2, np.float32), np.ones(2, np.float64))
        assert "jax_enable_x64" in str(e.value) and "float32" in str(e.value)
        with pytest.raises(policy.PrecisionError):
            hnp.zeros(3, dtype="float64")
    with jax.enable_x64(True):  # the fix the message names
        assert hnp.add(np.ones(2, np.float32), np.ones(2, np.float64)).dtype == np.float64
