"""``jax.scipy.stats.beta`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.beta
  >>> heddle.scipy.stats.beta.pdf(0.5, 2.0, 2.0)
  Array(1.5000013, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("beta"))
