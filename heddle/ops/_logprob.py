"""Log-probabilities of ``jax.scipy.stats`` that are -inf where their value is finite, and heddle's.

JAX computes several log-probabilities as the log of a probability or of a square, which
underflows or overflows in float32 long before the log does. bfloat16 shares float32's exponent
range, so a bfloat16 input computed in float32 meets it:

- ``cauchy.logpdf`` and ``t.logpdf`` square ``z = (x - loc) / scale``: -inf for ``|z| >= 1.8e19``
  (the value is ``-log(pi scale) - 2 log|z|``, about -90);
- ``norm.logcdf`` / ``norm.logsf`` call JAX's ``log_ndtr``, which squares ``z`` too: heddle's
  ``log_ndtr`` (``heddle.ops._formulas``) instead;
- ``expon.logcdf`` is ``log1p(-exp(-z))``: -inf for ``z < 6e-8``, where ``log(-expm1(-z))`` is not;
- ``gumbel_r.logsf`` and ``gumbel_l.logcdf`` take the log of ``exp(-z)`` flushed to 0 past
  ``|z| = 87.3``: there the value is ``-z`` (``z``) to far below float32's resolution;
- ``gamma``'s and ``chi2``'s ``logsf`` and ``logcdf``, and ``beta.logcdf``, are the log of the
  regularised incomplete gamma or beta function, which underflows: there they are the log of its
  continued fraction (Q, for ``y > a + 1``) or series (P and I_x) plus the log of the prefactor,
  ``a log y - y - lgamma(a)`` (``a log y + b log(1 - y) - log B(a, b)``), which does not.

Each function returns JAX's own value wherever that is finite or the replacement is not (NaN for
invalid parameters, -inf where the probability is 0); each side is computed on a safe input where
the other is taken (``_tail``), so a derivative of the unused side never makes a gradient NaN. Inputs below
float32's smallest normal (bfloat16 subnormals) read as 0 in XLA's float32 arithmetic on CPU and
are not handled here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy import stats as _jst
from jax.typing import ArrayLike

from heddle.ops import _formulas
from heddle.ops._formulas import log_ndtr

_LOG_PI = math.log(math.pi)
_TERMS = 64  # continued-fraction and series terms: converged where they are used


def _as(plain: jax.Array, *args: ArrayLike) -> list[jax.Array]:
    return [jnp.asarray(a, plain.dtype) for a in args]


def _tail(
    jfn: Callable[..., jax.Array],
    wide: Callable[..., jax.Array],
    x: ArrayLike,
    shape: tuple[ArrayLike, ...],
    loc: ArrayLike,
    scale: ArrayLike,
    where: Callable[..., jax.Array] | None = None,
    safe: Callable[..., Any] = lambda *shape: 1.0,
) -> jax.Array:
    """JAX's ``jfn(x, *shape, loc, scale)``, except where it is infinite and heddle's
    ``wide(z, x, loc, scale, *shape)`` of the standardised ``z = (x - loc) / scale`` is finite (and
    ``where(z, scale, *shape)`` holds). Each side is computed on an input where the other is taken
    replaced by the standardised point ``safe(*shape)``, so that neither's derivative there (a log
    of 0, an overflow: a NaN times the zero cotangent ``where`` gives it is NaN) reaches the
    gradient."""
    plain = jfn(x, *shape, loc, scale)
    x, loc, scale, *shape = _as(plain, x, loc, scale, *shape)
    z = (x - loc) / scale
    fix = jnp.isinf(plain) & jnp.isfinite(wide(z, x, loc, scale, *shape))
    if where is not None:
        fix = fix & where(z, scale, *shape)
    fix = lax.stop_gradient(fix)
    s = jnp.asarray(safe(*shape), plain.dtype)
    xw = jnp.where(fix, x, loc + scale * s)  # the wide side's input: safe where JAX's is taken
    xp = jnp.where(fix, loc + scale * s, x)  # JAX's side's input: safe where the wide one is
    return jnp.where(
        fix, wide((xw - loc) / scale, xw, loc, scale, *shape), jfn(xp, *shape, loc, scale)
    )


def norm_logcdf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The normal distribution's log CDF, ``log_ndtr((x - loc) / scale)`` with heddle's
    ``log_ndtr`` (finite for every finite ``z``, no cancellation for ``z > 0``).

    Args:
      x: a float array.
      loc: the mean.
      scale: the standard deviation.

    Returns:
      ``norm.logcdf(x, loc, scale)``.
    """
    plain = _jst.norm.logcdf(x, loc, scale)
    x, loc, scale = _as(plain, x, loc, scale)
    return log_ndtr((x - loc) / scale)


