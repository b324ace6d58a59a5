"""``jax.scipy.stats.dirichlet`` under heddle's dtype policy: float32 for narrow inputs, rounded once.

Examples:
  >>> import heddle.scipy.stats.dirichlet
  >>> heddle.scipy.stats.dirichlet.pdf([0.25, 0.75], [1.0, 1.0])
  Array(0.99999905, dtype=float32)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.distribution("dirichlet"))
