"""``jax.scipy.stats.vonmises`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.vonmises
  >>> heddle.scipy.stats.vonmises.pdf(0.0, 1.0)
  Array(0.34171045, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

_NAMES = _build.distribution("vonmises")
globals().update(_NAMES)

__all__ = sorted(_NAMES)
