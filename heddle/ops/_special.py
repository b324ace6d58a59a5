"""Policy versions of ``jax.scipy.special`` and of ``jax.scipy.stats``' ``norm`` and ``logistic``.

Every function runs the whole of JAX's own implementation in the accumulation dtype (float32 for
narrow floats) and rounds once (``float_op``, heddle/ops/_float_op.py), so ``logsumexp`` sums in
float32 and ``erf``, ``gammaln`` or ``norm.logpdf`` of a bfloat16 array are float32 values rounded
once. ``SPECIAL`` classifies every public name of ``jax.scipy.special`` as data: the parameters that
are value operands (the rest are static: ``axis``, ``series_order``, ``v``, ...); ``CREATION`` and
``PASS`` hold the rest. ``tests/scipy/test_special.py`` compares the table with
``dir(jax.scipy.special)``.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as _jss
import jax.scipy.stats as _jst
import numpy as np
from jax import lax

from heddle.ops import _formulas, _logprob
from heddle.ops._float_op import float_op
from heddle.policy import _dtypes as D
from heddle.policy._policy import active

# name -> value operands; every one is float-only, computes in acc_dtype and rounds once
SPECIAL: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        "dawsn digamma entr erf erfc erfcx erfinv exp1 expi expit fresnel gamma gammaln gammasgn "
        "i0 i0e i1 i1e loggamma logit log_ndtr ndtr sici spence".split(),
        ("x",),
    ),
    "ndtri": ("p",),
    "wofz": ("z",),
    **dict.fromkeys("softmax log_softmax".split(), ("x",)),
    "logsumexp": ("a", "b"),
    **dict.fromkeys("beta betaln".split(), ("a", "b")),
    "betainc": ("a", "b", "x"),
    **dict.fromkeys("boxcox boxcox1p".split(), ("x", "lmbda")),
    "comb": ("N", "k"),
    "expn": ("n", "x"),
    "factorial": ("n",),
    **dict.fromkeys("gammainc gammaincc".split(), ("a", "x")),
    "hyp1f1": ("a", "b", "x"),
    "hyp2f1": ("a", "b", "c", "x"),
    **dict.fromkeys("kl_div rel_entr".split(), ("p", "q")),
    "multigammaln": ("a",),  # d: the dimension, a static integer
    "owens_t": ("h", "a"),
    "poch": ("z", "m"),
    "polygamma": ("x",),  # n: the integer order of the derivative, not rounded
    **dict.fromkeys("xlogy xlog1py".split(), ("x", "y")),
    "zeta": ("x", "q"),
    "bessel_jn": ("z",),  # v (the order) and n_iter: static integers
    "sph_harm_y": ("theta", "phi"),  # n, m: integer degree and order, not rounded
}

# names that create a float array from integers: the policy's default float
CREATION: dict[str, str] = {
    "bernoulli": "the first n+1 Bernoulli numbers, in the policy's default float",
}

PASS: dict[str, str] = {}
"""``jax.scipy.special`` names passed through unchanged, each with the reason (none today)."""

STATS: dict[str, tuple[str, ...]] = {"norm": ("loc", "scale"), "logistic": ("loc", "scale")}
"""``jax.scipy.stats`` distributions with policy versions: the parameters besides the first."""


def _doc(qualname: str, jfn: Callable[..., Any]) -> str:
    return (
        f"heddle's policy version of ``jax.{qualname}``.\n\n"
        "Dtypes: a float input keeps its dtype; an integer or bool input gives the policy's default "
        "float; JAX's implementation runs in the accumulation dtype (float32 for narrow floats) and "
        "the output is rounded once (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.{qualname}.\n  **kwargs: as for jax.{qualname}.\n\n"
        f"Returns:\n  The result of jax.{qualname} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.scipy\n  >>> heddle.{qualname}  # doctest: +ELLIPSIS\n"
        f"  <function ...>\n\n"
        f"Original documentation follows.\n\n{jfn.__doc__ or ''}"
    )


@functools.lru_cache(maxsize=64)
def _bernoulli_exact(n: int) -> tuple[Fraction, ...]:
    """B_0..B_n exactly (B_1 = -1/2): B_m = -1/(m+1) sum_{k<m} C(m+1, k) B_k."""
    b: list[Fraction] = []
    for m in range(n + 1):
        b.append(
            Fraction(1) if m == 0 else -sum(math.comb(m + 1, k) * b[k] for k in range(m)) / (m + 1)
        )
    return tuple(b)


def bernoulli(n: int) -> jax.Array:
    """The first ``n + 1`` Bernoulli numbers, in the policy's default float.

    Dtypes: the active policy's ``default_float`` (float32; JAX gives float64 under
    ``jax_enable_x64``). The numbers are computed exactly (as Fractions, on the host) and rounded
    once through float64; JAX's float32 recurrence is a few ulps off from B_4 on.

    Args:
      n: the largest index (a Python int, as JAX requires).

    Returns:
      ``[B_0, ..., B_n]``.

    Raises:
      ValueError: ``n`` is negative.

    Examples:
      >>> import heddle.scipy
      >>> heddle.scipy.special.bernoulli(2)
      Array([ 1.       , -0.5      ,  0.16666667], dtype=float32)
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(
            f"heddle.scipy.special.bernoulli({n}): n counts the numbers B_0..B_n, so it must be "
            "non-negative; bernoulli(0) gives [B_0]"
        )
    d = active().default_float
    D.require_available(d, "heddle.scipy.special.bernoulli")
    with np.errstate(over="ignore"):
        values = np.array([float(b) for b in _bernoulli_exact(n)], np.float64).astype(d)
    return jnp.asarray(values)


