"""Computing a JAX function in the accumulation dtype and rounding once: ``float_op``.

``float_op`` wraps any JAX function whose value operands are named parameters: the whole of JAX's
own implementation runs in the accumulation dtype (float32 for narrow floats) and the outputs are
rounded once at the end, so every intermediate stays in float32 (POLICY.md 5). ``heddle/ops/_nn.py``
(activations, the softmax family, attention) and ``heddle/ops/_linalg.py`` are built on it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from heddle.ops._core import _EAGER, compute_dtype, remember
from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _lattice, _rules, _scalars
from heddle.policy._policy import Policy, active
from heddle.policy._rules import OpClass

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _positions(fn: Callable[..., Any]) -> dict[str, int]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: i for i, p in enumerate(params) if p.kind in _POSITIONAL}


def complex_of(d: np.dtype) -> np.dtype:
    """The narrowest complex dtype whose real part holds every value of the real dtype ``d``."""
    if D.kind(d) == "c":
        return d
    out = _lattice.least_upper_bound([d], _lattice.COMPLEXES)
    return np.dtype("complex64") if out is None else out


def round_outputs(out: Any, result: np.dtype, p: Policy) -> Any:
    """Rounds every array leaf of ``out`` once to the dtype the policy gives it.

    A real float leaf takes the real part of ``result``; a complex leaf takes ``result`` if it is
    complex, else the narrowest complex holding it; an integer leaf takes ``result`` when ``result``
    is an integer (an integrality-preserving op), else the policy's index dtype (counts and ranks);
    bool leaves are left alone.
    """

    def leaf(o: Any) -> Any:
        d = getattr(o, "dtype", None)
        if d is None:
            return o
        k = D.kind(np.dtype(d))
        if k == "f":
            want = D.real_dtype(result) if D.is_inexact(result) else p.int_float_dtype
        elif k == "c":
            want = complex_of(result) if D.is_inexact(result) else p.default_complex
        elif k in "iu":
            want = result if D.is_integer(result) else p.index_dtype
        else:
            return o
        return o if o.dtype == want else cast(o, want)

    return jax.tree.map(leaf, out)


def precision_scope(comp: np.dtype, p: Policy) -> contextlib.AbstractContextManager[Any]:
    """``jax.default_matmul_precision`` for contractions inside JAX code computing in ``comp``.

    float32 and complex64 contractions run at ``Precision.HIGHEST`` unless the policy's
    ``float32_matmul_precision`` says otherwise; other dtypes need no scope.
    """
    if D.real_dtype(comp) == np.float32 and p.float32_matmul_precision != "default":
        return jax.default_matmul_precision(p.float32_matmul_precision)
    return contextlib.nullcontext()


_DYNAMIC = object()  # marks an array argument in a kernel's template


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def _template(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple, list[Any]]:
    """(hashable template of the non-array arguments, the array arguments in order)."""
    arrays: list[Any] = []

    def mark(v: Any) -> Any:
        if _is_array(v):
            arrays.append(v)
            return _DYNAMIC
        return v

    targs = tuple(mark(a) for a in args)
    tkw = tuple((k, mark(kwargs[k])) for k in sorted(kwargs))
    return (targs, tkw), arrays


def _static_key(v: Any) -> Any:
    """A non-array argument as a kernel's cache key: numbers by type and value as written
    (``0.0`` and ``-0.0``, ``1`` and ``1.0``, ``True`` and ``1`` are equal in Python, not here)."""
    if isinstance(v, (tuple, list)):
        return type(v), tuple(_static_key(x) for x in v)
    if isinstance(v, np.generic):
        return type(v), v.tobytes()
    if isinstance(v, (bool, int, float, complex)):
        return type(v), repr(v)
    return v


def _fill(template: tuple, arrays: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    it = iter(arrays)
    targs, tkw = template
    args = [next(it) if a is _DYNAMIC else a for a in targs]
    kwargs = {k: next(it) if v is _DYNAMIC else v for k, v in tkw}
    return args, kwargs


def host_data(x: Any) -> Any:
    """Nested lists and tuples as arrays at the policy's defaults (as ``heddle.numpy.asarray``)."""
    if isinstance(x, (list, tuple)):
        from heddle.ops._creation import asarray

        return asarray(x)
    return x


