"""Drop-in replacement for ``jax.scipy.fft`` under heddle's dtype policy.

``dct``, ``dctn``, ``idct`` and ``idctn`` do as ``heddle.numpy.fft``: a narrow float input (which
JAX's FFT does not take) is transformed in float32 and the real result is rounded once to the input's
dtype (``dct`` of bfloat16 is bfloat16); float32 and float64 compute in their own dtype; an integer
input gives the default float. The classification is data in ``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.scipy.fft
  >>> heddle.scipy.fft.dct(np.array([1.0, 2.0], ml_dtypes.bfloat16))
  Array([6, -1.41406], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("fft"))
