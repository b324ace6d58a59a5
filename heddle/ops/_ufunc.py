"""The ufunc methods of heddle.numpy's binary ufuncs: ``outer``, ``reduce``, ``accumulate``, ``at``, ...

jax.numpy's ufuncs (``add``, ``multiply``, ``maximum``, ``logaddexp``, ``logical_and``, ...) carry
these methods; heddle's versions are attributes of the policy function, with jax.numpy's signatures:

- ``outer(A, B)`` is the policy op on ``A`` with ``B.ndim`` trailing axes added, against ``B``;
- ``add`` and ``multiply`` reduce and accumulate as ``heddle.numpy.sum``/``prod``/``cumsum``/
  ``cumprod`` (float32 accumulation for narrow floats, integers in their accumulation dtype);
- every other ``reduce``/``accumulate``/``reduceat`` converts the operand to the op's result dtype
  for two such operands, then exactly to the compute dtype (float32 for narrow floats), runs
  jax.numpy's method there and rounds once: a ``logaddexp.reduce`` of bfloat16 accumulates in float32;
- ``at(a, indices, b, inplace=False)`` converts ``b`` to ``a``'s dtype (the result's), computes in the
  accumulation dtype (repeated indices combine in float32) and rounds once to ``a``'s dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from heddle.ops._core import compute_dtype
from heddle.ops._float_op import host_data
from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _scalars
from heddle.policy._policy import Policy, active

# ufunc -> the heddle.numpy reductions its reduce and accumulate are
DELEGATES = {"add": ("sum", "cumsum"), "multiply": ("prod", "cumprod")}


def _no_out(out: Any, qualname: str) -> None:
    if out is not None:
        raise NotImplementedError(
            f"heddle.numpy.{qualname}(out=...): JAX arrays are immutable, so there is no output "
            f"buffer to write; use the returned array: y = heddle.numpy.{qualname}(a)"
        )


@functools.lru_cache(maxsize=1024)
def _result(op: Callable[..., Any], d: np.dtype, p: Policy) -> np.dtype:
    s = jax.ShapeDtypeStruct((), d)
    return np.dtype(jax.eval_shape(op, s, s).dtype)


def _prepared(op: Callable[..., Any], a: Any, dtype: Any) -> tuple[jax.Array, np.dtype]:
    """(``a`` converted to the compute dtype, the result dtype) for a generic reduction of ``op``."""
    a = host_data(a)
    p = active()
    d = _scalars.resolve((a,), p)
    result = _result(op, d, p) if dtype is None else D.dtype(dtype)
    comp = compute_dtype(result, p)
    for x in {result, comp}:
        D.require_available(x, "heddle.numpy ufunc method")
    return cast(cast(materialise(a, d), result), comp), result


def _round(out: jax.Array, result: np.dtype) -> jax.Array:
    return out if out.dtype == result else cast(out, result)


def attach(name: str, op: Callable[..., Any], jufunc: Any, namespace: dict[str, Any]) -> None:
    """Gives the policy function ``op`` of the jax.numpy ufunc ``jufunc`` its ufunc methods.

    Args:
      name: the ufunc's name (``"add"``).
      op: heddle.numpy's policy function for it.
      jufunc: ``jax.numpy``'s ufunc object.
      namespace: heddle.numpy's names (for ``sum``, ``cumsum``, ...).
    """
    delegate = DELEGATES.get(name)

    def outer(A: Any, B: Any, /) -> jax.Array:
        """The op on every pair: ``result[i..., j...] = op(A[i...], B[j...])``."""
        A, B = host_data(A), host_data(B)
        nb = np.ndim(B)
        if np.ndim(A) and nb:
            A = jnp.reshape(A, (*np.shape(A), *(1,) * nb))
        return op(A, B)

    def reduce(
        a: Any,
        axis: int | None = 0,
        dtype: Any = None,
        out: None = None,
        keepdims: bool = False,
        initial: Any = None,
        where: Any = None,
    ) -> jax.Array:
        """The op folded over ``axis``, computed in the accumulation dtype and rounded once."""
        _no_out(out, f"{name}.reduce")
        if delegate is not None:
            red = namespace[delegate[0]]
            return red(a, axis=axis, dtype=dtype, keepdims=keepdims, initial=initial, where=where)
        x, result = _prepared(op, a, dtype)
        init = (
            None if initial is None else cast(cast(materialise(initial, result), result), x.dtype)
        )
        y = jufunc.reduce(x, axis=axis, keepdims=keepdims, initial=init, where=where)
        return _round(y, result)

    def accumulate(a: Any, axis: int = 0, dtype: Any = None, out: None = None) -> jax.Array:
        """The running op along ``axis``, computed in the accumulation dtype and rounded once."""
        _no_out(out, f"{name}.accumulate")
        if delegate is not None:
            return namespace[delegate[1]](a, axis=axis, dtype=dtype)
        x, result = _prepared(op, a, dtype)
        return _round(jufunc.accumulate(x, axis=axis), result)

    def reduceat(
        a: Any, indices: Any, axis: int = 0, dtype: Any = None, out: None = None
    ) -> jax.Array:
        """``reduce`` over the slices ``indices[i]:indices[i+1]``, in the accumulation dtype."""
        _no_out(out, f"{name}.reduceat")
        x, result = _prepared(op, a, dtype)
        return _round(jufunc.reduceat(x, indices, axis=axis), result)

    def at(a: Any, indices: Any, b: Any = None, /, *, inplace: bool = True) -> jax.Array:
        """``a`` with the op applied at ``indices`` (with ``b``), in the accumulation dtype: repeated
        indices combine in float32 for narrow floats; the result keeps ``a``'s dtype."""
        if inplace:
            raise NotImplementedError(
                f"heddle.numpy.{name}.at(..., inplace=True): JAX arrays are immutable, so the op "
                f"cannot update a in place; pass inplace=False and use the result: "
                f"a = heddle.numpy.{name}.at(a, indices, b, inplace=False)"
            )
        a = host_data(a)
        p = active()
        d = _scalars.resolve((a,), p)
        comp = compute_dtype(d, p)
        x = cast(materialise(a, d), comp)
        if b is None:
            return _round(jufunc.at(x, indices, inplace=False), d)
        y = cast(cast(materialise(host_data(b), d), d), comp)
        return _round(jufunc.at(x, indices, y, inplace=False), d)

    for method in (outer, reduce, accumulate, reduceat, at):
        method.__qualname__ = f"{name}.{method.__name__}"
        method.__doc__ = (
            f"heddle's policy version of ``jax.numpy.{name}.{method.__name__}``.\n\n"
            f"{method.__doc__}\n\nArgs:\n  *args: as for jax.numpy.{name}.{method.__name__}.\n"
            f"  **kwargs: as for jax.numpy.{name}.{method.__name__}.\n\n"
            f"Returns:\n  The result under heddle's dtype policy.\n"
        )
        setattr(op, method.__name__, method)
    op.nin, op.nout, op.identity = jufunc.nin, jufunc.nout, jufunc.identity


def ufunc_names() -> list[str]:
    """The names of jax.numpy's ufunc objects with two inputs."""
    return sorted(
        n for n in dir(jnp) if isinstance(getattr(jnp, n), jnp.ufunc) and getattr(jnp, n).nin == 2
    )
