"""Policy versions of the ``jax.lax`` entry points that accumulate: contractions, reductions, scans.

Contractions (``dot_general``, ``dot``, the convolutions, ``batch_matmul``, ``ragged_dot``) convert
their operands to their promotion and accumulate through ``preferred_element_type=acc_dtype``,
float32 ones at ``Precision.HIGHEST`` unless the active policy's ``float32_matmul_precision`` says
otherwise; the result is the promotion (integer and bool: the accumulation dtype) or
``preferred_element_type`` when given, rounded once. Sums, products and their scans convert to the
accumulation dtype first; ``reduce`` and ``reduce_window`` do so when their computation is an add or a
multiply. Selections (max, min, cummax, cummin) copy values and pass through.

``LAX`` classifies the names that have a policy version; every other name of ``jax.lax`` is
re-exported unchanged by ``heddle.lax``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax

from heddle.ops import _core
from heddle.ops._core import cast, compute_dtype, contraction_operand_dtype, materialise
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._errors import message
from heddle.policy._policy import Policy, current
from heddle.policy._rules import OpClass

_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH}


def contraction_dtypes(
    lhs: Any, rhs: Any, preferred: Any, p: Policy, widen: bool | None = None
) -> tuple[np.dtype, np.dtype, np.dtype]:
    """(result, operand dtype, accumulation dtype) of a contraction of ``lhs`` and ``rhs``; ``widen``
    (default: ``_core.widens_narrow_contractions()``) says whether narrow floats go to float32."""
    common = _scalars.resolve((lhs, rhs), p)
    result, acc = _rules.reduction_dtypes(common, preferred, p)
    if widen is None:
        widen = _core.widens_narrow_contractions()
    return result, contraction_operand_dtype(common, acc, widen), acc


def _widens(name: str, a: dict[str, Any]) -> bool:
    """Whether the contraction ``name`` with bound arguments ``a`` widens narrow operands."""
    if name == "dot_general":  # dot by dot, from its dimension numbers
        ndim = (np.ndim(a["lhs"]), np.ndim(a["rhs"]))
        return _core.narrow_dot_needs_widening(*ndim, a["dimension_numbers"])
    return _core.widens_narrow_contractions(name)


def _contraction(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> jax.Array:
        p = current()
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        widen = _widens(name, a)
        result, to, acc = contraction_dtypes(
            a["lhs"], a["rhs"], a.get("preferred_element_type"), p, widen
        )
        for d in {result, to, acc}:
            D.require_available(d, f"heddle.lax.{name}")
        a["lhs"] = cast(materialise(a["lhs"], to), to)
        a["rhs"] = cast(materialise(a["rhs"], to), to)
        a["preferred_element_type"] = acc
        if a.get("precision") is None and D.real_dtype(to) == np.float32:
            a["precision"] = _PRECISION.get(p.float32_matmul_precision)
        out = fn(*bound.args, **bound.kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


def _batch_matmul_impl(
    lhs: Any, rhs: Any, precision: Any = None, preferred_element_type: Any = None
) -> jax.Array:
    lhs, rhs = jax.numpy.asarray(lhs), jax.numpy.asarray(rhs)
    if lhs.ndim < 2 or lhs.ndim != rhs.ndim or lhs.shape[:-2] != rhs.shape[:-2]:
        raise ValueError(
            message(
                f"heddle.lax.batch_matmul of shapes {lhs.shape} and {rhs.shape}",
                "both operands need the same rank >= 2 and the same leading (batch) dimensions",
                "Broadcast the batch dimensions first (jnp.broadcast_to), or use "
                "heddle.numpy.matmul, which broadcasts.",
            )
        )
    batch = tuple(range(lhs.ndim - 2))
    dims = (((lhs.ndim - 1,), (rhs.ndim - 2,)), (batch, batch))
    return lax.dot_general(
        lhs, rhs, dims, precision=precision, preferred_element_type=preferred_element_type
    )


_batch_contraction = _contraction(_batch_matmul_impl, "batch_matmul")


@functools.wraps(lax.batch_matmul)
def batch_matmul(lhs: Any, rhs: Any, precision: Any = None) -> jax.Array:
    return _batch_contraction(lhs, rhs, precision)


def _accumulating(fn: Callable[..., Any], name: str, op_class: OpClass) -> Callable[..., Any]:
    """Sums, products and scans: operand to acc_dtype, ``fn`` there, round once to the result."""

    @functools.wraps(fn)
    def op(operand: Any, *args: Any, **kwargs: Any) -> jax.Array:
        p = current()
        d = _scalars.resolve((operand,), p)
        if op_class is OpClass.REDUCTION:
            result, comp = _rules.reduction_dtypes(d, None, p)
        else:
            result = _rules.result_dtype(op_class, d, policy=p)
            comp = compute_dtype(result, p)
        for x in {result, comp}:
            D.require_available(x, f"heddle.lax.{name}")
        first = result if op_class is OpClass.FLOAT_ONLY else d  # int -> default float first
        x = cast(cast(materialise(operand, d), first), comp)
        out = fn(x, *args, **kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


@functools.lru_cache(maxsize=256)
def _monoid_of(computation: Callable[..., Any], d: np.dtype) -> str | None:
    """``"add"`` or ``"mul"`` when ``computation`` on two scalars of ``d`` is exactly that primitive."""
    s = jax.ShapeDtypeStruct((), d)
    try:
        closed = jax.make_jaxpr(computation)(s, s)
    except Exception:  # not a binary scalar function we can read: treat as unknown
        return None
    jaxpr = closed.jaxpr
    if len(jaxpr.eqns) != 1 or len(jaxpr.outvars) != 1:
        return None
    eqn = jaxpr.eqns[0]
    if eqn.primitive.name not in ("add", "mul") or set(eqn.invars) != set(jaxpr.invars):
        return None
    if eqn.outvars[0] is not jaxpr.outvars[0] or len(set(jaxpr.invars)) != 2:
        return None
    return eqn.primitive.name


def monoid(computation: Callable[..., Any], d: np.dtype) -> str | None:
    """The accumulating monoid (``"add"``/``"mul"``) ``computation`` computes on ``d``, if any."""
    try:
        return _monoid_of(computation, d)
    except TypeError:  # an unhashable callable
        return _monoid_of.__wrapped__(computation, d)


def _is_array(x: Any) -> bool:
    return hasattr(x, "dtype") or _scalars.scalar_kind(x) is not None


def _generic_reduce(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """lax.reduce / lax.reduce_window: accumulate in acc_dtype when the computation adds or multiplies.

    One operand with one init value whose computation is ``add`` or ``mul`` (read from its jaxpr) is
    converted to the accumulation dtype with its init value; the result has the reduction's dtype
    (a float keeps its dtype, integers and bool their accumulation dtype), rounded once. Anything
    else (max, min, variadic reductions, other computations) is JAX's own call, unchanged.
    """

    sig = inspect.signature(fn)
    operand_name, init_name, comp_name = list(sig.parameters)[:3]

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        operands, init_values = a[operand_name], a[init_name]
        if not (_is_array(operands) and _is_array(init_values)):
            return fn(*args, **kwargs)  # variadic (tuples of operands): JAX's own call
        p = current()
        d = _scalars.resolve((operands,), p)
        kind = monoid(a[comp_name], d)
        if kind is None:
            return fn(*args, **kwargs)
        result, acc = _rules.reduction_dtypes(d, None, p)
        for x in {result, acc}:
            D.require_available(x, f"heddle.lax.{name}")
        a[operand_name] = cast(materialise(operands, d), acc)
        a[init_name] = cast(materialise(init_values, d), acc)
        a[comp_name] = lax.add if kind == "add" else lax.mul
        out = fn(*bound.args, **bound.kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


# The classification of the names heddle.lax replaces, as data: name -> (kind, reason).
LAX: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        "dot_general dot conv_general_dilated conv conv_with_general_padding conv_transpose "
        "batch_matmul ragged_dot ragged_dot_general".split(),
        ("contraction", "preferred_element_type=acc_dtype, rounded once"),
    ),
    **dict.fromkeys(
        "reduce_sum reduce_prod cumsum cumprod".split(),
        ("reduction", "accumulates in acc_dtype, rounded once; integers return acc_dtype"),
    ),
    "cumlogsumexp": ("float_only", "computed in float32 for narrow floats, rounded once"),
    "logistic": ("elementwise", "computed in float32 for narrow floats, rounded once"),
    **dict.fromkeys(
        "reduce reduce_window".split(),
        ("generic reduction", "acc_dtype when the computation is add or mul, else unchanged"),
    ),
}

# Names of jax.lax that take a preferred_element_type or reduce, deliberately left as JAX's own.
LAX_PASS: dict[str, str] = {
    "reduce_max": "selection: values copied bit-exactly",
    "reduce_min": "selection: values copied bit-exactly",
    "cummax": "selection: values copied bit-exactly",
    "cummin": "selection: values copied bit-exactly",
    "reduce_and": "bitwise/logical: exact in the input dtype",
    "reduce_or": "bitwise/logical: exact in the input dtype",
    "reduce_xor": "bitwise/logical: exact in the input dtype",
    "reduce_precision": "an explicit rounding the user asks for",
    "argmax": "index_dtype is a required argument: the user chooses it",
    "argmin": "index_dtype is a required argument: the user chooses it",
    "conv_general_dilated_patches": "extracts patches (a copy); its preferred_element_type is the "
    "user's",
    "scaled_dot": "block-scaled (MX) contraction over quantised operands with its own scales; "
    "already accumulates in preferred_element_type",
    "DotAlgorithm": "a class describing dot algorithms",
    "psum": "a collective: it communicates in the operand's dtype; widening it would double the "
    "traffic, so the choice stays with the program",
}


def _doc(name: str, kind: str, how: str, jfn: Callable[..., Any]) -> str:
    return (
        f"heddle's policy version of ``jax.lax.{name}`` ({kind}).\n\n"
        f"Dtypes: {how} (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.lax.{name}.\n  **kwargs: as for jax.lax.{name}.\n\n"
        f"Returns:\n  The result of jax.lax.{name} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.lax\n  >>> heddle.lax.{name}  # doctest: +ELLIPSIS\n"
        f"  <function ...>\n\n"
        f"Original documentation follows.\n\n{jfn.__doc__ or ''}"
    )


def build() -> dict[str, Any]:
    """The policy functions of heddle.lax, by name."""
    names: dict[str, Any] = {}
    for name, (kind, how) in LAX.items():
        jfn = getattr(lax, name, None)
        if jfn is None:
            continue
        if name == "batch_matmul":
            op = batch_matmul
        elif kind == "contraction":
            op = _contraction(jfn, name)
        elif kind == "reduction":
            op = _accumulating(jfn, name, OpClass.REDUCTION)
        elif kind == "elementwise":
            from heddle.ops._float_op import float_op

            op = float_op(jfn, f"lax.{name}")
        elif kind == "float_only":
            op = _accumulating(jfn, name, OpClass.FLOAT_ONLY)
        else:
            op = _generic_reduce(jfn, name)
        op.__doc__ = _doc(name, kind, how, jfn)
        names[name] = op
    return names
