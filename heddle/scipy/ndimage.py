"""Drop-in replacement for ``jax.scipy.ndimage`` under heddle's dtype policy.

``map_coordinates`` interpolates in float32 for narrow floats and for integer inputs, with the
coordinates converted to float32 (float64 for a float64 input), and rounds once: a float input keeps
its dtype, an integer input stays integer (rounded half away from zero, as in JAX). ``cval`` is
rounded once to the result dtype. The classification is data in ``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.scipy.ndimage
  >>> image = np.arange(12.0).reshape(3, 4).astype(ml_dtypes.bfloat16)
  >>> heddle.scipy.ndimage.map_coordinates(image, [np.array([0.5, 1.5]), np.array([1.5, 2.5])], 1)
  Array([3.5, 8.5], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("ndimage"))
