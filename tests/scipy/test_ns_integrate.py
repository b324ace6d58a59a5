"""heddle.scipy.integrate.trapezoid: a float-only sum, every partial sum in float32.

Reference: the trapezoid rule in NumPy float64 on the same narrow inputs; float32 partial sums of
``n`` terms are within ``n * 2**-24 * sum|terms|`` of it before the one rounding.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.integrate as hint

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_trapezoid_sums_in_float32(d, transform):
    y = (1 + np.sin(np.arange(50_000) / 100.0)).astype(d)
    x = np.linspace(0, 1, 50_000).astype(F32)
    got = transform(lambda y, x: (hint.trapezoid(y, dx=0.5), hint.trapezoid(y, x)))(y, x)
    y64 = y.astype(np.float64)
    dx = float(np.asarray(0.5, d))
    ref = dx * (y64[1:] + y64[:-1]).sum() / 2
    bound = 50_000 * 2.0**-24 * ref
    assert got[0].dtype == d
    assert abs(float(got[0]) - ref) <= float(ml_dtypes.finfo(d).eps) * ref / 2 + bound
    assert got[1].dtype == F32  # float32 x: the promotion
    ref_x = np.sum((x[1:] - x[:-1]).astype(np.float64) * (y64[1:] + y64[:-1]) / 2)
    assert abs(float(got[1]) - ref_x) <= 1e-5 * ref_x
    assert hint.trapezoid(np.arange(5, dtype=np.int8)).dtype == F32
