"""``jax.scipy.stats.wrapcauchy`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.wrapcauchy
  >>> heddle.scipy.stats.wrapcauchy.pdf(0.0, 0.5)
  Array(0.47746485, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("wrapcauchy"))
