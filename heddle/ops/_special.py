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
    "polygamma": ("n", "x"),
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


def build_special() -> dict[str, Any]:
    """The policy functions of heddle.scipy.special, by name."""
    names: dict[str, Any] = {}
    for name, values in SPECIAL.items():
        jfn = getattr(_jss, name, None)
        if jfn is None:
            continue
        fn = _formulas.SPECIAL.get(name, jfn)
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
        op = float_op(jfn, f"scipy.stats.{dist}.{name}", values=(first, *STATS[dist]))
        op.__doc__ = _doc(f"scipy.stats.{dist}.{name}", jfn)
        names[name] = op
    return names
