"""The loss-scale state keeps its types through every update; inject_hyperparams; float32 bounds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from heddle import scaling

F32 = np.float32
GOOD, BAD = {"w": jnp.ones(3)}, {"w": jnp.array([1.0, jnp.nan, 1.0])}
# finite steps until the scale grows, non-finite ones until it backs off, and back again
FLAGS = [True, True, True, False, False, True, False, True, True]


def _types(tree):
    return [
        (np.dtype(x.dtype), jax.typeof(x).weak_type, np.shape(x)) for x in jax.tree.leaves(tree)
    ]


def _state(opt, scale_dtype, count_dtype):
    s = opt.init({"w": jnp.zeros(3)})
    ls = s.loss_scale
    ls = scaling.DynamicLossScale(
        jnp.asarray(ls.scale, scale_dtype), *(jnp.asarray(c, count_dtype) for c in ls[1:])
    )
    return s._replace(loss_scale=ls)


@pytest.mark.parametrize(
    ("scale_dtype", "count_dtype"),
    [
        (jnp.float16, jnp.int32),
        (jnp.bfloat16, jnp.int16),
        (jnp.float32, jnp.uint8),
        (jnp.float16, jnp.uint8),
    ],
)
def test_every_field_keeps_its_dtype_through_every_kind_of_step(
    scale_dtype, count_dtype, transform
):
    opt = scaling.dynamic_loss_scale(
        optax.sgd(0.1), init_scale=2.0**10, growth_interval=2, hysteresis=2
    )
    state = _state(opt, scale_dtype, count_dtype)
    before = _types(state)
    update = transform(lambda g, s: opt.update(g, s, {"w": jnp.zeros(3)}, value=g["w"].sum()))
    for finite in FLAGS:
        _, state = update(GOOD if finite else BAD, state)
        assert _types(state) == before
    assert int(state.loss_scale.skipped) == FLAGS.count(False)


@pytest.mark.parametrize("scale_dtype", [jnp.float16, jnp.float32])
def test_the_state_is_a_lax_scan_carry(scale_dtype):
    """A float16 scale used to come back float32, which lax.scan refuses as a carry."""
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), init_scale=2.0**13, growth_interval=1)
    params = {"w": jnp.zeros(3)}
    state = _state(opt, scale_dtype, jnp.int32)
    grads = jnp.stack([GOOD["w"] if f else BAD["w"] for f in FLAGS])

    def body(carry, g):
        p, s = carry
        u, s = opt.update({"w": g}, s, p)
        return (optax.apply_updates(p, u), s), s.loss_scale.scale

    (_, state), scales = jax.lax.scan(body, (params, state), grads)
    assert scales.dtype == np.dtype(scale_dtype)
    # the reference: the rule in float64, capped at the largest power of two the dtype holds
    top = 2.0**15 if scale_dtype == jnp.float16 else 2.0**24
    s, ref = 2.0**13, []
    for f in FLAGS:
        s = min(s * 2, top) if f else max(s / 2, 1.0)
        ref.append(s)
    assert np.asarray(scales, np.float64).tolist() == ref


def test_a_float16_scale_stops_at_the_largest_power_of_two_it_holds():
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), init_scale=2.0**14, growth_interval=1)
    state = _state(opt, jnp.float16, jnp.int32)
    for _ in range(4):
        _, state = opt.update(GOOD, state, {"w": jnp.zeros(3)})
        assert np.isfinite(float(state.loss_scale.scale))
    assert float(state.loss_scale.scale) == 2.0**15


def test_float32_extremes_stay_finite_and_positive():
    """The largest and smallest bounds float32 holds: the scale never reaches inf or 0."""
    big = float(np.finfo(F32).max)
    tiny = float(np.finfo(F32).tiny)
    opt = scaling.dynamic_loss_scale(
        optax.sgd(0.1), init_scale=2.0**120, min_scale=tiny, max_scale=big, growth_interval=1
    )
    state = opt.init({"w": jnp.zeros(3)})
    step = jax.jit(lambda g, s: opt.update(g, s, {"w": jnp.zeros(3)})[1])
    for _ in range(12):
        state = step(GOOD, state)
    assert float(state.loss_scale.scale) == 2.0**127
    for _ in range(300):
        state = step(BAD, state)
    assert float(state.loss_scale.scale) == tiny == 2.0**-126


def test_inject_hyperparams_builds_and_steps_under_jit():
    """inject_hyperparams passes every number (min_scale included) as an array, traced in update."""
    with jax.numpy_dtype_promotion("standard"):  # optax.adam's own arithmetic
        opt = optax.inject_hyperparams(scaling.dynamic_loss_scale)(
            optax.adam(0.1), growth_interval=2, init_scale=2.0**10
        )
        params = {"w": jnp.ones(3)}
        state = jax.jit(opt.init)(params)
        assert float(state.hyperparams["min_scale"]) == 1.0

        @jax.jit
        def step(params, state, g):
            u, state = opt.update(g, state, params)
            return optax.apply_updates(params, u), state

        for g in (GOOD, GOOD, BAD, GOOD):
            params, state = step(params, state, g)
        ls = scaling.loss_scale_state(state)
        assert (float(ls.scale), int(ls.skipped), int(ls.good_steps)) == (2.0**10, 1, 1)
        # a hyperparameter changed in the state takes effect at the next step
        state.hyperparams["growth_factor"] = jnp.asarray(4.0, jnp.float32)
        params, state = step(params, state, GOOD)
        assert float(scaling.loss_scale(state)) == 2.0**12
        assert scaling.loss_scale(state).dtype == np.dtype("float32")
