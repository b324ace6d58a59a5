"""``jax.scipy.stats.norm`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.norm
  >>> heddle.scipy.stats.norm.cdf(0.0)
  Array(0.5, dtype=float32)
"""

from __future__ import annotations

from heddle.ops import _special
from heddle.scipy import _build

__all__ = _build.export(globals(), _special.build_stats("norm"))
