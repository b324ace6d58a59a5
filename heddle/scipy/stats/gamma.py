"""``jax.scipy.stats.gamma`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.gamma
  >>> heddle.scipy.stats.gamma.pdf(1.0, 1.0)
  Array(0.36787927, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("gamma"))
