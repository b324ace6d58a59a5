"""Log-probabilities of heddle.scipy.stats are finite wherever their value is (heddle/ops/_logprob.py).

JAX computes them as the log of a probability or of a square, which underflows or overflows in
float32 (and so for bfloat16, which has float32's range): ``cauchy.logpdf(1.8e19)`` was -inf where
scipy gives -89.9, ``expon.logcdf`` of 12,929 bfloat16 inputs below 6e-8 was -inf, ``gamma.logsf``
past ``x = 92``, ... Every finite bfloat16 and float16 pattern (float32 subnormals left out: XLA:CPU
reads them as 0) goes through each function under ``jax.jit``; the reference is scipy in float64
(for the Gumbel tails, where scipy's own float64 underflows past ``|z| = 709``, ``-z``). Each
result is finite where the reference rounded to the dtype is, and where JAX's own float32 value
was infinite heddle's equals the reference rounded once.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import jax.scipy.stats as jst
import ml_dtypes
import numpy as np
import pytest
import scipy.special as sp
import scipy.stats as ss

import heddle.scipy.stats as hst

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
TINY = float(np.finfo(np.float32).tiny)


# float64 references where scipy's own float64 underflows (past exp(-745)): closed forms
def _gumbel_r_logsf(x):
    return np.where(x > 30, -x, ss.gumbel_r.logsf(x))


def _gumbel_l_logcdf(x):
    return np.where(x < -30, x, ss.gumbel_l.logcdf(x))


def _gamma2_logsf(x, a):  # Q(2, x) = (1 + x) exp(-x)
    assert a == 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x > 0, np.log1p(np.maximum(x, 0)) - x, ss.gamma.logsf(x, a))


def _chi2_3_logsf(x, df):  # Q(3/2, t) = exp(-t) (erfcx(sqrt t) + 2 sqrt(t / pi)), t = x/2
    assert df == 3.0
    t = np.maximum(x, 0) / 2
    far = np.log(sp.erfcx(np.sqrt(t)) + 2 * np.sqrt(t / np.pi)) - t
    return np.where(x > 100, far, ss.chi2.logsf(x, df))


# (distribution, function, shape arguments): bfloat16 / float16 inputs that were -inf before
CASES = {
    "norm.logcdf": ((), ss.norm.logcdf),  # 53 / 0
    "norm.logsf": ((), ss.norm.logsf),  # 53 / 0
    "cauchy.logpdf": ((), ss.cauchy.logpdf),  # 16,384 / 0
    "t.logpdf": ((3.0,), ss.t.logpdf),  # 16,384 / 0
    "expon.logcdf": ((), ss.expon.logcdf),  # 12,929 / 0
    "gumbel_r.logsf": ((), _gumbel_r_logsf),  # 396 / 9,866
    "gumbel_l.logcdf": ((), _gumbel_l_logcdf),  # 396 / 9,866
    "gamma.logsf": ((2.0,), _gamma2_logsf),
    "gamma.logcdf": ((2.0,), ss.gamma.logcdf),
    "chi2.logsf": ((3.0,), _chi2_3_logsf),
    "chi2.logcdf": ((3.0,), ss.chi2.logcdf),
    "beta.logcdf": ((2.0, 3.0), ss.beta.logcdf),
}


def _patterns(dtype):
    x = np.arange(2**16, dtype=np.uint16).view(dtype)
    with np.errstate(invalid="ignore"):
        f = x.astype(np.float64)
        return x[np.isfinite(f) & ((np.abs(f) >= TINY) | (f == 0))]


def _fn(root, name):
    dist, fn = name.split(".")
    return getattr(getattr(root, dist), fn)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_finite_wherever_the_value_is(name, dtype):
    args, reference = CASES[name]
    x = _patterns(dtype)
    got = np.asarray(jax.jit(lambda v: _fn(hst, name)(v, *args))(x)).astype(np.float64)
    theirs = jax.jit(lambda v: _fn(jst, name)(v.astype(jnp.float32), *args))(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want64 = reference(x.astype(np.float64), *args)
        want = want64.astype(dtype).astype(np.float64)
    finite = np.isfinite(want)
    assert not np.any(finite & ~np.isfinite(got)), x[finite & ~np.isfinite(got)][:5]
    fixed = finite & np.isinf(np.asarray(theirs, np.float64))
    assert np.all(_rounded_once(got[fixed], want64[fixed], dtype)), x[fixed][
        got[fixed] != want[fixed]
    ]
    # nothing else changes: JAX's own formula (within one ulp of its value compiled on its own,
    # which XLA fuses differently), except norm's log CDF and log SF, heddle's log_ndtr
    # (tests/ops/test_formulas_tails.py) everywhere
    if not name.startswith("norm."):
        same = np.isfinite(np.asarray(theirs, np.float64))
        rounded = np.asarray(theirs).astype(dtype).astype(np.float64)
        ulp = np.spacing(np.abs(rounded[same]).astype(dtype)).astype(np.float64)
        assert np.all(np.abs(got[same] - rounded[same]) <= ulp)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_gradient_is_finite_where_the_value_is(name):
    # each side of the replacement is computed on a safe input where the other is taken: before,
    # jax.grad of cauchy.logpdf at its mode was NaN (a log of 0 on the unused side), and of every
    # fixed tail (gumbel_r.logsf(100), gamma.logsf(200, 2), expon.logcdf(1e-9))
    args, reference = CASES[name]
    points = np.asarray([-3.0, -1e-9, 0.0, 1e-30, 1e-9, 0.3, 1.0, 3.0, 30.0, 100.0, 400.0, 1e20])
    f = _fn(hst, name)
    g = np.asarray(jax.jit(jax.vmap(jax.grad(lambda v: f(v, *args))))(points.astype(np.float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lo, hi = (reference(points * (1 - s) - s * 1e-12, *args) for s in (1e-6, -1e-6))
        value = reference(points, *args)
    inside = np.isfinite(value) & np.isfinite(lo) & np.isfinite(hi)
    jf = _fn(jst, name)
    theirs = np.asarray(jax.jit(jax.vmap(lambda v: jf(v, *args)))(points.astype(np.float32)))
    their_g = np.asarray(
        jax.jit(jax.vmap(jax.grad(lambda v: jf(v, *args))))(points.astype(np.float32))
    )
    # finite wherever JAX's own gradient is, and where JAX's value was infinite and is fixed
    want = inside & (np.isfinite(their_g) | np.isinf(theirs))
    assert np.all(np.isfinite(g[want])), points[want & ~np.isfinite(g)]


def _rounded_once(got, exact, dtype):
    """Whether each of ``got`` is ``exact`` rounded once to ``dtype``; either neighbour where
    ``exact`` lies within 1e-3 of an ulp of a rounding boundary (float32 cannot tell there)."""
    nearest = exact.astype(dtype).astype(np.float64)
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.abs(got).astype(dtype)).astype(np.float64)
    near_tie = np.abs(np.abs(got - exact) - ulp / 2) <= 1e-3 * ulp
    return (got == nearest) | near_tie


@pytest.mark.slow  # 30 functions on every pattern against scipy: 10 s; CASES run by default
def test_the_class_is_every_log_function_that_was_minus_inf():
    # every log-probability of a distribution, at one shape: the ones not in CASES are finite
    # wherever scipy's is on every bfloat16 pattern (float32 subnormals left out)
    shapes = {"t": (3.0,), "gamma": (2.0,), "chi2": (3.0,), "beta": (2.0, 3.0)}
    x = _patterns(BF16)
    missing = []
    for dist in "norm cauchy t expon gumbel_r gumbel_l gamma chi2 beta logistic laplace".split():
        for fn in ("logpdf", "logcdf", "logsf"):
            name = f"{dist}.{fn}"
            if not hasattr(getattr(jst, dist), fn) or not hasattr(getattr(ss, dist), fn):
                continue
            args = shapes.get(dist, ())
            got = np.asarray(jax.jit(lambda v, n=name, a=args: _fn(hst, n)(v, *a))(x))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = _fn(ss, name)(x.astype(np.float64), *args).astype(BF16).astype(np.float64)
            if np.any(np.isfinite(ref) & ~np.isfinite(got.astype(np.float64))):
                missing.append(name)
    assert missing == []


@pytest.mark.parametrize("name", ["cauchy.logpdf", "gamma.logsf", "beta.logcdf"])
def test_eagerly_and_in_float32(name):
    args, reference = CASES[name]
    x = np.asarray([1e-30, 1e-20, 200.0, 1e20, 3e30], np.float32)
    got = np.asarray(_fn(hst, name)(x, *args), np.float64)
    want = reference(x.astype(np.float64), *args)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=1e-38)
    assert np.array_equal(np.isfinite(got), finite)
