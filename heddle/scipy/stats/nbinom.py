"""``jax.scipy.stats.nbinom`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.nbinom
  >>> heddle.scipy.stats.nbinom.pmf(0, 1, 0.5)
  Array(0.49999976, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

_NAMES = _build.distribution("nbinom")
globals().update(_NAMES)

__all__ = sorted(_NAMES)
