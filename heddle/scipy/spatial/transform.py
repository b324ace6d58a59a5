"""``jax.scipy.spatial.transform``: ``Rotation`` and ``Slerp``, JAX's classes re-exported unchanged.

They are classes of many constructors and methods whose arithmetic runs in the dtype of the
quaternions they are built from: build them from float32 data to compute in float32. The
classification is data in ``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np
  >>> from heddle.scipy.spatial.transform import Rotation
  >>> Rotation.from_rotvec(np.array([0.0, 0.0, np.pi / 2], np.float32)).as_euler("xyz").dtype
  dtype('float32')
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("spatial.transform"))
