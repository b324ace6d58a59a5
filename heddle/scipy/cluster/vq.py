"""Drop-in replacement for ``jax.scipy.cluster.vq`` under heddle's dtype policy.

``vq`` computes the distances in float32 for narrow floats and rounds them once to the promotion of
``obs`` and ``code_book``; the codes are int32, the index dtype. The classification is data in
``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.scipy.cluster.vq
  >>> obs = np.array([[0.0], [0.9], [2.2]], ml_dtypes.bfloat16)
  >>> heddle.scipy.cluster.vq.vq(obs, np.array([[0.0], [2.0]], ml_dtypes.bfloat16))
  (Array([0, 0, 1], dtype=int32), Array([0, 0.898438, 0.203125], dtype=bfloat16))
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("cluster.vq"))
