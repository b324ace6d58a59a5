"""Bad arguments are refused at construction, with a message whose suggested fix works."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from heddle import scaling

BAD_CONSTRUCTION = [
    # (kwargs, error, message fragment, kwargs the message's fix suggests)
    ({"init_scale": 0.0}, ValueError, "init_scale must be a number in", {"init_scale": 2.0**15}),
    ({"init_scale": -4.0}, ValueError, "init_scale must be a number in", {"init_scale": 2.0**15}),
    ({"init_scale": np.inf}, ValueError, "init_scale must be a number in", {"init_scale": 2.0**15}),
    ({"init_scale": 2.0**30}, ValueError, "init_scale must be a number in", {"init_scale": 2.0**15}),
    ({"min_scale": 0.0}, ValueError, "min_scale must be a number in (0.0", {"min_scale": 1.0}),
    ({"min_scale": "1"}, TypeError, "min_scale must be a real number", {"min_scale": 1.0}),
    ({"max_scale": 0.5}, ValueError, "max_scale must be a number in [1.0", {"max_scale": 2.0**24}),
    ({"growth_factor": 0.5}, ValueError, "growth_factor must be a number in [1.0", {"growth_factor": 2.0}),
    ({"backoff_factor": 2.0}, ValueError, "backoff_factor must be a number in (0.0, 1.0]", {"backoff_factor": 0.5}),
    ({"backoff_factor": 0.0}, ValueError, "backoff_factor must be a number in (0.0, 1.0]", {"backoff_factor": 0.5}),
    ({"backoff_factor": True}, TypeError, "backoff_factor must be a real number", {"backoff_factor": 0.5}),
    ({"growth_interval": 2.5}, TypeError, "growth_interval must be an int", {"growth_interval": 2000}),
    ({"growth_interval": True}, TypeError, "growth_interval must be an int", {"growth_interval": 2000}),
    ({"growth_interval": 0}, ValueError, "growth_interval must be at least 1", {"growth_interval": 2000}),
    ({"hysteresis": 0}, ValueError, "hysteresis must be at least 1", {"hysteresis": 1}),
    ({"hysteresis": 1.0}, TypeError, "hysteresis must be an int", {"hysteresis": 1}),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "fragment", "fix"), BAD_CONSTRUCTION)
def test_bad_arguments_raise_at_construction(kwargs, error, fragment, fix):
    with pytest.raises(error) as info:
        scaling.dynamic_loss_scale(optax.sgd(0.1), **kwargs)
    msg = str(info.value)
    assert fragment in msg
    name, value = next(iter(fix.items()))
    hint = (
        "e.g. 2.0**15"
        if value == 2.0**15
        else "e.g. 2.0**24"
        if value == 2.0**24
        else f"{name}={value}"
    )
    assert hint in msg
    scaling.dynamic_loss_scale(optax.sgd(0.1), **fix)  # the suggested fix works


def test_inner_must_be_a_transformation():
    with pytest.raises(TypeError, match="must be an optax gradient transformation"):
        scaling.dynamic_loss_scale(optax.adam)  # the factory, not the transformation
    scaling.dynamic_loss_scale(optax.adam(1e-3))  # the fix


def test_integral_numpy_interval_is_accepted():
    scaling.dynamic_loss_scale(optax.sgd(0.1), growth_interval=np.int64(10), hysteresis=np.int8(2))


@pytest.mark.parametrize("bad", [0.0, -1.0, np.inf, np.nan])
def test_backward_scaled_refuses_a_bad_scale(bad):
    with pytest.raises(ValueError, match="positive finite") as info:
        scaling.backward_scaled(lambda w: w.sum(), bad)
    assert "2.0**15" in str(info.value)
    scaling.backward_scaled(lambda w: w.sum(), 2.0**15)(jnp.ones(2))  # the fix


@pytest.mark.parametrize("bad", ["1024", [1024.0], {"scale": 1.0}, None])
def test_backward_scaled_refuses_a_non_number(bad):
    with pytest.raises(TypeError, match="the scale must be a number") as info:
        scaling.backward_scaled(lambda w: w.sum(), bad)
    assert "loss_scale(opt_state)" in str(info.value)


@pytest.mark.parametrize("bad", [0.0, -2.0, np.nan])
def test_state_constructors_refuse_a_bad_scale(bad):
    with pytest.raises(ValueError, match="positive finite"):
        scaling.DynamicLossScale.create(bad)
    with pytest.raises(ValueError, match="positive finite"):
        scaling.StaticLossScale.create(bad)
    assert float(scaling.StaticLossScale.create(2.0**15).scale) == 2.0**15  # the fix


def test_loss_scale_without_a_scale_in_the_state():
    opt = optax.sgd(0.1)
    with pytest.raises(ValueError, match="holds no loss-scale state") as info:
        scaling.loss_scale(opt.init({"w": jnp.ones(1)}))
    assert "dynamic_loss_scale(optimiser)" in str(info.value)
    fixed = scaling.dynamic_loss_scale(opt)  # the fix
    assert float(scaling.loss_scale(fixed.init({"w": jnp.ones(1)}))) == 2.0**15


def test_loss_scale_with_two_scales_in_the_state():
    opt = optax.chain(
        scaling.dynamic_loss_scale(optax.sgd(0.1)), scaling.dynamic_loss_scale(optax.sgd(0.1))
    )
    with pytest.raises(ValueError, match="it holds 2 of them"):
        scaling.loss_scale(opt.init({"w": jnp.ones(1)}))
