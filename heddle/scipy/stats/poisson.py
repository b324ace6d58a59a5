"""``jax.scipy.stats.poisson`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.poisson
  >>> heddle.scipy.stats.poisson.pmf(0, 1.0)
  Array(0.36787927, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("poisson"))
