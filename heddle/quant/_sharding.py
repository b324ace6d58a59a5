"""Block layouts on arrays sharded with explicit mesh axes (``jax.make_mesh``'s default).

Under explicit sharding every array's type says which mesh axes split each of its dimensions, and a
reshape must say how the result is split (``out_sharding``). Quantisation reshapes one axis ``k``
of ``n`` elements into ``(n // b, b)`` (blocks, packing groups) and back. The split can follow the
sharding when each device holds whole blocks (the mesh axes move to the ``n // b`` dimension) or when
there is a single block (they move to the ``b`` dimension: the block's reduction crosses devices);
otherwise a block would straddle two devices, and ``check`` refuses it with a ``FormatError`` that
names the reshard that works. Arrays without explicit axes (unsharded, or sharded with
``AxisType.Auto``) are reshaped as they are: XLA's partitioner handles them.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from heddle.policy._errors import message
from heddle.quant._formats import FormatError


def _sharding(x: Any) -> NamedSharding | None:
    """The explicit ``NamedSharding`` of ``x``'s type, or None where no dimension has one."""
    sh = getattr(jax.typeof(x), "sharding", None)
    if not isinstance(sh, NamedSharding) or sh.mesh.empty:
        return None
    return sh if any(e is not None for e in sh.spec) else None


def _entries(sh: NamedSharding, ndim: int) -> list[Any]:
    spec = list(sh.spec)
    return spec + [None] * (ndim - len(spec))


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def devices_along(x: Any, k: int) -> tuple[tuple[str, ...], int]:
    """The explicit mesh axes splitting dimension ``k`` of ``x`` and how many devices that is."""
    sh = _sharding(x)
    if sh is None:
        return (), 1
    axes = _axes(_entries(sh, jnp.ndim(x))[k])
    return axes, math.prod(sh.mesh.shape[a] for a in axes)


def _joined(axes: tuple[str, ...]) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def split(x: jax.Array, k: int, b: int) -> jax.Array:
    """``x`` with dimension ``k`` (``n`` elements) reshaped to ``(n // b, b)``."""
    shape = (*x.shape[:k], x.shape[k] // b, b, *x.shape[k + 1 :])
    sh = _sharding(x)
    if sh is None:
        return x.reshape(shape)
    spec = _entries(sh, x.ndim)
    _, m = devices_along(x, k)
    g = x.shape[k] // b
    if g % m == 0:
        parts = [spec[k], None]
    elif g == 1:
        parts = [None, spec[k]]
    else:  # ``check`` refuses these layouts before any tracing
        raise AssertionError(f"blocks of {b} straddle the {m} shards of dimension {k}")
    out = NamedSharding(sh.mesh, P(*spec[:k], *parts, *spec[k + 1 :]))
    return jax.lax.reshape(x, shape, out_sharding=out)


def merge(x: jax.Array, k: int) -> jax.Array:
    """``x`` with dimensions ``k`` and ``k + 1`` merged into one (inverse of ``split``)."""
    shape = (*x.shape[:k], x.shape[k] * x.shape[k + 1], *x.shape[k + 2 :])
    sh = _sharding(x)
    if sh is None:
        return x.reshape(shape)
    spec = _entries(sh, x.ndim)
    merged = _joined(_axes(spec[k]) + _axes(spec[k + 1]))  # row-major: outer axes first
    out = NamedSharding(sh.mesh, P(*spec[:k], merged, *spec[k + 2 :]))
    return jax.lax.reshape(x, shape, out_sharding=out)


def broadcast_like(s: jax.Array, x: jax.Array) -> jax.Array:
    """``s`` broadcast to ``x``'s shape, split over the devices like ``x``."""
    return jnp.broadcast_to(s, x.shape, out_sharding=_sharding(x))


def _replicated_along(x: Any, k: int) -> str:
    sh = _sharding(x)
    spec = _entries(sh, jnp.ndim(x))
    spec[k] = None
    return repr(P(*spec))


def check(
    x: Any, k: int, n: int, groups: tuple[tuple[int, str], ...], call: str, name: str
) -> None:
    """Refuses a layout whose groups along dimension ``k`` straddle devices.

    Args:
      x: the array (or tracer) whose sharding is checked; it may be ``n``'s packed form.
      k: the dimension, counted from the start.
      n: the number of elements along ``k`` that ``groups`` split.
      groups: ``(size, what)`` per reshape along ``k``: ``size`` consecutive elements go together.
        A group of all ``n`` elements is a single block, which may cross devices (its reduction
        does); pass packing groups only where there is packing.
      call: the user's call, for the message.
      name: how the fix names ``x`` (``x``, ``q.data``).

    Raises:
      FormatError: a group spans two devices' shards.
    """
    axes, m = devices_along(x, k)
    if m == 1:
        return
    per = n // m
    for size, what in groups:
        if per % size == 0 or size == n:
            continue
        raise FormatError(
            message(
                call,
                f"{what} of {size} elements along axis {k} would straddle devices: the axis's "
                f"{n} elements are split over {m} devices (mesh axes {', '.join(axes)}), {per} per "
                f"device, which is not a multiple of {size}",
                f"Reshard {name} so that axis {k} is not split: jax.sharding.reshard({name}, "
                f"NamedSharding(mesh, {_replicated_along(x, k)})), or split it over fewer "
                f"devices, so that each holds a multiple of {size} elements.",
            )
        )
