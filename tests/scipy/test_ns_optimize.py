"""heddle.scipy.optimize.minimize: the optimiser runs in float32 for a narrow ``x0``; the result's
arrays are rounded once to ``x0``'s dtype, its counts int32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import heddle.scipy.optimize as hopt

BF16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)


def test_minimize_bfgs_in_float32():
    seen = []

    def fun(x):
        seen.append(x.dtype)
        return jnp.sum((x - jnp.array([3.0, -0.1])) ** 2)

    x0 = np.array([1.0, 1.0], BF16)
    out = hopt.minimize(fun, x0, method="BFGS")
    assert set(seen) == {F32}  # the user's function sees float32
    assert out.x.dtype == BF16 and out.fun.dtype == BF16 and out.jac.dtype == BF16
    assert out.nit.dtype == np.int32 and out.status.dtype == np.int32 and out.success.dtype == bool
    np.testing.assert_array_equal(out.x, np.array([3.0, -0.1], BF16))  # float32's optimum, rounded
    traced = jax.eval_shape(jax.jit(lambda x: hopt.minimize(fun, x, method="BFGS")), x0)
    assert traced.x.dtype == BF16 and traced.nit.dtype == np.int32
