"""Models for the audit tests: a bfloat16 MLP and a one-block transformer, written three ways.

- ``mlp_loss`` / ``block_loss`` with ``np=jax.numpy, nn=jax.nn``: plain JAX code, as most models are
  written. Their narrow accumulations are the matmuls without ``preferred_element_type``, the softmax
  (``exp`` in bfloat16, then summed) and, in the backward pass, the bias-gradient sums.
- The same functions with ``np=heddle.numpy, nn=heddle.nn``: one import changed.
- ``mlp_explicit_loss`` / ``block_explicit_loss``: plain JAX written in heddle's explicit style:
  matmuls with ``preferred_element_type=float32``, everything between them in float32, narrow values
  rounded once with ``astype``.

Array operations go through ``np``/``nn`` (never the ``@`` operator) so that the module swap reaches
every op. The ``*_specs`` helpers give ``jax.ShapeDtypeStruct`` arguments (nothing is allocated).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

BF16 = jnp.bfloat16
F32 = jnp.float32


# -- plain code, parametrised by the numpy / nn modules ----------------------------------------------


def mlp(params: list[dict[str, Any]], x: Any, np: Any = jnp, nn: Any = jax.nn) -> Any:
    """Logits of an MLP with ReLU hidden layers."""
    h = x
    for layer in params[:-1]:
        h = nn.relu(np.add(np.matmul(h, layer["w"]), layer["b"]))
    last = params[-1]
    return np.add(np.matmul(h, last["w"]), last["b"])


def mlp_loss(
    params: list[dict[str, Any]], x: Any, labels: Any, np: Any = jnp, nn: Any = jax.nn
) -> Any:
    """Mean cross-entropy of the MLP against one-hot labels."""
    logp = nn.log_softmax(mlp(params, x, np, nn), axis=-1)
    return np.negative(np.mean(np.sum(np.multiply(logp, labels), axis=-1)))


def layer_norm(x: Any, g: Any, b: Any, np: Any = jnp) -> Any:
    """Layer normalisation over the last axis."""
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    return np.add(np.multiply(np.divide(np.subtract(x, mu), np.sqrt(np.add(var, 1e-5))), g), b)


def block(p: dict[str, Any], x: Any, np: Any = jnp, nn: Any = jax.nn) -> Any:
    """One pre-norm transformer block (single head) on ``x`` of shape ``[tokens, width]``."""
    h = layer_norm(x, p["ln1_g"], p["ln1_b"], np)
    q = np.matmul(h, p["wq"])
    k = np.matmul(h, p["wk"])
    v = np.matmul(h, p["wv"])
    scores = np.divide(np.matmul(q, np.transpose(k)), math.sqrt(q.shape[-1]))
    attn = nn.softmax(scores, axis=-1)
    x = np.add(x, np.matmul(np.matmul(attn, v), p["wo"]))
    h = layer_norm(x, p["ln2_g"], p["ln2_b"], np)
    up = nn.gelu(np.add(np.matmul(h, p["w1"]), p["b1"]))
    return np.add(np.add(x, np.matmul(up, p["w2"])), p["b2"])


def block_loss(p: dict[str, Any], x: Any, np: Any = jnp, nn: Any = jax.nn) -> Any:
    """Mean square of the block's output (a stand-in loss)."""
    return np.mean(np.square(block(p, x, np, nn)))


# -- plain JAX in heddle's explicit style ------------------------------------------------------------


def _dot(a: Any, b: Any) -> Any:
    """``a @ b`` accumulated and returned in float32 (inputs stay in their own dtype)."""
    return lax.dot_general(
        a, b, (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )


def mlp_explicit(params: list[dict[str, Any]], x: Any) -> Any:
    """The MLP's logits in float32; hidden activations rounded once per layer to ``x.dtype``."""
    h = x
    for layer in params[:-1]:
        h32 = _dot(h, layer["w"]) + layer["b"].astype(F32)
        h = jax.nn.relu(h32).astype(x.dtype)
    last = params[-1]
    return _dot(h, last["w"]) + last["b"].astype(F32)


def mlp_explicit_loss(params: list[dict[str, Any]], x: Any, labels: Any) -> Any:
    """Cross-entropy in float32 on the float32 logits."""
    logp = jax.nn.log_softmax(mlp_explicit(params, x), axis=-1)
    return -jnp.mean(jnp.sum(logp * labels.astype(F32), axis=-1))


def block_explicit(p: dict[str, Any], x: Any) -> Any:
    """The block with a float32 residual stream; matmul inputs rounded once to ``x.dtype``."""
    narrow = x.dtype
    p32 = {k: v.astype(F32) for k, v in p.items() if k.startswith(("ln", "b"))}
    x32 = x.astype(F32)
    h = layer_norm(x32, p32["ln1_g"], p32["ln1_b"]).astype(narrow)
    q, k, v = _dot(h, p["wq"]), _dot(h, p["wk"]), _dot(h, p["wv"])
    attn = jax.nn.softmax(jnp.matmul(q, k.T) / math.sqrt(q.shape[-1]), axis=-1)
    x32 = x32 + _dot(jnp.matmul(attn, v).astype(narrow), p["wo"])
    h = layer_norm(x32, p32["ln2_g"], p32["ln2_b"]).astype(narrow)
    up = jax.nn.gelu(_dot(h, p["w1"]) + p32["b1"]).astype(narrow)
    return (x32 + _dot(up, p["w2"]) + p32["b2"]).astype(narrow)


def block_explicit_loss(p: dict[str, Any], x: Any) -> Any:
    """Mean square of the block's output, in float32."""
    return jnp.mean(jnp.square(block_explicit(p, x).astype(F32)))


# -- arguments ---------------------------------------------------------------------------------------


def mlp_specs(
    batch: int = 32, sizes: tuple[int, ...] = (64, 32, 10), dtype: Any = BF16
) -> tuple[list[dict[str, Any]], Any, Any]:
    """``(params, x, labels)`` as ``jax.ShapeDtypeStruct``s."""
    params = [
        {"w": jax.ShapeDtypeStruct((m, n), dtype), "b": jax.ShapeDtypeStruct((n,), dtype)}
        for m, n in itertools.pairwise(sizes)
    ]
    x = jax.ShapeDtypeStruct((batch, sizes[0]), dtype)
    labels = jax.ShapeDtypeStruct((batch, sizes[-1]), dtype)
    return params, x, labels


def block_shapes(tokens: int = 16, width: int = 32, hidden: int = 64) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of ``block``."""
    return {
        "ln1_g": (width,),
        "ln1_b": (width,),
        "wq": (width, width),
        "wk": (width, width),
        "wv": (width, width),
        "wo": (width, width),
        "ln2_g": (width,),
        "ln2_b": (width,),
        "w1": (width, hidden),
        "b1": (hidden,),
        "w2": (hidden, width),
        "b2": (width,),
    }


def block_specs(
    tokens: int = 16, width: int = 32, hidden: int = 64, dtype: Any = BF16
) -> tuple[dict[str, Any], Any]:
    """``(params, x)`` as ``jax.ShapeDtypeStruct``s."""
    params = {
        k: jax.ShapeDtypeStruct(s, dtype) for k, s in block_shapes(tokens, width, hidden).items()
    }
    return params, jax.ShapeDtypeStruct((tokens, width), dtype)


def materialise(tree: Any, seed: int = 0, scale: float = 0.3) -> Any:
    """Random NumPy arrays with the shapes and dtypes of a tree of ``ShapeDtypeStruct``s."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: (scale * rng.standard_normal(s.shape)).astype(s.dtype),
        tree,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
    )
