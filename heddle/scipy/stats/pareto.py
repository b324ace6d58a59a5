"""``jax.scipy.stats.pareto`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.pareto
  >>> heddle.scipy.stats.pareto.cdf(2.0, 1.0)
  Array(0.5, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("pareto"))
