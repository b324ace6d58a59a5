"""``jax.scipy.stats.betabinom`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.betabinom
  >>> heddle.scipy.stats.betabinom.pmf(1, 2, 1.0, 1.0)
  Array(0.33333302, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("betabinom"))
