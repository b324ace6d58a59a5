"""Elementwise formulas that are accurate in float32 where JAX's own lose accuracy before the rounding.

heddle computes a narrow float op in float32 and rounds once (POLICY.md 5); that one rounding is
correct only when the float32 value is within float32's own error of the true value. These JAX
implementations are not, and are replaced, name by name, by the formulas here (``NUMPY`` for
``heddle.numpy``, ``NN`` for ``heddle.nn``, ``SPECIAL`` and ``STATS`` for ``heddle.scipy``, ``LAX``
for ``heddle.lax``); each keeps JAX's signature and runs inside the same ``make_op``/``float_op``
mechanism as every other op:

- ``sinc``: JAX computes ``sin(pi * x)`` with ``pi * x`` rounded, so ``sinc`` of a nonzero integer is
  not 0 (``sinc(1) = -2.78e-08`` in float32) and ``pi * x`` overflows to NaN for ``|x| >= 1.1e38``;
  here ``x = n + r`` exactly (``n = round(x)``, ``|r| <= 1/2``) and ``sin(pi x) = (-1)^n sin(pi r)``.
- ``i0``: JAX's ``exp(|x|) * i0e(x)`` overflows for ``88.7 < |x| < 91.9``, where ``i0`` is finite in
  float32; here ``exp(|x|/2) * (i0e(x) * exp(|x|/2))`` there.
- ``scipy.special.i1``: the same overflow, the same cure (``i1e``).
- ``scipy.special.log_ndtr``: ``log(ndtr(x))`` rounds ``ndtr(x)`` near 1 for ``x > 0`` (72 bfloat16
  inputs wrong); here ``log1p(-ndtr(-x))`` there.
- ``scipy.special.erfcx``: JAX's gives 0 for ``9.2 <= x < 9.4``; here its asymptotic series for
  ``x >= 9``.
- ``sinh``, ``cosh``: XLA's ``exp(|x| + log(1/2))`` rounds ``|x| + log(1/2)`` (8 float32 ulps of
  error near ``|x| = 11``); here ``exp(|x|)/2 -+ exp(-|x|)/2`` for ``|x| >= 1``, split in two
  factors past float32's exp overflow.
- ``squareplus``: ``(x + sqrt(x^2 + b)) / 2`` cancels for ``x < 0`` (float16 ``squareplus(-9136)``
  is 0, not 1.09e-4) and ``x^2`` overflows for ``|x| > 1.8e19``; here ``b / (2 (s - x))`` for
  ``x < 0`` with ``s = sqrt(x*x + b)`` (``x*x`` is exact for a <= 16-bit input), ``hypot`` past
  ``2**60`` (where ``(x + s) / 2`` would overflow and equals ``s``).
- ``gelu(approximate=True)``: ``1 + tanh(y)`` cancels for ``x < 0`` (5% low in float16 at
  ``x = -4.64``); here the identity ``(1 + tanh(y)) / 2 = sigmoid(2 y)``.
- ``scipy.special.log_ndtr`` for ``x < -2**60`` and ``scipy.stats.norm.logpdf`` where JAX's
  overflows: ``x**2`` overflows float32 for ``|x| >= 1.8e19`` (-inf for bfloat16 inputs whose
  value is finite); here ``-(x/2) x``, which overflows only where the value does.
- ``scipy.special.gammaln``/``loggamma`` and ``heddle.lax.lgamma``: XLA's float32 lgamma loses
  its relative accuracy where the value is small (``lgamma(1) = 4.8e-07``, up to 2e7 ulps near its
  zeros on ``x < 0``, 10 to 70 ulps elsewhere on [-3.5, 3.5]: 62 float16 and 3 bfloat16 results
  not correctly rounded, by up to 12 float16 ulps); here Taylor polynomials about 1, 1.5, 2 and 3
  (exactly 0 at 1 and 2), exact shifts ``x -+ k`` with one ``log`` of their product, Stirling's
  series past 8, and on ``(-n-1, -n)``, ``2 <= n <= 13``, the reflection formula taken relative to
  the zero of lgamma there (double-float offsets from the poles), which keeps relative accuracy
  through the zero.
- ``scipy.special.digamma`` and ``heddle.lax.digamma``: XLA's loses relative accuracy near every
  zero (up to 2e6 ulps at 1.4616; 16 float16 results not correctly rounded, by up to 2.5
  ulps); here, for ``0 < x < 10``, ``digamma(x) - digamma(x0)`` at its zero ``x0`` through ten
  recurrence steps and the asymptotic series, each term a multiple of ``x - x0`` (for
  ``|x| < 1/4`` at ``1 + x``, less ``1/x``); for ``-1024 < x < 0`` the reflection formula relative
  to the zero of digamma on ``x``'s unit interval (1024 zeros, found by bisection in float64 at
  import); the asymptotic series past 10.
- ``scipy.special.gamma``: JAX's ``sign * exp(lgamma(x))`` turns lgamma's absolute error into a
  relative one (50 to 350 float32 ulps past ``|x| = 8``; 28 float16 results not correctly
  rounded); here ``gamma(1 + r)`` from the series of ``1/gamma`` times (or over) the exact factors
  ``x - 1, x - 2, ...`` (or ``x, x + 1, ...``) for ``-34.5 <= x < 35.5``.
- ``logaddexp``: ``max + log1p(exp(-|d|))`` rounds ``log 2`` at ``d = 0``, so float16
  ``logaddexp(x, x)`` near ``x = -0.69`` (where ``x + log 2`` cancels) was wrongly rounded; here
  ``max + log 2 + log1p(expm1(-|d|)/2)`` with ``log 2`` in two float32 parts for ``|d| < 1``.

The gamma-family formulas are a few float32 ulps from the true value over dense float32 samples
(tests/ops/test_formulas_gamma.py), their coefficients computed here once from their series in
float64; their derivatives are ``digamma``, ``polygamma(1, .)`` (JAX's) and ``gamma digamma``, and
``logaddexp``'s is JAX's own. A double-float constant ``hi + lo`` is read through an
``optimization_barrier``: XLA's simplifier otherwise folds ``(x - hi) - lo`` into ``x - (hi + lo)``.

XLA:CPU flushes float32 subnormals to zero, so a float32 intermediate below ``2**-126`` is 0 even
where the result rounds to a normal bfloat16 (bfloat16 has float32's exponent range). In float32
these formulas keep every intermediate normal:

- ``arcsin``/``asin``, ``deg2rad``/``radians``, ``scipy.special.erfinv``, ``silu``/``swish``,
  ``mish``, ``gelu``: near 0 each is ``c x`` to far below float32's resolution, so for
  ``|x| < 2**-100`` they are JAX's own function of ``x 2**64``, scaled back by ``2**-64`` (JAX's
  arcsin halves its argument, silu's and gelu's ``x/2`` and erfinv's ``0.886 x`` are subnormal for
  the smallest normal ``x``);
- ``silu``/``swish`` and ``mish`` for ``x < -87``: ``x exp(x)`` (their value to ``exp(x)`` relative
  error) as ``x (exp(x/2) 2**32)**2`` scaled back by ``2**-64`` (JAX's ``sigmoid(x)`` and
  ``tanh(softplus(x))`` are subnormal there);
- ``gelu(approximate=False)`` for ``x < -13``: ``x/2 erfcx(z) exp(-x**2/2)`` with ``z = -x/sqrt 2``,
  ``x**2`` split exactly in two and the exponential scaled as above (JAX's ``erfc(z)`` is
  subnormal there);
- ``exp2``: ``2**f 2**n`` with ``n = round(x)``, ``f = x - n`` exact and ``2**n`` built from its
  bits (JAX's ``exp(x ln 2)`` is subnormal at ``exp2(-126)``, and rounds ``x ln 2``: 68 float32
  ulps of error near ``|x| = 126``).

A result scaled back into float32's subnormal range is 0 there, except that one which rounds to
``+-2**-126`` in bfloat16 is given as ``+-2**-126`` (float32's nearest value that is not flushed).
In float64 (``jax_enable_x64``) these subnormal tails are JAX's own.

Complex input: every formula here is for real arguments; a complex one is JAX's own function's
(``sinh(2+3j)``, ``sinc(1j)``, ...), so heddle gives what jax.numpy gives in complex64/complex128.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy import special as _special
from jax.scipy.stats import norm as _norm
from jax.typing import ArrayLike

_EXP_SAFE = 80.0  # below float32's exp overflow (88.72) with room for the factor 1/2


def _complex_by(jfn: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Makes a real formula defer to JAX's own ``jfn`` when its first argument is complex.

    The formula's signature is kept (``inspect.signature`` follows ``__wrapped__``) and the
    arguments are passed on unchanged, so errors are JAX's own too.
    """

    def wrap(formula: Callable[..., Any]) -> Callable[..., Any]:
        first = next(iter(inspect.signature(formula).parameters))

        @functools.wraps(formula)
        def op(*args: Any, **kwargs: Any) -> Any:
            x = args[0] if args else kwargs.get(first)
            if jnp.iscomplexobj(x):
                return jfn(*args, **kwargs)
            return formula(*args, **kwargs)

        return op

    return wrap