def float_op(
    fn: Callable[..., Any],
    qualname: str,
    *,
    op_class: OpClass = OpClass.FLOAT_ONLY,
    values: Sequence[str] = ("x",),
    params: Sequence[str] = (),
    matmul: bool = False,
    widen: bool = True,
) -> Callable[..., Any]:
    """Wraps a JAX function so that it computes in the accumulation dtype and rounds once.

    Eagerly, the conversions, the call and the rounding run as one jitted kernel per (dtypes,
    non-array arguments); under an outer ``jax.jit`` they are traced inline.

    Args:
      fn: the JAX function.
      qualname: its public name (``"nn.softmax"``), for messages and docs.
      op_class: fixes the result dtype from the value operands (POLICY.md 4).
      values: names of the parameters that are value operands: they take part in promotion and are
        converted, with heddle's cast, to the result dtype and then exactly to the compute dtype.
      params: names of numeric hyper-parameters (``alpha``, ``epsilon``, ``rcond``): they do not take
        part in promotion; an array is converted to the compute dtype's real part, a Python scalar is
        passed on unrounded.
      matmul: whether ``fn`` contracts internally (run under ``precision_scope``).
      widen: whether the value operands reach ``fn`` widened to the compute dtype (the default), or
        rounded to the result dtype only, for an ``fn`` that widens them itself where it reads them
        (so that XLA can fuse the conversion into its one consumer).

    Returns:
      The wrapped function; ``inspect.signature`` of it is that of ``fn``.

    Raises:
      TypeError: at import, when a name in ``values`` or ``params`` is not a parameter of ``fn``.
    """
    known = inspect.signature(fn).parameters
    missing = [n for n in (*values, *params) if n not in known]
    if missing:  # a table entry that no longer matches JAX's signature: fail at import, loudly
        raise TypeError(f"heddle.{qualname}: JAX's signature has no parameter {missing}")
    pos = _positions(fn)
    slots = [(n, pos.get(n)) for n in values]
    pslots = [(n, pos.get(n)) for n in params]
    kernels: dict[tuple, Callable[..., Any]] = {}

    def present(args: Sequence[Any], kwargs: dict[str, Any], which: list) -> list:
        out = []
        for n, i in which:
            v = kwargs[n] if n in kwargs else args[i] if i is not None and i < len(args) else None
            if v is not None:
                out.append((n, i, v))
        return out

    def put(args: list[Any], kwargs: dict[str, Any], n: str, i: int | None, v: Any) -> None:
        if n in kwargs:
            kwargs[n] = v
        else:
            args[i] = v

    def compute(args: list[Any], kwargs: dict[str, Any], result: np.dtype, p: Policy) -> Any:
        comp = compute_dtype(result, p)
        for n, i, v in present(args, kwargs, slots):
            v = cast(v, result)
            put(args, kwargs, n, i, cast(v, comp) if widen else v)
        for n, i, v in present(args, kwargs, pslots):
            if hasattr(v, "dtype"):
                put(args, kwargs, n, i, cast(v, D.real_dtype(comp)))
        scope = precision_scope(comp, p) if matmul else contextlib.nullcontext()
        with scope:
            out = fn(*args, **kwargs)
        return round_outputs(out, result, p)

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        found = [(n, i, host_data(v)) for n, i, v in present(args, kwargs, slots)]
        if not found:
            return fn(*args, **kwargs)
        p = active()
        common = _scalars.resolve(tuple(v for _, _, v in found), p)
        result = _rules.result_dtype(op_class, common, policy=p)
        for d in {result, compute_dtype(result, p)}:
            D.require_available(d, f"heddle.{qualname}")
        new_args, new_kwargs = list(args), dict(kwargs)
        for n, i, v in found:
            put(new_args, new_kwargs, n, i, materialise(v, result))
        template, arrays = _template(new_args, new_kwargs)
        if any(isinstance(a, jax.core.Tracer) for a in arrays):
            return compute(new_args, new_kwargs, result, p)
        key = (_static_key(template), result, p, D.x64_enabled())
        try:
            kernel = kernels.get(key)
        except TypeError:  # an unhashable non-array argument: run op by op
            return compute(new_args, new_kwargs, result, p)
        if kernel is _EAGER:
            return compute(new_args, new_kwargs, result, p)
        if kernel is None:

            def run(*arrays: Any, template: tuple = template) -> Any:
                a, k = _fill(template, arrays)
                return compute(a, k, result, p)

            kernel = remember(kernels, key, jax.jit(run))
        try:
            return kernel(*arrays)
        except jax.errors.ConcretizationTypeError:  # Python on values (lstsq's numpy_resid=True)
            kernels[key] = _EAGER
            return compute(new_args, new_kwargs, result, p)

    return op
