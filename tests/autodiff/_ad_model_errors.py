"""Relative gradient errors of the test models against the policy's float64 reference, as JSON.

Run as a script by test_models.py with XLA's CPU YNN fusion off: that fusion computes a contraction,
an elementwise op and a reduction in one float32 kernel and skips the bfloat16 rounding written
between them (``convert(f32 -> bf16 -> f32)``), so under ``jax.jit`` on CPU a gradient can be
rounded less often than the policy says (more precise, not less) and would not match the reference.
"""

from __future__ import annotations

import json
import sys

import _ad_models as M
import _ad_reference as R
import jax
import jax.numpy as jnp
import numpy as np

from heddle import autodiff


def setup(which, dtype):
    rng = np.random.default_rng(0)
    if which == "mlp":
        p64, x64, model = M.init_mlp(rng, (64, 128, 10)), rng.standard_normal((256, 64)), M.mlp
    else:
        p64, x64, model = M.init_block(rng), rng.standard_normal((8, 16, 32)), M.block
    params = {k: jnp.asarray(v, jnp.float32).astype(dtype) for k, v in p64.items()}
    x = jnp.asarray(x64, jnp.float32).astype(dtype)

    def loss(xp, p, x):
        return M.mean_square(xp, model(xp, p, x))

    def recorded(p):
        rec = R.Recording()
        return loss(rec, p, x), rec.values

    return params, x, loss, recorded


def rel_err(g, ref):
    return max(
        float(np.linalg.norm(np.asarray(g[k], np.float64) - ref[k]) / np.linalg.norm(ref[k]))
        for k in ref
    )


def main(cases):
    out = {}
    for case in cases:
        which, dtype = case.split("-")
        params, x, loss, recorded = setup(which, jnp.dtype(dtype))
        row = {}
        for name, vg in (("heddle", autodiff.value_and_grad), ("jax", jax.value_and_grad)):
            (value, values), grads = jax.jit(vg(recorded, has_aux=True))(params)
            row[name] = {
                "err": rel_err(grads, R.replay_grad(loss, values, params, x)),
                "dtypes": sorted({str(g.dtype) for g in grads.values()}),
                "value_is_last_op": value.tobytes() == values[-1].tobytes(),
            }
        out[case] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
