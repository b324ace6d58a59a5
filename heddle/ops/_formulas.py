"""Elementwise formulas that are accurate in float32 where JAX's own lose accuracy before the rounding.

heddle computes a narrow float op in float32 and rounds once (POLICY.md 5); that one rounding is
correct only when the float32 value is within float32's own error of the true value. These JAX
implementations are not, and are replaced, name by name, by the formulas here (``NUMPY`` for
``heddle.numpy``, ``NN`` for ``heddle.nn``); each keeps JAX's signature and runs inside the same
``make_op``/``float_op`` mechanism as every other op:

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


NUMPY = {
    "sinc": sinc,
    "i0": i0,
    "sinh": sinh,
    "cosh": cosh,
    "exp2": exp2,
    "arcsin": arcsin,
    "asin": asin,
    "deg2rad": deg2rad,
    "radians": radians,
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
}
"""``heddle.scipy.special`` names computed by the formulas here instead of ``jax.scipy.special``'s."""

STATS = {"norm": {"logpdf": norm_logpdf}}
"""``heddle.scipy.stats.<dist>`` names, by distribution, computed by the formulas here instead of
``jax.scipy.stats``'."""
