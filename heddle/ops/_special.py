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

from heddle.ops import _formulas
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


FORMULAS: dict[str, Callable[..., Any]] = {
    "polygamma": polygamma,
    "spence": spence,
    "exp1": exp1,
    "expi": expi,
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
        fn = _formulas.STATS.get(dist, {}).get(name, jfn)
        op = float_op(fn, f"scipy.stats.{dist}.{name}", values=(first, *STATS[dist]))
        op.__doc__ = _doc(f"scipy.stats.{dist}.{name}", jfn)
        names[name] = op
    return names
