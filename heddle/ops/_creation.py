"""Creation ops: the ``dtype`` argument, else the scalar defaults or the typed input's own dtype.

POLICY.md 4 (creation). Python scalars and nested lists take the policy's defaults (float32, int32,
complex64), never NumPy's 64-bit ones; host float64 data converts to a narrower ``dtype`` with heddle's
correctly rounded cast.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from heddle.ops._core import cast, materialise
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._policy import current

_HOST_DEFAULTS = {
    "b": None,
    "i": "default_int",
    "u": "default_int",
    "f": "default_float",
    "c": "default_complex",
}


def _want(dtype: Any, fallback: Callable[[], np.dtype], what: str) -> np.dtype:
    d = fallback() if dtype is None else D.dtype(dtype)
    return D.require_available(d, what)


def _default_float() -> np.dtype:
    return current().default_float


def _like(fn: Callable[..., Any]) -> Callable[..., Any]:
    first = next(iter(inspect.signature(fn).parameters))  # "a", or "prototype" for empty_like

    @functools.wraps(fn)
    def op(*args: Any, dtype: Any = None, **kwargs: Any) -> jax.Array:
        a = args[0] if args else kwargs.pop(first)
        if len(args) > 1:  # dtype given positionally
            dtype, args = args[1], args[:1] + args[2:]
        d = _want(dtype, lambda: _scalars.resolve((a,)), f"{fn.__name__}")
        return fn(a, d, *args[1:], **kwargs)

    return op


def _shaped(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def op(shape: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> jax.Array:
        return fn(shape, _want(dtype, _default_float, fn.__name__), *args, **kwargs)

    return op


zeros = _shaped(jnp.zeros)
ones = _shaped(jnp.ones)
empty = _shaped(jnp.empty)
zeros_like = _like(jnp.zeros_like)
ones_like = _like(jnp.ones_like)
empty_like = _like(jnp.empty_like)


@functools.wraps(jnp.full)
def full(shape: Any, fill_value: Any, dtype: Any = None, **kwargs: Any) -> jax.Array:
    d = _want(dtype, lambda: _scalars.resolve((fill_value,)), "full")
    return jnp.full(shape, _value_as(fill_value, d), d, **kwargs)


@functools.wraps(jnp.full_like)
def full_like(
    a: Any, fill_value: Any, dtype: Any = None, shape: Any = None, **kwargs: Any
) -> jax.Array:
    d = _want(dtype, lambda: _scalars.resolve((a,)), "full_like")
    return jnp.full_like(a, _value_as(fill_value, d), d, shape, **kwargs)


def _value_as(value: Any, d: np.dtype) -> Any:
    if _scalars.scalar_kind(value) is not None and not hasattr(value, "dtype"):
        _scalars.resolve((np.zeros((), d), value))  # range check against d
        return materialise(value, d)
    return cast(asarray(value), d)


def _host_default(arr: np.ndarray) -> np.dtype:
    """The dtype Python data (lists, scalars) takes: the policy's defaults, not NumPy's 64-bit ones."""
    field = _HOST_DEFAULTS[D.kind(np.dtype(arr.dtype)) if arr.dtype in D.DTYPES else "f"]
    return np.dtype(bool) if field is None else getattr(current(), field)


def _is_python_data(obj: Any) -> bool:
    return isinstance(obj, (list, tuple, bool, int, float, complex)) and not isinstance(
        obj, np.generic
    )


@functools.wraps(jnp.asarray)
def asarray(
    a: Any, dtype: Any = None, order: Any = None, *, copy: Any = None, **kwargs: Any
) -> jax.Array:
    if _is_python_data(a):
        host = np.asarray(a)
        d = _host_default(host) if dtype is None else D.dtype(dtype)
        if d.kind in "iu" and host.dtype.kind in "iu" and host.size:
            _scalars.resolve((np.zeros((), d), int(host.max()), int(host.min())))  # range check
        src = host
    else:
        src = a
        d = D.dtype(src) if dtype is None else D.dtype(dtype)
        if dtype is None:
            D.require_available(d, "asarray of 64-bit host data")
    D.require_available(d, "asarray")
    out = cast(src, d)
    return (
        jnp.asarray(out, order=order, copy=copy, **kwargs)
        if order or copy or kwargs
        else jnp.asarray(out)
    )


@functools.wraps(jnp.array)
def array(
    object: Any,
    dtype: Any = None,
    copy: bool = True,
    order: Any = "K",
    ndmin: int = 0,
    **kwargs: Any,
) -> jax.Array:
    out = asarray(object, dtype)
    return jnp.array(out, copy=copy, order=order, ndmin=ndmin, **kwargs)


def _ranged(fn: Callable[..., Any], float_only: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def op(*args: Any, dtype: Any = None, **kwargs: Any) -> jax.Array:
        given = (*args[:3], *(kwargs.get(k) for k in ("start", "stop", "step")))
        scalars = tuple(a for a in given if a is not None)
        p = current()
        if dtype is not None:
            d = D.dtype(dtype)
        else:
            common = _scalars.resolve(scalars or (0.0,), p)
            d = (
                _rules.result_dtype(_rules.OpClass.FLOAT_ONLY, common, policy=p)
                if float_only
                else common
            )
        D.require_available(d, fn.__name__)
        comp = _rules.acc_dtype(d, p) if D.kind(d) == "f" else d
        return cast(fn(*args, dtype=comp, **kwargs), d)

    return op


arange = _ranged(jnp.arange, float_only=False)
linspace = _ranged(jnp.linspace, float_only=True)
logspace = _ranged(jnp.logspace, float_only=True)
geomspace = _ranged(jnp.geomspace, float_only=True)


@functools.wraps(jnp.eye)
def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = None, **kwargs: Any) -> jax.Array:
    return jnp.eye(N, M, k, _want(dtype, _default_float, "eye"), **kwargs)


@functools.wraps(jnp.identity)
def identity(n: int, dtype: Any = None) -> jax.Array:
    return jnp.identity(n, _want(dtype, _default_float, "identity"))


def _window(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> jax.Array:
        return cast(fn(*args, **kwargs), D.require_available(_default_float(), fn.__name__))

    return op


bartlett = _window(jnp.bartlett)
blackman = _window(jnp.blackman)
hamming = _window(jnp.hamming)
hanning = _window(jnp.hanning)
kaiser = _window(jnp.kaiser)

CREATION = {
    name: globals()[name]
    for name in (
        "zeros ones empty zeros_like ones_like empty_like full full_like asarray array arange "
        "linspace logspace geomspace eye identity bartlett blackman hamming hanning kaiser"
    ).split()
}
