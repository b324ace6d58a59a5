"""Flax linen, flax nnx and equinox layers, called as they are: their plain audit finds narrow
accumulations, ``audit(autocast(f))`` and ``audit(jax.grad(autocast(f)))`` find none."""

from __future__ import annotations

import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import heddle

BF16 = jnp.bfloat16
NA = "narrow_accumulation"


@pytest.fixture(autouse=True)
def _standard_promotion():
    # flax's pooling divides a bfloat16 array by a NumPy int: the libraries need JAX's own mode
    with jax.numpy_dtype_promotion("standard"):
        yield


def _bf16(tree):
    return jax.tree.map(lambda a: a.astype(BF16) if eqx.is_inexact_array(a) else a, tree)


class LinenMLP(linen.Module):
    @linen.compact
    def __call__(self, x):
        x = linen.relu(linen.Dense(32, dtype=BF16, param_dtype=BF16)(x))
        return linen.Dense(10, dtype=BF16, param_dtype=BF16)(x)


class LinenCNN(linen.Module):
    @linen.compact
    def __call__(self, x):
        x = linen.relu(linen.Conv(4, (3, 3), dtype=BF16, param_dtype=BF16)(x))
        x = linen.avg_pool(x, (2, 2), (2, 2))
        return linen.Dense(10, dtype=BF16, param_dtype=BF16)(x.reshape(x.shape[0], -1))


class LinenBlock(linen.Module):
    @linen.compact
    def __call__(self, x):
        kw = dict(dtype=BF16, param_dtype=BF16)
        h = linen.LayerNorm(**kw)(x)
        x = x + linen.MultiHeadDotProductAttention(num_heads=2, **kw)(h, h)
        h = linen.LayerNorm(**kw)(x)
        return x + linen.Dense(16, **kw)(linen.gelu(linen.Dense(32, **kw)(h)))


def _linen(module, x):
    params = module.init(jax.random.key(0), x)

    def loss(params, x):
        return module.apply(params, x).astype(jnp.float32).mean()

    return loss, (params, x)


def _nnx(x, kind):
    rngs = nnx.Rngs(0)
    kw = dict(dtype=BF16, param_dtype=BF16, rngs=rngs)
    if kind == "mlp":
        model = nnx.Sequential(nnx.Linear(16, 32, **kw), nnx.relu, nnx.Linear(32, 10, **kw))
    elif kind == "cnn":
        model = nnx.Sequential(
            nnx.Conv(3, 4, (3, 3), **kw), nnx.relu, lambda y: y.reshape(y.shape[0], -1),
            nnx.Linear(8 * 8 * 4, 10, **kw),
        )  # fmt: skip
    else:
        model = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, **kw)
    graphdef, state = nnx.split(model)

    def loss(state, x):
        m = nnx.merge(graphdef, state)
        return m(x).astype(jnp.float32).mean()

    return loss, (state, x)


def _eqx(x, kind):
    key = jax.random.key(0)
    if kind == "mlp":
        model = eqx.nn.MLP(16, 10, 32, 2, key=key)
        call = lambda m, x: jax.vmap(m)(x)
    elif kind == "cnn":
        conv = eqx.nn.Conv2d(3, 4, 3, padding=1, key=key)
        lin = eqx.nn.Linear(4 * 4 * 4, 10, key=key)
        pool = eqx.nn.AvgPool2d(2, 2)
        model = (conv, pool, lin)
        call = lambda m, x: jax.vmap(lambda v: m[2](m[1](jax.nn.relu(m[0](v))).ravel()))(x)
    else:
        model = eqx.nn.MultiheadAttention(2, 16, key=key)
        call = lambda m, x: jax.vmap(lambda v: m(v, v, v))(x)
    model = _bf16(model)
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, x):
        return call(eqx.combine(params, static), x).astype(jnp.float32).mean()

    return loss, (params, x)


def _case(lib, kind):
    x = jnp.ones((4, 16), BF16) if kind == "mlp" else jnp.ones((4, 8, 16), BF16)
    if kind == "cnn":
        x = jnp.ones((4, 8, 8, 3), BF16) if lib != "equinox" else jnp.ones((4, 3, 8, 8), BF16)
    if lib == "linen":
        module = {"mlp": LinenMLP, "cnn": LinenCNN, "block": LinenBlock}[kind]()
        return _linen(module, x)
    if lib == "nnx":
        return _nnx(x, kind)
    return _eqx(x, kind)


# one model per library runs by default (about 10 s each); the rest are slow
QUICK = {("linen", "block"), ("nnx", "mlp"), ("equinox", "cnn")}
CASES = [
    pytest.param(
        lib, kind, id=f"{lib}-{kind}", marks=() if (lib, kind) in QUICK else pytest.mark.slow
    )
    for lib in ("linen", "nnx", "equinox")
    for kind in ("mlp", "cnn", "block")
]


@pytest.mark.parametrize(("lib", "kind"), CASES)
def test_autocast_leaves_no_narrow_accumulation(lib, kind):
    loss, args = _case(lib, kind)
    plain = heddle.audit(loss, *args, include_backward=True).counts[NA]
    assert plain > 0
    assert heddle.audit(heddle.autocast(loss), *args).counts[NA] == 0
    assert heddle.audit(jax.grad(heddle.autocast(loss)), *args).counts[NA] == 0
    # and the forward value is the model's own, to bfloat16 rounding of float32 sums
    ours, theirs = heddle.autocast(loss)(*args), loss(*args)
    assert ours.dtype == theirs.dtype and abs(float(ours) - float(theirs)) < 0.05
