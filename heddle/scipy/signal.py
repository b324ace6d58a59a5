"""Drop-in replacement for ``jax.scipy.signal`` under heddle's dtype policy.

Every function is float-only, as in JAX (an integer input gives the default float, float32).
Convolutions and correlations (``convolve``, ``correlate``, ``convolve2d``, ``correlate2d``) are
contractions: narrow floats accumulate in float32 (the whole convolution runs there, at full float32
precision) and round once. ``fftconvolve``, ``stft``, ``istft``, ``csd``, ``welch`` and ``detrend``
compute a narrow float (which JAX's FFT does not take) in float32 / complex64; every
output is rounded once, a real one (frequencies, segment times, a spectral density) to the input's
float dtype, a complex one (``stft``'s ``Zxx``) to the narrowest complex holding it (complex64). A
window given as an array and ``fs`` are converted to the compute dtype, not promoted. The
classification is data in ``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np
  >>> import heddle.scipy.signal
  >>> x = np.full(4096, 0.01, np.float16)
  >>> float(heddle.scipy.signal.convolve(x, x, mode="valid")[0])  # 4096 * 1e-4, summed in float32
  0.4096...
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("signal"))
