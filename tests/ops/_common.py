"""Shared reference helpers of the heddle.lax and heddle.numpy.linalg/fft tests.

``round_once`` rounds an exact float64 reference to a <= 16-bit float format from the format's own
values (every bit pattern decoded, sorted), so no XLA or ml_dtypes conversion from float64, and no
double rounding, is involved.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16, F16, F32 = ml_dtypes.bfloat16, np.float16, np.float32
U32 = 2.0**-24  # unit roundoff of float32


def finite_values(dtype) -> np.ndarray:
    """Every finite value of a float format of 16 bits or fewer, sorted, as exact float64."""
    nbits = 8 * np.dtype(dtype).itemsize
    raw = np.arange(2**nbits, dtype=np.uint16 if nbits == 16 else np.uint8).view(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        v = raw.astype(np.float64)
    return np.unique(v[np.isfinite(v)]) + 0.0  # one zero, +0


def round_once(ref, dtype) -> np.ndarray:
    """``ref`` (exact float64) rounded once to ``dtype``, ties to even; inf past max + half an ulp."""
    vals = finite_values(dtype)
    ref = np.asarray(ref, np.float64)
    i = np.clip(np.searchsorted(vals, ref), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    mid = lo + (hi - lo) / 2
    hi_even = (i - np.searchsorted(vals, 0.0)) % 2 == 0
    out = np.where(ref < mid, lo, np.where(ref > mid, hi, np.where(hi_even, hi, lo)))
    out = np.where(ref == hi, hi, out)
    big = vals[-1] + (vals[-1] - vals[-2]) / 2  # past it: inf (float16, bfloat16)
    return np.where(ref >= big, np.inf, np.where(ref <= -big, -np.inf, out)).astype(dtype)
