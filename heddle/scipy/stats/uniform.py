"""``jax.scipy.stats.uniform`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.uniform
  >>> heddle.scipy.stats.uniform.cdf(0.25)
  Array(0.25, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("uniform"))
