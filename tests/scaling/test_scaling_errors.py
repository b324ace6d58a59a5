"""Bad arguments are refused at construction, with a message whose suggested fix works."""

from __future__ import annotations

import jax
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
    ({"growth_interval": 2**31}, ValueError, "at most 2147483647 (an int32 count)", {"growth_interval": 2000}),
    ({"hysteresis": 1.0}, TypeError, "hysteresis must be an int", {"hysteresis": 1}),
    # numbers float32 (the dtype of the scale) cannot hold: inf or 0 once applied
    ({"max_scale": 1e39}, ValueError, "max_scale must be a number that float32 holds", {"max_scale": 2.0**24}),
    ({"init_scale": 1e39}, ValueError, "init_scale must be a number in", {"init_scale": 2.0**15}),
    ({"min_scale": 1e-50}, ValueError, "min_scale must be a number that float32 holds", {"min_scale": 1.0}),
    ({"min_scale": 1e-39, "init_scale": 1.0}, ValueError, "min_scale must be a number that float32 holds", {"min_scale": 1.0}),
    ({"growth_factor": 1e39}, ValueError, "growth_factor must be a number that float32 holds", {"growth_factor": 2.0}),
    ({"backoff_factor": 1e-50}, ValueError, "backoff_factor must be a number that float32 holds", {"backoff_factor": 0.5}),
    ({"init_scale": np.ones(2)}, TypeError, "init_scale must be a real number", {"init_scale": 2.0**15}),
    ({"max_scale": 1e30 + 1e30j}, TypeError, "max_scale must be a real number", {"max_scale": 2.0**24}),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "fragment", "fix"), BAD_CONSTRUCTION)
def test_bad_arguments_raise_at_construction(kwargs, error, fragment, fix):
    with pytest.raises(error) as info:
        scaling.dynamic_loss_scale(optax.sgd(0.1), **kwargs)
    msg = str(info.value)
    assert fragment in msg
    name, value = next(iter(fix.items()))
    kwargs = {k: v for k, v in kwargs.items() if k != name}
    hint = (
        "e.g. 2.0**15"
        if value == 2.0**15
        else "e.g. 2.0**24"
        if value == 2.0**24
        else f"{name}={value}"
    )
    assert hint in msg
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), **kwargs, **fix)  # the suggested fix works
    assert np.isfinite(float(scaling.loss_scale(opt.init({"w": jnp.ones(1)}))))


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
    assert "loss_scale(opt_state)" in str(info.value) and "2.0**15" in str(info.value)
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1))  # the fixes: loss_scale(opt_state), 2.0**15
    for fix in (scaling.loss_scale(opt.init({"w": jnp.ones(2)})), 2.0**15):
        assert bool(scaling.backward_scaled(lambda w: w.sum(), fix)(jnp.ones(2))[2])


FLOAT32_CANNOT_HOLD = [1e39, 3.5e38, 1e-50, 1e-39, np.float64(1e300)]


def _builders():
    return {
        "backward_scaled": lambda s: scaling.backward_scaled(lambda w: w.sum(), s),
        "StaticLossScale.create": scaling.StaticLossScale.create,
        "DynamicLossScale.create": scaling.DynamicLossScale.create,
    }


@pytest.mark.parametrize("bad", FLOAT32_CANNOT_HOLD)
@pytest.mark.parametrize("where", list(_builders()))
def test_a_scale_float32_cannot_hold_is_refused(where, bad):
    """1e39 would be inf in float32 (the scale's dtype), 1e-50 zero, 1e-39 subnormal."""
    build = _builders()[where]
    with pytest.raises(ValueError, match="positive finite number that float32 holds") as info:
        build(bad)
    assert "2.0**15" in str(info.value)
    build(2.0**15)  # the fix
    assert float(scaling.StaticLossScale.create(2.0**15).scale) == 2.0**15


@pytest.mark.parametrize(
    "bad", [np.ones(2), jnp.full((3,), 8.0), np.ones((1,)), jnp.ones((2, 2)), np.ones(0)]
)
@pytest.mark.parametrize("where", list(_builders()))
def test_a_vector_scale_is_refused_up_front(where, bad):
    build = _builders()[where]
    with pytest.raises(TypeError, match="a loss scale is one number, not an array") as info:
        build(bad)
    assert "2.0**15" in str(info.value) and "loss_scale(opt_state)" in str(info.value)
    build(2.0**15)  # the fix


