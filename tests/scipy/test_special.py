"""heddle.scipy.special and heddle.scipy.stats: float32 computation for narrow inputs, rounded once.

References: float64 with ``math`` (``math.erfc``, ``math.log``, ``math.exp``) rounded once by NumPy
(float64 -> float16 is one correct rounding), and the Bernoulli numbers as exact Fractions. The
names themselves are compared with ``dir(jax.scipy.special)`` in tests/ops/test_coverage.py and the
unary functions swept over every bfloat16 and float16 input in tests/ops/test_unary_rounding.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.scipy.special
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.scipy.special as hsp
from heddle.scipy.stats import logistic, norm

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
TRANSFORMS = [lambda f: f, jax.jit]
IDS = ["eager", "jit"]


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
def test_logsumexp_sums_in_float32(transform):
    # the MNIST example's loss: logsumexp of float16 logits; JAX's sum in float16 overflows to inf
    x = np.zeros(100_000, F16)
    got = transform(hsp.logsumexp)(x)
    assert got.dtype == F16
    assert float(got) == float(np.float16(math.log(100_000)))
    assert np.isinf(float(jax.scipy.special.logsumexp(x)))


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
def test_logsumexp_weights_axis_and_sign(transform):
    a = np.array([[0.0, 1.0], [2.0, 3.0]], F16)
    b = np.array([[1.0, -2.0], [0.5, 0.25]], F16)
    val, sign = transform(lambda a, b: hsp.logsumexp(a, axis=1, b=b, return_sign=True))(a, b)
    for i in range(2):
        s = sum(float(b[i, j]) * math.exp(float(a[i, j])) for j in range(2))
        assert float(val[i]) == float(np.float16(math.log(abs(s))))
        assert float(sign[i]) == math.copysign(1.0, s)


def _norm_cdf(x):
    return 0.5 * math.erfc(-x / math.sqrt(2))


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
def test_norm_and_logistic_round_float64_values_once(transform):
    x = np.linspace(-6, 6, 97).astype(F16)
    refs = {
        norm.cdf: _norm_cdf,
        norm.logpdf: lambda v: -v * v / 2 - 0.5 * math.log(2 * math.pi),
        norm.pdf: lambda v: math.exp(-v * v / 2) / math.sqrt(2 * math.pi),
        logistic.cdf: lambda v: 1 / (1 + math.exp(-v)),
        logistic.sf: lambda v: 1 / (1 + math.exp(v)),
    }
    for fn, ref in refs.items():
        got = np.asarray(transform(fn)(x))
        assert got.dtype == F16
        want = np.array([ref(float(v)) for v in x]).astype(F16)
        # float32 within a few ulps of float64: only a tie could round the other way
        assert np.mean(got == want) > 0.97, fn
        assert np.all(np.abs(got.astype(float) - want.astype(float)) <= np.spacing(want) * 1.01)


def test_norm_logpdf_with_loc_and_scale_promotes_like_an_op():
    x = np.array([1.0], BF16)
    assert norm.logpdf(x, 0.5, 2.0).dtype == BF16  # Python scalars take the array's dtype
    assert norm.logpdf(np.array([1], np.int32)).dtype == np.float32  # int: default float
    scale = np.array([2.0], np.float32)
    assert norm.logpdf(x, 0.0, scale).dtype == np.float32  # promotion of the operands
    v = float(norm.logpdf(x, 0.5, 2.0)[0])
    want = -((1.0 - 0.5) ** 2) / 8 - math.log(2.0) - 0.5 * math.log(2 * math.pi)
    assert v == float(np.float64(want).astype(BF16))


def test_bernoulli_numbers_are_the_exact_ones_rounded_once():
    # B_0..B_6 = 1, -1/2, 1/6, 0, -1/30, 0, 1/42
    exact = [Fraction(1), Fraction(-1, 2), Fraction(1, 6), 0, Fraction(-1, 30), 0, Fraction(1, 42)]
    got = hsp.bernoulli(6)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got), np.array([float(f) for f in exact], np.float32))
    assert float(jax.scipy.special.bernoulli(6)[4]) != float(np.float32(-1 / 30))  # JAX's drifts
    with jax.enable_x64(True):
        assert hsp.bernoulli(2).dtype == np.float32  # the policy's default float, not float64
    with heddle.policy.default_dtypes(float="bfloat16"):
        assert hsp.bernoulli(2).dtype == BF16
    with pytest.raises(ValueError, match=r"must be non-negative; bernoulli\(0\) gives"):
        hsp.bernoulli(-1)
    assert float(hsp.bernoulli(0)[0]) == 1.0  # the fix the message gives


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_float16_erf_is_float32_rounded_once_with_and_without_x64(x64):
    x = np.linspace(-3, 3, 61).astype(F16)
    with jax.enable_x64(x64):
        got = np.asarray(hsp.erf(x))
    assert got.dtype == F16
    want = np.array([math.erf(float(v)) for v in x]).astype(F16)
    assert np.mean(got == want) > 0.97
    assert np.all(np.abs(got.astype(float) - want.astype(float)) <= np.spacing(want) * 1.01)


def test_i1_is_finite_where_its_value_is():
    x = np.array([89.0, 90.0, 91.0], BF16)
    got = np.asarray(hsp.i1(x)).astype(np.float64)
    assert np.isfinite(got).all()  # JAX's exp(|x|) * i1e(x) overflows float32 here
    # i1(x) ~ e^x / sqrt(2 pi x) (1 - 3/(8x)) to far better than a bfloat16 ulp at x ~ 90
    want = [math.exp(v) / math.sqrt(2 * math.pi * v) * (1 - 3 / (8 * v) - 15 / (128 * v * v))
            for v in (89.0, 90.0, 91.0)]  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=2**-8)


def test_log_ndtr_for_positive_x_does_not_cancel():
    x = np.array([2.171875, 3.671875], BF16)
    got = np.asarray(hsp.log_ndtr(x)).astype(np.float64)
    want = [math.log1p(-0.5 * math.erfc(v / math.sqrt(2))) for v in (2.171875, 3.671875)]
    np.testing.assert_array_equal(got, np.array(want).astype(BF16).astype(np.float64))
