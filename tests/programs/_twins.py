"""Models written twice: with jax.numpy and operators, and with heddle.numpy/heddle.nn calls.

``autocast(jnp_version)`` must give bit for bit what ``heddle_version`` gives (one library call of
the first is one heddle call of the second). Constants are exact in every float format tested, so
the Python scalars JAX rounds before tracing are the values heddle rounds them to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import heddle.lax as hlax
import heddle.nn as hnn
import heddle.numpy as hnp

EPS = 2.0**-10
SCALE = 0.125  # about 1 / sqrt(32), exact in every format


def mlp_jnp(p, x):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return h @ p["w2"] + p["b2"]


def mlp_heddle(p, x):
    h = hnn.relu(hnp.add(hnp.matmul(x, p["w1"]), p["b1"]))
    return hnp.add(hnp.matmul(h, p["w2"]), p["b2"])


def layernorm_jnp(p, x):
    mean = x.mean(-1, keepdims=True)
    var = jnp.var(x, -1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + EPS) * p["g"] + p["b"]


def layernorm_heddle(p, x):
    mean = hnp.mean(x, -1, keepdims=True)
    var = hnp.var(x, -1, keepdims=True)
    y = hnp.divide(hnp.subtract(x, mean), hnp.sqrt(hnp.add(var, EPS)))
    return hnp.add(hnp.multiply(y, p["g"]), p["b"])


def rmsnorm_jnp(p, x):
    return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * p["g"]


def rmsnorm_heddle(p, x):
    ms = hnp.mean(hnp.multiply(x, x), -1, keepdims=True)
    return hnp.multiply(hnp.divide(x, hnp.sqrt(hnp.add(ms, EPS))), p["g"])


def attention_jnp(p, x):
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    logits = jnp.einsum("btd,bsd->bts", q, k) * SCALE
    return jax.nn.softmax(logits, axis=-1) @ v


def attention_heddle(p, x):
    q, k, v = hnp.matmul(x, p["wq"]), hnp.matmul(x, p["wk"]), hnp.matmul(x, p["wv"])
    logits = hnp.multiply(hnp.einsum("btd,bsd->bts", q, k), SCALE)
    return hnp.matmul(hnn.softmax(logits, axis=-1), v)


def block_jnp(p, x):
    x = x + attention_jnp(p, layernorm_jnp(p, x))
    return x + mlp_jnp(p, rmsnorm_jnp(p, x))


def block_heddle(p, x):
    x = hnp.add(x, attention_heddle(p, layernorm_heddle(p, x)))
    return hnp.add(x, mlp_heddle(p, rmsnorm_heddle(p, x)))


_DN = ("NHWC", "HWIO", "NHWC")


def cnn_jnp(p, x):
    y = jax.lax.conv_general_dilated(x, p["k"], (1, 1), "SAME", dimension_numbers=_DN)
    y = jax.nn.relu(y + p["kb"])
    b, h, w, c = y.shape
    y = y.reshape(b, h // 2, 2, w // 2, 2, c).mean((2, 4))
    return y.reshape(b, -1) @ p["wc"]


def cnn_heddle(p, x):
    y = hlax.conv_general_dilated(x, p["k"], (1, 1), "SAME", dimension_numbers=_DN)
    y = hnn.relu(hnp.add(y, p["kb"]))
    b, h, w, c = y.shape
    y = hnp.mean(hnp.reshape(y, (b, h // 2, 2, w // 2, 2, c)), (2, 4))
    return hnp.matmul(hnp.reshape(y, (b, -1)), p["wc"])


def embed_jnp(p, ids):
    e = p["emb"][ids]
    upd = jnp.zeros_like(p["emb"]).at[ids].add(e)
    return e.sum(-1) + upd.sum()


def embed_heddle(p, ids):
    e = hnp.take(p["emb"], ids, axis=0)
    dn = jax.lax.ScatterDimensionNumbers((1,), (0,), (0,))
    upd = hlax.scatter_add(hnp.zeros_like(p["emb"]), ids[:, None], e, dn, mode="drop")
    return hnp.add(hnp.sum(e, -1), hnp.sum(upd))


MODELS = {
    "mlp": (mlp_jnp, mlp_heddle),
    "layernorm": (layernorm_jnp, layernorm_heddle),
    "rmsnorm": (rmsnorm_jnp, rmsnorm_heddle),
    "attention": (attention_jnp, attention_heddle),
    "block": (block_jnp, block_heddle),
    "cnn": (cnn_jnp, cnn_heddle),
    "embed": (embed_jnp, embed_heddle),
}


def params(dtype, seed=0, d=32, hidden=64, c=4):
    """Parameters of every model, in ``dtype``."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        s = scale if scale is not None else 1 / np.sqrt(shape[0])
        return jnp.asarray(rng.normal(0, s, shape).astype(np.float32)).astype(dtype)

    return {
        "w1": w(d, hidden), "b1": w(hidden, scale=0.1), "w2": w(hidden, d), "b2": w(d, scale=0.1),
        "g": w(d, scale=1.0), "b": w(d, scale=0.1),
        "wq": w(d, d), "wk": w(d, d), "wv": w(d, d),
        "k": w(3, 3, 3, c, scale=0.3), "kb": w(c, scale=0.1), "wc": w(4 * 4 * c, 10),
        "emb": w(20, d, scale=1.0),
    }  # fmt: skip


def inputs(name, dtype, seed=1, batch=2, t=8, d=32):
    """The model's input."""
    rng = np.random.default_rng(seed)
    if name == "cnn":
        return jnp.asarray(rng.normal(size=(batch, 8, 8, 3)).astype(np.float32)).astype(dtype)
    if name == "embed":
        return jnp.asarray(rng.integers(0, 20, size=(batch * t,)), jnp.int32)
    return jnp.asarray(rng.normal(size=(batch, t, d)).astype(np.float32)).astype(dtype)
