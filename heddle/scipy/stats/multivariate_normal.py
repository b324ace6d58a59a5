"""``jax.scipy.stats.multivariate_normal`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.multivariate_normal
  >>> heddle.scipy.stats.multivariate_normal.pdf([0.0, 0.0], [0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]])
  Array(0.15915495, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("multivariate_normal"))