# --- float32 subnormals ------------------------------------------------------------------------------

_TINY = float(np.finfo(np.float32).tiny)  # 2**-126
_ROUNDS_TO_TINY = _TINY * (1 - 2.0**-8)  # the bfloat16 midpoint below 2**-126 (ties to 2**-126)
_SMALL = 2.0**-100  # |x| below this: f(x) = f'(0) x to far below float32's resolution
_SHIFT = 64  # the exponent shift that keeps such values normal


def _is_f32(x: jax.Array) -> bool:
    return x.dtype == np.float32


def _unflush(out: jax.Array, scaled: jax.Array, k: int) -> jax.Array:
    """``out`` (float32), which equals ``scaled * 2**-k`` unless flushed to 0, where it rounds to
    ``+-2**-126`` in bfloat16: ``+-2**-126`` instead of the flushed 0."""
    up = (out == 0) & (jnp.abs(scaled) >= _ROUNDS_TO_TINY * 2.0**k)
    return jnp.where(up, jnp.where(scaled > 0, _TINY, -_TINY), out)


def _unscale(scaled: jax.Array, k: int) -> jax.Array:
    """``scaled * 2**-k`` in float32, exact where normal (see ``_unflush``)."""
    return _unflush(scaled * 2.0**-k, scaled, k)


