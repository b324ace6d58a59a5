"""Drop-in replacement for ``jax.scipy``'s ``special`` and ``stats`` under heddle's dtype policy.

``heddle.scipy.special`` has every public name of the installed ``jax.scipy.special``;
``heddle.scipy.stats`` has ``norm`` and ``logistic``. Every function runs JAX's implementation in
float32 for narrow inputs and rounds once (``logsumexp`` sums in float32). The classification is data
in ``heddle/ops/_special.py``.

Examples:
  >>> import numpy as np
  >>> import heddle.scipy
  >>> x = np.zeros(100_000, np.float16)
  >>> float(heddle.scipy.special.logsumexp(x))  # jax.scipy.special.logsumexp gives inf
  11.515625
"""

from heddle.scipy import special as special
from heddle.scipy import stats as stats

__all__ = ["special", "stats"]
