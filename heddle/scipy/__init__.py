"""Drop-in replacement for ``jax.scipy`` under heddle's dtype policy: every submodule, every name.

``heddle.scipy`` has each submodule of the installed ``jax.scipy`` (``cluster``, ``fft``,
``integrate``, ``interpolate``, ``linalg``, ``ndimage``, ``optimize``, ``signal``, ``sparse``,
``spatial``, ``special``, ``stats``) with every public name of it. Every function of narrow float
inputs (bfloat16, float16, float8) runs JAX's implementation in float32 and rounds its result once to
the dtype heddle's lattice gives: ``logsumexp``, ``convolve``, ``trapezoid`` and the other sums
accumulate in float32, linear algebra and FFTs (which JAX does not run on narrow floats) compute in
float32 / complex64, integer and bool results (codes, pivots, counts) are int32, and functions that
only copy values (``toeplitz``, ``block_diag``, ``mode``'s modes) keep the input's dtype. The few
names that are classes of their own arithmetic (``spatial.transform.Rotation``, ``Slerp``,
``optimize.OptimizeResults``) are JAX's, unchanged. The classification is data: in
``heddle/ops/_special.py`` for ``special`` (and ``stats.norm``, ``stats.logistic``), in
``heddle/scipy/_table.py`` for the rest; a test compares it with the installed ``jax.scipy``.

Examples:
  >>> import numpy as np
  >>> import heddle.scipy
  >>> x = np.zeros(100_000, np.float16)
  >>> float(heddle.scipy.special.logsumexp(x))  # jax.scipy.special.logsumexp gives inf
  11.515625
"""

from heddle.scipy import cluster as cluster
from heddle.scipy import fft as fft
from heddle.scipy import integrate as integrate
from heddle.scipy import interpolate as interpolate
from heddle.scipy import linalg as linalg
from heddle.scipy import ndimage as ndimage
from heddle.scipy import optimize as optimize
from heddle.scipy import signal as signal
from heddle.scipy import sparse as sparse
from heddle.scipy import spatial as spatial
from heddle.scipy import special as special
from heddle.scipy import stats as stats

__all__ = [
    "cluster",
    "fft",
    "integrate",
    "interpolate",
    "linalg",
    "ndimage",
    "optimize",
    "signal",
    "sparse",
    "spatial",
    "special",
    "stats",
]
