"""Cotangent sums in the backward pass accumulate in float32 (POLICY.md 7), against exact references."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import autodiff

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
U32 = 2.0**-24  # float32 unit roundoff


def f32_sum_bound(n, abs_sum):
    """Worst-case error of a float32 sum of n terms, any order: (n - 1) u sum|x_i| (to first order)."""
    return (n - 1) * U32 * abs_sum * 1.01


def layer(rows):
    """A bias added to a batch, in heddle's op style: convert to float32, add, round once."""
    return lambda b: (rows.astype(F32) + b.astype(F32)).astype(BF16)


@pytest.mark.parametrize("n", [65536, 65000])
def test_bias_broadcast_cotangent_sum(n, transform):
    rows, bias = jnp.zeros((n, 1), BF16), jnp.zeros(1, BF16)
    ct = jnp.full((n, 1), 0.1, BF16)
    c = Fraction(float(np.float32(ml_dtypes.bfloat16(0.1))))  # the rounded cotangent, 0.10009765625
    exact = n * c  # float32 accumulation of the rounded cotangents, exactly
    ours = transform(lambda ct: autodiff.vjp(layer(rows), bias)[1](ct)[0])(ct)
    assert ours.dtype == F32
    assert abs(Fraction(float(ours[0])) - exact) <= f32_sum_bound(n, exact)
    through_heddle_numpy = transform(
        lambda ct: autodiff.vjp(lambda b: hnp.add(rows, b), bias)[1](ct)[0]
    )(ct)
    assert through_heddle_numpy.tobytes() == ours.tobytes()
    # Beside it, plain JAX: the same op style rounds the sum to bfloat16 at the leaf, and a plain
    # bfloat16 broadcast sums in bfloat16 (65,536 rows: 6240 for an exact 6560).
    plain_ops = transform(lambda ct: jax.vjp(layer(rows), bias)[1](ct)[0])(ct)
    plain = transform(lambda ct: jax.vjp(lambda b: rows + b, bias)[1](ct)[0])(ct)
    assert plain.dtype == plain_ops.dtype == BF16
    assert abs(Fraction(float(plain[0])) - exact) > f32_sum_bound(n, exact)
    # JAX's transpose of the op keeps the sum in float32 but rounds it to the leaf's bfloat16
    # (65,000 rows: 6506.35 becomes 6496).
    assert float(plain_ops[0]) == float(ml_dtypes.bfloat16(float(ours[0])))


def test_many_uses_of_one_leaf_sum_in_float32(transform):
    """A bfloat16 parameter used by 300 separate ops: JAX adds their cotangents in bfloat16."""
    w = jnp.array(1.0, BF16)
    cs = (np.arange(1, 301) * 0.01).astype(np.float32)

    def f(w):
        total = jnp.float32(0)
        for c in cs:
            total = total + w.astype(F32) * F32(c)  # one float32 contribution per use
        return total

    exact = sum(Fraction(float(c)) for c in cs)
    ours = transform(autodiff.grad(f))(w)
    assert ours.dtype == F32
    assert abs(Fraction(float(ours)) - exact) <= f32_sum_bound(300, exact)
    plain = transform(jax.grad(f))(w)
    assert abs(Fraction(float(plain)) - exact) > f32_sum_bound(300, exact)


def test_many_uses_of_an_intermediate_value(transform):
    """An op's bfloat16 result read by 200 ops: their contributions are summed in float32, and the
    sum, the cotangent of a bfloat16 value, stays float32 through the op that produced it (JAX rounds
    every contribution and adds them in bfloat16)."""
    x = jnp.array([0.75, -1.25], BF16)
    cs = np.linspace(0.013, 0.5, 200).astype(np.float32)

    def f(x):
        h = (x.astype(F32) * F32(3.0)).astype(BF16)  # one op, rounded once
        return sum((h.astype(F32) * F32(c)).sum() for c in cs)

    total = sum(Fraction(float(c)) for c in cs)  # the cotangent of h, exactly
    once = Fraction(float(ml_dtypes.bfloat16(float(total))))  # what a bfloat16 cotangent holds
    assert abs(total - once) > 2 * f32_sum_bound(200, total)  # rounding it would show
    g = transform(autodiff.grad(f))(x)
    assert g.dtype == F32
    for v in np.asarray(g):
        assert abs(Fraction(float(v)) - 3 * total) <= 3 * f32_sum_bound(201, total)
    plain = np.asarray(transform(jax.grad(f))(x), np.float64)
    assert (plain != float(3 * total)).all()


