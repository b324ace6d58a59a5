"""``jax.scipy.stats.vonmises`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.vonmises
  >>> heddle.scipy.stats.vonmises.pdf(0.0, 1.0)
  Array(0.34171045, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("vonmises"))
