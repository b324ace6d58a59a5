"""Drop-in replacement for ``jax.scipy.sparse.linalg`` under heddle's dtype policy.

``cg``, ``bicgstab`` and ``gmres`` iterate in float32 for narrow floats and round the solution once
to the promotion of ``b``, ``x0`` and of ``A`` and ``M`` where those are arrays. An operator or
preconditioner given as a function is the user's: it receives float32 vectors for narrow floats.
The classification is data in ``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.scipy.sparse.linalg
  >>> a = np.array([[4.0, 1.0], [1.0, 3.0]], ml_dtypes.bfloat16)
  >>> x, info = heddle.scipy.sparse.linalg.cg(a, np.array([1.0, 2.0], ml_dtypes.bfloat16))
  >>> x
  Array([0.0908203, 0.636719], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("sparse.linalg"))
