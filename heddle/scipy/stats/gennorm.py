"""``jax.scipy.stats.gennorm`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.gennorm
  >>> heddle.scipy.stats.gennorm.pdf(0.0, 2.0)
  Array(0.5641897, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("gennorm"))
