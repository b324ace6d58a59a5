"""The one mechanism every op wrapper uses: resolve dtypes, convert explicitly, call JAX, round once.

An op is described by an ``OpSpec`` (data, in ``heddle/ops/_table.py``): the jax.numpy function, the
op class (which fixes the result dtype, POLICY.md 4) and the compute plan (how it accumulates,
POLICY.md 5). ``make_op`` turns a spec into a function with jax.numpy's signature:

1. resolve: the result dtype from the operands (arrays, dtypes, Python scalars) and the op class;
2. convert: every value operand explicitly, with heddle's correctly rounded cast, to the result dtype,
   then exactly to the compute dtype (float32 for narrow floats);
3. call the jax.numpy function, passing the accumulation dtype through ``dtype=`` or
   ``preferred_element_type=``;
4. round once to the result dtype.

Eagerly, steps 2-4 run as one jitted kernel per (op, dtypes, static arguments), so an op costs one
dispatch; under an outer ``jax.jit`` they are traced inline.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._policy import Policy, current
from heddle.policy._rules import OpClass

try:  # the correctly rounded cast
    from heddle.policy._casts import astype as _astype
except ImportError:  # pragma: no cover - only while the cast module is being built
    _astype = None


class Plan(enum.Enum):
    """How an op computes (POLICY.md 5)."""

    UPCAST = "upcast"  # operands -> result dtype -> compute dtype (float32 for narrow floats); round once
    NATIVE = (
        "native"  # operands -> result dtype; the op runs there (comparisons, copies, integer ops)
    )
    ACC_DTYPE = "acc_dtype"  # operand -> accumulation dtype; fn(..., dtype=acc); round once
    PREFERRED = (
        "preferred"  # operands -> result dtype; fn(..., preferred_element_type=acc); round once
    )
    PASS = "pass"  # no dtype decision: the jax.numpy function unchanged


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op of the namespace, as data.

    Attributes:
      fn: the JAX function called in step 3.
      op_class: fixes the result dtype (POLICY.md 4).
      plan: fixes the compute and accumulation dtype (POLICY.md 5).
      values: which positional arguments are value operands: a tuple of positions, ``"all"``, or
        ``"seq"`` (the first argument is a sequence of arrays, as in ``concatenate``).
      value_kwargs: keyword arguments that are value operands too (``where``'s ``x``/``y`` style).
    """

    fn: Callable[..., Any]
    op_class: OpClass
    plan: Plan
    values: tuple[int, ...] | str = "all"
    value_kwargs: tuple[str, ...] = ()


def cast(x: Any, d: np.dtype) -> jax.Array:
    """heddle's correctly rounded cast of an array to ``d`` (a no-op when it already is ``d``)."""
    if getattr(x, "dtype", None) == d and not isinstance(x, np.ndarray):
        return x
    if _astype is not None:
        return _astype(x, d)
    return lax.convert_element_type(x, d)


def compute_dtype(d: np.dtype, p: Policy) -> np.dtype:
    """The dtype an UPCAST op computes in: the accumulation dtype for floats, ``d`` otherwise."""
    return _rules.acc_dtype(d, p) if D.kind(d) == "f" else d


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def materialise(x: Any, d: np.dtype) -> Any:
    """A Python scalar as a NumPy value of dtype ``d`` (rounded once); arrays unchanged."""
    if _scalars.scalar_kind(x) is not None and not hasattr(x, "dtype"):
        D.require_available(d, "a Python scalar operand")
        return np.asarray(cast(np.asarray(x), d)) if D.kind(d) in "fc" else np.asarray(x, d)
    return x


def _result_and_compute(spec: OpSpec, operands: Sequence[Any], dtype_arg: Any, p: Policy):
    """(result dtype, dtype the operands are converted to, compute dtype, accumulation dtype)."""
    common = _scalars.resolve(tuple(operands), p)
    if spec.plan is Plan.ACC_DTYPE:
        if spec.op_class is OpClass.REDUCTION:
            result, acc = _rules.reduction_dtypes(common, dtype_arg, p)
        else:  # float-only ops that accumulate: mean, var, std, ...
            result = (
                _rules.result_dtype(spec.op_class, common, policy=p)
                if dtype_arg is None
                else D.dtype(dtype_arg)
            )
            acc = _rules.reduction_dtypes(common, result, p)[1]
        return result, acc, acc, acc
    if spec.plan is Plan.PREFERRED:
        if dtype_arg is None:
            result = _rules.result_dtype(OpClass.REDUCTION, common, policy=p)
        else:
            result = D.dtype(dtype_arg)
        return result, common, common, _rules.acc_dtype(result, p)
    result = _rules.result_dtype(spec.op_class, common, policy=p)
    if spec.op_class in (OpClass.COMPARISON, OpClass.INDEX, OpClass.SELECTION):
        return result, common, common, None
    comp = compute_dtype(result, p) if spec.plan is Plan.UPCAST else result
    return result, result, comp, None


