"""heddle.scipy.interpolate.RegularGridInterpolator: state in float32, each call rounded once.

Reference: the bilinear interpolation in NumPy float64 on the same narrow values, rounded once
(either neighbour next to a midpoint).
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

from heddle.scipy.interpolate import RegularGridInterpolator

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_bilinear_values_rounded_once(d):
    rng = np.random.default_rng(0)
    gx, gy = np.arange(5.0), np.arange(4.0) * 2
    values = rng.uniform(-2, 2, (5, 4)).astype(d)
    pts = np.stack([rng.uniform(0, 4, 50), rng.uniform(0, 6, 50)], axis=1).astype(F32)
    pts[-1] = (10.0, 0.0)  # outside the grid: the fill value, NaN
    f = RegularGridInterpolator((gx, gy), values)
    assert f.values.dtype == F32 and f.result_dtype == d
    out = f(pts)
    assert out.dtype == d and np.isnan(float(out[-1]))
    traced = jax.eval_shape(jax.jit(lambda f, p: f(p)), f, pts)  # a pytree, as an argument
    assert traced.dtype == d and traced.shape == out.shape
    got, pts = out[:-1], pts[:-1]
    p64 = pts.astype(np.float64)
    i, j = np.floor(p64[:, 0]).astype(int), np.floor(p64[:, 1] / 2).astype(int)
    a, b = p64[:, 0] - i, p64[:, 1] / 2 - j
    v = values.astype(np.float64)
    ref = v[i, j] * (1 - a) * (1 - b) + v[i + 1, j] * a * (1 - b) + v[i, j + 1] * (1 - a) * b
    ref += v[i + 1, j + 1] * a * b
    want = ref.astype(d)
    u = _ulp(want.astype(np.float64), d)
    tie = np.abs(np.abs(ref - want.astype(np.float64)) - u / 2) <= 2.0**-18 * 2
    ok = (np.asarray(got).view(np.uint16) == want.view(np.uint16)) | (
        tie & (np.abs(np.asarray(got, np.float64) - ref) <= u)
    )
    assert got.dtype == d and ok.all()
