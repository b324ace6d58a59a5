"""``jax.scipy.stats.chi2`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.chi2
  >>> heddle.scipy.stats.chi2.cdf(2.0, 2)
  Array(0.6321202, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("chi2"))
