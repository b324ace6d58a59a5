"""``jax.scipy.stats.gumbel_l`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.gumbel_l
  >>> heddle.scipy.stats.gumbel_l.cdf(0.0)
  Array(0.63212055, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("gumbel_l"))
