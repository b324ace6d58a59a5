"""``jax.scipy.stats.cauchy`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.cauchy
  >>> heddle.scipy.stats.cauchy.cdf(0.0)
  Array(0.5, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("cauchy"))
