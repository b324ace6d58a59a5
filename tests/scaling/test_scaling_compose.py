"""Composition with optax.chain and optax.MultiSteps, loss_scale lookup, and the float16 clip trap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from heddle import autodiff, scaling

F32 = jnp.float32


@pytest.fixture(autouse=True)
def _standard_promotion():
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int and float counters internally
        yield


def _same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb, strict=True)
    )


PARAMS = {"w": jnp.linspace(-1.0, 1.0, 4, dtype=F32), "b": jnp.zeros((), F32)}


def _grads(k, bad=False):
    g = {"w": jnp.linspace(0.1, 0.4, 4, dtype=F32) * (k + 1), "b": jnp.asarray(0.5 * k, F32)}
    if bad:
        g["w"] = g["w"].at[1].set(jnp.nan)
    return g


def test_chain_clip_adam_skips_as_a_whole_and_matches_on_finite_steps():
    inner = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))
    opt = jax.jit(scaling.dynamic_loss_scale(inner).update)
    ref = jax.jit(inner.update)
    s, r = scaling.dynamic_loss_scale(inner).init(PARAMS), inner.init(PARAMS)
    for k in range(5):
        bad = k == 2
        before = s.inner_state
        u, s = opt(_grads(k, bad), s, PARAMS)
        if bad:
            assert _same(s.inner_state, before)
            assert all(not np.asarray(x).any() for x in jax.tree.leaves(u))
            continue
        v, r = ref(_grads(k), r, PARAMS)
        assert _same(u, v) and _same(s.inner_state, r)
    assert int(s.loss_scale.skipped) == 1


def test_multisteps_inside_skips_a_nonfinite_microbatch():
    """dynamic_loss_scale(MultiSteps(adam, 2)): the NaN micro-batch never reaches the accumulator,
    and the run continues exactly as a run that never saw it."""
    k = 2
    ours = scaling.dynamic_loss_scale(optax.MultiSteps(optax.adam(1e-2), every_k_schedule=k))
    ref = optax.MultiSteps(optax.adam(1e-2), every_k_schedule=k)
    s, r = ours.init(PARAMS), ref.init(PARAMS)
    p, q = PARAMS, PARAMS
    good = [_grads(i) for i in range(6)]
    stream = [good[0], _grads(9, bad=True), *good[1:]]
    for g in stream:
        u, s = jax.jit(ours.update)(g, s, p)
        p = optax.apply_updates(p, u)
    for g in good:
        v, r = jax.jit(ref.update)(g, r, q)
        q = optax.apply_updates(q, v)
    assert _same(p, q) and _same(s.inner_state, r)
    assert np.isfinite(np.asarray(s.inner_state.acc_grads["w"])).all()
    assert float(scaling.loss_scale(s)) == 2.0**14


def test_multisteps_poisoning_trap():
    """optax.MultiSteps resets its accumulator by multiplying by zero: one NaN micro-batch poisons it
    for good (the trap heddle's composition above avoids)."""
    ms = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2)
    s = ms.init(PARAMS)
    s = ms.update(_grads(0, bad=True), s, PARAMS)[1]
    for i in range(6):
        s = ms.update(_grads(i), s, PARAMS)[1]
    assert np.isnan(np.asarray(s.acc_grads["w"])).any()


def test_loss_scale_reads_through_wrappers():
    opt_in = scaling.dynamic_loss_scale(optax.sgd(1e-3), init_scale=2.0**7)
    wrapped = {
        "plain": opt_in,
        "chain": optax.chain(optax.clip_by_global_norm(1.0), opt_in),
        "multisteps outside": optax.MultiSteps(opt_in, every_k_schedule=3),
        "multisteps inside": scaling.dynamic_loss_scale(
            optax.MultiSteps(optax.sgd(1e-3), every_k_schedule=3), init_scale=2.0**7
        ),
        "named chain": optax.named_chain(("clip", optax.clip(1.0)), ("scaled", opt_in)),
    }
    for name, opt in wrapped.items():
        state = opt.init(PARAMS)
        assert float(scaling.loss_scale(state)) == 2.0**7, name
        assert scaling.loss_scale(state).dtype == F32
        _, state = opt.update(_grads(0, bad=True), state, PARAMS)
        if name != "multisteps outside":  # MultiSteps outside only calls the inner every k steps
            assert float(scaling.loss_scale(state)) == 2.0**6, name
            assert int(scaling.loss_scale_state(state).skipped) == 1, name
    assert scaling.loss_scale_state(scaling.NoLossScale()).scale.item() == 1.0
    assert scaling.loss_scale(scaling.StaticLossScale.create(8.0)).item() == 8.0


def test_clip_by_global_norm_float16_trap():
    """float16 gradients whose global norm overflows make clip_by_global_norm zero the update
    silently; heddle's float32 gradients of the same float16 parameters clip correctly."""
    w = jnp.ones(128, jnp.float16)
    loss = lambda w: jnp.sum(w * jnp.float16(30.0))  # each gradient 30: norm^2 = 115200 > 65504
    clip = optax.clip_by_global_norm(1.0)
    g16 = jax.grad(loss)(w)
    u16, _ = clip.update(g16, clip.init(w))
    assert g16.dtype == jnp.float16 and not np.asarray(u16).any()  # the trap: all zeros
    g32 = autodiff.grad(loss)(w)
    u32, _ = clip.update(g32, clip.init(w))
    assert g32.dtype == F32
    norm = float(np.linalg.norm(np.asarray(u32, np.float64)))
    assert abs(norm - 1.0) < 1e-6
    np.testing.assert_allclose(np.asarray(u32), np.full(128, 1 / np.sqrt(128)), rtol=1e-6)