def test_long_contraction_weight_gradient(transform):
    """dW of x @ W over 16,384 rows: one float32 contraction, never rounded to bfloat16."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16384, 4)), F32).astype(BF16)
    w = jnp.asarray(rng.standard_normal((4, 3)), F32).astype(BF16)
    ct = jnp.asarray(rng.standard_normal((16384, 3)), F32).astype(BF16)

    def f(w):
        y = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=F32)
        return y.astype(BF16)

    (g,) = transform(lambda ct: autodiff.vjp(f, w)[1](ct))(ct)
    xs, cs = np.asarray(x, np.float64), np.asarray(ct, np.float64)
    exact = xs.T @ cs  # products of bfloat16 values are exact in float64; the sums nearly so
    bound = f32_sum_bound(16384, np.abs(xs).T @ np.abs(cs))
    assert g.dtype == F32 and (np.abs(np.asarray(g, np.float64) - exact) <= bound).all()
    (plain,) = transform(lambda ct: jax.vjp(f, w)[1](ct))(ct)
    # JAX accumulates this contraction in float32 too, then rounds it to the leaf's bfloat16.
    assert plain.dtype == BF16
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(g).astype(ml_dtypes.bfloat16))


def test_repeated_gather_indices_accumulate_in_float32(transform):
    """x[idx] with one index repeated 4096 times: the scatter-add of the cotangents is float32."""
    x = jnp.zeros(3, BF16)
    idx = jnp.asarray(np.r_[np.zeros(4096, np.int32), [1, 2]])
    ct = jnp.full(4098, 0.1, BF16)
    (g,) = transform(lambda ct: autodiff.vjp(lambda x: hnp.take(x, idx), x)[1](ct))(ct)
    c = Fraction(float(np.float32(ml_dtypes.bfloat16(0.1))))
    assert g.dtype == F32
    assert abs(Fraction(float(g[0])) - 4096 * c) <= f32_sum_bound(4096, 4096 * c)
    assert Fraction(float(g[1])) == c
    (plain,) = transform(lambda ct: jax.vjp(lambda x: x[idx], x)[1](ct))(ct)
    assert abs(Fraction(float(plain[0])) - 4096 * c) > f32_sum_bound(4096, 4096 * c)


def test_cumsum_reverse_scan_in_float32(transform):
    """The cotangent of cumsum is a reverse cumsum: float32 partial sums, each rounded never."""
    n = 4096
    x = jnp.zeros(n, BF16)
    ct = jnp.full(n, 0.1, BF16)
    (g,) = transform(lambda ct: autodiff.vjp(hnp.cumsum, x)[1](ct))(ct)
    c = Fraction(float(np.float32(ml_dtypes.bfloat16(0.1))))
    g = np.asarray(g)
    for i in (0, n // 2, n - 1):
        k = n - i  # x[i] feeds the last n - i partial sums
        assert abs(Fraction(float(g[i])) - k * c) <= f32_sum_bound(k, k * c)


def test_inlined_jit_and_structural_ops_keep_float32(transform):
    """A jax.jit-compiled op inside the function, and transposes/reshapes of a leaf, keep twins."""
    n = 65000
    rows = jnp.zeros((n, 1), BF16)
    op = jax.jit(lambda a, b: (a.astype(F32) + b.astype(F32)).astype(BF16))

    def f(b):
        bt = jnp.reshape(jnp.transpose(b), (1,))  # value-copying ops on the leaf
        return op(rows, bt)

    ct = jnp.full((n, 1), 0.1, BF16)
    (g,) = transform(lambda ct: autodiff.vjp(f, jnp.zeros((1, 1), BF16))[1](ct))(ct)
    c = Fraction(float(np.float32(ml_dtypes.bfloat16(0.1))))
    assert g.dtype == F32 and g.shape == (1, 1)
    assert abs(Fraction(float(g[0, 0])) - n * c) <= f32_sum_bound(n, n * c)
    (plain,) = transform(lambda ct: jax.vjp(f, jnp.zeros((1, 1), BF16))[1](ct))(ct)
    assert float(plain[0, 0]) == float(ml_dtypes.bfloat16(float(g[0, 0]))) != float(g[0, 0])


@pytest.mark.parametrize("policy", [None, jax.checkpoint_policies.nothing_saveable])
def test_checkpointed_function_keeps_float32_leaf_sums_and_rematerialises(transform, policy):
    n = 65000
    rows = jnp.zeros((n, 1), BF16)
    layer = jax.checkpoint(lambda b: (rows.astype(F32) + b.astype(F32)).astype(BF16), policy=policy)
    ct = jnp.full((n, 1), 0.1, BF16)
    (g,) = transform(lambda ct: autodiff.vjp(layer, jnp.zeros(1, BF16))[1](ct))(ct)
    c = Fraction(float(np.float32(ml_dtypes.bfloat16(0.1))))
    assert g.dtype == F32 and abs(Fraction(float(g[0])) - n * c) <= f32_sum_bound(n, n * c)
    loss = lambda b: (layer(b).astype(F32) ** 2).sum()
    names = {e.primitive.name for e in jax.make_jaxpr(autodiff.grad(loss))(jnp.zeros(1, BF16)).eqns}
    assert "remat2" in names or "checkpoint" in names  # still rematerialised in the backward pass


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, F16])
def test_contraction_of_narrow_leaves_of_every_width(dtype, transform):
    """float8 and float16 operands of a float32-accumulating contraction: float32 gradients, exact
    here (small integers and halves)."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.integers(-3, 4, (64, 3)), F32).astype(dtype)
    w = jnp.asarray(rng.integers(-2, 3, (3, 2)) * 0.5, F32).astype(dtype)

    def f(w, x):
        y = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=F32)
        return (y * y).sum()

    gw, gx = transform(autodiff.grad(f, argnums=(0, 1)))(w, x)
    xs, ws = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y = xs @ ws
    assert gw.dtype == gx.dtype == F32
    np.testing.assert_array_equal(np.asarray(gw), xs.T @ (2 * y))
    np.testing.assert_array_equal(np.asarray(gx), (2 * y) @ ws.T)