def test_a_traced_vector_scale_is_refused_when_traced():
    with pytest.raises(TypeError, match="a loss scale is one number"):
        jax.jit(lambda s, w: scaling.backward_scaled(lambda w: w.sum(), s)(w))(
            jnp.ones(2), jnp.ones(2)
        )
    g = jax.jit(lambda s, w: scaling.backward_scaled(lambda w: w.sum(), s)(w)[1])(
        jnp.float32(2.0**15), jnp.ones(2)
    )  # the fix: one number (traced values are not range-checked, as any array argument)
    assert np.asarray(g).tolist() == [1.0, 1.0]


def test_a_state_with_a_vector_scale_is_refused():
    bad = scaling.StaticLossScale(jnp.ones(3))
    with pytest.raises(TypeError, match="a loss scale is one number"):
        scaling.backward_scaled(lambda w: w.sum(), bad)
    scaling.backward_scaled(lambda w: w.sum(), scaling.StaticLossScale.create(2.0**15))


@pytest.mark.parametrize("bad", ["8", 1 + 2j, object()])
def test_state_constructors_refuse_a_non_number(bad):
    with pytest.raises(TypeError, match="a loss scale must be a real number") as info:
        scaling.StaticLossScale.create(bad)
    assert "2.0**15" in str(info.value)
    assert float(scaling.DynamicLossScale.create(2.0**15).scale) == 2.0**15  # the fix


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
    with pytest.raises(ValueError, match="it holds 2 of them") as info:
        scaling.loss_scale(opt.init({"w": jnp.ones(1)}))
    assert "dynamic_loss_scale(optimiser) once" in str(info.value)
    once = scaling.dynamic_loss_scale(optax.chain(optax.sgd(0.1), optax.sgd(0.1)))  # the fix
    assert float(scaling.loss_scale(once.init({"w": jnp.ones(1)}))) == 2.0**15


def _trained_state():
    opt = scaling.dynamic_loss_scale(optax.adam(1e-3), growth_interval=1)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)
    with jax.numpy_dtype_promotion("standard"):  # optax.adam's own arithmetic
        for _ in range(3):
            _, state = opt.update({"w": jnp.ones(3)}, state, params)
    return opt, params, state


def test_loss_scale_after_a_msgpack_restore_without_a_target():
    from flax import serialization

    opt, params, state = _trained_state()
    restored = serialization.msgpack_restore(
        serialization.msgpack_serialize(serialization.to_state_dict(state))
    )
    with pytest.raises(ValueError, match="restored from a checkpoint without a target") as info:
        scaling.loss_scale(restored)
    msg = str(info.value)
    assert "flax.serialization.from_state_dict(opt.init(params), restored)" in msg
    assert "Build the optimiser" not in msg
    fixed = serialization.from_state_dict(opt.init(params), restored)  # the fix
    assert float(scaling.loss_scale(fixed)) == float(scaling.loss_scale(state)) == 2.0**18
    assert int(scaling.loss_scale_state(fixed).since_skip) == 3


def test_loss_scale_after_an_orbax_restore_without_a_target(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    opt, params, state = _trained_state()
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "state", state)
        ckpt.wait_until_finished()
        restored = ckpt.restore(tmp_path / "state")
        with pytest.raises(ValueError, match="restored from a checkpoint without a target") as info:
            scaling.loss_scale(restored)
        assert "orbax.checkpoint.StandardCheckpointer().restore(path, opt.init(params))" in str(
            info.value
        )
        fixed = ckpt.restore(tmp_path / "state", opt.init(params))  # the fix
    assert float(scaling.loss_scale(fixed)) == 2.0**18
    assert int(scaling.loss_scale_state(fixed).since_skip) == 3


def test_inject_hyperparams_with_float16_params_says_to_pass_float32():
    import warnings

    params = {"w": jnp.ones(2, jnp.float16)}
    opt = optax.inject_hyperparams(scaling.dynamic_loss_scale)(optax.sgd(0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # optax's own cast of 2**24 to float16
        with pytest.raises(ValueError, match="max_scale arrived as float16") as info:
            opt.init(params)
    assert "hyperparam_dtype=jnp.float32" in str(info.value)
    fixed = optax.inject_hyperparams(scaling.dynamic_loss_scale, hyperparam_dtype=jnp.float32)
    state = fixed(optax.sgd(0.1)).init(params)  # the fix
    assert float(scaling.loss_scale(state)) == 2.0**15
