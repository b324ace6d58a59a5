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
from heddle.policy._policy import Policy, active
from heddle.policy._promotion import promote_all

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


def _check_range(
    value: Any, d: np.dtype, p: Policy, typed: np.dtype | None = None, what: str | None = None
) -> None:
    """Raises ``ScalarRangeError`` when the Python value ``value`` does not fit ``d``.

    A complex value is checked part by part against the real part of ``d``; a real value against a
    complex ``d`` likewise. ``typed`` is the promotion of the typed operands the scalar met (None: there
    were none and ``d`` is the policy's default), for the message and the fix it suggests; ``what``
    names the value in the message (default: "the Python int 3").
    """
    if not p.check_scalar_range or isinstance(value, bool):
        return
    what = what or f"the Python {type(value).__name__} {_show(value)}"
    parts = (value.real, value.imag) if isinstance(value, complex) else (value,)
    real = D.real_dtype(d)
    for part in parts:
        _check_real(part, what, real, d, p, typed)


def _check_real(
    value: Any, what: str, real: np.dtype, d: np.dtype, p: Policy, typed: np.dtype | None
) -> None:
    """Checks ``value`` (``what`` names it, or the number it is a part of) against ``real``."""
    k = D.kind(real)
    if k in "iu":
        lo, hi = D.int_range(real)
        if not lo <= value <= hi:
            raise ScalarRangeError(
                message(
                    _asked(what, d, p, typed),
                    f"it is outside {d.name}'s range [{lo}, {hi}] and heddle does not wrap silently",
                    _int_fix(value, d) if typed is not None else _default_fix(value, "int"),
                )
            )
        return
    if isinstance(value, float) and not math.isfinite(value):
        return  # inf and nan pass (POLICY.md 3)
    exact = Fraction(value)
    values = _lattice.finite_values(real)
    if values is not None and values[0] > 0 and exact <= 0:  # float8_e8m0fnu: no zero, no sign
        raise ScalarRangeError(
            message(
                _asked(what, d, p, typed),
                f"{d.name} has no zero and no negative values (its smallest value is {values[0]:g})",
                "Convert the array to a signed float first, e.g. heddle.astype(x, 'float32').",
            )
        )
    if abs(exact) >= _overflow_threshold(real):
        raise ScalarRangeError(
            message(
                _asked(what, d, p, typed),
                f"it rounds past {d.name}'s largest finite value {float(D.finfo(real).max):g} "
                "and heddle does not overflow to inf silently",
                _float_fix(exact, d) if typed is not None else _default_fix(value, "float"),
            )
        )


def _asked(what: str, d: np.dtype, p: Policy, typed: np.dtype | None) -> str:
    if typed is None:
        return f"{what} has no typed operand and takes the default {d.name} (policy {p.name!r})"
    if typed == d:
        return f"{what} meets an operand of dtype {d.name} (policy {p.name!r})"
    return f"{what} meets an operand of dtype {typed.name} and takes {d.name} (policy {p.name!r})"


def _show(value: Any) -> str:
    """``repr(value)``, shortened for huge Python ints."""
    text = repr(value)
    if len(text) <= 24:
        return text
    return f"{text[:8]}...({len(text.lstrip('-'))} digits)"


def _int_fix(value: int, d: np.dtype) -> str:
    fix = f"Convert the array first, e.g. heddle.astype(x, '{_wider_int(value, d)}')"
    if -(2**63) <= value < 2**64:  # NumPy builds these as int64/uint64 arrays
        fix += f", or pass a typed scalar whose wrap you want: np.array({value}).astype('{d.name}')"
    return fix + "."


def _float_fix(exact: Fraction, d: np.dtype) -> str:
    wider = _wider_float(exact, D.real_dtype(d))
    if wider is None:
        return (
            "No float of the policy holds a value this large; pass float('inf') if infinity is "
            "what you mean."
        )
    if D.kind(d) == "c":
        wider = _complex_of(wider)
    return (
        f"Convert the array to a wider format first, e.g. heddle.astype(x, '{wider.name}'), "
        "or pass float('inf') if infinity is what you mean."
    )


def _default_fix(value: Any, kind: str) -> str:
    wider = "int64" if kind == "int" else "float64"
    return (
        f"Pass a typed value, e.g. np.{wider}({_show(value)}), or widen the default: "
        f"with heddle.policy.default_dtypes({kind}='{wider}'): ..."
    )


def _wider_int(value: int, d: np.dtype) -> str:
    for c in _lattice.INTEGERS:
        lo, hi = D.int_range(c)
        if lo <= value <= hi and _lattice.holds(c, d):
            return c.name
    return "float64"


def _wider_float(exact: Fraction, d: np.dtype) -> np.dtype | None:
    """The first float (in ``DTYPES`` order) that holds every value of ``d`` and ``exact`` in range."""
    for c in _lattice.REAL_FLOATS:
        if _lattice.lossless(d, c) and abs(exact) < _overflow_threshold(c):
            return c
    return None


def _concrete(x: Any) -> list[Any]:
    """The Python values a scalar operand's range check needs; empty when it is traced.

    A Python number is its own value. A weakly typed JAX value with a known value gives its element, or
    for a weakly typed array (``jnp.full(3, 1000)``) its extremes: the smallest and largest element,
    part by part for complex, NaN ignored.
    """
    if isinstance(x, (bool, int, float, complex)):
        return [x]
    try:
        arr = np.asarray(x)
    except Exception:  # a tracer: its value is not known at trace time
        return []
    if arr.size == 1:
        return [arr.item()]
    if arr.size == 0 or arr.dtype == np.bool_:
        return []
    parts = (arr.real, arr.imag) if arr.dtype.kind == "c" else (arr,)
    out = []
    for part in parts:
        finite = part[~np.isnan(part)] if part.dtype.kind == "f" else part
        if finite.size:
            out += [finite.min().item(), finite.max().item()]
    return out


def _describe(x: Any, value: Any) -> str | None:
    """How a message names ``value``: None for a Python number (the default wording)."""
    if isinstance(x, (bool, int, float, complex)):
        return None
    if getattr(x, "size", 1) == 1:
        return f"the weakly typed JAX value {_show(value)}"
    return f"the element {_show(value)} of a weakly typed JAX array"


def resolve(
    operands: tuple[Any, ...], policy: Policy | None = None, *, check: bool = True
) -> np.dtype:
    """``result_type`` with an explicit policy; the ops call this. ``check=False`` skips the range
    checks (for representative scalars that stand for a kind, not for a value)."""
    p = policy or active()
    typed_dtypes: list[np.dtype] = []
    scalars: list[tuple[str, Any]] = []
    for x in operands:
        k = scalar_kind(x)
        if k is not None:
            scalars.append((k, x))
        else:
            typed_dtypes.append(D.dtype(x))
    typed = promote_all(p, typed_dtypes) if typed_dtypes else None
    if scalars:
        top = max((k for k, _ in scalars), key=_ORDER.index)
        if typed is None:
            result = _default(p, top)
        else:
            rule = SCALAR_RULES[top, D.kind(typed)]
            result = {"typed": typed, "default": _default(p, top)}.get(rule) or _complex_of(typed)
        for _, x in scalars if check else ():
            values = _concrete(x)
            for value in values:
                _check_range(value, result, p, typed, _describe(x, value))
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
