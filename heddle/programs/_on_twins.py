"""One rule for autocast and heddle.autodiff: a value computed on narrow operands whose derivative
flows through their float32 twins.

autocast's narrow dot and its tie-counting selections (``reduce_max``, ``cummax``, ...), and
heddle.autodiff's contractions, each compute their value on the narrow operands (at the narrow
kernel's speed, with no float32 copy for a selection) and must differentiate as the same function of
the float32 twins, which hold the narrow values exactly, so that every cotangent stays float32
(POLICY.md 7). ``on_twins`` is that rule, once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero


def on_twins(
    value: Callable[..., Any],
    derivative: Callable[..., Any],
    twins: Sequence[Any],
    narrow: Sequence[Any] = (),
) -> Any:
    """``value(*twins, *narrow)``, differentiated as ``derivative(*twins)``.

    Args:
      value: computes the result; it may read the narrow operands (or narrow the twins itself).
      derivative: the same function of the twins alone (float32): its JVP is the result's, with a
        term only for each twin whose tangent is not zero (no float32 work for an operand that is
        not differentiated).
      twins: float32 arrays, each holding a narrow value exactly; the derivative reaches them.
      narrow: further operands ``value`` reads, not differentiated (the narrow values themselves,
        whose tangents are their twins').

    Returns:
      ``value(*twins, *narrow)``, of ``derivative``'s dtype.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jnp.asarray([1.0, 3.0, 3.0], jnp.bfloat16)
      >>> tw = x.astype(jnp.float32)
      >>> top = lambda tw, x: jnp.max(x).astype(jnp.float32)
      >>> float(on_twins(top, jnp.max, [tw], [x]))
      3.0
      >>> jax.grad(lambda t: on_twins(top, jnp.max, [t], [x]))(tw).tolist()  # ties share it
      [0.0, 0.5, 0.5]
    """
    n = len(twins)

    @jax.custom_jvp
    def fn(*args: Any) -> Any:
        return value(*args)

    @functools.partial(fn.defjvp, symbolic_zeros=True)
    def _(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        out = value(*primals)
        live = [i for i in range(n) if not isinstance(tangents[i], SymbolicZero)]
        if not live:
            return out, jax.tree.map(lax.zeros_like_array, out)  # type: ignore[attr-defined]

        def moving(*xs: Any) -> Any:
            args = list(primals[:n])
            for i, x in zip(live, xs, strict=True):
                args[i] = x
            return derivative(*args)

        _, t = jax.jvp(moving, [primals[i] for i in live], [tangents[i] for i in live])
        return out, t

    return fn(*twins, *narrow)
