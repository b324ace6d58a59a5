"""Drop-in replacement for ``jax.scipy.special`` under heddle's dtype policy.

Every public name of the installed ``jax.scipy.special`` exists here. Each function computes in float32
for narrow inputs and rounds once; ``bernoulli`` gives the policy's default float. The classification
is data in ``heddle/ops/_special.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.scipy.special
  >>> heddle.scipy.special.erf(np.array([0.5], ml_dtypes.bfloat16))
  Array([0.519531], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.ops import _special
from heddle.scipy import _build

__all__ = _build.export(globals(), _special.build_special())
