"""Creation ops: the ``dtype`` argument, else the scalar defaults or the typed input's own dtype.

POLICY.md 4 (creation). Python scalars and nested lists take the policy's defaults (float32, int32,
complex64), never NumPy's 64-bit ones; host float64 data converts to a narrower ``dtype`` with heddle's
correctly rounded cast.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._errors import PrecisionError, message
from heddle.policy._policy import active

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
    return active().default_float


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
    return jnp.full(shape, _value_as(fill_value, d, dtype is not None, "full"), d, **kwargs)


@functools.wraps(jnp.full_like)
def full_like(
    a: Any, fill_value: Any, dtype: Any = None, shape: Any = None, **kwargs: Any
) -> jax.Array:
    d = _want(dtype, lambda: _scalars.resolve((a,)), "full_like")
    fill = _value_as(fill_value, d, True, "full_like")
    return jnp.full_like(a, fill, d, shape, **kwargs)


def _value_as(value: Any, d: np.dtype, explicit: bool, what: str) -> Any:
    if _scalars.scalar_kind(value) is not None and not hasattr(value, "dtype"):
        for v in _scalars._concrete(value):
            check_created(v, d, explicit, what)
        return materialise(value, d)
    return asarray(value, d)  # host float64 data rounds once to d, with or without x64


def check_created(value: Any, d: np.dtype, explicit: bool, what: str) -> None:
    """Range check (POLICY.md 3) of a value a creation function ``what`` writes into ``d``:
    ``explicit`` when the user asked for ``d`` (the message then suggests a dtype that holds it),
    else ``d`` is the policy's default (the message suggests a typed value or a wider default)."""
    p = active()
    if not explicit:
        _scalars._check_range(value, d, p, None)
        return
    try:
        _scalars._check_range(value, d, p, d)
    except _scalars.ScalarRangeError:
        part = max((value.real, value.imag), key=abs) if isinstance(value, complex) else value
        if D.kind(d) in "iu":
            wider, why = _scalars._wider_int(part, d), f"it is outside {d.name}'s range"
        else:
            w = _scalars._wider_float(Fraction(part), D.real_dtype(d))
            wider, why = (w.name if w else "float64"), f"it rounds past {d.name}'s largest value"
        if D.kind(d) == "c":
            wider = _scalars._complex_of(np.dtype(wider)).name
        raise _scalars.ScalarRangeError(
            message(
                f"{what} with dtype={d.name} holds the value {_scalars._show(value)}",
                f"{why} and heddle does not wrap or overflow to inf silently",
                f"Ask for a dtype that holds it: dtype='{wider}'.",
            )
        ) from None


def _host_default(arr: np.ndarray) -> np.dtype:
    """The dtype Python data (lists, scalars) takes: the policy's defaults, not NumPy's 64-bit ones."""
    field = _HOST_DEFAULTS[D.kind(np.dtype(arr.dtype)) if arr.dtype in D.DTYPES else "f"]
    return np.dtype(bool) if field is None else getattr(active(), field)


def _is_python_data(obj: Any) -> bool:
    return isinstance(obj, (list, tuple, bool, int, float, complex)) and not isinstance(
        obj, np.generic
    )


def _holds_arrays(obj: Any) -> bool:
    """Whether Python data (lists, tuples) holds JAX arrays (tracers too), which NumPy cannot read
    under ``jax.jit``."""
    return isinstance(obj, (list, tuple)) and any(
        isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(obj)
    )


def _stacked(obj: Any, dtype: Any) -> jax.Array:
    """A list or tuple holding arrays as one array: their promotion (or ``dtype``), each converted
    with heddle's cast; works on traced arrays (``jax.jit``), where NumPy cannot look inside."""
    leaves, tree = jax.tree.flatten(obj)
    d = _scalars.resolve(tuple(leaves)) if dtype is None else D.dtype(dtype)
    D.require_available(d, "asarray")
    if dtype is not None:
        _scalars.resolve((np.zeros((), d), *(v for v in leaves if _is_python_data(v))))
    converted = [materialise(v, d) if _is_python_data(v) else cast(v, d) for v in leaves]
    return jnp.asarray(jax.tree.unflatten(tree, converted))


def _host(a: Any) -> np.ndarray:
    """Python data as a NumPy array; a typed error for what is not numbers."""
    host = np.asarray(a)
    if host.dtype.kind not in "OUSV":
        return host
    flat = [a] if isinstance(a, (str, bytes)) else list(np.ravel(host))
    big = [v for v in flat if type(v) is int and not -(2**63) <= v < 2**64]
    if big:  # NumPy keeps ints past int64/uint64 as Python objects
        raise _scalars.ScalarRangeError(
            message(
                f"asarray({_scalars._show(big[0])})",
                "the Python int is outside the range of every integer dtype (int64, uint64 at most)",
                f"Pass it as a float, e.g. heddle.numpy.asarray(float({_scalars._show(big[0])})).",
            )
        )
    odd = next((v for v in flat if _scalars.scalar_kind(v) is None), a)
    raise TypeError(
        message(
            f"asarray({_scalars._show(a)})",
            f"{type(odd).__name__} {_scalars._show(odd)} is not a number, and heddle arrays hold "
            "numbers only",
            "Pass numbers, e.g. float('nan') for a missing value: "
            "heddle.numpy.asarray([1, float('nan')]); text converts first: float('1.5').",
        )
    )


