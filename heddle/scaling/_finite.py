"""One on-device finiteness flag for a whole pytree of gradients."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _inexact(x: Any) -> bool:
    d = getattr(x, "dtype", None)
    if d is None:
        return isinstance(x, float | complex)
    try:
        return bool(jnp.issubdtype(np.dtype(d), jnp.inexact))
    except TypeError:
        return False  # float0, PRNG keys


def _leaf_finite(x: Any) -> jax.Array:
    """One fused reduction: every element's exponent field says finite (real and imaginary part).

    ``lax.is_finite`` reads each element's encoding, so it is exact for every float format:
    those without inf (``float8_e4m3fn``, the ``*fnuz`` formats, ``float8_e8m0fnu``, whose NaN is
    0xFF), those without NaN (``float4_e2m1fn``), and complex parts that ``abs`` would overflow.
    The reduction is over booleans, so no NaN has to survive a ``max`` (XLA's cross-device max
    under ``jax.jit`` may drop it) and no inf has to survive a sum.
    """
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.all(lax.is_finite(lax.real(x)) & lax.is_finite(lax.imag(x)))
    return jnp.all(lax.is_finite(x))


def grads_finite(tree: Any, *, axis_name: Hashable | Sequence[Hashable] | None = None) -> jax.Array:
    """Whether every element of every floating leaf of ``tree`` is finite, as one ``bool[]``.

    Integer, bool and float0 leaves are ignored (always finite); complex leaves count as finite when
    both parts are. Exact for every float dtype of the policy, including the formats without inf
    (``float8_e4m3fn``, ``*fnuz``, ``float8_e8m0fnu``), and for NaN, inf and -inf in arrays sharded
    over several devices. The result stays on device: no host synchronisation, usable inside
    ``jax.jit``.

    Args:
      tree: a pytree of arrays (gradients, updates, anything).
      axis_name: inside ``shard_map``/``pmap``/``vmap`` with a named axis, the axis (or axes) over
        which to agree: the result is then True on every device only if the leaves are finite on
        every device, so replicas always take the same decision.

    Returns:
      A scalar ``bool`` array.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import scaling
      >>> scaling.grads_finite({"w": jnp.ones(3), "n": jnp.int32(1)}).item()
      True
      >>> scaling.grads_finite([jnp.ones(3), jnp.array([1.0, jnp.nan], jnp.float16)]).item()
      False
    """
    flags = [_leaf_finite(x) for x in jax.tree.leaves(tree) if _inexact(x) and np.size(x)]
    flag = jnp.stack(flags).all() if flags else jnp.array(True)
    if axis_name is not None:
        # An integer minimum: nothing to propagate, every member gets the same 0 or 1.
        flag = lax.pmin(flag.astype(jnp.int32), axis_name) == 1
    return flag
