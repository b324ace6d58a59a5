"""heddle.scipy.fft: ``dct`` and friends transform narrow floats in float32 and round once.

Reference: the type-2 DCT as a float64 matrix product in NumPy on the same narrow inputs. Float32's
error is relative to the largest output (the transform runs through an FFT), so each output is
within one ulp of the narrow dtype plus that error of the float64 value.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.fft as hfft

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


def _dct2(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    k, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return 2 * x @ np.cos(np.pi * k * (2 * j + 1) / (2 * n)).T


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_dct_in_float32_rounded_once(d, transform):
    x = np.sin(np.arange(64) * 0.37).astype(d)
    want = _dct2(x.astype(np.float64))
    if transform is not jax.jit:  # eagerly each is compiled on its own: dct only
        err = np.abs(np.asarray(hfft.dct(x), np.float64) - want)
        assert (err <= _ulp(want, d) + 2.0**-20 * np.abs(want).max()).all()
        return
    got = transform(lambda v: (hfft.dct(v), hfft.idct(hfft.dct(v)), hfft.dctn(v.reshape(8, 8))))(x)
    assert all(g.dtype == d for g in got)
    err = np.abs(np.asarray(got[0], np.float64) - want)
    assert (err <= _ulp(want, d) + 2.0**-20 * np.abs(want).max()).all()
    # idct(dct(x)) is x up to the two roundings of dct's output and its own
    back = np.asarray(got[1], np.float64)
    assert np.abs(back - x.astype(np.float64)).max() <= 4 * float(ml_dtypes.finfo(d).eps)
    m = x.reshape(8, 8).astype(np.float64)
    want2 = _dct2(_dct2(m).T).T
    err = np.abs(np.asarray(got[2], np.float64) - want2)
    assert (err <= _ulp(want2, d) + 2.0**-20 * np.abs(want2).max()).all()
    assert jax.eval_shape(hfft.dct, np.arange(4, dtype=np.int8)).dtype == F32
