"""``jax.scipy.stats.nbinom`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.nbinom
  >>> heddle.scipy.stats.nbinom.pmf(0, 1, 0.5)
  Array(0.49999976, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("nbinom"))
