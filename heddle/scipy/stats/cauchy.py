"""``jax.scipy.stats.cauchy`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.cauchy
  >>> heddle.scipy.stats.cauchy.cdf(0.0)
  Array(0.5, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

_NAMES = _build.distribution("cauchy")
globals().update(_NAMES)

__all__ = sorted(_NAMES)
