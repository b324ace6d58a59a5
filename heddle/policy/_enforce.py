"""``enforce()``: make JAX's own implicit promotion strict, so code that bypasses heddle raises."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def enforce() -> Iterator[None]:
    """Inside the block, a raw jax.numpy call that mixes dtypes raises instead of promoting.

    heddle's own ops convert explicitly and keep working. This is JAX's
    ``jax.numpy_dtype_promotion('strict')``, scoped to the block and thread.

    Returns:
      A context manager.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import policy
      >>> with policy.enforce():
      ...     try:
      ...         jnp.ones(2, jnp.bfloat16) + jnp.ones(2, jnp.float32)
      ...     except Exception as e:
      ...         type(e).__name__
      'TypePromotionError'
    """
    with jax.numpy_dtype_promotion("strict"):
        yield
