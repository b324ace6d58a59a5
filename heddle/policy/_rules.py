"""What each op class produces and accumulates in (POLICY.md 4, 5 and 7).

``OP_CLASSES`` is the one table of op classes and their result rule; the ops look their class up and
call ``result_dtype``. ``acc_dtype`` and ``grad_dtype`` are the accumulation and gradient rules.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import PromotionError, message
from heddle.policy._policy import Policy, active
from heddle.policy._promotion import promote_all

_F32 = np.dtype("float32")
_I32 = np.dtype("int32")
_U32 = np.dtype("uint32")


def promote_types(a: Any, b: Any) -> np.dtype:
    """The promotion of two dtypes under the active policy (POLICY.md 2).

    Args:
      a: a dtype-like.
      b: a dtype-like.

    Returns:
      The result dtype.

    Raises:
      PromotionError: the pair has no promotion (e.g. ``uint64`` with ``int8``, or
        ``float8_e4m3fn`` with ``float8_e5m2``); the message names the explicit cast.

    Examples:
      >>> from heddle import policy
      >>> policy.promote_types("int8", "uint8")
      dtype('int16')
      >>> policy.promote_types("float16", "bfloat16")
      dtype('float32')
    """
    return active().promote(a, b)


def can_lossless_cast(src: Any, dst: Any) -> bool:
    """Whether every value of ``src`` is exactly a value of ``dst``.

    Decided from the formats' values, not their widths: ``int16 -> float32`` is lossless,
    ``int32 -> float32`` is not, ``float8_e4m3fn -> bfloat16`` is.

    Args:
      src: the source dtype-like.
      dst: the destination dtype-like.

    Returns:
      True when the cast never changes a finite value.

    Examples:
      >>> from heddle import policy
      >>> policy.can_lossless_cast("int32", "float32"), policy.can_lossless_cast("int16", "float32")
      (False, True)
    """
    return _lattice.lossless(D.dtype(src), D.dtype(dst))


def least_upper_float(d: Any) -> np.dtype:
    """The narrowest float dtype that holds every value of ``d`` exactly.

    A float or complex dtype is returned unchanged. For an integer or bool dtype it is the unique
    minimal float container. Where several incomparable formats are minimal (``int8`` fits both float16
    and bfloat16) it is the narrowest container of all of them, found the same way (float32), so the
    answer never depends on a tie-break: ``int4`` fits many float8 formats, whose minimal common
    containers are float16 and bfloat16 again, so it is float32 too.

    Args:
      d: a dtype-like.

    Returns:
      The float dtype.

    Raises:
      PromotionError: no float holds every value (``int64``, ``uint64``).

    Examples:
      >>> from heddle import policy
      >>> policy.least_upper_float("int8"), policy.least_upper_float("int32")
      (dtype('float32'), dtype('float64'))
      >>> policy.least_upper_float("bool")
      dtype(float4_e2m1fn)
    """
    d = D.dtype(d)
    if D.is_inexact(d):
        return d
    minimal = _minimal_holders([d])
    while len(minimal) > 1:  # a tie: climb to the minimal containers of every tied format
        minimal = _minimal_holders(minimal)
    if not minimal:
        raise PromotionError(
            message(
                f"least_upper_float({d.name})",
                "no float format of the policy holds every value of it exactly",
                "Choose a float and accept the rounding: heddle.astype(x, 'float64').",
            )
        )
    return minimal[0]


def _minimal_holders(dtypes: list[np.dtype]) -> list[np.dtype]:
    """The minimal real floats that hold every value of every dtype in ``dtypes``."""
    holders = [f for f in _lattice.REAL_FLOATS if all(_lattice.holds(f, d) for d in dtypes)]
    return [f for f in holders if not any(g != f and _lattice.holds(f, g) for g in holders)]


def acc_dtype(d: Any, policy: Policy | None = None) -> np.dtype:
    """The accumulation dtype of ``d`` (POLICY.md 5).

    Floats narrower than float32 accumulate in float32 (or ``Policy.min_float_acc`` if wider); float32
    and float64 in themselves; complex in itself; bool and signed integers narrower than 32 bits in
    int32, unsigned narrower than 32 bits in uint32, wider integers in themselves.

    Args:
      d: a dtype-like.
      policy: the policy whose ``min_float_acc`` applies; the active one by default.

    Returns:
      The accumulation dtype.

    Examples:
      >>> from heddle import policy
      >>> policy.acc_dtype("bfloat16"), policy.acc_dtype("int8"), policy.acc_dtype("uint4")
      (dtype('float32'), dtype('int32'), dtype('uint32'))
    """
    d = D.dtype(d)
    k = D.kind(d)
    if k == "c":
        return d
    if k == "f":
        floor = (policy or active()).min_float_acc
        return _wider_float(_wider_float(d, _F32), floor)
    if k in "bi":
        return d if _lattice.holds(d, _I32) else _I32
    return d if _lattice.holds(d, _U32) else _U32


def _wider_float(a: np.dtype, b: np.dtype) -> np.dtype:
    return a if _lattice.holds(a, b) else b


def grad_dtype(d: Any) -> np.dtype:
    """The dtype of a gradient with respect to a leaf of dtype ``d`` (POLICY.md 7).

    float64 and the complex dtypes keep their dtype; every other float becomes float32; integer and
    bool leaves get float32 (zero) gradients.

    Args:
      d: the leaf's dtype-like.

    Returns:
      The gradient's dtype.

    Examples:
      >>> from heddle import policy
      >>> policy.grad_dtype("bfloat16"), policy.grad_dtype("float64"), policy.grad_dtype("int32")
      (dtype('float32'), dtype('float64'), dtype('float32'))
    """
    d = D.dtype(d)
    return d if D.kind(d) == "c" or _lattice.holds(d, _F32) else _F32


class OpClass(enum.Enum):
    """The op classes of POLICY.md 4; each op of heddle.numpy/nn/lax belongs to one."""

    ARITHMETIC = "arithmetic"
    COMPARISON = "comparison"
    INDEX = "index"
    FLOAT_ONLY = "float_only"
    INTEGRAL = "integral"
    SELECTION = "selection"
    REDUCTION = "reduction"
    CAST = "cast"
    CREATION = "creation"


def _float_only(policy: Policy, dtypes: tuple[np.dtype, ...]) -> np.dtype:
    d = _promote_all(policy, dtypes)
    return d if D.is_inexact(d) else policy.int_float_dtype


def _reduction(policy: Policy, dtypes: tuple[np.dtype, ...]) -> np.dtype:
    d = _promote_all(policy, dtypes)
    return d if D.is_inexact(d) else acc_dtype(d, policy)


def _promote_all(policy: Policy, dtypes: tuple[np.dtype, ...]) -> np.dtype:
    return promote_all(policy, dtypes)


# POLICY.md 4 as data: op class -> result rule over the (already resolved) operand dtypes.
OP_CLASSES = {
    OpClass.ARITHMETIC: _promote_all,
    OpClass.COMPARISON: lambda policy, dtypes: np.dtype("bool"),
    OpClass.INDEX: lambda policy, dtypes: policy.index_dtype,
    OpClass.FLOAT_ONLY: _float_only,
    OpClass.INTEGRAL: lambda policy, dtypes: dtypes[0],
    OpClass.SELECTION: lambda policy, dtypes: dtypes[0],
    OpClass.REDUCTION: _reduction,
    # casts and creation: the requested dtype, given last (``astype(x, D)`` passes ``x.dtype, D``;
    # a creation op passes its ``dtype=`` argument, or the scalar default / typed input it resolved)
    OpClass.CAST: lambda policy, dtypes: dtypes[-1],
    OpClass.CREATION: lambda policy, dtypes: dtypes[-1],
}


def result_dtype(op_class: OpClass, *dtypes: Any, policy: Policy | None = None) -> np.dtype:
    """The result dtype of an op of class ``op_class`` on operands of the given dtypes (POLICY.md 4).

    Reductions, scans and contractions (``OpClass.REDUCTION``) keep a float input's dtype and give
    integer and bool inputs their accumulation dtype. ``CAST`` and ``CREATION`` give the requested
    dtype, passed last.

    Args:
      op_class: the op's class.
      *dtypes: the operands' dtypes (Python scalars already resolved, see ``result_type``); at least one.
      policy: the policy; the active one by default.

    Returns:
      The result dtype.

    Raises:
      PromotionError: the operands of an arithmetic, float-only or reduction op have no promotion.
      ValueError: no dtype was given.

    Examples:
      >>> from heddle import policy
      >>> policy.result_dtype(policy.OpClass.FLOAT_ONLY, "int8")
      dtype('float32')
      >>> policy.result_dtype(policy.OpClass.REDUCTION, "int8")
      dtype('int32')
    """
    p = policy or active()
    if not dtypes:
        raise ValueError(
            message(
                f"result_dtype({op_class})",
                "it needs the dtype of at least one operand",
                f"Pass the operands' dtypes, e.g. result_dtype({op_class}, x.dtype); for Python "
                "scalars resolve them first with heddle.policy.result_type(...).",
            )
        )
    return OP_CLASSES[OpClass(op_class)](p, tuple(D.dtype(d) for d in dtypes))


def reduction_dtypes(
    d: Any, dtype: Any = None, policy: Policy | None = None
) -> tuple[np.dtype, np.dtype]:
    """Result and accumulation dtype of a sum-like op on input ``d`` with an optional ``dtype=``.

    An explicit ``dtype`` sets the result; accumulation is the wider of the accumulation dtypes of the
    input and the result (POLICY.md 4, last paragraph): their promotion, so an integer input with a
    float ``dtype`` accumulates in the float's accumulation dtype. Where the result's accumulation
    dtype already holds every input value, it is the one (``uint8`` summed with ``dtype=int32``
    accumulates in int32, not in the int64 promotion of uint32 and int32).

    Args:
      d: the input's dtype-like.
      dtype: the op's ``dtype=`` argument, or None.
      policy: the policy; the active one by default.

    Returns:
      ``(result, accumulation)``.

    Raises:
      PromotionError: the two accumulation dtypes have no promotion (``uint64`` with a signed result).

    Examples:
      >>> from heddle import policy
      >>> policy.reduction_dtypes("bfloat16")
      (dtype(bfloat16), dtype('float32'))
      >>> policy.reduction_dtypes("int8", "int16")
      (dtype('int16'), dtype('int32'))
    """
    p = policy or active()
    d = D.dtype(d)
    result = _reduction(p, (d,)) if dtype is None else D.dtype(dtype)
    a, b = acc_dtype(d, p), acc_dtype(result, p)
    if a == b or (dtype is not None and _lattice.lossless(d, b)):
        return result, b
    return result, p.promote(a, b)
