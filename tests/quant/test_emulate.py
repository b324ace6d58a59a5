"""``emulate(fn, dtype)`` equals ``fn`` written with explicit narrow heddle ops, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle.numpy as hnp
import heddle.quant as hq
from heddle.policy import UnknownDTypeError


def _params(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (16, 64), "b1": (64,), "w2": (64, 10), "b2": (10,)}
    return {
        k: jnp.asarray(rng.standard_normal(s).astype(np.float32) / 4) for k, s in shapes.items()
    }


def mlp(p, x):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    h = jax.nn.relu(h * 1.7 - 0.1)
    return h @ p["w2"] + p["b2"]


def mlp_narrow(p, x, d):
    """The same MLP with every stored value explicitly in ``d``: heddle ops round once each."""
    p = {k: hnp.astype(v, d) for k, v in p.items()}
    x = hnp.astype(x, d)
    h = hnp.tanh(hnp.matmul(x, p["w1"]) + p["b1"])
    h = hnp.maximum(h * 1.7 - 0.1, 0.0)
    return hnp.matmul(h, p["w2"]) + p["b2"]


@pytest.mark.parametrize("d", ["bfloat16", "float16"])
def test_mlp_equals_explicit_narrow_heddle_ops(d, transform):
    """The reference runs op by op (each heddle op is its own kernel, rounding once on store).

    Under an outer ``jax.jit`` XLA on CPU may drop a narrow rounding between two fused ops
    (``--xla_allow_excess_precision``, on by default), so the reference is run eagerly.
    """
    p = _params()
    x = jnp.asarray(np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32))
    got = transform(hq.emulate(mlp, d))(p, x)
    want = mlp_narrow(p, x, d)
    assert got.dtype == jnp.float32 and want.dtype == np.dtype(d)  # emulate keeps fn's dtypes
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.float32)))
    # and it is not the float32 result: the emulation really rounds
    assert not np.array_equal(np.asarray(got), np.asarray(mlp(p, x)))


def test_rounding_reaches_inside_scan_cond_and_while(transform):
    def f(xs):
        c = jax.lax.scan(lambda c, v: (c * 1.01 + v, c), jnp.float32(0.0), xs)[0]
        c = jax.lax.cond(c > 0, lambda a: a / 3.0, lambda a: a * 3.0, c)
        return jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 1.1), (0, c))[1]

    xs = jnp.asarray(np.random.default_rng(2).uniform(0, 1, 20).astype(np.float32))
    got = transform(hq.emulate(f, "bfloat16"))(xs)

    c = hnp.astype(jnp.float32(0.0), "bfloat16")
    for v in hnp.astype(xs, "bfloat16"):
        c = c * 1.01 + v  # a Python float meets bfloat16: rounded once to bfloat16
    c = c / 3.0 if float(c) > 0 else c * 3.0
    for _ in range(3):
        c = c * 1.1
    assert got.dtype == jnp.float32
    assert float(got) == float(c)
    assert float(got) != float(f(xs))


def test_pytrees_literals_and_dtypes():
    def f(d, scale):
        return {"y": d["a"] * 0.1 + scale, "n": jnp.sum(d["i"]), "h": d["h"] * 3.0}

    d = {"a": jnp.float32(1.0), "i": jnp.arange(4, dtype=jnp.int32), "h": jnp.float16(1.001)}
    out = hq.emulate(f, "bfloat16")(d, jnp.float32(0.0))
    assert set(out) == {"y", "n", "h"}
    assert out["y"].dtype == jnp.float32 and float(out["y"]) == float(jnp.bfloat16(0.1))
    assert out["n"].dtype == jnp.int32 and int(out["n"]) == 6  # integers untouched
    # float16 cannot hold every bfloat16 value: float16 values are left as they are
    assert out["h"].dtype == jnp.float16 and float(out["h"]) == float(jnp.float16(1.001) * 3)


def test_complex_values_round_each_part():
    def f(z):
        return z * (1.0 + 0.01j)

    z = jnp.complex64(1.01 + 2.01j)
    out = complex(hq.emulate(f, "bfloat16")(z))

    def b(v):
        return float(jnp.bfloat16(v))

    zr, zi, c = b(1.01), b(2.01), b(0.01)
    assert out == complex(b(zr - zi * c), b(zr * c + zi))


def test_vmap_of_an_emulated_function():
    p = _params()
    xs = jnp.asarray(np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32))
    em = hq.emulate(mlp, "bfloat16")
    batched = jax.jit(jax.vmap(em, in_axes=(None, 0)))(p, xs)
    one = jax.jit(em)
    for i in range(4):
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(one(p, xs[i])))


def test_emulating_a_wider_dtype_changes_nothing():
    p = _params()
    x = jnp.ones((2, 16), jnp.float32)
    np.testing.assert_array_equal(
        np.asarray(hq.emulate(mlp, "float32")(p, x)), np.asarray(mlp(p, x))
    )


def test_errors():
    with pytest.raises(TypeError, match=r"emulate\(fn, 'int8'\).*emulate\(fn, 'bfloat16'\)"):
        hq.emulate(mlp, "int8")
    with pytest.raises(UnknownDTypeError):
        hq.emulate(mlp, "bfloat17")


def test_float64_values_round_once_under_x64():
    with jax.enable_x64(True):
        x = jnp.asarray([1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-8], jnp.float64)
        out = jax.jit(hq.emulate(lambda v: v * 1.0, "bfloat16"))(x)
        assert out.dtype == jnp.float64
        # one rounding: just above the halfway point goes up; the exact tie goes to even (1.0)
        assert np.asarray(out).tolist() == [1.0078125, 1.0]


def test_rounding_reaches_inside_custom_vjp_and_checkpoint(transform):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x) * 1.01

    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x),))

    def g(x):
        return jax.checkpoint(lambda a: f(a) + 0.3)(x)

    x = jnp.linspace(0, 1, 16, dtype=jnp.float32)
    got = transform(hq.emulate(g, "bfloat16"))(x)
    want = hnp.sin(hnp.astype(x, "bfloat16")) * 1.01 + 0.3  # op by op, each rounded once
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.float32)))