def _precision_kwargs(spec: OpSpec, to: np.dtype, p: Policy) -> dict[str, Any]:
    if spec.plan is Plan.PREFERRED and to == np.float32:
        return {
            "precision": {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH}.get(
                p.float32_matmul_precision
            )
        }
    return {}


def _split(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]):
    """The value operands, and a function that puts converted values back in their places."""
    if spec.values == "seq":
        seq = list(args[0])
        return seq, lambda vals: ((list(vals[: len(seq)]), *args[1:]), kwargs)
    pos = range(len(args)) if spec.values == "all" else [i for i in spec.values if i < len(args)]
    pos = [i for i in pos if args[i] is not None]
    kws = [k for k in spec.value_kwargs if kwargs.get(k) is not None]
    operands = [args[i] for i in pos] + [kwargs[k] for k in kws]

    def rebuild(vals):
        new_args, new_kwargs = list(args), dict(kwargs)
        for i, v in zip(pos, vals[: len(pos)], strict=True):
            new_args[i] = v
        for k, v in zip(kws, vals[len(pos) :], strict=True):
            new_kwargs[k] = v
        return tuple(new_args), new_kwargs

    return operands, rebuild


def make_op(name: str, spec: OpSpec) -> Callable[..., Any]:
    """Builds the public function for ``spec`` with the signature of ``spec.fn``."""
    if spec.plan is Plan.PASS:
        return spec.fn

    fn = spec.fn

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        p = current()
        dtype_arg = kwargs.pop("dtype", None) if spec.plan is Plan.ACC_DTYPE else None
        if spec.plan is Plan.PREFERRED:
            dtype_arg = kwargs.pop("preferred_element_type", None)
        operands, rebuild = _split(spec, args, kwargs)
        result, to, comp, acc = _result_and_compute(spec, operands, dtype_arg, p)
        for d in {result, to, comp, acc} - {None}:
            D.require_available(d, f"heddle.numpy.{name}")
        values = [materialise(v, to) for v in operands]
        vals = [cast(cast(v, to), comp) for v in values]
        new_args, new_kwargs = rebuild(vals)
        if spec.plan is Plan.ACC_DTYPE:
            new_kwargs["dtype"] = acc
        elif spec.plan is Plan.PREFERRED:
            new_kwargs["preferred_element_type"] = acc
            new_kwargs.update(_precision_kwargs(spec, to, p))
        out = fn(*new_args, **new_kwargs)
        return jax.tree.map(
            lambda o: cast(o, result) if getattr(o, "dtype", result) != result else o, out
        )

    op.__doc__ = _doc(name, spec, fn)
    return op


def _doc(name: str, spec: OpSpec, fn: Callable[..., Any]) -> str:
    dtypes = {
        OpClass.ARITHMETIC: "result: promotion of the operands",
        OpClass.COMPARISON: "result: bool",
        OpClass.INDEX: "result: int32",
        OpClass.FLOAT_ONLY: "result: a float input's dtype; integer/bool input gives the default float",
        OpClass.INTEGRAL: "result: the input dtype",
        OpClass.SELECTION: "result: the input dtype, values copied bit-exactly",
        OpClass.REDUCTION: "result: a float input's dtype, integer/bool input its accumulation dtype",
    }.get(spec.op_class, "")
    acc = {
        Plan.UPCAST: "computed in float32 for narrow floats, rounded once",
        Plan.ACC_DTYPE: "accumulates in acc_dtype, rounded once",
        Plan.PREFERRED: "accumulates in acc_dtype via preferred_element_type, rounded once",
        Plan.NATIVE: "no arithmetic beyond the explicit conversion",
    }.get(spec.plan, "")
    return (
        f"heddle's policy version of ``jax.numpy.{name}``.\n\n"
        f"Dtypes: {dtypes}; {acc} (POLICY.md 4-5). Arguments are those of jax.numpy.{name}.\n\n"
        f"Args:\n  *args: as for jax.numpy.{name}.\n  **kwargs: as for jax.numpy.{name}.\n\n"
        f"Returns:\n  The result of jax.numpy.{name} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.numpy as hnp\n  >>> hnp.{name}  # doctest: +ELLIPSIS\n  <function ...>\n\n"
        f"Original documentation follows.\n\n{fn.__doc__ or ''}"
    )
