"""The proof that matters: float16 cotangents stall training; float32 cotangents do not.

An MLP on scikit-learn's digits (1,797 8x8 images, shipped with the package), mixed precision:
float32 master weights, the forward pass in the compute dtype (plain jax.numpy, as a user's existing
model is written). The loss is the mean cross-entropy of the micro-batch divided by 2**14, the
normalisation a large data-parallel or accumulated run applies (each micro-batch's loss divided by the
global batch). Its cotangents, ~1e-8 at the logits, underflow float16's subnormals (smallest 6e-8):

- with ``jax.grad`` (float16 cotangents) and no loss scaling, float16 gets zero gradients and does
  not learn; bfloat16 has float32's exponent range and learns;
- with ``heddle.autodiff`` (every cotangent of a float16 value is float32, POLICY.md 7) float16
  learns as float32 does, with no loss scaling at all;
- dynamic loss scaling on top changes nothing and never skips a step: no cotangent overflows.

Fixed seeds, full-batch Adam, 150 steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from heddle import scaling

sklearn_datasets = pytest.importorskip("sklearn.datasets")

GLOBAL_BATCH_NORM = 2.0**-14
STEPS = 150


@functools.cache
def digits():
    x, y = sklearn_datasets.load_digits(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(x))
    x, y = (x[idx] / 16.0).astype(np.float32), y[idx].astype(np.int32)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def init(key, sizes=(64, 64, 10)):
    keys = jax.random.split(key, len(sizes) - 1)
    params = {}
    for i, (k, m, n) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True)):
        params[f"w{i}"] = jax.random.normal(k, (m, n), jnp.float32) / np.sqrt(m)
        params[f"b{i}"] = jnp.zeros(n, jnp.float32)
    return params


def forward(params, x, dtype):
    h = x.astype(dtype)
    n = len(params) // 2
    for i in range(n):
        h = h @ params[f"w{i}"].astype(dtype) + params[f"b{i}"].astype(dtype)
        if i < n - 1:
            h = jnp.tanh(h)
    return h


def loss_fn(params, x, y, dtype):
    logp = jax.nn.log_softmax(forward(params, x, dtype))
    ce = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return ce * jnp.asarray(GLOBAL_BATCH_NORM, dtype)


@functools.partial(jax.jit, static_argnames=("dtype", "scaled", "backward"))
def train(params, x, y, *, dtype, scaled, backward):  # backward: "jax", "heddle", "heddle-scaled"
    inner = optax.adam(1e-2, eps=1e-30)  # Adam is scale-invariant: only zeros can stop it
    opt = scaling.dynamic_loss_scale(inner, growth_interval=50) if scaled else inner
    state = opt.init(params)

    def step(_, carry):
        params, state, _ = carry
        scale = scaling.loss_scale(state) if scaled else 1.0
        if backward == "jax":  # float16 cotangents
            value, grads = jax.value_and_grad(loss_fn)(params, x, y, dtype)
        else:
            contractions = "scaled" if backward == "heddle-scaled" else "float32"
            value, grads, _ = scaling.backward_scaled(loss_fn, scale, contractions=contractions)(
                params, x, y, dtype
            )
        extra = {"value": value} if scaled else {}
        updates, state = opt.update(grads, state, params, **extra)
        return optax.apply_updates(params, updates), state, value.astype(jnp.float32)

    params, state, value = jax.lax.fori_loop(0, STEPS, step, (params, state, jnp.float32(0)))
    skipped = scaling.loss_scale_state(state).skipped if scaled else jnp.int32(0)
    return params, value / GLOBAL_BATCH_NORM, skipped


@functools.cache
def run(dtype, scaled, backward="heddle"):
    xtr, ytr, xte, yte = digits()
    with jax.numpy_dtype_promotion("standard"):  # optax's adam mixes int and float internally
        params, loss, skipped = train(
            init(jax.random.key(0)),
            jnp.asarray(xtr),
            jnp.asarray(ytr),
            dtype=dtype,
            scaled=scaled,
            backward=backward,
        )
        logits = forward(params, jnp.asarray(xte), dtype)
    acc = float(np.mean(np.asarray(jnp.argmax(logits, -1)) == yte))
    return acc, float(loss), int(skipped)


def test_float32_learns():
    acc, loss, _ = run(jnp.float32, False)
    assert acc >= 0.95 and loss < 0.1


def test_float16_cotangents_without_loss_scaling_stall():
    acc, loss, _ = run(jnp.float16, False, "jax")
    assert acc < 0.5 or not np.isfinite(loss)
    assert not loss < 1.0  # near log(10) = 2.3: it did not learn


def test_float16_with_float32_cotangents_matches_float32_without_loss_scaling():
    acc32, loss32, _ = run(jnp.float32, False)
    acc, loss, _ = run(jnp.float16, False)
    assert acc >= acc32 - 0.02 and loss < 2 * loss32 + 0.02


def test_float16_with_narrow_backward_contractions_matches_float32_without_loss_scaling():
    """contractions="scaled": the backward matmuls read a scaled float16 copy of each float32
    cotangent; still no underflow, so no loss scaling."""
    acc32, loss32, _ = run(jnp.float32, False)
    acc, loss, _ = run(jnp.float16, False, "heddle-scaled")
    assert acc >= acc32 - 0.02 and loss < 2 * loss32 + 0.02


def test_float16_with_dynamic_loss_scaling_matches_float32_and_never_skips():
    acc32, loss32, _ = run(jnp.float32, False)
    acc, loss, skipped = run(jnp.float16, True)
    assert acc >= acc32 - 0.02 and loss < 2 * loss32 + 0.02
    assert skipped == 0  # float32 cotangents: the scale grows without overflowing


def test_bfloat16_without_loss_scaling_matches_float32():
    acc32, _, _ = run(jnp.float32, False)
    for backward in ("jax", "heddle"):
        acc, _, _ = run(jnp.bfloat16, False, backward)
        assert acc >= acc32 - 0.02