def norm_logsf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The normal distribution's log survival function, ``log_ndtr((loc - x) / scale)``.

    Args:
      x: a float array.
      loc: the mean.
      scale: the standard deviation.

    Returns:
      ``norm.logsf(x, loc, scale)``.
    """
    plain = _jst.norm.logsf(x, loc, scale)
    x, loc, scale = _as(plain, x, loc, scale)
    return log_ndtr((loc - x) / scale)


def cauchy_logpdf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The Cauchy log density; where ``z**2`` overflows, ``-log(pi scale) - 2 log|z|``.

    Args:
      x: a float array.
      loc: the location.
      scale: the scale.

    Returns:
      ``cauchy.logpdf(x, loc, scale)``.
    """
    return _tail(
        _jst.cauchy.logpdf,
        lambda z, x, loc, scale: -(_LOG_PI + jnp.log(scale)) - 2 * jnp.log(jnp.abs(z)),
        x,
        (),
        loc,
        scale,
    )


def t_logpdf(x: ArrayLike, df: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """Student's t log density; where ``z**2 / df`` overflows, the density at ``loc`` less
    ``(df + 1)/2 (2 log|z| - log df)``.

    Args:
      x: a float array.
      df: the degrees of freedom.
      loc: the location.
      scale: the scale.

    Returns:
      ``t.logpdf(x, df, loc, scale)``.
    """

    def wide(z: jax.Array, x: jax.Array, loc: jax.Array, scale: jax.Array, df: jax.Array) -> Any:
        peak = _jst.t.logpdf(loc, df, loc, scale)
        return peak - (df + 1) / 2 * (2 * jnp.log(jnp.abs(z)) - jnp.log(df))

    return _tail(_jst.t.logpdf, wide, x, (df,), loc, scale)


def expon_logcdf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The exponential log CDF, ``log(-expm1(-z))`` where JAX's ``log1p(-exp(-z))`` is -inf.

    Args:
      x: a float array.
      loc: the location.
      scale: the scale.

    Returns:
      ``expon.logcdf(x, loc, scale)``.
    """
    return _tail(
        _jst.expon.logcdf,
        lambda z, *_: jnp.log(-jnp.expm1(-z)),
        x,
        (),
        loc,
        scale,
        where=lambda z, scale: z > 0,
    )


def gumbel_r_logsf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The right-skewed Gumbel log survival function; ``-z`` where ``exp(-z)`` underflows.

    Args:
      x: a float array.
      loc: the location.
      scale: the scale.

    Returns:
      ``gumbel_r.logsf(x, loc, scale)``.
    """
    return _tail(
        _jst.gumbel_r.logsf,
        lambda z, *_: -z,
        x,
        (),
        loc,
        scale,
        where=lambda z, scale: (z > 20) & (scale > 0),
    )


def gumbel_l_logcdf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The left-skewed Gumbel log CDF; ``z`` where ``exp(z)`` underflows.

    Args:
      x: a float array.
      loc: the location.
      scale: the scale.

    Returns:
      ``gumbel_l.logcdf(x, loc, scale)``.
    """
    return _tail(
        _jst.gumbel_l.logcdf,
        lambda z, *_: z,
        x,
        (),
        loc,
        scale,
        where=lambda z, scale: (z < -20) & (scale > 0),
    )


def _log_upper_gamma(a: jax.Array, y: jax.Array) -> jax.Array:
    """``log Q(a, y)``, the regularised upper incomplete gamma function, for ``y > a + 1``: the
    log of its continued fraction (modified Lentz) plus ``a log y - y - lgamma(a)``."""
    tiny = jnp.asarray(1e-30, y.dtype)
    b = y + 1 - a
    c = jnp.full_like(y, 1 / 1e-30)
    d = 1 / b
    h = d

    def step(i: Any, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        b, c, d, h = carry
        n = lax.convert_element_type(i, y.dtype)
        an = -n * (n - a)
        b = b + 2
        d = an * d + b
        d = jnp.where(jnp.abs(d) < tiny, tiny, d)
        c = b + an / c
        c = jnp.where(jnp.abs(c) < tiny, tiny, c)
        d = 1 / d
        return b, c, d, h * (d * c)

    _, _, _, h = lax.fori_loop(1, _TERMS, step, (b, c, d, h))
    log_q = a * jnp.log(y) - y - lax.lgamma(a) + jnp.log(h)
    # far out the fraction's terms fall below float32's normals; its first terms are then exact:
    # Q = y**(a-1) exp(-y) / Gamma(a) (1 + (a-1)/y + (a-1)(a-2)/y**2 + ...)
    far = (a - 1) * jnp.log(y) - y - lax.lgamma(a) + jnp.log1p((a - 1) / y * (1 + (a - 2) / y))
    return jnp.where((y > 1e6) & (y > 100 * jnp.abs(a)), far, log_q)


def _log_lower_gamma(a: jax.Array, y: jax.Array, log_y: jax.Array) -> jax.Array:
    """``log P(a, y)``, the regularised lower incomplete gamma function, for ``y < a + 1``: the
    log of its series plus ``a log y - y - lgamma(a + 1)`` (``log_y`` given: ``y`` itself may be
    below float32's normals, which XLA:CPU reads as 0)."""

    def step(n: Any, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        term, total = carry
        term = term * y / (a + lax.convert_element_type(n, y.dtype))
        return term, total + term

    _, total = lax.fori_loop(1, _TERMS, step, (jnp.ones_like(y), jnp.ones_like(y)))
    return a * log_y - y - lax.lgamma(a + 1) + jnp.log(total)


def gamma_logsf(x: ArrayLike, a: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The gamma distribution's log survival function, finite where it is.

    Args:
      x: a float array.
      a: the shape.
      loc: the location.
      scale: the scale.

    Returns:
      ``gamma.logsf(x, a, loc, scale)``.
    """
    return _tail(
        _jst.gamma.logsf,
        lambda y, x, loc, scale, a: _log_upper_gamma(a, y),
        x,
        (a,),
        loc,
        scale,
        where=lambda y, scale, a: (y > a + 1) & (a > 0) & (scale > 0),
        safe=lambda a: a + 2,
    )


def gamma_logcdf(x: ArrayLike, a: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The gamma distribution's log CDF, finite where it is.

    Args:
      x: a float array.
      a: the shape.
      loc: the location.
      scale: the scale.

    Returns:
      ``gamma.logcdf(x, a, loc, scale)``.
    """
    return _tail(
        _jst.gamma.logcdf,
        lambda y, x, loc, scale, a: _log_lower_gamma(a, y, jnp.log(x - loc) - jnp.log(scale)),
        x,
        (a,),
        loc,
        scale,
        where=lambda y, scale, a: (y > 0) & (y < a + 1) & (a > 0) & (scale > 0),
        safe=lambda a: (a + 1) / 2,
    )


def chi2_logsf(x: ArrayLike, df: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The chi-squared log survival function (a gamma of shape ``df/2``, scale ``2 scale``).

    Args:
      x: a float array.
      df: the degrees of freedom.
      loc: the location.
      scale: the scale.

    Returns:
      ``chi2.logsf(x, df, loc, scale)``.
    """
    return _tail(
        _jst.chi2.logsf,
        lambda z, x, loc, scale, df: _log_upper_gamma(df / 2, z / 2),
        x,
        (df,),
        loc,
        scale,
        where=lambda z, scale, df: (z > df + 2) & (df > 0) & (scale > 0),
        safe=lambda df: df + 4,
    )


def chi2_logcdf(x: ArrayLike, df: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The chi-squared log CDF (a gamma of shape ``df/2``, scale ``2 scale``).

    Args:
      x: a float array.
      df: the degrees of freedom.
      loc: the location.
      scale: the scale.

    Returns:
      ``chi2.logcdf(x, df, loc, scale)``.
    """

    def wide(z: jax.Array, x: jax.Array, loc: jax.Array, scale: jax.Array, df: jax.Array) -> Any:
        return _log_lower_gamma(df / 2, z / 2, jnp.log(x - loc) - jnp.log(2 * scale))

    return _tail(
        _jst.chi2.logcdf,
        wide,
        x,
        (df,),
        loc,
        scale,
        where=lambda z, scale, df: (z > 0) & (z < df + 2) & (df > 0) & (scale > 0),
        safe=lambda df: (df + 2) / 2,
    )


def beta_logcdf(
    x: ArrayLike, a: ArrayLike, b: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1
) -> jax.Array:
    """The beta distribution's log CDF, finite where it is: for ``y < (a + 1)/(a + b + 2)``,
    ``a log y + b log(1 - y) - log(a B(a, b))`` plus the log of the series
    ``sum_n (a + b)_n / (a + 1)_n y**n``.

    Args:
      x: a float array.
      a: the first shape.
      b: the second shape.
      loc: the location.
      scale: the scale.

    Returns:
      ``beta.logcdf(x, a, b, loc, scale)``.
    """

    def wide(y: jax.Array, x: jax.Array, loc: jax.Array, scale: jax.Array, a: Any, b: Any) -> Any:
        def step(n: Any, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            term, total = carry
            k = lax.convert_element_type(n, y.dtype)
            term = term * (a + b + k - 1) / (a + k) * y
            return term, total + term

        _, total = lax.fori_loop(1, _TERMS, step, (jnp.ones_like(y), jnp.ones_like(y)))
        log_beta = lax.lgamma(a) + lax.lgamma(b) - lax.lgamma(a + b)
        log_y = jnp.log(x - loc) - jnp.log(scale)  # y itself may be below float32's normals
        return a * log_y + b * jnp.log1p(-y) - jnp.log(a) - log_beta + jnp.log(total)

    def near(y: jax.Array, scale: jax.Array, a: Any, b: Any) -> Any:
        return (y > 0) & (y < (a + 1) / (a + b + 2)) & (a > 0) & (b > 0) & (scale > 0)

    return _tail(
        _jst.beta.logcdf, wide, x, (a, b), loc, scale, near, lambda a, b: (a + 1) / (a + b + 2) / 4
    )


_OWN: dict[str, dict[str, Callable[..., Any]]] = {
    "norm": {"logcdf": norm_logcdf, "logsf": norm_logsf},
    "cauchy": {"logpdf": cauchy_logpdf},
    "t": {"logpdf": t_logpdf},
    "expon": {"logcdf": expon_logcdf},
    "gumbel_r": {"logsf": gumbel_r_logsf},
    "gumbel_l": {"logcdf": gumbel_l_logcdf},
    "gamma": {"logsf": gamma_logsf, "logcdf": gamma_logcdf},
    "chi2": {"logsf": chi2_logsf, "logcdf": chi2_logcdf},
    "beta": {"logcdf": beta_logcdf},
}

STATS: dict[str, dict[str, Callable[..., Any]]] = {
    dist: {**_formulas.STATS.get(dist, {}), **_OWN.get(dist, {})}
    for dist in {*_formulas.STATS, *_OWN}
}
"""``heddle.scipy.stats.<dist>`` names, by distribution, computed by heddle's formulas instead of
``jax.scipy.stats``' own: these and ``heddle.ops._formulas.STATS`` (norm's ``logpdf``)."""
