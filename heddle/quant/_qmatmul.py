"""``qmatmul``: ``x @ dequantize(q)`` with float32 accumulation, without a rounded weight.

Two plans, chosen from the layout (static, so under ``jax.jit`` it costs nothing):

- the scale is constant along the contraction axis (per tensor, or per output channel:
  ``quantize(w, fmt, axis=0)``): contract with the exact element values and multiply the float32
  result by the scales, ``(x @ codes) * scale``. Element values of the integer and float formats
  are exact in bfloat16 and float16, so a narrow ``x`` keeps its dtype for the contraction;
- otherwise (blocks along the contraction axis, NF4, MX): dequantise to float32 (exact for MX) and
  contract in float32.

A weight of 1024 rows or more is contracted in slabs of 512 rows (``lax.scan``, float32 running
sum): each slab is dequantised just before its contraction, so the float32 copy of the whole weight
never exists. On CPU this brings the int8 contraction to about 1.1x a float32 matmul, against
1.3-1.5x for dequantising the whole weight first (benchmarks/RESULTS-quant.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import heddle.numpy as hnp
from heddle.policy import _dtypes as D
from heddle.policy._errors import message
from heddle.policy._rules import promote_types
from heddle.quant import _sharding
from heddle.quant._formats import decode
from heddle.quant._qarray import QArray
from heddle.quant._quantize import codes, values

_NARROW = (np.dtype(jnp.bfloat16), np.dtype(np.float16))


def qmatmul(
    x: jax.typing.ArrayLike,
    q: QArray,
    *,
    preferred_element_type: jax.typing.DTypeLike | None = None,
) -> jax.Array:
    """Contracts the last axis of ``x`` with the first axis of a quantised 2-D weight.

    Dtypes: result ``promote_types(x.dtype, q.dtype)`` (or ``preferred_element_type``);
    accumulation float32 (float64 for a float64 result); one rounding, on store.

    Args:
      x: a float array of shape ``(..., K)``.
      q: a ``QArray`` of shape ``(K, N)``. Quantise weights with ``axis=0`` (scales along the
        contraction axis: per output channel, or blocks along ``K``).
      preferred_element_type: the result dtype, if not the promotion of ``x`` and ``q.dtype``.

    Returns:
      An array of shape ``(..., N)``.

    Raises:
      TypeError: ``q`` is not a 2-D ``QArray``, or ``x`` is not a float array.
      ValueError: the contraction sizes differ.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> w = jnp.eye(4, dtype=jnp.bfloat16) * 2
      >>> q = hq.quantize(w, "int8", axis=0)
      >>> hq.qmatmul(jnp.ones((1, 4), jnp.bfloat16), q)
      Array([[2, 2, 2, 2]], dtype=bfloat16)
    """
    if not isinstance(q, QArray) or q.ndim != 2:
        fix = (
            "Quantise the weight first: heddle.quant.qmatmul(x, heddle.quantize(w, 'int8', "
            "axis=0))."
        )
        if isinstance(q, QArray):
            fix = (
                "Quantise the weight as a 2-D (K, N) array: heddle.quant.qmatmul(x, "
                "heddle.quantize(w.reshape(K, -1), 'int8', axis=0)), then reshape the result."
            )
        raise TypeError(
            message(
                f"qmatmul(x, <{type(q).__name__} of {getattr(q, 'ndim', '?')} dims>)",
                "the weight must be a 2-D QArray of shape (K, N)",
                fix,
            )
        )
    if not isinstance(x, jax.Array):
        x = jnp.asarray(np.asarray(x))
    xd = D.dtype(x.dtype)
    if D.kind(xd) != "f":
        raise TypeError(
            message(
                f"qmatmul(<{xd.name} array>, q)",
                "activations must be float arrays",
                "Convert them first: qmatmul(heddle.numpy.astype(x, 'float32'), q).",
            )
        )
    if x.ndim < 1 or x.shape[-1] != q.shape[0]:
        raise ValueError(
            message(
                f"qmatmul(<array of shape {tuple(x.shape)}>, <QArray of shape {q.shape}>)",
                "the last axis of x must have the size of the weight's first axis",
                "Transpose or reshape x so that its last axis is the contraction axis.",
            )
        )
    if preferred_element_type is None:
        r = promote_types(xd, q.dtype)
    else:
        r = D.dtype(preferred_element_type)
    D.require_available(r, "qmatmul")
    return _qmatmul(x, q, r)


_CHUNK = 512  # rows of the weight dequantised at a time


def _chunks(q: QArray) -> int:
    """How many slabs of ``_CHUNK`` rows the contraction runs in (1: all at once)."""
    k = q.shape[0]
    if k < 2 * _CHUNK or k % _CHUNK:
        return 1
    if _sharding.devices_along(q.data, 0)[1] > 1:
        return 1  # K split over devices: each holds part of the contraction already
    if q.axis == -2 and q.scales.shape[0] > 1 and _CHUNK % (k // q.scales.shape[0]):
        return 1  # blocks along K that straddle a slab
    return k // _CHUNK


def _slab_leaves(q: QArray, n: int) -> tuple[jax.Array, jax.Array | None]:
    """The leaves split into ``n`` slabs of rows; scales None where one row serves every slab."""
    data = q.data.reshape(n, -1, *q.data.shape[1:])
    if q.scales.shape[0] == 1:
        return data, None
    return data, q.scales.reshape(n, -1, *q.scales.shape[1:])


@functools.partial(jax.jit, static_argnums=(2,))
def _qmatmul(x: jax.Array, q: QArray, r: np.dtype) -> jax.Array:
    cd = np.dtype(np.float64 if r == np.float64 else np.float32)
    f = q.fmt
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    after = q.scales.shape[0] == 1 and f.family in ("int", "float")  # scale constant along K
    od = np.dtype(x.dtype) if after and np.dtype(x.dtype) in _NARROW else cd
    xc = hnp.astype(x, od)

    def weight(qi: QArray) -> jax.Array:
        if after:
            return hnp.astype(decode(codes(qi), f), od)  # exact: the scale comes after
        return values(qi, cd, subnormals=False)

    n = _chunks(q)
    if n == 1:
        out = lax.dot_general(xc, weight(q), dims, preferred_element_type=cd)
    else:  # dequantise one slab of rows at a time: the float32 weight is never whole in memory
        data, scales = _slab_leaves(q, n)
        rows = q.length // n if q.axis == -2 else q.length
        xs = jnp.moveaxis(xc.reshape(*xc.shape[:-1], n, -1), -2, 0)

        def step(acc: jax.Array, part: tuple) -> tuple[jax.Array, None]:
            xi, di, *si = part
            qi = QArray(di, si[0] if si else q.scales, f.name, q.dtype, q.axis, rows)
            return acc + lax.dot_general(xi, weight(qi), dims, preferred_element_type=cd), None

        acc = jnp.zeros((*x.shape[:-1], q.shape[1]), cd)
        parts = (xs, data) if scales is None else (xs, data, scales)
        out, _ = lax.scan(step, acc, parts)
    if after:
        out = out * hnp.astype(lax.index_in_dim(q.scales, 0, 0, keepdims=False), cd)
    return hnp.astype(out, r)
