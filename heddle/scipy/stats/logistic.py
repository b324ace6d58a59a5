"""``jax.scipy.stats.logistic`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.logistic
  >>> heddle.scipy.stats.logistic.cdf(0.0)
  Array(0.5, dtype=float32)
"""

from __future__ import annotations

from heddle.ops import _special

_NAMES = _special.build_stats("logistic")
globals().update(_NAMES)

__all__ = sorted(_NAMES)