@pytest.mark.parametrize("op", ["tile", "repeat", "broadcast_to"])
def test_copying_ops_sum_their_cotangents_in_float32(op, transform):
    """A bfloat16 value copied 65,474 times (lax's tile primitive, repeat, broadcast): its gradient is
    the exact count 65474, which bfloat16 (8 significant bits) cannot hold: a bfloat16 sum is 65536."""
    n = 65474
    copy = {
        "tile": lambda b: hnp.tile(b, n),
        "repeat": lambda b: hnp.repeat(b, n),
        "broadcast_to": lambda b: hnp.broadcast_to(b, (n,)),
    }[op]
    b = jnp.ones(1, BF16)
    g = transform(autodiff.grad(lambda b: hnp.sum(hnp.astype(copy(b), F32))))(b)
    assert g.dtype == F32 and float(g[0]) == n


@pytest.mark.parametrize("op", ["max_pool", "take", "patches", "max_ties"])
def test_summing_backward_passes_of_copies_are_float32_and_unrounded(op, transform):
    """Copies whose backward pass sums many cotangents (max-pooling's select_and_scatter_add, a
    gather's scatter-add, the convolution behind conv_general_dilated_patches, the tie count of
    max): heddle.autodiff's gradient is the float32 sum itself, never rounded to bfloat16, and the
    same values as jax.grad's float32 sum rounded once."""
    from jax import lax

    import heddle.lax as hlax

    if op == "max_pool":
        x = jnp.zeros(4097, BF16).at[2048].set(1)
        f = lambda v: hlax.reduce_window(v, -jnp.inf, lax.max, (2049,), (1,), "VALID")
        want = 2049 / 16  # 128.0625: one maximum under 2049 windows, cotangent 1/16 each
        where = (2048,)
    elif op == "take":
        x = jnp.zeros((3, 4), BF16)
        f = lambda v: hnp.take(v, jnp.zeros(4099, jnp.int32), axis=0)
        want, where = 4099 / 16, (0, 0)
    elif op == "patches":
        x = jnp.zeros((1, 1, 24, 24), BF16)
        f = lambda v: hlax.conv_general_dilated_patches(v, (9, 9), (1, 1), "VALID")
        want, where = 9 * 9 / 16, (0, 0, 12, 12)  # the centre is in 9 * 9 patches
    else:
        x = jnp.ones(4099, BF16)
        f = hnp.max
        want, where = 16 / 4099, (0,)  # loss 16 * max: each tie gets 16/4099

    def loss(v):
        scale = 16.0 if op == "max_ties" else 0.0625
        return hnp.sum(hnp.multiply(hnp.astype(f(v), F32), scale))

    g = transform(autodiff.grad(loss))(x)
    assert g.dtype == F32
    assert float(g[where]) == float(np.float32(want))  # exact, or float32-rounded for max_ties
    plain = transform(jax.grad(loss))(x)
    assert plain.dtype == BF16 and float(plain[where]) == float(ml_dtypes.bfloat16(float(g[where])))
