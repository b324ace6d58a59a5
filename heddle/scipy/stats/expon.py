"""``jax.scipy.stats.expon`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.expon
  >>> heddle.scipy.stats.expon.cdf(1.0)
  Array(0.63212055, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("expon"))
