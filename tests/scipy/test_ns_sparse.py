"""heddle.scipy.sparse.linalg: the Krylov solvers iterate in float32 for narrow floats, with the
operator as a matrix (a value operand) or as the user's function.

Reference: NumPy's float64 solve on the same narrow matrix, rounded once (float32 iteration to a
1e-6 tolerance is far inside half an ulp of bfloat16; either neighbour next to a midpoint).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.sparse.linalg as hsl

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


@pytest.mark.parametrize("name", ["cg", "bicgstab", "gmres"])
def test_solvers_with_a_matrix_and_with_a_function(name):
    d = BF16
    a = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]], d)
    b = np.array([1.0, -2.0, 0.5], d)
    solve = getattr(hsl, name)
    ref = np.linalg.solve(a.astype(np.float64), b.astype(np.float64))
    x, info = jax.jit(lambda a, b: solve(a, b, tol=1e-7))(a, b)
    assert x.dtype == d and (info is None or int(info) == 0)  # gmres reports 0, the others None
    u = _ulp(ref, d)
    assert (np.abs(np.asarray(x, np.float64) - ref) <= u).all()
    x16 = jax.eval_shape(lambda a, b: solve(a, b, x0=np.zeros(3, F32))[0], a.astype(F16), b)
    assert x16.dtype == F32  # a float32 x0: the promotion
    if name != "cg":
        return
    seen = []
    a32 = jnp.asarray(a, F32)

    def matvec(v):
        seen.append(v.dtype)
        return a32 @ v

    x_fn, _ = solve(matvec, b, tol=1e-7)  # the user's operator: it sees float32 vectors
    assert x_fn.dtype == d and set(seen) == {F32}
    assert (np.abs(np.asarray(x_fn, np.float64) - ref) <= u).all()