def _check_data(host: np.ndarray, d: np.dtype, explicit: bool) -> None:
    """Range checks of Python data against the dtype it takes (POLICY.md 3): no silent wrap or
    overflow to inf, as for the Python scalars of ``full`` and the ops."""
    if host.size and host.dtype.kind in "iufcO":
        for value in _scalars._concrete(host):
            check_created(value, d, explicit, "asarray")


@functools.wraps(jnp.asarray)
def asarray(
    a: Any, dtype: Any = None, order: Any = None, *, copy: Any = None, **kwargs: Any
) -> jax.Array:
    if isinstance(a, (str, bytes)):  # not data, nor a dtype name
        _host(a)
    if _holds_arrays(a):
        out = _stacked(a, dtype)
        return (
            jnp.asarray(out, order=order, copy=copy, **kwargs) if order or copy or kwargs else out
        )
    if type(a) in (int, float, complex) and (dtype is not None or type(a) is not int):
        d = _host_default(np.asarray(a)) if dtype is None else D.dtype(dtype)
        D.require_available(d, "asarray")
        _check_data(np.asarray(a, object if type(a) is int else None), d, dtype is not None)
        src = materialise(a, d)  # rounded once, a Python int of any size too
    elif _is_python_data(a):
        host = _host(a)
        d = _host_default(host) if dtype is None else D.dtype(dtype)
        _check_data(host, d, dtype is not None)
        src = host
    else:
        src = a
        d = D.dtype(src) if dtype is None else D.dtype(dtype)
        if dtype is None and D.is_64bit(d) and not D.x64_enabled():
            narrow = {"f": "float32", "i": "int32", "u": "uint32", "c": "complex64"}[D.kind(d)]
            raise PrecisionError(
                message(
                    f"asarray of {d.name} host data",
                    "64-bit dtypes need jax_enable_x64, which is off, and heddle never narrows "
                    "silently",
                    "Pass the dtype you want, rounded once from the host values: "
                    f"heddle.numpy.asarray(x, dtype='{narrow}') (any narrower dtype works the same "
                    "way), or enable x64 with jax.config.update('jax_enable_x64', True).",
                )
            )
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


def _arange_ends(*args: Any, start: Any = None, stop: Any = None, step: Any = None) -> list:
    """The first and last value of ``arange(...)``, from its concrete arguments."""
    given = [*args, None, None, None]
    if start is None and stop is None:
        start, stop = (0, given[0]) if given[1] is None else (given[0], given[1])
    elif stop is None:
        start, stop = given[0] if start is None else start, given[1] if start is None else given[0]
    step = given[2] if step is None and given[2] is not None else (1 if step is None else step)
    start = 0 if start is None else start
    if stop is None:
        start, stop = 0, start
    start, stop, step = (np.asarray(v).item() for v in (start, stop, step))
    n = max(math.ceil((stop - start) / step), 0)
    return [start, start + (n - 1) * step] if n else []


def _linspace_ends(start: Any, stop: Any, *args: Any, **kwargs: Any) -> list:
    return [start, stop]


def _logspace_ends(
    start: Any, stop: Any, num: int = 50, endpoint: bool = True, base: Any = 10.0, **kwargs: Any
) -> list:
    out = []
    for e in (start, stop):
        b, e = float(np.asarray(base).item()), float(np.asarray(e).item())
        try:
            out.append(b**e)
        except OverflowError:  # past every float: an exact value past the threshold
            out.append(2**1100)
    return out


def _ranged(
    fn: Callable[..., Any], float_only: bool, ends: Callable[..., list] | None = None
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def op(*args: Any, dtype: Any = None, **kwargs: Any) -> jax.Array:
        given = (*args[:3], *(kwargs.get(k) for k in ("start", "stop", "step")))
        scalars = tuple(a for a in given if a is not None)
        p = active()
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
        if ends is not None and p.check_scalar_range:  # no silent wrap or overflow (POLICY.md 3)
            try:
                values = [
                    v if isinstance(v, Fraction) else np.asarray(v).item()
                    for v in ends(*args, **kwargs)
                ]
            except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
                values = []  # traced (linspace under jit) or not numbers: JAX's own errors
            for v in values:
                if isinstance(v, (int, float, complex, Fraction)) and not isinstance(v, bool):
                    check_created(v, d, dtype is not None, fn.__name__)
        comp = _rules.acc_dtype(d, p) if D.kind(d) == "f" else d
        return cast(fn(*args, dtype=comp, **kwargs), d)

    return op


arange = _ranged(jnp.arange, float_only=False, ends=_arange_ends)
linspace = _ranged(jnp.linspace, float_only=True, ends=_linspace_ends)
logspace = _ranged(jnp.logspace, float_only=True, ends=_logspace_ends)
geomspace = _ranged(jnp.geomspace, float_only=True, ends=_linspace_ends)


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
