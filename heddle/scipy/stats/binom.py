"""``jax.scipy.stats.binom`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.binom
  >>> heddle.scipy.stats.binom.pmf(1, 2, 0.5)
  Array(0.5000001, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("binom"))
