"""``jax.scipy.stats.multinomial`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import numpy as np
  >>> import heddle.scipy.stats.multinomial
  >>> heddle.scipy.stats.multinomial.pmf(np.array([1, 1], np.int32), 2, [0.5, 0.5])
  Array(0.50000024, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("multinomial"))
