"""Drop-in replacement for ``jax.scipy.integrate`` under heddle's dtype policy.

``trapezoid`` is a float-only sum: computed in float32 for narrow floats (every partial sum in
float32), rounded once to the promotion of ``y``, ``x`` and ``dx``. The classification is data in
``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np
  >>> import heddle.scipy.integrate
  >>> heddle.scipy.integrate.trapezoid(np.array([0.0, 1.0, 2.0], np.float16), dx=0.5)
  Array(1., dtype=float16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("integrate"))
