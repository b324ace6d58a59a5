"""``jax.scipy.stats.geom`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.geom
  >>> heddle.scipy.stats.geom.pmf(1, 0.5)
  Array(0.5, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("geom"))
