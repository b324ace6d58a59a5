"""An MLP and a one-block transformer written against the jax.numpy API.

Every op goes through the module ``xp`` (heddle.numpy, or jax.numpy for the plain-JAX contrast and
the float64 reference), so the same code runs under each.
"""

from __future__ import annotations

import itertools

import numpy as np


def init_mlp(rng: np.random.Generator, sizes=(64, 128, 10)) -> dict:
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = rng.standard_normal((m, n)) / np.sqrt(m)
        params[f"b{i}"] = rng.standard_normal(n) * 0.1
    return params


def mlp(xp, params: dict, x):
    n = len(params) // 2
    for i in range(n):
        x = xp.add(xp.matmul(x, params[f"w{i}"]), params[f"b{i}"])
        if i < n - 1:
            x = xp.tanh(x)
    return x


def softmax(xp, x, axis=-1):
    e = xp.exp(xp.subtract(x, xp.max(x, axis=axis, keepdims=True)))
    return xp.divide(e, xp.sum(e, axis=axis, keepdims=True))


def layer_norm(xp, x, scale, eps=1e-5):
    mu = xp.mean(x, axis=-1, keepdims=True)
    var = xp.var(x, axis=-1, keepdims=True)
    return xp.multiply(xp.divide(xp.subtract(x, mu), xp.sqrt(xp.add(var, eps))), scale)


def init_block(rng: np.random.Generator, d=32, hidden=64) -> dict:
    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(shape[0])

    return {
        "ln1": 1 + 0.1 * rng.standard_normal(d), "wq": w(d, d), "wk": w(d, d), "wv": w(d, d),
        "wo": w(d, d), "ln2": 1 + 0.1 * rng.standard_normal(d), "w1": w(d, hidden),
        "w2": w(hidden, d),
    }  # fmt: skip


def block(xp, p: dict, x):
    """One pre-norm transformer block on x of shape (batch, seq, d)."""
    h = layer_norm(xp, x, p["ln1"])
    q, k, v = (xp.matmul(h, p[n]) for n in ("wq", "wk", "wv"))
    scores = xp.multiply(xp.einsum("bqd,bkd->bqk", q, k), 0.125)  # exact in every float format
    att = xp.einsum("bqk,bkd->bqd", softmax(xp, scores), v)
    x = xp.add(x, xp.matmul(att, p["wo"]))
    h = layer_norm(xp, x, p["ln2"])
    g = xp.tanh(xp.matmul(h, p["w1"]))
    return xp.add(x, xp.matmul(g, p["w2"]))


def mean_square(xp, y):
    return xp.mean(xp.multiply(y, y))
