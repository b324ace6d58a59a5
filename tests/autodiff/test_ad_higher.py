"""Jacobians and the Hessian under POLICY.md 7."""

from __future__ import annotations

import _ad_models as M
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import autodiff

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16


def cube(x):
    return (x.astype(F32) ** 3).astype(x.dtype)


@pytest.mark.parametrize("jac", [autodiff.jacfwd, autodiff.jacrev, autodiff.jacobian])
def test_jacobian_dtype_and_values(jac, transform):
    x = jnp.array([1.0, -2.0, 0.5], BF16)
    j = transform(jac(cube))(x)
    assert j.dtype == F32 and j.shape == (3, 3)
    np.testing.assert_array_equal(np.asarray(j), np.diag([3.0, 12.0, 0.75]))


@pytest.mark.parametrize("jac", [autodiff.jacfwd, autodiff.jacrev])
def test_jacobian_structure_matches_jax(jac, transform):
    jax_jac = {autodiff.jacfwd: jax.jacfwd, autodiff.jacrev: jax.jacrev}[jac]

    def f(a, b):
        return {"s": (a.astype(F32) * b.astype(F32)).sum(), "v": a.astype(F32) * 2}

    a, b = jnp.ones(2, BF16), jnp.full(2, 3.0, F16)
    ours = transform(jac(f, argnums=(0, 1)))(a, b)
    theirs = jax_jac(f, argnums=(0, 1))(a.astype(F32), b.astype(F32))
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for x, y in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert x.dtype == F32 and np.array_equal(np.asarray(x), np.asarray(y))


def test_jacobian_integer_inputs_and_aux(transform):
    def f(x, n):
        y = x.astype(F32) * n.astype(F32)
        return y, {"n": n}

    x, n = jnp.ones(2, BF16), jnp.array([2, 3], jnp.int32)
    for jac in (autodiff.jacfwd, autodiff.jacrev):
        (jx, jn), aux = transform(jac(f, argnums=(0, 1), has_aux=True))(x, n)
        assert jx.dtype == jn.dtype == F32 and jn.shape == (2, 2) and not np.asarray(jn).any()
        np.testing.assert_array_equal(np.asarray(jx), np.diag([2.0, 3.0]))
        assert aux["n"].tolist() == [2, 3]


def test_jacobian_blocks_promote_with_x64():
    """float32 output, float64 input: both modes give float64 blocks (JAX: jacfwd float32).

    JAX builds the Jacobian's basis with the inputs' common dtype, which strict promotion refuses
    for float32 with float64 (jax.jacrev alike), hence standard promotion here.
    """
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        f = lambda x, y: (x.astype(F32) * 2, y * 3)
        x, y = jnp.ones(2, jnp.float64), jnp.ones(2, BF16)
        for jac in (autodiff.jacfwd, autodiff.jacrev):
            (jxx, jxy), (jyx, jyy) = jac(f, argnums=(0, 1))(x, y)
            assert (jxx.dtype, jxy.dtype, jyx.dtype, jyy.dtype) == (
                jnp.float64,
                F32,
                jnp.float64,
                F32,
            )
            np.testing.assert_array_equal(np.asarray(jxx), 2 * np.eye(2))


def test_hessian_dtype_and_exact_values(transform):
    x = jnp.array([1.0, 2.0, -0.5], BF16)
    h = transform(autodiff.hessian(lambda x: (x.astype(F32) ** 3).sum().astype(BF16)))(x)
    assert h.dtype == F32
    np.testing.assert_array_equal(np.asarray(h), np.diag([6.0, 12.0, -3.0]))


def _small_model():
    rng = np.random.default_rng(3)
    params = {k: jnp.asarray(v, F32).astype(BF16) for k, v in M.init_mlp(rng, (6, 16, 3)).items()}
    x = jnp.asarray(rng.standard_normal((4, 6)), F32).astype(BF16)
    return params, x


def _loss_in_x(xp, params, x):
    return M.mean_square(xp, M.mlp(xp, params, x))


def test_hessian_of_a_bfloat16_function_against_float64():
    """A bfloat16 function in heddle's op style (one float32 path, one rounding, at the end), with a
    contraction of the leaf: heddle's Hessian is its float32 Hessian; the reference is the exact
    Hessian of the same function in float64 (jax.hessian, no finite differences)."""
    rng = np.random.default_rng(7)
    a = jnp.asarray(rng.standard_normal((8, 5)) / 3, F32).astype(BF16)
    c = jnp.asarray(rng.standard_normal(5), F32).astype(BF16)
    x = jnp.asarray(rng.standard_normal(8), F32).astype(BF16)

    def f(x):
        y = jax.lax.dot_general(x, a, (((0,), (0,)), ((), ())), preferred_element_type=F32)
        return (jnp.tanh(y) * c.astype(F32)).sum().astype(BF16)

    h = jax.jit(autodiff.hessian(f))(x)
    with jax.enable_x64(True):
        a64, c64 = np.asarray(a, np.float64), np.asarray(c, np.float64)
        ref = np.asarray(
            jax.hessian(lambda x: (jnp.tanh(x @ a64) * c64).sum())(np.asarray(x, np.float64))
        )
    err = np.linalg.norm(np.asarray(h, np.float64) - ref) / np.linalg.norm(ref)
    assert h.dtype == F32 and err <= 2.0**-16, err
    plain = jax.jit(jax.hessian(f))(x)  # the Hessian of a bfloat16 leaf is bfloat16 in JAX
    plain_err = np.linalg.norm(np.asarray(plain, np.float64) - ref) / np.linalg.norm(ref)
    assert plain.dtype == BF16 and plain_err > 16 * 2.0**-16, plain_err


def test_hessian_through_heddle_numpy_matches_jacfwd_of_jacrev():
    params, x = _small_model()
    f = lambda x: _loss_in_x(hnp, params, x)
    a = jax.jit(autodiff.hessian(f))(x)
    b = jax.jit(autodiff.jacfwd(autodiff.jacrev(f)))(x)
    assert a.dtype == b.dtype == F32 and np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "how",
    ["hessian", "jacfwd(grad)", "jacrev(grad)"],
)
@pytest.mark.parametrize("values", [[0.3, -0.2, 0.5], [-0.3, -0.2, 0.1]], ids=["sin", "cos"])
def test_second_derivatives_through_a_cond_against_float64(how, values):
    """The inner derivative's rule reads the cond's index as an argument (it was a tracer of the
    inner trace, closed over: UnexpectedTracerError at the outer level)."""

    def f(a):
        out = jax.lax.cond(a.sum() > 0, lambda a: jnp.sin(a) * a, jnp.cos, a)
        return jnp.sum(out.astype(jnp.float32))

    second = {
        "hessian": autodiff.hessian,
        "jacfwd(grad)": lambda f: autodiff.jacfwd(autodiff.grad(f)),
        "jacrev(grad)": lambda f: autodiff.jacrev(autodiff.grad(f)),
    }[how]
    a = jnp.asarray(values, jnp.bfloat16)
    a64 = np.asarray(a, np.float64)
    want = 2 * np.cos(a64) - a64 * np.sin(a64) if a64.sum() > 0 else -np.cos(a64)
    h = np.asarray(second(f)(a), np.float64)
    np.testing.assert_allclose(np.diag(h), want, rtol=1e-5)
    assert (h[~np.eye(3, dtype=bool)] == 0).all()
