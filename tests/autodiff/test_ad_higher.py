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


def _dot32(a, b):
    return jax.lax.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=F32)


def _through(a, d):
    """``a`` rounded to ``d`` in value, differentiated as the identity (heddle's rounding rule)."""
    return a + jax.lax.stop_gradient(a.astype(d).astype(F32) - a)


@pytest.mark.parametrize("narrow_result", [False, True], ids=["f32-result", "narrow-result"])
def test_second_derivatives_through_a_contraction_of_an_intermediate(narrow_result, transform):
    # sum(w**3) as a contraction of w*w with w: the backward contractions read both operands, so
    # differentiating the gradient again must reach them (exact small integers in bfloat16)
    w = jnp.array([1.0, 2.0], BF16)
    dot = jnp.dot if narrow_result else (lambda a, b: jnp.dot(a, b, preferred_element_type=F32))
    f = lambda w: dot(w * w, w).astype(F32)
    want = np.diag([6.0, 12.0])
    np.testing.assert_array_equal(np.asarray(transform(autodiff.hessian(f))(w)), want)
    np.testing.assert_array_equal(np.asarray(transform(jax.jacfwd(autodiff.grad(f)))(w)), want)
    hvp = transform(lambda w, v: jax.jvp(autodiff.grad(f), (w,), (v,))[1])(w, jnp.ones_like(w))
    np.testing.assert_array_equal(np.asarray(hvp), [6.0, 12.0])


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("narrow_result", [False, True], ids=["f32-result", "narrow-result"])
def test_hessian_vector_products_of_a_two_layer_net_are_float32s(dtype, narrow_result):
    """``jax.jvp`` of the default gradient: against float32 arithmetic on the rounded values (each
    rounding differentiated as the identity), to float32 accuracy: the backward contractions'
    operands carry float32 tangents."""
    rng = np.random.default_rng(1)
    W1, V1 = (jnp.asarray(rng.standard_normal((4, 6)) * 0.5, dtype) for _ in range(2))
    W2, V2 = (jnp.asarray(rng.standard_normal((6, 3)) * 0.5, dtype) for _ in range(2))
    x = jnp.asarray(rng.standard_normal((5, 4)), dtype)

    def f(W1, W2):
        if narrow_result:
            return jnp.sum(((jnp.tanh(x @ W1) @ W2).astype(F32)) ** 2)
        h = jnp.tanh(_dot32(x, W1)).astype(dtype)
        return jnp.sum(_dot32(h, W2) ** 2)

    def ref(W1, W2):
        x32 = x.astype(F32)
        if narrow_result:
            h = _through(jnp.tanh(_through(_dot32(x32, W1), dtype)), dtype)
            return jnp.sum(_through(_dot32(h, W2), dtype) ** 2)
        return jnp.sum(_dot32(_through(jnp.tanh(_dot32(x32, W1)), dtype), W2) ** 2)

    up = lambda *a: tuple(t.astype(F32) for t in a)
    _, want = jax.jvp(jax.grad(ref, (0, 1)), up(W1, W2), up(V1, V2))
    _, got = jax.jvp(autodiff.grad(f, (0, 1)), (W1, W2), (V1, V2))
    for a, b in zip(want, got, strict=True):
        assert b.dtype == F32
        assert float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a))) < 1e-5


def test_hessian_vector_product_through_a_scan_over_layers():
    """A scan over bfloat16 layers, against float32 arithmetic on the rounded values (each rounding
    differentiated as the identity): ``autodiff.hessian`` to float32 accuracy; ``jax.jvp`` of the
    gradient reads the narrow values' own tangents inside the body (rounded to bfloat16), so to
    bfloat16 accuracy; it was 0 where the backward contractions' operands carried no tangent."""
    rng = np.random.default_rng(0)
    Ws, Vs = (jnp.asarray(rng.standard_normal((3, 4, 4)) * 0.5, BF16) for _ in range(2))
    x = jnp.asarray(rng.standard_normal((2, 4)), BF16)
    layer = lambda h, W: (jnp.tanh(_dot32(h, W)).astype(BF16), None)
    f = lambda Ws: jnp.sum(jax.lax.scan(layer, x, Ws)[0].astype(F32) ** 2)
    layer32 = lambda h, W: (_through(jnp.tanh(_dot32(h, W)), BF16), None)
    ref = lambda Ws: jnp.sum(jax.lax.scan(layer32, x.astype(F32), Ws)[0] ** 2)
    with jax.default_matmul_precision("highest"):
        _, want = jax.jvp(jax.grad(ref), (Ws.astype(F32),), (Vs.astype(F32),))
        H32 = jax.hessian(lambda w: ref(w.reshape(3, 4, 4)))(Ws.ravel().astype(F32))
    _, got = jax.jvp(autodiff.grad(f), (Ws,), (Vs,))
    assert float(jnp.max(jnp.abs(want - got)) / jnp.max(jnp.abs(want))) < 8e-3
    H = autodiff.hessian(lambda w: f(w.reshape(3, 4, 4)))(Ws.ravel())
    assert float(jnp.max(jnp.abs(H - H32)) / jnp.max(jnp.abs(H32))) < 1e-5


@pytest.mark.parametrize("contractions", ["float32", "scaled"])
def test_a_contraction_of_a_stacked_scan_output(contractions, transform):
    # the stacked output of a scan read by a top-level contraction: its operand gets no cotangent
    # from heddle's rule, and JAX 0.10's scan transpose made a zero one of the wrong shape
    A = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], BF16)
    b = jnp.array([[1.0, 0.0, 2.0]], BF16)

    def f(A, b):
        ys = jax.lax.scan(lambda c, w: (c, w * 2), 0.0, A)[1]
        return jnp.sum(jnp.matmul(ys, b.T, preferred_element_type=F32))

    gA, gb = transform(autodiff.grad(f, (0, 1), contractions=contractions))(A, b)
    np.testing.assert_array_equal(np.asarray(gA), [[2.0, 0.0, 4.0], [2.0, 0.0, 4.0]])
    np.testing.assert_array_equal(np.asarray(gb), [[10.0, 14.0, 18.0]])
