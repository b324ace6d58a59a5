"""heddle.scipy.cluster.vq.vq: distances in float32, rounded once; codes int32.

Reference: the Euclidean distances in NumPy float64 on the same narrow data, rounded once (either
neighbour next to a midpoint).
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.cluster.vq as hvq

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_vq_codes_and_distances(d, transform):
    rng = np.random.default_rng(0)
    obs = rng.uniform(-2, 2, (40, 3)).astype(d)
    book = rng.uniform(-2, 2, (5, 3)).astype(d)
    codes, dist = transform(hvq.vq)(obs, book)
    assert codes.dtype == np.int32 and dist.dtype == d
    all64 = np.linalg.norm(obs.astype(np.float64)[:, None] - book.astype(np.float64), axis=-1)
    np.testing.assert_array_equal(codes, all64.argmin(axis=1))
    ref = all64.min(axis=1)
    want = ref.astype(d)
    u = _ulp(want.astype(np.float64), d)
    tie = np.abs(np.abs(ref - want.astype(np.float64)) - u / 2) <= 2.0**-18 * ref
    ok = (np.asarray(dist).view(np.uint16) == want.view(np.uint16)) | (
        tie & (np.abs(np.asarray(dist, np.float64) - ref) <= u)
    )
    assert ok.all()
