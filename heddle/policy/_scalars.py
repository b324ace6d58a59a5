"""``result_type``: promotion over arrays, dtypes and Python scalars (POLICY.md 2-3).

Python scalars (and JAX weakly typed values) have no dtype: each takes the dtype of the typed operands
it meets, by ``SCALAR_RULES``, and is then checked against that dtype's range where its value is known.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import ScalarRangeError, UnknownDTypeError, message
from heddle.policy._policy import Policy, current

_KIND_OF_PY = {bool: "b", int: "i", float: "f", complex: "c"}
_ORDER = "bifc"  # scalar kinds, narrowest first

# (scalar kind, kind of the typed result) -> which dtype the scalar takes.
# 'typed': the typed dtype; 'default': the policy's default of the scalar's kind;
# 'complex': the complex counterpart of the typed float.
SCALAR_RULES: dict[tuple[str, str], str] = {
    ("b", "b"): "typed", ("b", "i"): "typed", ("b", "u"): "typed", ("b", "f"): "typed", ("b", "c"): "typed",
    ("i", "b"): "default", ("i", "i"): "typed", ("i", "u"): "typed", ("i", "f"): "typed", ("i", "c"): "typed",
    ("f", "b"): "default", ("f", "i"): "default", ("f", "u"): "default", ("f", "f"): "typed", ("f", "c"): "typed",
    ("c", "b"): "default", ("c", "i"): "default", ("c", "u"): "default", ("c", "f"): "complex", ("c", "c"): "typed",
}  # fmt: skip


def _default(p: Policy, k: str) -> np.dtype:
    return {
        "b": np.dtype("bool"),
        "i": p.default_int,
        "f": p.default_float,
        "c": p.default_complex,
    }[k]


def _complex_of(d: np.dtype) -> np.dtype:
    out = _lattice.least_upper_bound([d], _lattice.COMPLEXES)
    assert out is not None  # every real float fits complex128
    return out


def scalar_kind(x: Any) -> str | None:
    """The kind of a Python scalar or weakly typed JAX value (``'b' 'i' 'f' 'c'``), else None."""
    k = _KIND_OF_PY.get(type(x))
    if k is not None:
        return k
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return _KIND_OF_PY[next(t for t in (bool, int, float, complex) if isinstance(x, t))]
    aval = getattr(x, "aval", None)
    if aval is not None and getattr(aval, "weak_type", False):
        k = D.kind(np.dtype(aval.dtype))
        return "i" if k == "u" else k
    return None


@functools.cache
def _overflow_threshold(d: np.dtype) -> Fraction:
    """The smallest magnitude that rounds past ``d``'s largest finite value (max + half an ulp)."""
    values = _lattice.finite_values(d)
    if values is not None:
        top, below = Fraction(float(values[-1])), Fraction(float(values[-2]))
    else:
        top = Fraction(float(D.finfo(d).max))
        below = Fraction(float(np.nextafter(d.type(D.finfo(d).max), d.type(0))))
    return top + (top - below) / 2


