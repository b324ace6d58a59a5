"""flax nnx objects passed to an autocast function keep what the function writes into them, as under
``nnx.jit``: BatchNorm statistics, counters and RNG streams are written back to the caller's module,
eagerly, under ``nnx.jit`` and ``nnx.grad``, each variable in its own dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import heddle

BF16, F32 = jnp.bfloat16, jnp.float32


@pytest.fixture(autouse=True)
def _standard_promotion():
    with jax.numpy_dtype_promotion("standard"):
        yield


class Net(nnx.Module):
    def __init__(self, dtype=F32):
        rngs = nnx.Rngs(0, dropout=1)
        self.lin = nnx.Linear(4, 3, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.bn = nnx.BatchNorm(3, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        return self.drop(self.bn(self.lin(x)))


def _loss(m, x):
    return m(x).astype(F32).sum()


X = jnp.asarray(np.random.default_rng(0).normal(size=(8, 4)), F32)


def _stats(m):
    return (int(m.calls[...]), np.asarray(m.bn.mean[...], np.float64),
            np.asarray(m.bn.var[...], np.float64), int(m.drop.rngs.count[...]))  # fmt: skip


def _reference(steps=2, dtype=F32):
    """Two plain calls: the statistics every transformed variant must leave behind."""
    m = Net(dtype)
    for _ in range(steps):
        _loss(m, X.astype(dtype))
    return _stats(m)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda f: heddle.autocast(f),
        lambda f: nnx.jit(heddle.autocast(f)),
        lambda f: heddle.autocast(nnx.jit(f)),
        lambda f: nnx.grad(heddle.autocast(f)),
    ],
    ids=["eager", "nnx.jit(autocast)", "autocast(nnx.jit)", "nnx.grad(autocast)"],
)
def test_state_written_in_the_call_reaches_the_callers_module(wrap):
    m = Net()
    f = wrap(_loss)
    for _ in range(2):
        f(m, X)
    calls, mean, var, count = _stats(m)
    r_calls, r_mean, r_var, r_count = _reference()
    assert (calls, count) == (r_calls, r_count) == (2, 2)
    # float32 statistics: autocast computes float32 as plain JAX does, up to the reduction order
    np.testing.assert_allclose(mean, r_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(var, r_var, rtol=1e-6, atol=1e-7)
    assert not np.all(mean == 0)  # the statistics really moved


def test_bfloat16_layers_statistics_keep_their_dtypes_and_follow_the_policy():
    plain, m = Net(BF16), Net(BF16)
    _loss(plain, X.astype(BF16))
    heddle.autocast(_loss)(m, X.astype(BF16))
    got_dtypes = [v.dtype for v in jax.tree.leaves(nnx.state(m))]
    assert got_dtypes == [v.dtype for v in jax.tree.leaves(nnx.state(plain))]
    # momentum 0.99 from zero: 0.01 * the batch mean of the layer's output, within a few roundings
    w = np.asarray(m.lin.kernel[...], np.float64)
    b = np.asarray(m.lin.bias[...], np.float64)
    ref = 0.01 * (np.asarray(X.astype(BF16), np.float64) @ w + b).mean(0)
    got = np.asarray(m.bn.mean[...], np.float64)
    np.testing.assert_allclose(got, ref, rtol=2**-6, atol=2**-20)


def test_precision_casts_params_for_compute_and_leaves_statistics_in_their_dtype():
    m = Net(F32)
    heddle.autocast(_loss, precision="params=float32,compute=bfloat16,output=float32")(m, X)
    assert m.bn.mean[...].dtype == F32 and m.lin.kernel[...].dtype == F32
    assert m.calls[...].dtype == jnp.int32 and int(m.calls[...]) == 1
    _, r_mean, _, _ = _reference(steps=1)
    # 0.01 * the batch mean of a bfloat16 layer output (|h| < 2: bf16 rounding of each < 2**-8), in f32
    np.testing.assert_allclose(
        np.asarray(m.bn.mean[...], np.float64), r_mean, rtol=2**-6, atol=3e-5
    )
    assert not np.array_equal(np.asarray(m.bn.mean[...], np.float64), r_mean)  # computed in bf16


def test_shared_submodules_stay_shared():
    m = Net()
    pair = (m, m)  # the same module twice, as nnx graphs allow
    heddle.autocast(lambda ms, x: _loss(ms[0], x) + _loss(ms[1], x))(pair, X)
    assert int(m.calls[...]) == 2


MIXED = "params=float32,compute=bfloat16,output=float32"


def test_precision_leaves_the_float32_masters_bit_identical():
    """The compute-dtype copies of the Params were written back: a forward pass rounded every
    float32 master to bfloat16 (200703 of 200704 kernel elements of a Linear changed)."""
    m = Net(F32)
    before = [np.asarray(v).copy() for v in jax.tree.leaves(nnx.state(m, nnx.Param))]
    for wrap in (lambda f: f, nnx.jit):
        wrap(heddle.autocast(_loss, precision=MIXED))(m, X)
    after = [np.asarray(v) for v in jax.tree.leaves(nnx.state(m, nnx.Param))]
    assert all(
        a.dtype == np.float32 and a.tobytes() == b.tobytes()
        for a, b in zip(after, before, strict=True)
    )
    assert int(m.calls[...]) == 2  # the other state still reaches the module


class Sower(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.full((3,), 1 + 2.0**-12, F32))

    def __call__(self, x):
        y = x * self.w
        self.last = nnx.BatchStat(y)  # a variable the call creates
        return y.sum()


def test_precision_with_new_variables_keeps_the_params_dtype_and_values():
    m = Sower()
    heddle.autocast(lambda m, x: m(x), precision=MIXED)(m, jnp.ones(3, F32))
    assert m.w[...].dtype == F32 and float(m.w[0]) == 1 + 2.0**-12
    assert m.last[...].shape == (3,)


class Remat(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
        self.lin.kernel[...] = self.lin.kernel[...] + 2.0**-12  # bits below bfloat16's

    def __call__(self, x):  # nnx.remat writes the layer's Params back as fresh arrays
        return nnx.remat(lambda layer, x: layer(x))(self.lin, x).astype(F32).sum()


def test_precision_keeps_masters_through_nnx_transforms_inside_the_call():
    m = Remat()
    before = np.asarray(m.lin.kernel[...]).copy()
    g = nnx.grad(heddle.autocast(lambda m, x: m(x), precision=MIXED))(m, X)
    heddle.autocast(lambda m, x: m(x), precision=MIXED)(m, X)
    assert np.asarray(m.lin.kernel[...]).tobytes() == before.tobytes()
    assert g.lin.kernel[...].dtype == F32


def test_precision_with_an_optimizer_inside_stores_what_it_assigned_and_keeps_the_rest():
    """Elements the call leaves unchanged keep their float32 masters bit for bit; an element it
    assigns (an optimizer update, a reset, nan_to_num) is the assigned value, never the master plus
    a rounded difference (that turned inf masters into NaN and a reset to 0 into the residual)."""
    import optax

    model = nnx.Linear(2, 1, use_bias=False, rngs=nnx.Rngs(0))
    model.kernel[...] = jnp.asarray([[1 + 2.0**-12], [1 + 2.0**-12]], F32)  # not bfloat16 values
    opt = nnx.Optimizer(model, optax.sgd(2.0**-4), wrt=nnx.Param)
    x = jnp.asarray([[1.0, 0.0]], F32)  # dL/dw = x: the second weight gets no update

    def step(model, opt):
        opt.update(model, nnx.grad(lambda m: m(x).astype(F32).sum())(model))

    heddle.autocast(step, precision=MIXED)(model, opt)
    # the copy bf16(1 + 2**-12) = 1 becomes 1 - 2**-4; the untouched one keeps its master's bits
    assert model.kernel[...].dtype == F32 and int(opt.step[...]) == 1
    assert np.asarray(model.kernel[...]).ravel().tolist() == [1 - 2.0**-4, 1 + 2.0**-12]


def test_precision_assignments_inside_the_call_are_stored_as_assigned():
    class W(nnx.Module):
        def __init__(self, v):
            self.w = nnx.Param(jnp.asarray(v, F32))

    def clean(m):
        m.w[...] = jnp.nan_to_num(m.w[...], posinf=1.0, neginf=-1.0)

    def reset(m):
        m.w[...] = jnp.zeros_like(m.w[...])

    m = W([np.nan, np.inf, -np.inf, 1 + 2.0**-12, 2.0])
    heddle.autocast(clean, precision=MIXED)(m)
    assert np.asarray(m.w[...]).tolist() == [0.0, 1.0, -1.0, 1 + 2.0**-12, 2.0]
    heddle.autocast(reset, precision=MIXED)(m)
    assert np.asarray(m.w[...]).tolist() == [0.0] * 5 and m.w[...].dtype == F32
