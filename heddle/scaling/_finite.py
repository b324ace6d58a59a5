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


def grads_finite(tree: Any, *, axis_name: Hashable | Sequence[Hashable] | None = None) -> jax.Array:
    """Whether every element of every floating leaf of ``tree`` is finite, as one ``bool[]``.

    Integer, bool and float0 leaves are ignored (always finite); complex leaves count as finite when
    both parts are. The result stays on device: no host synchronisation, usable inside ``jax.jit``.

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
      >>> scaling.grads_finite([jnp.ones(3), jnp.array([1.0, jnp.inf], jnp.float16)]).item()
      False
    """
    # One float reduction per leaf: max |x| is NaN if any element is NaN (XLA's max propagates NaN)
    # and inf if any is infinite; it vectorises better than a reduction over booleans.
    peaks = [jnp.max(jnp.abs(x)) for x in jax.tree.leaves(tree) if _inexact(x) and np.size(x)]
    flags = [jnp.isfinite(m) for m in peaks]
    flag = jnp.stack(flags).all() if flags else jnp.array(True)
    if axis_name is not None:
        flag = lax.pmin(flag.astype(jnp.int32), axis_name) == 1
    return flag