def _check_range(value: Any, d: np.dtype, p: Policy) -> None:
    if not p.check_scalar_range or isinstance(value, bool):
        return
    if isinstance(value, complex):
        for part in (value.real, value.imag):
            _check_range(part, D.real_dtype(d), p)
        return
    k = D.kind(d)
    if k == "c":
        _check_range(value, D.real_dtype(d), p)
        return
    if k in "iu":
        lo, hi = D.int_range(d)
        if not lo <= value <= hi:
            raise ScalarRangeError(
                message(
                    f"the Python int {value} meets an operand of dtype {d.name}",
                    f"it is outside {d.name}'s range [{lo}, {hi}] and heddle does not wrap silently",
                    f"Convert the array first, e.g. heddle.astype(x, '{_wider_int(value, d)}'), "
                    f"or pass a typed scalar whose wrap you want: np.array({value}).astype('{d.name}').",
                )
            )
        return
    if k == "f" and isinstance(value, float) and not math.isfinite(value):
        return
    values = _lattice.finite_values(d)
    if values is not None and (value < values[0] or (value == 0 and values[0] > 0)):
        raise ScalarRangeError(
            message(
                f"the Python scalar {value!r} meets an operand of dtype {d.name}",
                f"{d.name} has no such value (its finite values are {values[0]:g} .. {values[-1]:g})",
                "Convert the array to a format that holds it, e.g. heddle.astype(x, 'float32').",
            )
        )
    if abs(Fraction(value)) >= _overflow_threshold(d):
        raise ScalarRangeError(
            message(
                f"the Python scalar {value!r} meets an operand of dtype {d.name}",
                f"it rounds past {d.name}'s largest finite value {float(D.finfo(d).max):g} "
                "and heddle does not overflow to inf silently",
                "Convert the array to a wider float first, e.g. heddle.astype(x, 'float32'), "
                "or pass float('inf') if infinity is what you mean.",
            )
        )


def _wider_int(value: int, d: np.dtype) -> str:
    for c in _lattice.INTEGERS:
        lo, hi = D.int_range(c)
        if lo <= value <= hi and _lattice.holds(c, d):
            return c.name
    return "float64"


def _concrete(x: Any) -> Any:
    """The Python value of a scalar operand, or None when it is traced."""
    if isinstance(x, (bool, int, float, complex)):
        return x
    try:
        arr = np.asarray(x)
    except Exception:  # a tracer: its value is not known at trace time
        return None
    return arr.item() if arr.size == 1 else None


def resolve(operands: tuple[Any, ...], policy: Policy | None = None) -> np.dtype:
    """``result_type`` with an explicit policy; the ops call this."""
    p = policy or current()
    typed: np.dtype | None = None
    scalars: list[tuple[str, Any]] = []
    for x in operands:
        k = scalar_kind(x)
        if k is not None:
            scalars.append((k, x))
            continue
        d = D.dtype(x)
        typed = d if typed is None else p.promote(typed, d)
    if scalars:
        top = max((k for k, _ in scalars), key=_ORDER.index)
        if typed is None:
            result = _default(p, top)
        else:
            rule = SCALAR_RULES[top, D.kind(typed)]
            result = {"typed": typed, "default": _default(p, top)}.get(rule) or _complex_of(typed)
        for _, x in scalars:
            value = _concrete(x)
            if value is not None:
                _check_range(value, result, p)
        return result
    if typed is None:
        raise UnknownDTypeError(
            message(
                "result_type()",
                "it needs at least one operand",
                "Pass arrays, dtypes or Python scalars.",
            )
        )
    return typed


def result_type(*operands: Any) -> np.dtype:
    """The dtype heddle gives an op over these operands (POLICY.md 2 and 3).

    Arrays and dtypes are typed and promote by the active policy's table. Python scalars and JAX weakly
    typed values take the typed operands' dtype (or the policy's defaults when there are none) and are
    range-checked where their value is known.

    Args:
      *operands: arrays (NumPy or JAX), dtype-likes, Python scalars.

    Returns:
      The result dtype.

    Raises:
      PromotionError: two typed operands have no promotion.
      ScalarRangeError: a scalar does not fit the dtype it takes (``uint8`` array with ``-2``,
        ``bfloat16`` array with ``1e39``).
      UnknownDTypeError: an operand is not a dtype, array or scalar of the policy.

    Examples:
      >>> import numpy as np, ml_dtypes
      >>> from heddle import policy
      >>> policy.result_type(np.zeros(3, ml_dtypes.bfloat16), 0.1)
      dtype(bfloat16)
      >>> policy.result_type(np.zeros(3, np.int8), 1.5)
      dtype('float32')
      >>> policy.result_type(1, 2.0)
      dtype('float32')
    """
    return resolve(operands)