def polygamma(n: Any, x: Any) -> jax.Array:
    """``jax.scipy.special.polygamma`` with its integer order ``n`` (a Python int or an integer
    array, checked as JAX does) converted explicitly to ``x``'s dtype: no implicit promotion."""
    d = np.dtype(getattr(n, "dtype", None) or np.asarray(n).dtype)
    if D.kind(d) not in "iu":
        return _jss.polygamma(n, x)  # JAX's own error for a non-integer order
    x = jnp.asarray(x)
    return lax.polygamma(*jnp.broadcast_arrays(lax.convert_element_type(n, x.dtype), x))


_BIG_SPENCE = 2.0**60  # past it, 1/x (which JAX's spence computes) is far from float32's subnormals


def spence(x: Any) -> jax.Array:
    """``jax.scipy.special.spence``, with its large-argument branch computed without ``1/x``.

    JAX maps ``x > 2`` to ``1/x``, which for ``x`` past about 8.5e37 is a float32 subnormal that
    XLA:CPU flushes to zero, and ``log(0) * log(1)`` is NaN. For ``x >= 2**60``
    ``spence(x) = -log(x)**2 / 2 - pi**2 / 6 + (log(x) + 1) / x + ...``, and the last terms are below
    a float32 ulp of the first ones (under 1e-16 relative), so they are dropped. ``x = inf`` stays
    JAX's (NaN, as scipy.special.spence).
    """
    x = jnp.asarray(x)
    big = (x >= _BIG_SPENCE) & (x < np.inf)
    lx = jnp.log(jnp.where(big, x, 1.0))
    return jnp.where(big, -0.5 * lx * lx - np.pi**2 / 6, _jss.spence(jnp.where(big, 1.0, x)))


_E1_TERMS = 16  # x**k / (k * k!) for x <= 1 is under float32's eps by k = 12


