"""``jax.checkpoint`` under heddle.autodiff: cotangents cross a checkpoint in float32 both ways, so a
checkpointed layer differentiates as well as the same layer without one.

The reference is a float64 backward pass through the forward values the narrow program computed
(each intermediate pinned to them with a straight-through ``stop_gradient``): what the gradient
would be if no cotangent were rounded at all."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from heddle import autodiff


def _layer(h, w):
    return jnp.tanh(h @ w) + h


WRAPS = {
    "plain": _layer,
    "checkpoint": jax.checkpoint(_layer),
    "jit(checkpoint)": jax.jit(jax.checkpoint(_layer)),
    "checkpoint(jit)": jax.checkpoint(jax.jit(_layer)),
}


def _reference(ws, x):
    """Gradients of the mean square of the stack's output, in float64 through the narrow forward
    values."""
    hs, ms, ts = [x], [], []
    for w in ws:
        m = hs[-1] @ w
        t = jnp.tanh(m)
        ms.append(m)
        ts.append(t)
        hs.append(t + hs[-1])
    with jax.enable_x64(True):

        def pin(e, rec):
            return e + jax.lax.stop_gradient(jnp.asarray(np.asarray(rec, np.float64)) - e)

        def ref(ws):
            h = jnp.asarray(x, jnp.float64)
            for i, w in enumerate(ws):
                m = pin(h @ w, ms[i])
                h = pin(pin(jnp.tanh(m), ts[i]) + h, hs[i + 1])
            return jnp.mean(h**2)

        return [np.asarray(g) for g in jax.grad(ref)([jnp.asarray(w, jnp.float64) for w in ws])]


@pytest.mark.parametrize("wrap", list(WRAPS))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_a_checkpointed_stack_differentiates_as_the_plain_one(dtype, wrap):
    layer = WRAPS[wrap]

    def loss(ws, x):
        h = x
        for w in ws:
            h = layer(h, w)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.normal(0, 0.5, (16, 16))).astype(dtype) for _ in range(4)]
    x = jnp.asarray(rng.normal(0, 1, (8, 16))).astype(dtype)
    want = _reference(ws, x)
    # eagerly: the reference's forward values are the eager program's (under jax.jit XLA may keep
    # a fused bfloat16 intermediate unrounded, so the jitted program's own values differ)
    got = autodiff.grad(loss)(ws, x)
    for g, r in zip(got, want, strict=True):
        assert g.dtype == jnp.float32
        # float32 cotangents: a few float32 roundings per layer (a cotangent rounded to the narrow
        # dtype at a checkpoint's boundary gave 7e-3 to 9e-3 here)
        err = np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
        assert err < 1e-5, (wrap, err)


def _scanned(remat):
    layer = jax.checkpoint(_layer) if remat else _layer

    def loss(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (layer(h, w), None), x, ws)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    return loss


@pytest.mark.parametrize("contractions", ["float32", "scaled"])
def test_a_checkpoint_inside_a_scan_body_keeps_rematerialising(contractions):
    """Scan over checkpointed layers (the usual way to stack a deep model): the derivative's
    float32 version of the scan keeps the checkpoint, so the backward pass saves what jax.grad's
    does (before: the checkpoint was dropped there, 87 MiB of temporaries where jax.grad has 25 on
    8 bfloat16 layers of 2048 x 256), and the gradient is the one without the checkpoint."""
    rng = np.random.default_rng(1)
    ws = jnp.asarray(rng.normal(0, 1 / 16, (8, 256, 256))).astype(jnp.bfloat16)
    x = jnp.asarray(rng.normal(0, 1, (2048, 256))).astype(jnp.bfloat16)

    def temporaries(grad):
        return jax.jit(grad).lower(ws, x).compile().memory_analysis().temp_size_in_bytes

    ours = temporaries(autodiff.grad(_scanned(True), contractions=contractions))
    theirs = temporaries(jax.grad(_scanned(True)))
    unchecked = temporaries(autodiff.grad(_scanned(False), contractions=contractions))
    assert ours <= 1.1 * theirs and ours < unchecked / 2, (ours, theirs, unchecked)
    got = autodiff.grad(_scanned(True), contractions=contractions)(ws[:2, :16, :16], x[:8, :16])
    want = autodiff.grad(_scanned(False), contractions=contractions)(ws[:2, :16, :16], x[:8, :16])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
