"""The float32 formulas of the gamma family and of logaddexp (heddle/ops/_formulas.py).

XLA's float32 lgamma, digamma and gamma lose relative accuracy where their value is small (near the
zeros of lgamma and digamma) or, for gamma, turn lgamma's absolute error into a relative one, so the
one rounding to a narrow float was wrong: before these formulas 53 float16 (2 bfloat16)
``gammaln`` results, 9 (1) ``digamma`` and 15 float16 ``gamma`` results lay outside the tie band
below, and 4 float16 ``logaddexp(x, x)`` near ``x = -0.69`` (``x + log 2`` with ``log 2``
rounded).

Every bfloat16 and float16 bit pattern (finite ones) is compared, under ``jax.jit`` (one
compilation per function for both formats) and eagerly in float16, with the float64 value rounded
once (``tests/ops/_round.py``; SciPy's float64 functions, which mpmath confirms at every input
where they differ from heddle). A result may differ only where the float64 value lies within
``TIE_ULPS`` float32 ulps of a midpoint between two neighbours of the narrow format, where float32
cannot decide the rounding: measured, 8 float16 ``gammaln`` results, 7 ``digamma``, 3 ``gamma``
and 2 ``logaddexp(x, x)`` (``x + log 2`` within 0.03 float32 ulps of a midpoint), none in
bfloat16. The poles follow JAX: ``digamma(+-0)`` and ``loggamma(x <= 0)`` are NaN (SciPy: -+inf
and inf). bfloat16 subnormal inputs and results (float32 subnormals, which XLA:CPU
flushes) are not compared.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.special as sp
from _round import round_once  # tests/ops is on sys.path

import heddle.lax as hlax
import heddle.numpy as hnp
import heddle.scipy.special as hss
from heddle.ops import _formulas as F

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
TINY = float(np.finfo(np.float32).tiny)
TIE_ULPS = 3  # measured: every remaining difference lies within 2.7 float32 ulps of a midpoint
TIE_BOUND = 8  # differences inside the tie band, per function and dtype (measured: at most 8)


def _loggamma(x):
    with np.errstate(invalid="ignore"):
        return np.where(x > 0, sp.gammaln(x), np.nan)


def _digamma(x):
    return np.where(x == 0, np.nan, sp.digamma(x))  # JAX: NaN at every pole, 0 included


REFERENCE = {
    "special.gammaln": sp.gammaln,
    "special.loggamma": _loggamma,
    "special.digamma": _digamma,
    "special.gamma": sp.gamma,
    "lax.lgamma": sp.gammaln,
    "lax.digamma": _digamma,
    "logaddexp(x, x)": lambda x: x + math.log(2),
}

FUNCTION = {
    "special.gammaln": hss.gammaln,
    "special.loggamma": hss.loggamma,
    "special.digamma": hss.digamma,
    "special.gamma": hss.gamma,
    "lax.lgamma": hlax.lgamma,
    "lax.digamma": hlax.digamma,
    "logaddexp(x, x)": lambda x: hnp.logaddexp(x, x),
}


def _patterns(dtype):
    return np.arange(2**16, dtype=np.uint16).view(dtype)


def _near_tie(ref, dtype):
    """Whether each float64 ``ref`` lies within TIE_ULPS float32 ulps of a midpoint of ``dtype``."""
    with np.errstate(invalid="ignore"):
        v = np.unique(_patterns(dtype).astype(np.float64))
    v = v[np.isfinite(v)]
    i = np.clip(np.searchsorted(v, ref), 1, len(v) - 1)
    mid = (v[i - 1] + v[i]) / 2
    ulp = np.spacing(np.abs(mid).astype(np.float32)).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(ref) & (np.abs(ref - mid) <= TIE_ULPS * ulp)


def _patterns_both():
    return _patterns(BF16), _patterns(F16)


@functools.cache
def _jitted(name):
    """``jax.jit`` of the function on every bfloat16 and every float16 pattern (one compilation)."""
    fn = FUNCTION[name]
    return jax.jit(lambda a, b: (fn(a), fn(b)))(*_patterns_both())


def check(name, dtype, got):
    """(inputs wrongly rounded outside the tie band as (x, got, want), count inside it)."""
    x = _patterns(dtype)
    with np.errstate(invalid="ignore"):
        x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = np.asarray(REFERENCE[name](x64), np.float64)
    want = round_once(ref, dtype)
    got = np.asarray(got)
    assert got.dtype == dtype, (name, got.dtype)
    with np.errstate(invalid="ignore"):
        gf, wf = got.astype(np.float64), want.astype(np.float64)
    wrong = np.isfinite(x64) & (got.view(np.uint16) != want.view(np.uint16))
    wrong &= ~(np.isnan(gf) & np.isnan(wf))
    if dtype == BF16:  # float32 subnormals: XLA:CPU flushes them
        wrong &= ~(((np.abs(x64) < TINY) & (x64 != 0)) | ((np.abs(ref) < TINY) & (ref != 0)))
    tie = _near_tie(ref, dtype)
    outside = [(x64[i], gf[i], wf[i]) for i in np.flatnonzero(wrong & ~tie)]
    return outside, int((wrong & tie).sum())


def _assert_rounded(name, dtype, got):
    outside, ties = check(name, dtype, got)
    assert not outside, f"{name}({dtype}): {len(outside)} wrong, (x, got, want) {outside[:6]}"
    assert ties <= TIE_BOUND, (name, dtype, ties)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(FUNCTION))
def test_correctly_rounded_on_every_pattern_under_jit(name, dtype):
    _assert_rounded(name, dtype, _jitted(name)[dtype == F16])


# eagerly (heddle's own kernel per dtype), in float16, where JAX's formulas failed most
@pytest.mark.parametrize(
    "name", ["special.gammaln", "special.digamma", "special.gamma", "logaddexp(x, x)"]
)
def test_correctly_rounded_on_every_pattern_eagerly(name):
    _assert_rounded(name, F16, FUNCTION[name](_patterns(F16)))


def _ulps(got, ref):
    """|got - ref| in float32 ulps of ``ref`` (float64), 0 where ``ref`` is not a normal float32."""
    got = np.asarray(got, np.float64)
    ok = np.isfinite(ref) & (np.abs(ref) >= TINY) & (np.abs(ref) < 3e38)
    with np.errstate(all="ignore"):
        ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
        u = np.abs(got - ref) / ulp
    return np.where(ok, u, 0.0)


# (function, float64 reference, ranges, largest float32 error in ulps); JAX's own, on the same
# samples: 6.4e6, 1.9e7, 44 (gammaln); 8.7e5, 9.3e6, 17 (digamma); 400, 43, 360 (gamma)
FLOAT32 = {
    "gammaln": (hss.gammaln, sp.gammaln, [(-15, -2), (-2, 3), (3, 1e6)], 8),
    "digamma": (hss.digamma, sp.digamma, [(-1023, -2), (-2, 3), (3, 1e6)], 8),
    "gamma": (hss.gamma, sp.gamma, [(-34, -2), (-2, 3), (3, 35)], 12),
}


@pytest.mark.parametrize("name", list(FLOAT32))
def test_float32_error_is_a_few_ulps(name):
    fn, ref_fn, ranges, bound = FLOAT32[name]
    parts = [np.linspace(lo, hi, 200_000).astype(np.float32) for lo, hi in ranges]
    # and the 41 floats around digamma's zero 1.4616: XLA folds (x - hi) - lo into x - (hi + lo)
    # unless lo is opaque, which loses lo (1.2e-8), thousands of ulps of values near 1e-7
    x0 = np.float32(F._DG_X0)
    x = np.concatenate([*parts, x0 + np.arange(-20, 21, dtype=np.float32) * np.spacing(x0)])
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64))
    u = _ulps(jax.jit(fn)(x), ref)
    assert u.max() <= bound, (name, float(u.max()), float(x[np.argmax(u)]))
    if name == "gammaln":
        assert float(fn(np.float32(1))) == float(fn(np.float32(2))) == 0.0  # JAX's: 4.8e-07


def test_the_tables_are_the_series_and_the_zeros():
    # Taylor rows of lgamma: a_0 = lgamma(c), a_k = polygamma(k-1, c) / k!
    for i, c in enumerate(F._LG_CENTRES):
        want = [math.lgamma(c)] + [
            sp.polygamma(k - 1, c) / math.factorial(k) for k in range(1, F._LG_DEGREE + 1)
        ]
        np.testing.assert_allclose(F._LG_ROWS[i], want, rtol=1e-12, atol=1e-300)
    # 1/gamma(1 + t) and sin(pi t)
    t = np.linspace(-0.5, 0.5, 101)
    rg = sum(c * t**k for k, c in enumerate(F._RGAMMA.astype(np.float64)))
    np.testing.assert_allclose(rg, 1 / sp.gamma(1 + t), rtol=2e-8)
    sinpi = t * sum(c * (t * t) ** k for k, c in enumerate(F._SIN_PI))
    np.testing.assert_allclose(sinpi, np.sin(np.pi * t), rtol=1e-10, atol=1e-300)
    # the zeros of lgamma: -p + e, within float64's resolution of SciPy's zero
    e = F._LGZ_E_HI.astype(np.float64) + F._LGZ_E_LO
    z = e - F._LGZ_P
    slope = np.abs(sp.digamma(z))
    assert (np.abs(sp.gammaln(z)) <= 1e-14 * (1 + slope)).all()
    # the lgamma(y0 - t) - lgamma(y0) coefficients: -digamma(y0), polygamma(k-1, y0) (-1)^k / k!
    y0 = 1 - z
    for k in range(1, F._LG_D_DEGREE + 1):
        want = (-1) ** k * sp.polygamma(k - 1, y0) / math.factorial(k)
        np.testing.assert_allclose(F._LGZ_D[:, k - 1], want, rtol=2e-7)
    # the zeros of digamma, one per (-n-1, -n), and x0
    zeros = F._DG_ZEROS
    n = np.arange(len(zeros))
    assert ((zeros > -n - 1) & (zeros < -n)).all()
    slope = sp.polygamma(1, zeros)  # the zero to float64's resolution: |z| ulp times the slope
    assert (np.abs(sp.digamma(zeros)) <= 2 * slope * np.spacing(np.abs(zeros)) + 1e-15).all()
    assert abs(sp.digamma(F._DG_X0)) <= 1e-15


PAIRS = {
    "special.gammaln": jax.scipy.special.gammaln,
    "special.loggamma": jax.scipy.special.loggamma,
    "special.digamma": jax.scipy.special.digamma,
    "special.gamma": jax.scipy.special.gamma,
    "lax.lgamma": jax.lax.lgamma,
    "lax.digamma": jax.lax.digamma,
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_poles_and_infinities_are_jax_own(name):
    # the patterns of the sweep above that are poles, infinities or NaN (and 0.5 for reference)
    special = np.array([0.0, -0.0, -1.0, -2.0, -30.0, -1024.0, np.inf, -np.inf, np.nan, 0.5])
    for i, dtype in enumerate((BF16, F16)):
        pats = _patterns(dtype)
        with np.errstate(invalid="ignore"):
            where = np.flatnonzero(
                np.isin(pats.astype(np.float64), special) | np.isnan(pats.astype(np.float32))
            )
        x = pats[where].astype(np.float32)
        got = np.asarray(_jitted(name)[i])[where].astype(np.float32)
        want = np.asarray(PAIRS[name](x)).astype(dtype).astype(np.float32)
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all(), name
    assert float(hss.gamma(np.float16(-0.0))) == -np.inf
    inf = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    got = np.asarray(hnp.logaddexp(inf, inf[::-1]))
    np.testing.assert_array_equal(got, np.asarray(jnp.logaddexp(inf, inf[::-1])))


def test_lax_lgamma_and_digamma_are_policy_ops():
    # narrow floats compute in float32 with the formulas; integers give the default float
    assert hlax.lgamma(np.array(3, np.int32)).dtype == np.float32
    assert float(hlax.lgamma(np.array(3, np.int32))) == pytest.approx(math.log(2), rel=1e-7)
    assert hlax.digamma(np.array([1.5], BF16)).dtype == BF16
    assert hlax.lgamma.__name__ == "lgamma" and hlax.digamma.__name__ == "digamma"


def test_derivatives():
    x = np.array([0.3, 1.0, 1.4616, 2.0, 5.5, 12.0, -0.5, -2.457, -3.3, -7.2], np.float32)
    x64 = x.astype(np.float64)
    pairs = {
        hss.gammaln: sp.digamma(x64),
        hss.digamma: sp.polygamma(1, x64),
        hss.gamma: sp.gamma(x64) * sp.digamma(x64),
    }

    def grads(v):
        one = [jax.vmap(jax.grad(fn))(v) for fn in pairs]
        return one, jax.vmap(jax.grad(jax.grad(hss.gammaln)))(v)

    one, two = jax.jit(grads)(x)
    for (fn, want), g in zip(pairs.items(), one, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), want, rtol=2e-6, err_msg=fn.__name__)
    np.testing.assert_allclose(np.asarray(two, np.float64), sp.polygamma(1, x64), rtol=2e-6)
    a = np.array([0.1, -3.0, 2.0, -0.69], np.float32)
    b = np.array([0.1, -2.5, 40.0, -0.69], np.float32)
    ours = jax.vmap(jax.grad(hnp.logaddexp, argnums=(0, 1)))(a, b)
    theirs = jax.vmap(jax.grad(jnp.logaddexp, argnums=(0, 1)))(a, b)
    for o, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(t), rtol=1e-6)


def test_logaddexp_near_equal_arguments_in_float32():
    # near x = -log 2 the result cancels: JAX's rounded log 2 (1.9e-9 off) is 16 ulps of 1e-3 there
    x = np.linspace(-0.7, -0.686, 20_001).astype(np.float32)
    ref = x.astype(np.float64) + math.log(2)
    assert _ulps(jax.jit(hnp.logaddexp)(x, x), ref).max() <= 0.5
    assert _ulps(jnp.logaddexp(x, x), ref).max() > 10
    # |x1 - x2| = d < 1: the absolute error is that of log1p(expm1(-d)/2), small with d
    for d, bound in ((2.0**-12, 1e-10), (2.0**-6, 1e-9), (0.1, 5e-9), (0.99, 3e-8)):
        y = (x - np.float32(d)).astype(np.float32)
        ref = np.logaddexp(x.astype(np.float64), y.astype(np.float64))
        err = np.abs(np.asarray(jax.jit(hnp.logaddexp)(x, y), np.float64) - ref).max()
        assert err <= bound, (d, err)  # JAX's: 6e-9, 6e-8, 1.4e-8, 1.5e-8


def test_float64_is_jax_own_and_narrow_stays_the_formula():
    with jax.enable_x64(True):
        x = np.array([-3.3, -2.457, 0.25, 1.0, 1.5, 7.25, 30.0])
        for ours, theirs in (
            (hss.gammaln, jax.scipy.special.gammaln),
            (hss.digamma, jax.scipy.special.digamma),
            (hss.gamma, jax.scipy.special.gamma),
        ):
            got = np.asarray(ours(x))
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got, np.asarray(jax.jit(theirs)(x)))
        h = np.array([1.0, 2.0, -2.457], F16)  # float16 still computes in float32
        want = np.asarray(hss.gammaln(h.astype(np.float32))).astype(F16)
        np.testing.assert_array_equal(np.asarray(hss.gammaln(h)), want)


@pytest.fixture
def standard_promotion():
    with jax.numpy_dtype_promotion("standard"):  # JAX's complex loggamma adds an int32
        yield


@pytest.mark.usefixtures("standard_promotion")
def test_complex_input_is_jax_own():
    z = np.array([2 + 3j, -1.5 + 0.5j, 0.5 - 2j], np.complex64)
    for ours, theirs in (
        (hss.loggamma, jax.scipy.special.loggamma),
        (hss.gamma, jax.scipy.special.gamma),
        (hnp.logaddexp, lambda v: jnp.logaddexp(v, v[::-1])),
    ):
        got = ours(z, z[::-1]) if ours is hnp.logaddexp else ours(z)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(theirs)(z)))
