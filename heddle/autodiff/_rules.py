"""The contraction rule behind heddle's float32 derivatives in forward mode.

``contract(lhs, rhs, lhs32, rhs32, ...)`` is ``lax.dot_general`` on the operands as given (narrow, so
the forward runs exactly the contraction it replaces), whose tangent is the same contraction of the
float32 twins ``lhs32``/``rhs32`` (same values): ``heddle.programs._on_twins.on_twins``, the rule
autocast's narrow dot and tie-counting selections use too. It is a ``jax.custom_jvp`` function, so
forward mode, reverse mode (JAX linearises the JVP rule and transposes it) and ``vmap`` all apply.
The tangent contraction accumulates in float32, as JAX's own transpose does; its result is a float32
cotangent for the twin, summed with the twin's other cotangents before any rounding.

At the top level of an evaluation differentiated in reverse mode only (``grad``, ``vjp``,
``jacrev``) contractions whose operands are exact in float32 take ``_scaled.contraction`` instead:
the same values, with backward contractions laid out for the backend (``_scaled``'s docstring says
why and where). This rule is the one forward mode (``jacfwd``, ``hessian``) needs, the one inside
``scan``, ``cond`` and checkpoint bodies, and the one for a float32 result of a float64 operand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax

from heddle.programs._on_twins import on_twins

_F32 = np.dtype("float32")


@functools.cache
def _contraction(
    dimension_numbers: Any, precision: Any, preferred_element_type: Any, out_sharding: Any
):
    kw = dict(
        dimension_numbers=dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
        out_sharding=out_sharding,
    )

    def dot(lhs32, rhs32, lhs, rhs):
        del lhs32, rhs32
        return lax.dot_general(lhs, rhs, **kw)

    def derivative(lhs32, rhs32):
        return lax.dot_general(lhs32, rhs32, **kw)

    return lambda lhs, rhs, lhs32, rhs32: on_twins(dot, derivative, [lhs32, rhs32], [lhs, rhs])


@functools.cache
def read_as(d: np.dtype) -> Callable[[Any, Any], Any]:
    """``f(twin, v)``: ``convert(v, d)`` as the plain program binds it, differentiated as
    ``convert(twin, d)`` (with ``v`` already of dtype ``d``: ``v`` as given, bit for bit, a
    signalling NaN's payload included, differentiated through its float32 twin). The value is the plain conversion's, so XLA compiles it as it compiles
    the plain program (where it keeps a fused narrow intermediate unrounded, ``excess precision``,
    the value is the same); the derivative reaches the twin, which every use of ``v`` shares."""

    @jax.custom_jvp
    def f(twin: Any, v: Any) -> Any:
        del twin
        return lax.convert_element_type(v, d)

    @f.defjvp
    def _(primals: Any, tangents: Any) -> tuple[Any, Any]:
        return f(*primals), lax.convert_element_type(tangents[0], d)

    return f


def widen_exactly(x: jax.Array, dtype: Any = np.float32) -> jax.Array:
    """The narrow ``x`` converted to the wider ``dtype`` with its rounding pinned: XLA may otherwise
    drop the round trip of a narrow result computed in float32 (``xla_allow_excess_precision``)
    and pass the unrounded value on. ``x`` crosses an ``optimization_barrier``, which XLA does not
    look through, so the widening reads the rounded value, subnormals included, at the cost of one
    conversion (no rounding recomputed)."""
    return lax.convert_element_type(lax.optimization_barrier(x), dtype)


def like(x: jax.Array, other: jax.Array) -> jax.Array:
    """``x`` converted, explicitly and exactly, to ``other``'s dtype where they differ (a narrow
    residual meeting a float32 tangent): the contraction then has one operand dtype."""
    return x if x.dtype == other.dtype else widen_exactly(x, other.dtype)


def contract(
    lhs: jax.Array,
    rhs: jax.Array,
    lhs32: jax.Array,
    rhs32: jax.Array,
    *,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = _F32,
    out_sharding: Any = None,
) -> jax.Array:
    """``lax.dot_general(lhs, rhs)`` whose derivative flows through float32 twins of the operands.

    Args:
      lhs: the left operand as the forward pass uses it (narrow or float32).
      rhs: the right operand as the forward pass uses it.
      lhs32: a float32 array with exactly the values of ``lhs``; gradients reach ``lhs`` through it.
      rhs32: the same for ``rhs``.
      dimension_numbers: as ``lax.dot_general``.
      precision: as ``lax.dot_general``.
      preferred_element_type: the accumulation and result dtype (float32 for narrow operands).
      out_sharding: as ``lax.dot_general``.

    Returns:
      Bit for bit ``lax.dot_general(lhs, rhs, ...)``.
    """
    fn = _contraction(
        _freeze(dimension_numbers), precision, np.dtype(preferred_element_type), out_sharding
    )
    return fn(lhs, rhs, lhs32, rhs32)


def _freeze(x: Any) -> Any:
    return tuple(_freeze(e) for e in x) if isinstance(x, list | tuple) else x
