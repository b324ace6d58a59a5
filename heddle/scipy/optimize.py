"""Drop-in replacement for ``jax.scipy.optimize`` under heddle's dtype policy.

``minimize`` runs JAX's optimiser in float32 for a narrow ``x0`` (the user's function receives
float32 arguments) and rounds the result's arrays once to ``x0``'s dtype; its counts are int32.
``OptimizeResults`` is JAX's. The classification is data in ``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import jax.numpy as jnp
  >>> import heddle.scipy.optimize
  >>> x0 = np.array([1.0, -1.0], ml_dtypes.bfloat16)
  >>> out = heddle.scipy.optimize.minimize(lambda x: jnp.sum((x - 3.0) ** 2), x0, method="BFGS")
  >>> out.x
  Array([3, 3], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("optimize"))
