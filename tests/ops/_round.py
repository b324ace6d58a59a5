"""Reference rounding of exact float64 values to a <= 16-bit float format, from the format's own values.

Every bit pattern of the format is decoded (exact: each such value is a float64) and sorted; a float64
value is rounded to the nearest of them, ties to the even bit pattern, with overflow at max + half an
ulp. No XLA and no ml_dtypes conversion from float64 is involved, so there is no double rounding.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _table(dtype):
    dtype = np.dtype(dtype)
    bits = dtype.itemsize * 8
    patterns = np.arange(2**bits, dtype=np.uint16 if bits == 16 else np.uint8)
    with np.errstate(invalid="ignore"):
        values = patterns.view(dtype).astype(np.float64)
    finite = np.isfinite(values)
    order = np.argsort(values[finite], kind="stable")
    v, p = values[finite][order], patterns[finite][order].astype(np.int64)
    keep = np.concatenate(
        [[True], v[1:] != v[:-1]]
    )  # -0 and +0: keep the first (the negative zero)
    v, p = v[keep], p[keep]
    zero = np.flatnonzero(v == 0)
    if zero.size:
        p[zero] = 0  # +0 pattern for an exact zero
    inf = np.asarray(np.inf).astype(dtype)
    has_inf = bool(np.isinf(inf.astype(np.float64)))
    return v, p, has_inf


def round_once(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` (float64) rounded once, to nearest with ties to even, into ``dtype``."""
    dtype = np.dtype(dtype)
    v, p, has_inf = _table(dtype)
    with np.errstate(invalid="ignore"):
        x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return _round(x, dtype, v, p, has_inf)


def _round(x, dtype, v, p, has_inf):
    i = np.clip(np.searchsorted(v, x), 1, len(v) - 1)
    lo, hi = v[i - 1], v[i]
    dlo, dhi = x - lo, hi - x  # exact: neighbours of a <= 16-bit format differ by few bits
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (p[i] % 2 == 0))
    out = np.where(pick_hi, hi, lo)
    top = v[-1] + (v[-1] - v[-2]) / 2
    bottom = v[0] - (v[1] - v[0]) / 2
    big = np.inf if has_inf else np.nan
    out = np.where(x >= top, big, out)
    out = np.where(x <= bottom, -big if has_inf else np.nan, out)
    out = np.where(np.isnan(x), np.nan, out)
    out = np.where(
        np.isnan(out), out, np.copysign(out, x)
    )  # a result keeps the sign of x, zeros too
    return out.astype(dtype)  # exact: every value is representable (or inf/nan)


def same_bits(a, b) -> bool:
    """Bit-for-bit equality with every NaN counted equal."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    with np.errstate(invalid="ignore"):
        fa, fb = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(fa) & np.isnan(fb)
    ua = a.view(np.uint16 if a.itemsize == 2 else np.uint8)
    ub = b.view(np.uint16 if b.itemsize == 2 else np.uint8)
    return bool(((ua == ub) | both_nan).all())
