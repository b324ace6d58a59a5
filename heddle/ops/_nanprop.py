"""Max and min reductions that propagate NaN on every sharding, as they do on one device.

XLA:CPU's cross-device max/min combiner drops NaN: ``jnp.max`` of an 8-way sharded float32 array
holding one NaN returns the largest other value under ``jax.jit`` (``pmax`` in ``shard_map`` too),
while a sum gives NaN and ``argmax`` finds it. Here a float max (or min) is
``where(any(isnan(x)), nan, max(x))`` over the same axes, ``keepdims``, ``initial`` and ``where``:
``any`` combines across devices exactly, so a slice holding a NaN gives NaN wherever its shards
live (with a single device the check, one more pass over the operand, is skipped: XLA's own
reduction propagates NaN there). Values that are not NaN (+-inf and signed zeros included) are JAX's own, bit for bit; the
gradient is JAX's (``where`` passes the cotangent to the max of every slice without a NaN; ``ptp``, a max less a min,
the same way); integer
and bool operands take JAX's plain path. ``nanmax``/``nanmin`` already ignore NaN (JAX replaces it
before reducing and detects all-NaN slices with an exact ``all``) and are JAX's own.

``NUMPY`` maps ``heddle.numpy`` names to these functions (``heddle/numpy.py`` consults it, as it does
``_formulas.NUMPY``); ``reduce`` is the rule for the ``reduce_max``/``reduce_min`` primitives and
``across_devices`` the one for ``pmax``/``pmin``, used by ``heddle.lax`` and by ``heddle.autocast``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.programs._table import Monoid

REDUCTIONS = frozenset({Monoid.MAX.value, Monoid.MIN.value})
"""The max and min reductions (``reduce_max``, ``reduce_min``: the table of primitives'
``Monoid.MAX`` and ``Monoid.MIN``)."""


def _is_float(d: Any) -> bool:
    return bool(jnp.issubdtype(d, jnp.floating))


def _may_shard() -> bool:
    """Whether an array can span devices: with one device every max/min is XLA's own single-device
    reduction, which propagates NaN, and the extra pass over the operand is skipped."""
    return jax.device_count() > 1


def _with_nan(has_nan: jax.Array, out: jax.Array) -> jax.Array:
    return lax.select(has_nan, lax.full_like(out, np.nan), out)


def _propagating(jfn: Callable[..., Any]) -> Callable[..., Any]:
    """``jfn`` (``max``, ``min``, ``amax``, ``amin``, ``ptp``: a reduction selecting with max or
    min), NaN wherever its reduced slice holds one; ``initial`` and ``where`` where ``jfn`` has them
    (``ptp`` has neither)."""

    @functools.wraps(jfn)
    def fn(
        a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, **kw: Any
    ) -> jax.Array:
        m = jfn(a, axis=axis, out=out, keepdims=keepdims, **kw)
        if not _is_float(m.dtype) or not _may_shard():
            return m
        where, initial = kw.get("where"), kw.get("initial")
        has_nan = jnp.any(jnp.isnan(a), axis=axis, keepdims=keepdims, where=where)
        if initial is not None:
            has_nan = has_nan | jnp.isnan(initial)
        return _with_nan(jnp.broadcast_to(has_nan, m.shape), m)

    return fn


def reduce(name: str, operand: Any, axes: Sequence[int], bind: Callable[[Any], Any]) -> Any:
    """``bind(operand)`` (a ``reduce_max``/``reduce_min`` over ``axes``), NaN wherever the reduced
    slice of a float ``operand`` holds one."""
    out = bind(operand)
    if name not in REDUCTIONS or not _is_float(getattr(operand, "dtype", np.float32)):
        return out
    if not _may_shard():
        return out
    has_nan = lax.reduce_or(lax.ne(operand, operand), tuple(axes))
    return _with_nan(has_nan, out)


def across_devices(operand: Any, out: Any, axis_name: Any, axis_index_groups: Any = None) -> Any:
    """``out``, a ``pmax``/``pmin`` of ``operand`` over ``axis_name``, NaN on every device of a group
    where any device's ``operand`` holds NaN at that position (an exact integer sum of the NaN
    flags over the same devices)."""
    if not _is_float(getattr(operand, "dtype", np.float32)) or not _may_shard():
        return out
    flags = lax.convert_element_type(lax.ne(operand, operand), np.int32)
    has_nan = lax.psum(flags, axis_name, axis_index_groups=axis_index_groups) > 0
    return _with_nan(has_nan, out)


NUMPY: dict[str, Callable[..., Any]] = {
    name: _propagating(getattr(jnp, name)) for name in ("max", "min", "amax", "amin", "ptp")
}
"""``heddle.numpy`` names computed here instead of by ``jax.numpy``'s own."""
