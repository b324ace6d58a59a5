"""Small models written against the jax.numpy API, for examples, tests and benchmarks.

Each takes the array module ``xp`` as its first argument, so the same code runs with ``jax.numpy``,
``heddle.numpy`` or NumPy itself (the float64 reference). Only function calls go through ``xp``:
operators on JAX arrays (``a + b``, ``a @ b``) are JAX's own and would bypass heddle's policy.

Examples:
  >>> import numpy as np
  >>> import heddle.numpy as hnp
  >>> from heddle import examples
  >>> params = examples.cast_tree(examples.init_mlp(np.random.default_rng(0)), "bfloat16")
  >>> examples.mlp(hnp, params, np.ones((2, 64), "float32")).dtype
  dtype('float32')
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np


def init_mlp(rng: np.random.Generator, sizes: tuple[int, ...] = (64, 128, 10)) -> dict:
    """Float64 parameters of an MLP with the given layer sizes (``w0, b0, w1, b1, ...``)."""
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = rng.standard_normal((m, n)) / np.sqrt(m)
        params[f"b{i}"] = rng.standard_normal(n) * 0.1
    return params


def mlp(xp: Any, params: dict, x: Any) -> Any:
    """The MLP's logits: ReLU hidden layers, a linear last layer."""
    n = len(params) // 2
    for i in range(n):
        x = xp.add(xp.matmul(x, params[f"w{i}"]), params[f"b{i}"])
        if i < n - 1:
            x = xp.maximum(x, 0.0)
    return x


def softmax(xp: Any, x: Any, axis: int = -1) -> Any:
    """Softmax written with the array module's functions, as a jax.numpy user would."""
    e = xp.exp(xp.subtract(x, xp.max(x, axis=axis, keepdims=True)))
    return xp.divide(e, xp.sum(e, axis=axis, keepdims=True))


def layer_norm(xp: Any, x: Any, scale: Any, eps: float = 1e-5) -> Any:
    """Layer normalisation over the last axis."""
    mu = xp.mean(x, axis=-1, keepdims=True)
    var = xp.var(x, axis=-1, keepdims=True)
    return xp.multiply(xp.divide(xp.subtract(x, mu), xp.sqrt(xp.add(var, eps))), scale)


def init_block(rng: np.random.Generator, d: int = 32, hidden: int = 64) -> dict:
    """Float64 parameters of one pre-norm transformer block of width ``d``."""

    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(shape[0])

    return {
        "ln1": np.ones(d), "wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d),
        "ln2": np.ones(d), "w1": w(d, hidden), "w2": w(hidden, d),
    }  # fmt: skip


def block(xp: Any, p: dict, x: Any) -> Any:
    """One pre-norm transformer block on x of shape (batch, seq, d)."""
    h = layer_norm(xp, x, p["ln1"])
    q, k, v = (xp.matmul(h, p[n]) for n in ("wq", "wk", "wv"))
    scores = xp.divide(xp.einsum("bqd,bkd->bqk", q, k), float(np.sqrt(x.shape[-1])))
    att = xp.einsum("bqk,bkd->bqd", softmax(xp, scores), v)
    x = xp.add(x, xp.matmul(att, p["wo"]))
    h = layer_norm(xp, x, p["ln2"])
    g = xp.multiply(xp.tanh(xp.matmul(h, p["w1"])), 0.5)  # a smooth activation
    return xp.add(x, xp.matmul(g, p["w2"]))


def cast_tree(tree: dict, dtype: Any) -> dict:
    """Every leaf of a flat parameter dict as a NumPy array of ``dtype``."""
    return {k: np.asarray(v).astype(dtype) for k, v in tree.items()}
