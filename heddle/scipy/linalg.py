"""Drop-in replacement for ``jax.scipy.linalg`` under heddle's dtype policy.

Every public name of the installed ``jax.scipy.linalg`` exists here. Decompositions, solvers and
matrix functions (``cholesky``, ``lu``, ``qr``, ``svd``, ``eigh``, ``schur``, ``expm``, ``sqrtm``,
``solve``, ``solve_triangular``, ...) run JAX's own implementation in float32 for narrow float inputs
(JAX's LAPACK and QR kernels take no bfloat16 or float16) and round every output once, as
``heddle.numpy.linalg`` does: a real output takes the input's float dtype, a complex one
(``sqrtm``, ``funm``, ``schur(output="complex")``, ``rsf2csf``) the narrowest complex holding it
(complex64), an integer one (``lu_factor``'s pivots) int32; an integer input gives the default
float. Matrices built by copying (``toeplitz``, ``hankel``, ``circulant``, ``block_diag``, ...) keep
the promotion of their inputs, values copied bit-exactly; ``hilbert``, ``pascal``, ``helmert`` and
the other creation functions give the policy's default float (JAX: float64 under ``jax_enable_x64``),
``dft`` its default complex and ``hadamard`` its default int. The classification is data in
``heddle/scipy/_table.py``.

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.scipy.linalg
  >>> a = np.array([[4.0, 1.0], [1.0, 3.0]], ml_dtypes.bfloat16)
  >>> heddle.scipy.linalg.cholesky(a)
  Array([[2, 0.5],
         [0, 1.65625]], dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build

__all__ = _build.export(globals(), _build.namespace("linalg"))
