"""Drop-in replacement for ``jax.scipy.interpolate`` under heddle's dtype policy.

``RegularGridInterpolator`` holds its grid and values in the accumulation dtype (float32 for narrow
floats) and interpolates there; each call's result is rounded once to the promotion of ``values``
and ``fill_value`` (bfloat16 values give bfloat16 results). The classification is data in
``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> from heddle.scipy.interpolate import RegularGridInterpolator
  >>> grid = (np.array([0.0, 1.0, 2.0]),)
  >>> f = RegularGridInterpolator(grid, np.array([0.0, 10.0, 30.0], ml_dtypes.bfloat16))
  >>> f(np.array([[0.5], [1.25]], np.float32))
  Array([5, 15], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("interpolate"))
