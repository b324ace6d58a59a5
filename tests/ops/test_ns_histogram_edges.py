"""histogram_bin_edges / histogram: edge i is the exact rational lo + i (hi - lo) / bins rounded once
to the float dtype (fractions.Fraction reference), for any bins and range, eagerly and under jit."""

from __future__ import annotations

from fractions import Fraction

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def _finite_sorted(d: np.dtype) -> np.ndarray:
    x = np.arange(65536, dtype=np.uint16).view(d)
    return np.unique(x[np.isfinite(x.astype(np.float32))].astype(np.float64))


_TABLES = {d: _finite_sorted(d) for d in (BF16, F16)}


def _round_once(v: Fraction, d: np.dtype) -> float:
    """``v`` rounded to nearest, ties to even, to ``d`` (exact comparisons only)."""
    if d == F32:
        near = np.float32(float(v))
        cands = [
            near,
            np.nextafter(near, np.float32(-np.inf)),
            np.nextafter(near, np.float32(np.inf)),
        ]
    else:
        values = _TABLES[d]
        i = int(np.searchsorted(values, float(v)))
        cands = [np.asarray(values[j]).astype(d) for j in (i - 1, i, i + 1) if 0 <= j < len(values)]
    bits = np.dtype(f"u{d.itemsize}")
    best = min(
        cands, key=lambda c: (abs(Fraction(float(c)) - v), int(np.asarray(c, d).view(bits)) & 1)
    )
    return float(best)


def _reference(lo: float, hi: float, n: int, d: np.dtype) -> np.ndarray:
    flo, fhi = Fraction(float(np.asarray(lo, d))), Fraction(float(np.asarray(hi, d)))
    if flo == fhi:
        flo, fhi = flo - Fraction(1, 2), fhi + Fraction(1, 2)
    return np.array([_round_once(flo + i * (fhi - flo) / n, d) for i in range(n + 1)])


def _cases(seed: int, count: int):
    rng = np.random.default_rng(seed)
    out = [(0.0, 1.0, 10), (-1.0, 1.0, 7), (0.1, 0.7, 3), (-3.0, 5.0, 64), (2.0, 2.0, 5)]
    for _ in range(count):
        scale = 10.0 ** rng.integers(-3, 4)
        lo, hi = sorted(rng.uniform(-1, 1, 2) * scale)
        out.append((float(lo), float(hi), int(rng.integers(1, 200))))
    return out


@pytest.mark.parametrize("d", [BF16, F16, F32], ids=str)
def test_edges_are_the_exact_values_rounded_once(d, transform):
    bad = []
    for lo, hi, n in _cases(1, 10):
        sample = np.array([lo, hi], d)
        got = transform(lambda s, lo=lo, hi=hi, n=n: hnp.histogram_bin_edges(s, n, (lo, hi)))(
            sample
        )
        assert got.dtype == d
        want = _reference(lo, hi, n, d)
        wrong = np.asarray(got, np.float64) != want
        if wrong.any():
            bad.append((lo, hi, n, int(wrong.sum())))
    assert not bad, bad


@pytest.mark.parametrize("d", [BF16, F16, F32], ids=str)
def test_edges_from_the_sample_and_the_histogram(d):
    rng = np.random.default_rng(2)
    for lo, hi, n in _cases(3, 3):
        sample = rng.uniform(lo, hi, 50).astype(d)
        s64 = sample.astype(np.float64)
        want = _reference(s64.min(), s64.max(), n, d)
        edges = hnp.histogram_bin_edges(sample, n)
        np.testing.assert_array_equal(np.asarray(edges, np.float64), want)
        counts, e = hnp.histogram(sample, n)
        np.testing.assert_array_equal(np.asarray(e, np.float64), want)
        np.testing.assert_array_equal(np.asarray(counts, np.float64), np.histogram(s64, want)[0])


def test_float16_ten_bins_over_the_unit_interval(transform):
    """The reported case: JAX computes these in float16 and misses 3 of the 11 edges."""
    x = np.linspace(0, 1, 50).astype(F16)
    want = [_round_once(Fraction(i, 10), F16) for i in range(11)]
    got = transform(lambda v: hnp.histogram_bin_edges(v, 10, (0, 1)))(x)
    assert np.asarray(got, np.float64).tolist() == want
    got = transform(lambda v: hnp.histogram(v, 10, (0, 1))[1])(x)
    assert np.asarray(got, np.float64).tolist() == want
    got = transform(lambda v: hnp.histogramdd(v[:, None], 10, [(0, 1)])[1][0])(x)
    assert np.asarray(got, np.float64).tolist() == want


@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_traced_ends_round_once_from_float32(d):
    """Under jit without a range, the ends are traced: float32 arithmetic rounded once, within one
    ulp of the exact value."""
    bad = []
    for lo, hi, n in _cases(4, 6):
        sample = np.array([lo, (lo + hi) / 2, hi], d)
        got = jax.jit(lambda s, n=n: hnp.histogram_bin_edges(s, n))(sample)
        s64 = sample.astype(np.float64)
        want = _reference(s64.min(), s64.max(), n, d)
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        tiny = float(ml_dtypes.finfo(d).smallest_subnormal)
        spacing = np.maximum(np.abs(want) * (2.0**-7 if d == BF16 else 2.0**-10), tiny)
        if not (np.abs(got - want) <= spacing).all():
            bad.append((lo, hi, n))
    assert not bad, bad