@jax.custom_jvp
def exp1(x: Any) -> jax.Array:
    """``jax.scipy.special.exp1`` without its data-dependent loops on ``0 < x <= 1``.

    JAX's E1 is a ``jnp.piecewise`` over elementwise ``lax.while_loop``s, vectorised: every element
    runs every branch, and a batched while loop runs until its slowest element converges. Its
    continued fraction (meant for ``x > 1``) then runs on the small elements too, where it needs
    about ``1/x`` steps: minutes for a float32 array reaching 1e-5, and without end near bfloat16's
    smallest values. Here ``x <= 1`` takes JAX's own power series (its ``_expn1`` for n = 1) with a
    fixed number of terms, and JAX's function only ever sees ``x > 1`` (or non-positive and NaN
    arguments, which it answers without iterating). ``E1(inf) = 0`` (JAX: NaN).
    """
    x = jnp.asarray(x)
    small = (x > 0) & (x <= 1)
    t = jnp.where(small, x, 1.0)

    def term(k: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        yk, ans = carry
        kf = lax.convert_element_type(k, t.dtype)
        yk = yk * (-t) / kf
        return yk, ans + yk / kf

    _, series = lax.fori_loop(1, _E1_TERMS + 1, term, (jnp.ones_like(t), jnp.zeros_like(t)))
    near = (-np.euler_gamma - jnp.log(t)) - series
    far = jnp.where(x == np.inf, 0.0, _jss.exp1(jnp.where(small | (x == np.inf), 2.0, x)))
    return jnp.where(small, near, far)


@exp1.defjvp
def _exp1_jvp(primals: tuple[Any], tangents: tuple[Any]) -> tuple[jax.Array, jax.Array]:
    (x,), (dx,) = primals, tangents
    return exp1(x), -jnp.exp(-x) / x * dx


_EI_TERMS = 12


@jax.custom_jvp
def expi(x: Any) -> jax.Array:
    """``jax.scipy.special.expi`` whose negative half, ``-E1(-x)``, is ``exp1`` above (JAX's is its
    own slow E1); JAX's function keeps ``0 < x <= 64``. Past 64 JAX multiplies by ``exp(x)``, which
    overflows float32 from x = 88.7 although Ei stays finite to x = 93.3; there the asymptotic
    series ``Ei(x) = e**x / x * sum(k! / x**k)`` (error under 1e-12 from 12 terms) is scaled by
    ``exp(x / 2)`` twice; past 100 Ei is inf in every format it computes in. ``Ei(+-0) = -inf`` and
    ``Ei(inf) = inf`` (JAX: NaN)."""
    x = jnp.asarray(x)
    neg, edge, far = x < 0, (x == 0) | (x > 100), (x > 64) & (x <= 100)
    pos = _jss.expi(jnp.where(neg | edge | far, 1.0, x))
    pos = jnp.where(edge, jnp.where(x == 0, -np.inf, np.inf), pos)
    w = 1.0 / jnp.where(far, x, 64.0)
    series = jnp.ones_like(w)
    for k in range(_EI_TERMS, 0, -1):
        series = 1.0 + k * w * series
    half = jnp.exp(jnp.where(far, x, 64.0) / 2)
    pos = jnp.where(far, half * (half * w * series), pos)
    return jnp.where(neg, -exp1(jnp.where(neg, -x, 1.0)), pos)


@expi.defjvp
def _expi_jvp(primals: tuple[Any], tangents: tuple[Any]) -> tuple[jax.Array, jax.Array]:
    (x,), (dx,) = primals, tangents
    return expi(x), jnp.exp(x) / x * dx


_EN_SERIES_TERMS = 16  # x**k / k! for x <= 1: under float32's eps of E_n(x) by k = 12, any n
_EN_FRACTION_TERMS = 20  # the continued fraction for x > 1: within 2e-6 relative by 16 terms
_EN_LARGE_ORDER = 5000  # from here the asymptotic expansion in 1 / (x + n)


def _expn_series(n: jax.Array, x: jax.Array) -> jax.Array:
    """``E_n(x)`` for ``0 < x <= 1``, ``n >= 1``: ``(-x)**(n-1) / (n-1)! * (psi(n) - log x)`` less
    ``sum over k != n - 1 of (-x)**k / (k! * (k - n + 1))``, with a fixed number of terms."""
    total = jnp.where(n == 1, 0.0, 1.0 / (1.0 - n))  # k = 0
    term = jnp.ones_like(x)
    for k in range(1, _EN_SERIES_TERMS + 1):
        term = term * (-x) / k
        den = k - n + 1.0
        total = total + jnp.where(den == 0, 0.0, term / jnp.where(den == 0, 1.0, den))
    odd = jnp.fmod(n - 1.0, 2.0) == 1.0
    lead = jnp.exp((n - 1.0) * jnp.log(x) - lax.lgamma(n))
    lead = jnp.where(n == 1, 1.0, jnp.where(odd, -lead, lead))
    return lead * (lax.digamma(n) - jnp.log(x)) - total


def _expn_fraction(n: jax.Array, x: jax.Array) -> jax.Array:
    """``E_n(x)`` for ``x > 1``: ``exp(-x)`` times the continued fraction
    ``1 / (x + n - 1 n / (x + n + 2 - 2 (n + 1) / (x + n + 4 - ...)))``, evaluated from the top
    (Lentz's method) with a fixed number of terms."""
    tiny = 1e-30
    b = x + n
    c = jnp.full_like(x, 1.0 / tiny)
    d = 1.0 / b
    h = d
    for i in range(1, _EN_FRACTION_TERMS + 1):
        a = -i * (n - 1.0 + i)
        b = b + 2.0
        d = 1.0 / (a * d + b)
        c = b + a / c
        h = h * (c * d)
    return h * jnp.exp(-x)


def _expn_large_order(n: jax.Array, x: jax.Array) -> jax.Array:
    """``E_n(x)`` for ``n >= 5000``: ``exp(-x) / (x + n)`` times
    ``1 + n / s**2 + n (n - 2 x) / s**4 + n (6 x**2 - 8 n x + n**2) / s**6`` with ``s = x + n``."""
    s = x + n
    w = 1.0 / (s * s)
    poly = n * (6.0 * x * x - 8.0 * n * x + n * n) * w
    poly = (poly + n * (n - 2.0 * x)) * w
    poly = (poly + n) * w
    return (1.0 + poly) * jnp.exp(-x) / s


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def expn(n: Any, x: Any) -> jax.Array:
    """``jax.scipy.special.expn`` as ``scipy.special.expn`` defines it, without data-dependent loops.

    JAX's ``expn`` is a ``jnp.piecewise`` over elementwise ``lax.while_loop``s: every element runs
    every branch, so its continued fraction also runs on the smallest ``x``, where it needs about
    ``1/x`` steps (without end near bfloat16's subnormals). It also gives ``E_n(0) = 1/n`` for
    ``n >= 2`` (it is ``1/(n-1)``) and NaN at ``x = inf`` (it is 0). Here each branch sees only its
    own elements, with a fixed number of terms: the power series for ``0 < x <= 1``, the continued
    fraction for ``x > 1``, the asymptotic expansion for ``n >= 5000``; ``E_0(x) = exp(-x) / x``.
    As scipy, a non-integer order is truncated, and ``n < 0`` or ``x < 0`` is NaN.
    """
    x = jnp.asarray(x)
    d = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else np.dtype(np.float32)
    n, x = jnp.broadcast_arrays(jnp.trunc(jnp.asarray(n).astype(d)), x.astype(d))
    small, large = (x > 0) & (x <= 1), n >= _EN_LARGE_ORDER
    order = jnp.where(large | (n < 1), 1.0, n)
    near = _expn_series(order, jnp.where(small, x, 0.5))
    far = _expn_fraction(order, jnp.where(small | ~(x < np.inf), 2.0, x))
    out = jnp.where(small, near, far)
    out = jnp.where(large, _expn_large_order(jnp.where(large, n, _EN_LARGE_ORDER), x), out)
    out = jnp.where(n == 0, jnp.exp(-x) / x, out)
    out = jnp.where(x == np.inf, 0.0, out)
    at_zero = jnp.where(n <= 1, np.inf, 1.0 / jnp.where(n <= 1, 2.0, n - 1.0))
    out = jnp.where(x == 0, at_zero, out)
    return jnp.where((n < 0) | (x < 0) | jnp.isnan(n) | jnp.isnan(x), np.nan, out)


@expn.defjvp
def _expn_jvp(n: Any, primals: tuple[Any], tangents: tuple[Any]) -> tuple[jax.Array, jax.Array]:
    (x,), (dx,) = primals, tangents
    # dE_n/dx = -E_{n-1}(x); for n = 0, -exp(-x) (x + 1) / x**2 (E_{-1} is outside scipy's domain)
    x = jnp.asarray(x)
    zeroth = -jnp.exp(-x) * (x + 1.0) / (x * x)
    slope = jnp.where(jnp.trunc(jnp.asarray(n)) == 0, zeroth, -expn(jnp.asarray(n) - 1, x))
    return expn(n, x), slope * dx


FORMULAS: dict[str, Callable[..., Any]] = {
    "polygamma": polygamma,
    "spence": spence,
    "exp1": exp1,
    "expi": expi,
    "expn": expn,
}
"""``heddle.scipy.special`` names computed by the functions here instead of JAX's (each wraps JAX's
own, keeping its signature)."""


def build_special() -> dict[str, Any]:
    """The policy functions of heddle.scipy.special, by name."""
    names: dict[str, Any] = {}
    for name, values in SPECIAL.items():
        jfn = getattr(_jss, name, None)
        if jfn is None:
            continue
        fn = FORMULAS.get(name) or _formulas.SPECIAL.get(name, jfn)
        op = float_op(fn, f"scipy.special.{name}", values=values)
        op.__doc__ = _doc(f"scipy.special.{name}", jfn)
        names[name] = op
    names["bernoulli"] = bernoulli
    names.update({n: getattr(_jss, n) for n in PASS if hasattr(_jss, n)})
    return names


def build_stats(dist: str) -> dict[str, Any]:
    """The policy functions of ``heddle.scipy.stats.<dist>``, by name."""
    src = getattr(_jst, dist)
    names: dict[str, Any] = {}
    for name in sorted(n for n in dir(src) if not n.startswith("_")):
        jfn = getattr(src, name)
        if not callable(jfn):
            continue
        first = next(iter(inspect.signature(jfn).parameters))
        fn = _logprob.STATS.get(dist, {}).get(name, jfn)
        op = float_op(fn, f"scipy.stats.{dist}.{name}", values=(first, *STATS[dist]))
        op.__doc__ = _doc(f"scipy.stats.{dist}.{name}", jfn)
        names[name] = op
    return names
