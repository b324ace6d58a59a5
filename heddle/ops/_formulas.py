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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.scipy import special as _special
from jax.typing import ArrayLike

_EXP_SAFE = 80.0  # below float32's exp overflow (88.72) with room for the factor 1/2


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


def i0(x: ArrayLike) -> jax.Array:
    """The modified Bessel function of order 0, finite wherever its value is.

    Args:
      x: a float array.

    Returns:
      ``i0(x)`` in ``x``'s dtype.
    """
    return _bessel(x, jnp.i0, _special.i0e)


def i1(x: ArrayLike) -> jax.Array:
    """The modified Bessel function of order 1, finite wherever its value is (as ``i0``).

    Args:
      x: a float array.

    Returns:
      ``i1(x)`` in ``x``'s dtype.
    """
    return _bessel(x, _special.i1, _special.i1e)


def log_ndtr(x: ArrayLike, series_order: int = 3) -> jax.Array:
    """``log(ndtr(x))``; for ``x > 0`` as ``log1p(-ndtr(-x))``, which does not cancel.

    Args:
      x: a float array.
      series_order: the asymptotic series' order for very negative ``x`` (as JAX).

    Returns:
      ``log_ndtr(x)`` in ``x``'s dtype.
    """
    x = jnp.asarray(x)
    pos = x > 0
    upper = jnp.log1p(-_special.ndtr(-jnp.where(pos, x, 0)))
    lower = _special.log_ndtr(jnp.where(pos, 0, x), series_order=series_order)
    return jnp.where(pos, upper, lower)


_INV_SQRT_PI = 1 / math.sqrt(math.pi)


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


def gelu(x: ArrayLike, approximate: bool = True) -> jax.Array:
    """The Gaussian error linear unit; the tanh form as ``x * sigmoid(2 y)``, no cancellation.

    Args:
      x: a float array.
      approximate: the tanh approximation (True, JAX's default) or the exact ``erf`` form.

    Returns:
      ``gelu(x)`` in ``x``'s dtype.
    """
    if not approximate:
        return jax.nn.gelu(x, approximate=False)
    x = jnp.asarray(x)
    y = _SQRT_8_OVER_PI * (x + 0.044715 * (x**3))
    return x * jax.nn.sigmoid(y)


NUMPY = {"sinc": sinc, "i0": i0, "sinh": sinh, "cosh": cosh}
"""``heddle.numpy`` names computed by the formulas here instead of ``jax.numpy``'s."""

NN = {"squareplus": squareplus, "gelu": gelu}
"""``heddle.nn`` names computed by the formulas here instead of ``jax.nn``'s."""

SPECIAL = {"erfcx": erfcx, "i0": i0, "i1": i1, "log_ndtr": log_ndtr}
"""``heddle.scipy.special`` names computed by the formulas here instead of ``jax.scipy.special``'s."""