def _near_zero(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """``fn(x)`` for an ``fn`` with ``fn(x) = c x`` near 0; in float32, ``fn(x 2**64) 2**-64`` for
    ``|x| < 2**-100``, whose value is JAX's own wherever that is normal and which is not flushed
    where JAX's own is subnormal but the value rounds to a normal bfloat16."""
    if not _is_f32(x):
        return fn(x)
    small = jnp.abs(x) < _SMALL
    y = fn(jnp.where(small, x * 2.0**_SHIFT, x))  # one evaluation, at a normal argument
    return jnp.where(small, _unscale(y, _SHIFT), y)


def _x_exp_x(x: jax.Array) -> jax.Array:
    """``x exp(x)`` for float32 ``x < -87`` (elsewhere the value at -87 or -170), not flushed where it
    rounds to a normal bfloat16: ``x (exp(x/2) 2**32)**2 2**-64``, every factor normal."""
    t = jnp.clip(x, -170.0, -87.0)  # exp(t/2) >= 1.2e-37 is normal; x exp(x) < 2**-240 below -170
    h = jnp.exp(t / 2) * 2.0**32
    return _unscale((t * h) * h, _SHIFT)


_LOWER_TAIL = -87.0  # sigmoid(x), tanh(softplus(x)) ~ exp(x) are normal float32 for x >= -87.3


@_complex_by(jnp.sinc)
def sinc(x: ArrayLike, /) -> jax.Array:
    """``sin(pi x) / (pi x)``, exactly 0 at nonzero integers and at +-inf, 1 at 0.

    Args:
      x: a float array.

    Returns:
      ``sinc(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    small = jnp.abs(x) <= 0.5
    near = jnp.sinc(jnp.where(small, x, 0))  # JAX's own near 0, with its derivatives at 0
    far = jnp.where(small | ~jnp.isfinite(x), 2, x)
    n = jnp.round(far)
    r = far - n  # exact: |r| <= 1/2
    sign = 1 - 2 * jnp.abs(jnp.fmod(n, 2))  # (-1)^n, exact for every float n
    big = sign * jnp.sin(jnp.pi * r) / (jnp.pi * far)
    edge = jnp.where(jnp.isinf(x), 0, x)  # 0 at +-inf, NaN at NaN
    return jnp.where(small, near, jnp.where(jnp.isfinite(x), big, edge)).astype(x.dtype)


def _bessel(x: ArrayLike, plain: Callable[..., jax.Array], scaled: Callable[..., jax.Array]):
    """A modified Bessel function, from ``plain`` where ``exp(|x|)`` is finite and from the
    exponentially scaled ``scaled`` times ``exp(|x|/2)`` twice past that (finite wherever the value is)."""
    x = jnp.asarray(x)
    a = jnp.abs(x)
    half = jnp.exp(a / 2)
    split = half * (scaled(x) * half)
    return jnp.where(a < _EXP_SAFE, plain(jnp.where(a < _EXP_SAFE, x, 0)), split)


def _i0(x: ArrayLike) -> jax.Array:
    """The modified Bessel function of order 0, finite wherever its value is.

    Args:
      x: a float array.

    Returns:
      ``i0(x)`` in ``x``'s dtype.
    """
    return _bessel(x, jnp.i0, _special.i0e)


i0 = _complex_by(jnp.i0)(_i0)
special_i0 = _complex_by(_special.i0)(_i0)


@_complex_by(_special.i1)
def i1(x: ArrayLike) -> jax.Array:
    """The modified Bessel function of order 1, finite wherever its value is (as ``i0``).

    Args:
      x: a float array.

    Returns:
      ``i1(x)`` in ``x``'s dtype.
    """
    return _bessel(x, _special.i1, _special.i1e)


_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_HUGE = 2.0**60  # past this x**2/2 + log|x| + ... is x**2/2 in float32 (and float64)


@_complex_by(_special.log_ndtr)
def log_ndtr(x: ArrayLike, series_order: int = 3) -> jax.Array:
    """``log(ndtr(x))``; for ``x > 0`` as ``log1p(-ndtr(-x))``, which does not cancel, and for
    ``x < -2**60`` as ``-(x/2) x``, which overflows only where the value does (JAX squares ``x``).

    Args:
      x: a float array.
      series_order: the asymptotic series' order for very negative ``x`` (as JAX).

    Returns:
      ``log_ndtr(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    pos = x > 0
    huge = x < -_HUGE
    upper = jnp.log1p(-_special.ndtr(-jnp.where(pos, x, 0)))
    lower = _special.log_ndtr(jnp.where(pos | huge, 0, x), series_order=series_order)
    xh = jnp.where(huge, x, -_HUGE)
    far = -((0.5 * xh) * xh) - (jnp.log(-xh) + _LOG_SQRT_2PI)
    return jnp.where(pos, upper, jnp.where(huge, far, lower))


@_complex_by(_norm.logpdf)
def norm_logpdf(x: ArrayLike, loc: ArrayLike = 0, scale: ArrayLike = 1) -> jax.Array:
    """The normal distribution's log density; where JAX's squares overflow (``|x - loc| >= 1.8e19``
    in float32) ``-(z/2) z - log(scale) - log(sqrt(2 pi))`` with ``z = (x - loc) / scale``.

    Args:
      x: a float array.
      loc: the mean.
      scale: the standard deviation.

    Returns:
      ``norm.logpdf(x, loc, scale)`` in the promoted dtype.
    """
    plain = _norm.logpdf(x, loc, scale)
    x, loc, scale = (jnp.asarray(v, plain.dtype) for v in (x, loc, scale))
    z = (x - loc) / scale
    wide = -((0.5 * z) * z) - (jnp.log(scale) + _LOG_SQRT_2PI)
    return jnp.where(jnp.isinf(plain) & jnp.isfinite(wide), wide, plain)


_INV_SQRT_PI = 1 / math.sqrt(math.pi)


@_complex_by(_special.erfcx)
def erfcx(x: ArrayLike) -> jax.Array:
    """``exp(x^2) erfc(x)``; for ``x >= 9`` its asymptotic series (JAX's gives 0 on [9.2, 9.4)).

    ``erfcx(x) = 1/(x sqrt(pi)) sum_n (-1)^n (2n-1)!! t^n`` with ``t = 1/(2 x^2)``: the terms up to
    ``945 t^5`` leave ``10395 t^6 < 6e-10`` relative error at ``x = 9``.

    Args:
      x: a float array.

    Returns:
      ``erfcx(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    far = x >= 9
    xf = jnp.where(far, x, 9)
    t = 0.5 / (xf * xf)
    series = 1 - t * (1 - t * (3 - t * (15 - t * (105 - t * 945))))
    asymptotic = (_INV_SQRT_PI / xf) * series
    return jnp.where(far, asymptotic, _special.erfcx(jnp.where(far, 0, x)))


def _exp_halves(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(``exp(a)/2``, ``exp(-a)/2``) for ``a >= 0``, the first finite wherever its value is."""
    e = jnp.exp(jnp.where(a < _EXP_SAFE, a, 0))
    half = jnp.exp(a / 2)
    big = jnp.where(a < _EXP_SAFE, 0.5 * e, (0.5 * half) * half)
    return big, 0.5 * jnp.exp(-a)


@_complex_by(jnp.sinh)
def sinh(x: ArrayLike, /) -> jax.Array:
    """The hyperbolic sine, ``exp(|x|)/2 - exp(-|x|)/2`` with the sign of ``x`` for ``|x| >= 1``.

    Args:
      x: a float array.

    Returns:
      ``sinh(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    a = jnp.abs(x)
    up, down = _exp_halves(jnp.where(a < 1, 1, a))
    return jnp.where(a < 1, jnp.sinh(jnp.where(a < 1, x, 0)), jnp.sign(x) * (up - down)).astype(
        x.dtype
    )


@_complex_by(jnp.cosh)
def cosh(x: ArrayLike, /) -> jax.Array:
    """The hyperbolic cosine, ``exp(|x|)/2 + exp(-|x|)/2`` for ``|x| >= 1``.

    Args:
      x: a float array.

    Returns:
      ``cosh(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    a = jnp.abs(x)
    up, down = _exp_halves(jnp.where(a < 1, 1, a))
    return jnp.where(a < 1, jnp.cosh(jnp.where(a < 1, x, 0)), up + down).astype(x.dtype)


@_complex_by(jax.nn.squareplus)
def squareplus(x: ArrayLike, b: ArrayLike = 4) -> jax.Array:
    """``(x + sqrt(x^2 + b)) / 2`` without cancellation for ``x < 0`` or overflow of ``x^2``.

    Args:
      x: a float array.
      b: the smoothness parameter (>= 0).

    Returns:
      ``squareplus(x, b)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    b = jnp.asarray(b, x.dtype)
    moderate = jnp.abs(x) < 2.0**60
    xm = jnp.where(moderate, x, 0)
    s = jnp.where(moderate, jnp.sqrt(xm * xm + b), jnp.hypot(x, jnp.sqrt(b)))
    neg = x < 0
    return jnp.where(
        neg, (0.5 * b) / (s - jnp.where(neg, x, -1)), jnp.where(moderate, (x + s) / 2, s)
    )


_SQRT_8_OVER_PI = math.sqrt(8 / math.pi)


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(_SQRT_8_OVER_PI * (x + 0.044715 * (x**3)))


def _gelu_erf(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)


@_complex_by(jax.nn.gelu)
def gelu(x: ArrayLike, approximate: bool = True) -> jax.Array:
    """The Gaussian error linear unit; the tanh form as ``x * sigmoid(2 y)``, no cancellation.

    In float32 neither form is flushed where its value rounds to a normal bfloat16: near 0 both are
    scaled (``x/2``); below -87 ``sigmoid(2 y)`` is ``exp(2 y)``, computed as ``x exp(y)**2`` with
    every factor normal; the ``erf`` form for ``x < -13`` is ``x/2 erfcx(z) exp(-x**2/2)``.

    Args:
      x: a float array.
      approximate: the tanh approximation (True, JAX's default) or the exact ``erf`` form.

    Returns:
      ``gelu(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    form = _gelu_tanh if approximate else _gelu_erf
    if not _is_f32(x):
        return form(x)
    if not approximate:
        tail = (x < _GELU_TAIL) & (x > -jnp.inf)  # -inf: JAX's own (NaN)
        return jnp.where(tail, _gelu_exact_tail(x), _near_zero(form, jnp.where(tail, 0, x)))
    y2 = _SQRT_8_OVER_PI * (x + 0.044715 * (x**3))  # 2 y: sigmoid(2 y) ~ exp(2 y) below -87
    tail = (y2 < _LOWER_TAIL) & (x > -jnp.inf)  # -inf: JAX's own (NaN)
    t = jnp.clip(y2, -170.0, _LOWER_TAIL)
    h = jnp.exp(t / 2) * 2.0**32
    below = _unscale((jnp.where(tail, x, -1) * h) * h, _SHIFT)
    below = jnp.where(y2 < -170, -0.0, below)  # x exp(2 y) < 2**-240 there
    return jnp.where(tail, below, _near_zero(form, jnp.where(tail, 0, x)))


def _pow2(k: jax.Array) -> jax.Array:
    """``2**k`` in float32, exactly, for int32 ``k`` in [-126, 127], from its bits."""
    return lax.bitcast_convert_type(jnp.left_shift(k + 127, 23), jnp.float32)


@_complex_by(jnp.exp2)
def exp2(x: ArrayLike, /) -> jax.Array:
    """``2**x``; in float32 as ``2**f 2**n`` with ``n = round(x)``, ``f = x - n`` (exact).

    ``2**f`` (``|f| <= 1/2``) is JAX's ``exp(f ln 2)``, and ``2**n`` is built from its bits, so an
    integer ``x`` gives the exact power of two (``exp2(-126) = 2**-126``, JAX's own: 0) and ``x ln 2``
    is never rounded at large ``|x|``.

    Args:
      x: a float array.

    Returns:
      ``exp2(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    if not _is_f32(x):
        return jnp.exp2(x)
    c = jnp.clip(x, -200.0, 200.0)  # 0 and inf beyond; NaN stays NaN
    n = jnp.round(jnp.where(jnp.isnan(c), 0, c))
    m = jnp.exp2(c - n)  # in [2**-1/2, 2**1/2]
    k = n.astype(jnp.int32)
    a = k // 2  # k = a + b, both in [-100, 100]
    out = (m * _pow2(a)) * _pow2(k - a)
    return _unflush(out, m * _pow2(jnp.clip(k + _SHIFT, -126, 127)), _SHIFT)


def _linear_near_zero(jfn: Callable[[ArrayLike], jax.Array], what: str) -> Callable[..., jax.Array]:
    """JAX's ``jfn`` (``jfn(x) = c x`` near 0) through ``_near_zero``, complex input to ``jfn``."""

    @_complex_by(jfn)
    def op(x: ArrayLike, /) -> jax.Array:
        return _near_zero(jfn, jnp.asarray(x))

    op.__name__ = op.__qualname__ = jfn.__name__
    op.__doc__ = (
        f"{what}; for float32 ``|x| < 2**-100`` evaluated at ``x 2**64`` and scaled back, so a\n"
        "    value that rounds to a normal narrow float is not flushed with its float32 intermediate.\n\n"
        "    Args:\n      x: a float array.\n\n"
        f"    Returns:\n      ``{jfn.__name__}(x)`` in ``x``'s dtype.\n"
    )
    return op


arcsin = _linear_near_zero(jnp.arcsin, "The inverse sine")
asin = _linear_near_zero(jnp.asin, "The inverse sine (``arcsin``'s array-API name)")
deg2rad = _linear_near_zero(jnp.deg2rad, "Degrees to radians, ``x (pi/180)``")
radians = _linear_near_zero(jnp.radians, "Degrees to radians (``deg2rad``'s other name)")


@_complex_by(_special.erfinv)
def erfinv(x: ArrayLike) -> jax.Array:
    """The inverse error function; for float32 ``|x| < 2**-100`` without a subnormal ``0.886 x``.

    Args:
      x: a float array.

    Returns:
      ``erfinv(x)`` in ``x``'s dtype.
    """
    return _near_zero(_special.erfinv, jnp.asarray(x))


def _exp_tailed(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """``fn(x)`` for an ``fn`` that is ``c x`` near 0 and ``x exp(x)`` for ``x < -87`` (silu, mish)."""
    if not _is_f32(x):
        return fn(x)
    tail = (x < _LOWER_TAIL) & (x > -jnp.inf)  # -inf: JAX's own (-inf * 0, NaN)
    return jnp.where(tail, _x_exp_x(x), _near_zero(fn, jnp.where(tail, 0, x)))


@_complex_by(jax.nn.silu)
def silu(x: ArrayLike) -> jax.Array:
    """``x sigmoid(x)``; in float32 ``x exp(x)`` for ``x < -87`` and scaled near 0, never flushed
    where the value rounds to a normal bfloat16.

    Args:
      x: a float array.

    Returns:
      ``silu(x)`` in ``x``'s dtype.
    """
    return _exp_tailed(jax.nn.silu, jnp.asarray(x))


@_complex_by(jax.nn.swish)
def swish(x: ArrayLike) -> jax.Array:
    """``silu``'s other name, as ``silu``.

    Args:
      x: a float array.

    Returns:
      ``swish(x)`` in ``x``'s dtype.
    """
    return _exp_tailed(jax.nn.swish, jnp.asarray(x))


@_complex_by(jax.nn.mish)
def mish(x: ArrayLike) -> jax.Array:
    """``x tanh(softplus(x))``; in float32 ``x exp(x)`` for ``x < -87`` (``tanh(softplus(x))`` is
    ``exp(x)`` to ``exp(x)`` relative error) and scaled near 0, as ``silu``.

    Args:
      x: a float array.

    Returns:
      ``mish(x)`` in ``x``'s dtype.
    """
    return _exp_tailed(jax.nn.mish, jnp.asarray(x))


_SQRT_HALF = math.sqrt(0.5)
_GELU_TAIL = -13.0  # erfc(-x/sqrt 2) < 2**-126 below -13.003


def _gelu_exact_tail(x: jax.Array) -> jax.Array:
    """``x/2 erfc(-x/sqrt 2)`` for float32 ``x < -13`` (elsewhere its value at -13 or -20), as
    ``x/2 erfcx(z) exp(-x**2/2)``: ``x = xh + xl`` with ``xh`` the leading 12 bits, so
    ``x**2/2 = xh**2/2 + (xh xl + xl**2/2)`` with ``xh**2`` exact; ``exp(-xh**2/4) 2**32`` squared
    and scaled back by ``2**-64``."""
    t = jnp.clip(x, -20.0, _GELU_TAIL)  # the value is below 2**-280 past -20
    bits = lax.bitcast_convert_type(t, jnp.uint32) & np.uint32(0xFFFFF000)
    xh = lax.stop_gradient(lax.bitcast_convert_type(bits, jnp.float32))
    xl = t - xh  # exact; d/dx (xh**2/2 + xh xl + xl**2/2) = xh + xl = x
    e = jnp.exp(-(xh * xh) / 4) * 2.0**32
    lead = (0.5 * t) * erfcx(-t * _SQRT_HALF) * jnp.exp(-(xh * xl + (xl * xl) / 2))
    return _unscale((lead * e) * e, _SHIFT)


# --- the gamma function family and logaddexp ------------------------------------------------------
#
# JAX's float32 lgamma, digamma and gamma lose relative accuracy where the value is small (XLA's
# lgamma gives 4.8e-07 at x = 1, up to 2e7 float32 ulps near its zeros on x < 0, 10 to 70 ulps
# elsewhere on [-3.5, 3.5]; digamma up to 2e6 ulps near its zero 1.4616 and its zeros on x < 0;
# gamma = sign * exp(lgamma) 50 to 350 ulps for |x| > 8). The formulas below are built from float64
# constants computed once, here, from their series (Hurwitz zeta values, the zeros of digamma by
# bisection) or listed (the zeros of lgamma); the largest error over a dense float32 sample is a few
# float32 ulps.

_EULER = 0.57721566490153286061
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6)  # B_2, B_4, ..., B_14


def _zeta64(s: int, a: float) -> float:
    """The Hurwitz zeta function ``sum_j (a + j)**-s`` in float64 (``s >= 2``, ``a`` not a pole):
    the terms below ``a + j = 24`` and the Euler-Maclaurin tail after them."""
    n = max(0, math.ceil(24 - a))
    head = math.fsum((a + j) ** -s for j in range(n))
    b = a + n
    tail = b ** (1 - s) / (s - 1) + 0.5 * b**-s
    rising, factorial = float(s), 2.0  # s (s+1) ... (s+2k-2) and (2k)!
    for k, bern in enumerate(_BERNOULLI, 1):
        tail += bern / factorial * rising * b ** (-s - 2 * k + 1)
        rising *= (s + 2 * k - 1) * (s + 2 * k)
        factorial *= (2 * k + 1) * (2 * k + 2)
    return head + tail


def _digamma64(a: Any) -> Any:
    """digamma in float64 for ``a >= 1`` (NumPy arrays too): 24 steps of the recurrence, then the
    asymptotic series."""
    head = sum(1 / (a + j) for j in range(24))
    b = a + 24
    series = sum(bern / (2 * k) * b ** (-2 * k) for k, bern in enumerate(_BERNOULLI, 1))
    return np.log(b) - 0.5 / b - series - head


def _split(v: Any) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``v`` as two float32 arrays whose sum holds about 48 of its bits."""
    v = np.asarray(v, np.float64)
    hi = v.astype(np.float32)
    return hi, (v - hi).astype(np.float32)


def _opaque(c: float) -> jax.Array:
    """The float32 constant ``c``, which XLA's algebraic simplifier must not fold into another
    constant: it rewrites ``(x - hi) - lo`` as ``x - (hi + lo)``, which rounds away ``lo``."""
    return lax.optimization_barrier(jnp.float32(c))


def _poly(coef: Any, t: jax.Array) -> jax.Array:
    """``sum_k coef[k] t**k`` by Horner's rule."""
    acc = coef[-1]
    for c in reversed(coef[:-1]):
        acc = acc * t + c
    return acc


# sin(pi r) = sum_k (-1)^k pi^(2k+1) / (2k+1)! r^(2k+1): to 7e-10 (relative) on |r| <= 1/2
_SIN_PI = [(-1) ** k * math.pi ** (2 * k + 1) / math.factorial(2 * k + 1) for k in range(8)]


def _sinpi(v: jax.Array) -> jax.Array:
    """``sin(pi v)`` for ``|v| <= 1``: reduced exactly to ``|r| <= 1/2`` and summed as a series in
    ``r`` (no rounded ``pi v``, and far cheaper than XLA's sin with its general range reduction)."""
    r = jnp.where(v > 0.5, 1 - v, jnp.where(v < -0.5, -1 - v, v))
    return r * _poly([np.float32(c) for c in _SIN_PI], r * r)


def _with_jvp(tangent: Callable[..., jax.Array]) -> Callable[[Callable[..., Any]], Any]:
    """``jax.custom_jvp`` of a formula whose tangent is ``tangent(primals, tangents, out)``."""

    def wrap(formula: Callable[..., Any]) -> Any:
        fn = jax.custom_jvp(formula)

        @fn.defjvp
        def _jvp(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
            out = fn(*primals)
            return out, tangent(primals, tangents, out)

        return fn

    return wrap


def _jax_tangent(jfn: Callable[..., Any]) -> Callable[..., jax.Array]:
    """The tangent of JAX's own ``jfn``: its derivatives are kept."""
    return lambda primals, tangents, out: jax.jvp(jfn, primals, tangents)[1]


# lgamma(c + t) = sum_k a_k t^k with a_0 = lgamma(c), a_1 = digamma(c), a_k = (-1)^k zeta(k, c)/k.
# Rows 1 and 2 vanish at the zeros 1 and 2 (full relative accuracy there); with |t| <= 1/2 the terms
# past t^13 are below 2e-9 of the value.
_LG_DEGREE = 13
_LG_CENTRES = (1.0, 1.5, 2.0, 3.0)
_LG_EDGES = (1.25, 1.75, 2.5)  # [0.75, 1.25) -> 1, [1.25, 1.75) -> 1.5, [1.75, 2.5) -> 2, -> 3


def _lgamma_row(c: float) -> list[float]:
    return [math.lgamma(c), float(_digamma64(c))] + [
        (-1) ** k * _zeta64(k, c) / k for k in range(2, _LG_DEGREE + 1)
    ]


_LG_ROWS = np.array([_lgamma_row(c) for c in _LG_CENTRES])
_LG_A0 = _split(_LG_ROWS[:, 0])
_LG_AK = _LG_ROWS[:, 1:].astype(np.float32)

# The zeros of lgamma on x < -2, as offsets from the pole -p next to them: -p - a_p and -p + b_p,
# p: (-a_p, b_p) (mpmath, 50 digits). The interval (-n-1, -n), 2 <= n <= 13, holds -n - a_n and
# -n-1 + b_(n+1), on either side of the zero of digamma (lgamma's extremum) between them; past
# n = 13 a zero lies within 2e-10 of its pole, closer than float32 resolves.
_LG_ZERO_OFFSETS = {
    2: (-0.45702473822080064, None),
    3: (-0.14358088834998006, 0.2523173532725874),
    4: (-0.03936183974053688, 0.04470571514140207),
    5: (-0.008218168322593521, 0.008455359439952277),
    6: (-0.0013852944531550972, 0.0013925199191243706),
    7: (-0.00019833340732475162, 0.0001984921093623021),
    8: (-2.48002706819597e-05, 2.4802904179335845e-05),
    9: (-2.7557148226503463e-06, 2.7557490225318057e-06),
    10: (-2.755730136466002e-07, 2.7557337083353163e-07),
    11: (-2.5052106852407546e-08, 2.5052109918476226e-08),
    12: (-2.087675687777539e-09, 2.087675709796081e-09),
    13: (-1.6059043830108875e-10, 1.6059043843534355e-10),
    14: (None, 1.147074559808161e-11),
}
_LG_LAST = 13  # the last interval (-n-1, -n) with its two zeros listed
_LG_D_DEGREE = 9  # lgamma(y0 - t) - lgamma(y0) on each row's t: the terms past t^9 < 5e-10 of it


def _lgamma_zero_table() -> tuple[np.ndarray, ...]:
    """Per zero ``z = -p + e`` (row ``2 (n - 2)`` the one next to ``-n``, ``+ 1`` the one next to
    ``-n-1``): ``p``, ``e`` (hi, lo), ``cot(pi e)``, ``1/|sin(pi e)|`` and the Taylor coefficients
    ``d_k`` of ``lgamma(y0 - t) - lgamma(y0)``, ``y0 = 1 - z``: ``d_1 = -digamma(y0)``,
    ``d_k = zeta(k, y0) / k``."""
    keys = [key for n in range(2, _LG_LAST + 1) for key in ((n, 0), (n + 1, 1))]
    p = np.array([k for k, _ in keys], np.float64)
    e = np.array([_LG_ZERO_OFFSETS[k][side] for k, side in keys], np.float64)
    y0 = 1 + p - e
    d = [
        [-float(_digamma64(y))] + [_zeta64(k, y) / k for k in range(2, _LG_D_DEGREE + 1)]
        for y in y0
    ]
    f32 = np.float32
    return (
        p.astype(f32),
        *_split(e),
        (1 / np.tan(np.pi * e)).astype(f32),
        (1 / np.abs(np.sin(np.pi * e))).astype(f32),
        np.array(d, f32),
    )


_LGZ_P, _LGZ_E_HI, _LGZ_E_LO, _LGZ_COT, _LGZ_INV_SIN, _LGZ_D = _lgamma_zero_table()

# The zeros of digamma: x0 on x > 0, and z_n = -n-1 + delta_n in each (-n-1, -n), where
# pi cot(pi delta_n) = digamma(n + 2 - delta_n) (the reflection formula), by bisection in float64.
# n < 1024 holds every float16 input that is not an integer; past it, JAX's own digamma.
_DG_X0 = 1.4616321449683622
_DG_LAST = 1024


def _digamma_zeros(count: int) -> np.ndarray:
    n = np.arange(count, dtype=np.float64)
    lo, hi = np.zeros(count), np.ones(count)
    for _ in range(60):  # pi cot(pi d) - digamma(n + 2 - d) falls from +inf to -inf on (0, 1)
        mid = (lo + hi) / 2
        above = np.pi / np.tan(np.pi * mid) > _digamma64(n + 2 - mid)
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return (lo + hi) / 2 - (n + 1)


_DG_ZEROS = _digamma_zeros(_DG_LAST)
_DG_Z_HI, _DG_Z_LO = _split(np.concatenate([[_DG_X0], _DG_ZEROS]))  # row 0: x0, row n + 1: z_n
_DG_Y0 = np.concatenate([[_DG_X0], 1 - _DG_ZEROS]).astype(np.float32)
_DG_SIN = np.sin(np.pi * (_DG_ZEROS + np.arange(1, _DG_LAST + 1))).astype(np.float32)
_DG_SHIFT = 10  # the recurrence steps before the asymptotic series (its terms past y**-6: < 4e-10)


def _digamma_difference(y: jax.Array, y0: jax.Array, d: jax.Array) -> jax.Array:
    """``digamma(y) - digamma(y0)`` for ``y, y0 > 0`` with ``y - y0 = d`` given accurately: every
    term is ``d`` times a positive factor, so the difference keeps ``d``'s relative accuracy.

    ``digamma(y) = digamma(y + 10) - sum_{j<10} 1/(y + j)`` and
    ``1/(y0 + j) - 1/(y + j) = d / ((y + j)(y0 + j))``; at ``a = y + 10``, ``b = y0 + 10`` the
    asymptotic series ``log y - 1/(2y) - sum_k B_2k / (2k y**2k)`` differs by ``log1p(d/b)`` and
    ``d`` times polynomials in ``a``, ``b`` and ``1/(a b)``.
    """
    steps = sum(1 / ((y + j) * (y0 + j)) for j in range(_DG_SHIFT))
    a, b = y + _DG_SHIFT, y0 + _DG_SHIFT
    w = 1 / (a * b)
    s, q = a + b, a * a + b * b
    series = s * w * ((1 / 12) - w * w * (q * (1 / 120) - w * w * (q * q - (a * b) ** 2) / 252))
    return jnp.log1p(d / b) + d * (w * (0.5 + series) + steps)


def _digamma_asymptotic(x: jax.Array) -> jax.Array:
    """digamma for ``x >= 10``: ``log x - 1/(2x) - 1/(12x**2) + 1/(120x**4) - ...``."""
    r = 1 / (x * x)
    return jnp.log(x) - 0.5 / x - r * (1 / 12 - r * (1 / 120 - r * (1 / 252 - r * (1 / 240))))


def _digamma32(x: jax.Array) -> jax.Array:
    """digamma of float32 ``x``, from the zero of digamma in ``x``'s interval.

    ``0 < x < 10``: ``digamma(x) - digamma(x0)`` (``|x| < 1/4``: at ``1 + x``, less ``1/x``);
    ``-1024 < x < 0``: the reflection formula at
    ``x`` less at the zero ``z`` of ``(-n-1, -n)``, ``digamma(1-x) - digamma(1-z)`` (as above) plus
    ``pi (cot(pi z) - cot(pi x)) = pi sin(pi t) / (sin(pi x) sin(pi z))``, ``t = x - z``; both
    terms are ``t`` times a factor of one sign. ``x >= 10``: the asymptotic series. Elsewhere (the
    poles, ``x <= -1024``, NaN) JAX's own.
    """
    small = (jnp.abs(x) < 0.25) & (x != 0)  # digamma(1 + x) - 1/x: no cancellation
    pos = (x > 0) & (x < 10) & ~small
    n = jnp.floor(-x)
    neg = (x < 0) & (n < _DG_LAST) & (x != -n) & ~small
    near = pos | neg | small
    xs = jnp.where(small, 1 + x, jnp.where(near, x, 1.0))
    row = jnp.where(neg, n + 1, 0).astype(jnp.int32)
    t = (xs - jnp.take(_DG_Z_HI, row)) - jnp.take(_DG_Z_LO, row)
    y = jnp.where(neg, 1 - xs, xs)
    diff = _digamma_difference(y, jnp.take(_DG_Y0, row), jnp.where(neg, -t, t))
    sin_x = jnp.abs(_sinpi(xs - jnp.round(xs)))
    cot = jnp.pi * _sinpi(jnp.clip(t, -1, 1)) / (sin_x * jnp.take(_DG_SIN, jnp.maximum(row - 1, 0)))
    out = jnp.where(neg, diff + cot, jnp.where(small, diff - 1 / jnp.where(small, x, 1.0), diff))
    far = x >= 10
    big = _digamma_asymptotic(jnp.where(far, x, 10.0))
    own = lax.digamma(jnp.where(near | far, 1.0, x))
    return jnp.where(near, out, jnp.where(far, big, own))


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _lgamma_shifted(x: jax.Array) -> jax.Array:
    """lgamma of float32 ``x > -2``: the Taylor rows on [0.75, 3.5); ``lgamma(x - k) +
    log((x-1)...(x-k))`` on [3.5, 8); ``lgamma(x + m) - log|x (x+1) ... (x+m-1)|`` on (-2, 0.75)
    (no cancellation: both terms have one sign, or the first is under 0.13); Stirling's series with
    four terms past 8."""
    big = x >= 8
    down = (x >= 3.5) & ~big
    up = x < 0.75
    k = jnp.where(down, jnp.round(x) - 3, 0)
    m = jnp.where(up, jnp.where(x >= -0.25, 1, jnp.where(x >= -1.25, 2, 3)), 0)
    u = jnp.where(big, 3.0, x - k)  # exact
    above = [u + m >= e for e in _LG_EDGES]

    def pick(col: np.ndarray) -> jax.Array:
        return jnp.where(
            above[2], col[3], jnp.where(above[1], col[2], jnp.where(above[0], col[1], col[0]))
        )

    t = u - (pick(np.array(_LG_CENTRES, np.float32)) - m)  # exact
    core = pick(_LG_A0[0]) + (pick(_LG_A0[1]) + t * _poly([pick(c) for c in _LG_AK.T], t))
    prod = jnp.ones_like(x)
    for j in range(1, 6):
        prod = prod * jnp.where(j <= k, x - j, 1.0)
    for j in range(3):
        prod = prod * jnp.where(j < m, x + j, 1.0)
    xb = jnp.where(big, x, 8.0)
    logs = jnp.log(jnp.where(big, xb, jnp.abs(prod)))
    z = 1 / xb
    y = z * z
    w = z * (1 / 12 - y * (1 / 360 - y * (1 / 1260 - y * (1 / 1680))))
    stirling = (xb - 0.5) * (logs - 1) + ((_HALF_LOG_2PI - 0.5) + w)
    return jnp.where(big, stirling, core + jnp.where(up, -logs, logs))


def _lgamma32(x: jax.Array) -> jax.Array:
    """lgamma of float32 ``x``.

    ``x > -2``: ``_lgamma_shifted``. On ``(-n-1, -n)`` for ``2 <= n <= 13``, from the zero ``z`` of
    lgamma on ``x``'s side of the extremum: the reflection formula at ``x`` less at ``z`` is
    ``lgamma(x) = -log(sin(pi x)/sin(pi z)) - (lgamma(1-x) - lgamma(1-z))``; with ``t = x - z``,
    ``sin(pi x)/sin(pi z) = 1 + cot(pi z) sin(pi t) - 2 sin(pi t/2)**2`` (through ``log1p``) and the
    second term is a Taylor polynomial in ``t`` (``_lgamma_zero_table``): both keep ``t``'s relative
    accuracy. Elsewhere below -2 the reflection formula, ``log(pi/|sin(pi x)|) - lgamma(1-x)``.
    """
    finite = jnp.isfinite(x)
    xf = jnp.where(finite, x, 0.0)
    r = xf - jnp.round(xf)  # exact
    sin_x = jnp.abs(_sinpi(r))
    low = x <= -2
    shifted = _lgamma_shifted(jnp.where(low, jnp.where(finite, 1 - x, 2.0), x))
    reflected = jnp.log(jnp.pi / sin_x) - shifted
    n = jnp.floor(-xf)
    zone = low & (n <= _LG_LAST) & (r != 0)
    nz = jnp.clip(n, 2, _LG_LAST)
    below = xf < jnp.take(_DG_Z_HI, nz.astype(jnp.int32) + 1)  # x below the extremum
    row = (2 * (nz - 2) + below.astype(nz.dtype)).astype(jnp.int32)
    t = jnp.where(zone, xf + jnp.take(_LGZ_P, row), 0.0)  # x + p, exact
    t = (t - jnp.take(_LGZ_E_HI, row)) - jnp.take(_LGZ_E_LO, row)
    h = _sinpi(t / 2)
    u = jnp.take(_LGZ_COT, row) * _sinpi(t) - 2 * h * h
    ratio = jnp.where(
        u > -0.5, jnp.log1p(jnp.maximum(u, -0.5)), jnp.log(sin_x * jnp.take(_LGZ_INV_SIN, row))
    )
    d = t * _poly([jnp.take(_LGZ_D[:, i], row) for i in range(_LG_D_DEGREE)], t)
    negative = jnp.where(r == 0, jnp.inf, jnp.where(zone, -ratio - d, reflected))
    return jnp.where(~low, shifted, jnp.where(finite, negative, lax.lgamma(x)))


# 1/Gamma(1 + t) = exp(-lgamma(1 + t)) = sum_k f_k t^k (an entire function), from
# -lgamma(1 + t) = gamma t - sum_k (-1)^k zeta(k)/k t^k; on |t| <= 1/2 the terms past t^12 < 2e-10.
def _rgamma_series(degree: int) -> np.ndarray:
    g = [0.0, _EULER] + [-((-1) ** k) * _zeta64(k, 1.0) / k for k in range(2, degree + 1)]
    f = [1.0]
    for m in range(1, degree + 1):  # f = exp(g): m f_m = sum_k k g_k f_(m-k)
        f.append(sum(k * g[k] * f[m - k] for k in range(1, m + 1)) / m)
    return np.array(f, np.float32)


_RGAMMA = _rgamma_series(12)
_GAMMA_RANGE = (-34.5, 35.5)  # below, |gamma| < 2**-126; above, gamma overflows float32


def _gamma32(x: jax.Array) -> jax.Array:
    """gamma of float32 ``x``: ``x = q + r`` (``q = round(x)``), ``gamma(1 + r)`` from the series of
    ``1/gamma``, times ``(r+1) ... (r+q-1)`` or divided by ``r (r-1) ... (r+q)`` (exact factors,
    at most 34 roundings); JAX's own outside ``[-34.5, 35.5)``."""
    inside = (x >= _GAMMA_RANGE[0]) & (x < _GAMMA_RANGE[1])
    xi = jnp.where(inside, x, 1.0)
    q = jnp.round(xi)
    r = jnp.where(q == 0, xi, xi - q)  # exact; keeps the sign of a zero
    rg = _poly(list(_RGAMMA), r)
    up = 1 / rg
    down = rg * r
    for j in range(1, 35):
        up = up * jnp.where(j < q, r + j, 1.0)
        down = down * jnp.where(j <= -q, r - j, 1.0)
    out = jnp.where(q >= 1, up, 1 / down)
    out = jnp.where((xi < 0) & (r == 0), jnp.nan, out)
    return jnp.where(inside, out, _special.gamma(jnp.where(inside, 2.0, x)))


@_with_jvp(_jax_tangent(lax.digamma))  # polygamma(1, x) dx, as JAX
def _digamma(x: jax.Array) -> jax.Array:
    return _digamma32(x) if _is_f32(x) else lax.digamma(x)


@_with_jvp(lambda p, t, out: _digamma(p[0]) * t[0])
def _lgamma(x: jax.Array) -> jax.Array:
    return _lgamma32(x) if _is_f32(x) else lax.lgamma(x)


@_with_jvp(lambda p, t, out: out * _digamma(p[0]) * t[0])
def _gamma(x: jax.Array) -> jax.Array:
    return _gamma32(x) if _is_f32(x) else _special.gamma(x)


@_complex_by(lax.lgamma)
def lgamma(x: ArrayLike) -> jax.Array:
    """``log|gamma(x)|``; in float32 to a few ulps everywhere, zeros included (JAX's: 4.8e-07 at 1).

    Args:
      x: a float array.

    Returns:
      ``lgamma(x)`` in ``x``'s dtype.
    """
    return _lgamma(jnp.asarray(x))


@_complex_by(_special.gammaln)
def gammaln(x: ArrayLike) -> jax.Array:
    """``log|gamma(x)|`` (``lgamma``'s SciPy name), as ``lgamma``.

    Args:
      x: a float array.

    Returns:
      ``gammaln(x)`` in ``x``'s dtype.
    """
    return _lgamma(jnp.asarray(x))


@_complex_by(_special.loggamma)
def loggamma(x: ArrayLike) -> jax.Array:
    """``log(gamma(x))`` for real ``x > 0`` (``lgamma``), NaN for ``x <= 0`` (as JAX).

    Args:
      x: a float array.

    Returns:
      ``loggamma(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    return jnp.where(x > 0, _lgamma(x), jnp.nan)


@_complex_by(lax.digamma)
def lax_digamma(x: ArrayLike) -> jax.Array:
    """The digamma function; in float32 to a few ulps on ``x > -1024``, its zeros included.

    Args:
      x: a float array.

    Returns:
      ``digamma(x)`` in ``x``'s dtype (NaN at the poles 0, -1, -2, ..., as JAX).
    """
    return _digamma(jnp.asarray(x))


lax_digamma.__name__ = lax_digamma.__qualname__ = "digamma"


@_complex_by(_special.digamma)
def digamma(x: ArrayLike) -> jax.Array:
    """The digamma function, as ``heddle.lax.digamma``.

    Args:
      x: a float array.

    Returns:
      ``digamma(x)`` in ``x``'s dtype (NaN at the poles 0, -1, -2, ..., as JAX).
    """
    return _digamma(jnp.asarray(x))


@_complex_by(_special.gamma)
def gamma(x: ArrayLike) -> jax.Array:
    """The gamma function; in float32 from the series of ``1/gamma`` and exact factors, a few ulps
    (JAX's ``sign * exp(lgamma(x))``: up to 350 ulps).

    Args:
      x: a float array.

    Returns:
      ``gamma(x)`` in ``x``'s dtype.
    """
    return _gamma(jnp.asarray(x))


_LN2_HI, _LN2_LO = (float(v) for v in _split(math.log(2)))


@_with_jvp(_jax_tangent(jnp.logaddexp))
def _logaddexp(x1: jax.Array, x2: jax.Array) -> jax.Array:
    out = jnp.logaddexp(x1, x2)
    if not _is_f32(out):
        return out
    d = jnp.abs(x1 - x2)
    near = d < 1
    c = jnp.log1p(jnp.expm1(-jnp.where(near, d, 0.0)) / 2)  # log((1 + exp(-d)) / 2), in (-0.38, 0]
    fine = (jnp.maximum(x1, x2) + _LN2_HI) + (c + _opaque(_LN2_LO))
    return jnp.where(near, fine, out)


@_complex_by(jnp.logaddexp)
def logaddexp(x1: ArrayLike, x2: ArrayLike, /) -> jax.Array:
    """``log(exp(x1) + exp(x2))``; in float32 for ``|x1 - x2| < 1`` as
    ``max + log 2 + log((1 + exp(-|x1 - x2|)) / 2)`` with ``log 2`` in two parts, so
    ``logaddexp(x, x)`` is ``x + log 2`` to float32's resolution (JAX rounds ``log 2`` first).

    Args:
      x1: a float array.
      x2: a float array (broadcast with ``x1``).

    Returns:
      ``logaddexp(x1, x2)`` in the promoted dtype.
    """
    x1, x2 = jnp.asarray(x1), jnp.asarray(x2)
    return _logaddexp(x1, x2)


def isclose(
    a: ArrayLike,
    b: ArrayLike,
    rtol: ArrayLike = 1e-05,
    atol: ArrayLike = 1e-08,
    equal_nan: bool = False,
) -> jax.Array:
    """``|a - b| <= atol + rtol |b|`` (as ``jnp.isclose``), evaluated in float32 for narrow floats.

    The tolerances are rounded to the operands' dtype, as jax.numpy rounds them; the difference and
    the bound are then float32 (``jnp.isclose`` of bfloat16 rounds ``|a - b|`` to bfloat16 first,
    which can move it across the bound).

    Args:
      a, b: arrays of one dtype (heddle's common dtype of the operands).
      rtol, atol: the relative and absolute tolerances.
      equal_nan: whether two NaNs compare close.

    Returns:
      A bool array.

    Example:
      >>> import jax.numpy as jnp
      >>> a = jnp.asarray([1.0, 1.0078125], jnp.bfloat16)
      >>> isclose(a, jnp.asarray([1.0, 1.0], jnp.bfloat16), rtol=0.0, atol=0.0078125).tolist()
      [True, True]
    """
    d = np.dtype(jnp.result_type(a))
    if not jnp.issubdtype(d, jnp.floating) or d.itemsize >= 4:
        return jnp.isclose(a, b, rtol, atol, equal_nan)
    wide = lambda t: lax.convert_element_type(lax.convert_element_type(t, d), np.float32)
    return jnp.isclose(wide(a), wide(b), wide(rtol), wide(atol), equal_nan)


def allclose(
    a: ArrayLike,
    b: ArrayLike,
    rtol: ArrayLike = 1e-05,
    atol: ArrayLike = 1e-08,
    equal_nan: bool = False,
) -> jax.Array:
    """Whether every element of ``a`` and ``b`` is ``isclose``.

    Args:
      a, b: arrays of one dtype (heddle's common dtype of the operands).
      rtol, atol: the relative and absolute tolerances.
      equal_nan: whether two NaNs compare close.

    Returns:
      A bool scalar array.

    Example:
      >>> import jax.numpy as jnp
      >>> bool(allclose(jnp.ones(3, jnp.bfloat16), jnp.ones(3, jnp.bfloat16)))
      True
    """
    return jnp.all(isclose(a, b, rtol, atol, equal_nan))


NUMPY = {
    "isclose": isclose,
    "allclose": allclose,
    "sinc": sinc,
    "i0": i0,
    "sinh": sinh,
    "cosh": cosh,
    "exp2": exp2,
    "arcsin": arcsin,
    "asin": asin,
    "deg2rad": deg2rad,
    "radians": radians,
    "logaddexp": logaddexp,
}
"""``heddle.numpy`` names computed by the formulas here instead of ``jax.numpy``'s."""

NN = {"squareplus": squareplus, "gelu": gelu, "silu": silu, "swish": swish, "mish": mish}
"""``heddle.nn`` names computed by the formulas here instead of ``jax.nn``'s."""

SPECIAL = {
    "erfcx": erfcx,
    "erfinv": erfinv,
    "i0": special_i0,
    "i1": i1,
    "log_ndtr": log_ndtr,
    "gammaln": gammaln,
    "loggamma": loggamma,
    "digamma": digamma,
    "gamma": gamma,
}
"""``heddle.scipy.special`` names computed by the formulas here instead of ``jax.scipy.special``'s."""

STATS = {"norm": {"logpdf": norm_logpdf}}
"""``heddle.scipy.stats.<dist>`` names, by distribution, computed by the formulas here instead of
``jax.scipy.stats``'."""


def _lax_exp2(x: ArrayLike, *, accuracy: Any = None) -> jax.Array:
    """``heddle.lax.exp2``: ``exp2``'s formula; with an ``accuracy``, JAX's own (which takes one).

    Args:
      x: a float array.
      accuracy: as for ``jax.lax.exp2``; None for heddle's formula.

    Returns:
      ``2**x`` in ``x``'s dtype.
    """
    return exp2(x) if accuracy is None else lax.exp2(x, accuracy=accuracy)


_lax_exp2.__name__ = _lax_exp2.__qualname__ = "exp2"

LAX = {
    "lgamma": lgamma,
    "digamma": lax_digamma,
    "exp2": _lax_exp2,
    "asin": asin,
    "sinh": sinh,
    "cosh": cosh,
    "erf_inv": erfinv,
}
"""``heddle.lax`` names computed by the formulas here, as heddle.numpy's of the same function."""
