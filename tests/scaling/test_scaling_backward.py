"""backward_scaled and grads_finite."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from heddle import autodiff, scaling

F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32


def f16_model(params, x):
    """A plain-jax.numpy float16 model: its backward pass holds float16 cotangents."""
    h = jnp.tanh(x @ params["w"].astype(F16))
    return jnp.mean(h * h)


def _params():
    rng = np.random.default_rng(0)
    return (
        {"w": jnp.asarray(rng.standard_normal((8, 4)) * 0.3, F32)},
        jnp.asarray(rng.standard_normal((16, 8)), F32).astype(F16),
    )


@pytest.mark.parametrize("scale", [1.0, 2.0**10, 2.0**15])
def test_value_is_the_unscaled_loss_and_grads_are_unscaled_exactly(scale, transform):
    params, x = _params()
    value, grads, finite = transform(scaling.backward_scaled(f16_model, scale))(params, x)
    assert value.dtype == F16 and value.item() == transform(f16_model)(params, x).item()
    assert bool(finite) and grads["w"].dtype == F32
    # Reference: the float64 gradient of the float64 model at the same parameters.
    with jax.enable_x64(True):
        ref = jax.grad(lambda p: jnp.mean(jnp.tanh(jnp.asarray(x, jnp.float64) @ p) ** 2))(
            jnp.asarray(params["w"], jnp.float64)
        )
    err = np.abs(np.asarray(grads["w"], np.float64) - np.asarray(ref)).max()
    assert err <= 2.0**-10 * np.abs(np.asarray(ref)).max()  # float16 forward and cotangents


def test_power_of_two_scale_unscales_exactly():
    """The backward pass of 64 * loss, divided by 64: exactly the scaled run's gradients (the
    float16 cotangents stay normal numbers here, so scaling by a power of two is exact)."""
    params, x = _params()
    _, g1, _ = scaling.backward_scaled(lambda p, x: f16_model(p, x) * F16(64.0), 1.0)(params, x)
    _, g2, _ = scaling.backward_scaled(f16_model, 64.0)(params, x)
    assert np.array_equal(np.asarray(g1["w"]) / np.float32(64.0), np.asarray(g2["w"]))


def test_overflow_is_reported_not_finite(transform):
    params, x = _params()
    # The cotangents are float32 (heddle.autodiff), so only a scale near float32's range overflows:
    # the gradient, a sum of up to 16 inputs of magnitude ~1, times 2**126.
    big = {"w": params["w"] * 50.0}
    _, grads, finite = transform(
        scaling.backward_scaled(lambda p, x: jnp.sum(x @ p["w"].astype(F16)), 2.0**126)
    )(big, x)
    assert not bool(finite)
    assert not np.isfinite(np.asarray(grads["w"])).all()
    _, grads, finite = transform(
        scaling.backward_scaled(lambda p, x: jnp.sum(x @ p["w"].astype(F16)), 1.0)
    )(big, x)
    assert bool(finite)


def test_scale_from_states_and_arrays():
    params, x = _params()
    expected = scaling.backward_scaled(f16_model, 2.0**8)(params, x)[1]["w"]
    for scale in (
        scaling.StaticLossScale.create(2.0**8),
        scaling.DynamicLossScale.create(2.0**8),
        jnp.float32(2.0**8),
        np.float32(2.0**8),
        256,
    ):
        got = scaling.backward_scaled(f16_model, scale)(params, x)[1]["w"]
        assert np.array_equal(np.asarray(got), np.asarray(expected))
    got = scaling.backward_scaled(f16_model, scaling.NoLossScale())(params, x)[1]["w"]
    ref = autodiff.grad(f16_model)(params, x)["w"]
    assert np.array_equal(np.asarray(got), np.asarray(ref))


def test_traced_scale_inside_jit():
    params, x = _params()
    fn = jax.jit(lambda s, p, x: scaling.backward_scaled(f16_model, s)(p, x))
    a = fn(jnp.float32(2.0**8), params, x)[1]["w"]
    b = jax.jit(lambda p, x: scaling.backward_scaled(f16_model, 2.0**8)(p, x))(params, x)[1]["w"]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_argnums_has_aux_and_grad_dtypes():
    def loss(a, b, c):
        out = (a.astype(F32) * b.astype(F32)).sum() * c.astype(F32)
        return out, {"mean": out / 3}

    a, b = jnp.ones(3, F16), jnp.full(3, 2.0, BF16)
    (value, aux), grads, finite = scaling.backward_scaled(
        loss, 4.0, argnums=(0, 1, 2), has_aux=True
    )(a, b, jnp.int32(2))
    assert value.item() == 12.0 and aux["mean"].item() == 4.0 and bool(finite)
    ga, gb, gc = grads
    assert (ga.dtype, gb.dtype, gc.dtype) == (F32, F32, F32)
    assert ga.tolist() == [4.0] * 3 and gb.tolist() == [2.0] * 3 and gc.item() == 0.0


# grads_finite


def _leaf(dtype, bad=None):
    x = np.ones(5, dtype=dtype)
    if bad is not None:
        x[2] = bad
    return jnp.asarray(x)


@pytest.mark.parametrize(
    "dtype", [np.float16, ml_dtypes.bfloat16, np.float32, ml_dtypes.float8_e5m2]
)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_grads_finite_finds_any_nonfinite_element(dtype, bad, transform):
    tree = {"ok": _leaf(np.float32), "n": jnp.arange(3), "b": jnp.array([True, False])}
    assert bool(transform(scaling.grads_finite)(tree))
    tree["bad"] = [_leaf(dtype), _leaf(dtype, bad)]
    flag = transform(scaling.grads_finite)(tree)
    assert flag.dtype == jnp.bool_ and flag.shape == () and not bool(flag)


def test_grads_finite_complex_and_empty():
    assert bool(scaling.grads_finite({}))
    assert bool(scaling.grads_finite(jnp.array([1 + 1j], jnp.complex64)))
    assert not bool(scaling.grads_finite(jnp.array([1 + 1j * np.inf], jnp.complex64)))
    assert not bool(scaling.grads_finite(jnp.array([np.nan + 0j], jnp.complex64)))


def test_grads_finite_with_x64():
    with jax.enable_x64(True):
        assert not bool(scaling.grads_finite([jnp.array([1.0, np.inf], jnp.float64)]))
        assert bool(scaling.grads_finite([jnp.array([1.0, 2.0], jnp.float64), jnp.int64(3)]))


def test_grads_finite_axis_name_agrees_across_the_axis():
    """Under a named vmap axis, one non-finite member makes every member report False."""
    x = jnp.ones((4, 3), F32).at[2, 1].set(jnp.inf)
    local = jax.vmap(scaling.grads_finite)(x)
    agreed = jax.vmap(lambda r: scaling.grads_finite(r, axis_name="i"), axis_name="i")(x)
    assert local.tolist() == [True, True, False, True]
    assert agreed.tolist() == [False] * 4
    fine = jax.vmap(lambda r: scaling.grads_finite(r, axis_name="i"), axis_name="i")(
        jnp.ones((4, 3))
    )
    assert fine.tolist() == [True] * 4
