"""``jax.scipy.stats``' ``norm`` and ``logistic`` under heddle's dtype policy.

Each function computes in float32 for narrow inputs and rounds once, so ``norm.logpdf`` or
``logistic.cdf`` of a bfloat16 array is the float32 value rounded once. Other distributions: use
``jax.scipy.stats``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> from heddle.scipy.stats import norm
  >>> norm.logpdf(np.array([0.0], ml_dtypes.bfloat16))
  Array([-0.918945], dtype=bfloat16)
"""

from heddle.scipy.stats import logistic as logistic
from heddle.scipy.stats import norm as norm

__all__ = ["logistic", "norm"]
