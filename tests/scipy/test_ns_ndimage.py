"""heddle.scipy.ndimage.map_coordinates: interpolation in float32, one rounding.

Reference: the linear interpolation written out in NumPy float64 on the same narrow inputs, rounded
once (a weighted sum of four values: float32 is within a few of its ulps, so the result is the
float64 value rounded once except next to a midpoint, where either neighbour passes). Integer input
stays integer, rounded half away from zero, as JAX's.
"""

from __future__ import annotations

import jax
import jax.scipy.ndimage as jnd
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.ndimage as hnd

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


def _linear64(img: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
    fr, fc = rows - r0, cols - c0
    v = img.astype(np.float64)
    return (
        v[r0, c0] * (1 - fr) * (1 - fc)
        + v[r0 + 1, c0] * fr * (1 - fc)
        + v[r0, c0 + 1] * (1 - fr) * fc
        + v[r0 + 1, c0 + 1] * fr * fc
    )


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_linear_interpolation_rounds_float64_values_once(d, transform):
    rng = np.random.default_rng(0)
    img = rng.uniform(-3, 3, (6, 7)).astype(d)
    rows = rng.uniform(0, 4.99, 200).astype(F32)
    cols = rng.uniform(0, 5.99, 200).astype(F32)
    got = transform(lambda im, r, c: hnd.map_coordinates(im, [r, c], 1))(img, rows, cols)
    assert got.dtype == d
    ref = _linear64(img, rows.astype(np.float64), cols.astype(np.float64))
    want = ref.astype(d)
    g, w = np.asarray(got, np.float64), want.astype(np.float64)
    u = _ulp(w, d)
    tie = np.abs(np.abs(ref - w) - u / 2) <= 2.0**-18 * np.abs(img.astype(np.float64)).max()
    ok = (np.asarray(got).view(np.uint16) == want.view(np.uint16)) | (tie & (np.abs(g - ref) <= u))
    assert ok.all(), (g[~ok], ref[~ok])
    nearest = hnd.map_coordinates(img, [rows, cols], 0)  # a copy of the nearest values
    want0 = img[np.round(rows).astype(int), np.round(cols).astype(int)]
    np.testing.assert_array_equal(np.asarray(nearest).view(np.uint16), want0.view(np.uint16))


def test_integer_input_and_fill_value():
    img = np.arange(12, dtype=np.int8).reshape(3, 4)
    coords = [np.array([0.5, 1.5, 2.5]), np.array([0.5, 1.5, 9.0])]
    got = hnd.map_coordinates(img, coords, 1, cval=7.7)
    assert got.dtype == np.int8
    # 2.5 and 7.5 rounded half away from zero; the third point is outside: int(7.7)
    np.testing.assert_array_equal(got, [3, 8, 7])
    with jax.numpy_dtype_promotion("standard"):  # JAX's own mixes int8 with float32 weights
        np.testing.assert_array_equal(got, jnd.map_coordinates(img, coords, 1, cval=7))
    out = hnd.map_coordinates(img.astype(BF16), coords, 1, cval=0.1)
    assert out.dtype == BF16
    assert float(out[2]) == float(np.asarray(0.1, BF16))  # the fill value, rounded once
