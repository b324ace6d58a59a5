"""Python scalars on the host: what an op's dtype plan reads from its operands, and their rounding.

A Python scalar (and a fill value written as a nested list of them) has no dtype: it takes the one
its op resolves (POLICY.md 3). ``signature`` is what the plan depends on (a scalar's type, an
array's dtype and weak type), ``representative`` stands in for it while the plan is resolved, and
``materialise`` rounds the scalar once, on the host, to the dtype the plan converts its operand to.
``range_checked`` is POLICY.md 3's range check of one scalar, memoised.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._policy import Policy
from heddle.policy._scalars import _check_range, _overflow_threshold

REPRESENTATIVE: dict[type, Any] = {bool: True, int: 0, float: 0.0, complex: 0j}
"""The Python scalar types, each with a value of it that stands in for any other while an op's
dtype plan is resolved (the plan depends on the type alone)."""

KINDS = (bool, int, float, complex)
"""The Python scalar types, narrowest kind first."""


@functools.lru_cache(maxsize=4096)
def _python_scalar_as(x: Any, kind_type: type, d: np.dtype) -> np.ndarray:
    if D.kind(d) == "f" and _lattice.finite_values(d) is not None:
        return round_scalar(complex(x).real if kind_type is complex else x, d)
    if D.kind(d) in "iu" and kind_type is int:
        lo, hi = D.int_range(d)
        if not lo <= x <= hi:  # only without range checks (policy.JAX): wrap, as JAX does
            x = (x - lo) % (hi - lo + 1) + lo
    if D.kind(d) in "fc" and kind_type is int:  # NumPy rounds int -> float64 -> float32: twice
        return np.asarray(_int_as_float(x, D.real_dtype(d))).astype(d)
    return np.asarray(x, d)  # NumPy rounds float64 -> float32 once, and ints convert exactly


def _int_as_float(x: int, d: np.dtype) -> np.ndarray:
    """A Python int rounded once (to nearest, ties to even) to float32 or float64."""
    big = _overflow_threshold(d)
    if abs(x) >= big:  # only without range checks (policy.JAX): overflow to inf
        return np.asarray(math.copysign(math.inf, x), d)
    near = np.asarray(float(x), np.float64).astype(d)  # Python's int -> float rounds once
    if d == np.float64 or abs(x) <= 2**53:  # float(x) exact: one rounding
        return near
    inf = d.type(math.inf)
    cands = [near, np.nextafter(near, -inf), np.nextafter(near, inf)]
    cands = [c for c in cands if math.isfinite(c)]
    bits = np.dtype(f"u{d.itemsize}")
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(c.view(bits)) & 1))


def round_scalar(x: float | int, d: np.dtype) -> np.ndarray:
    """A Python number rounded once (to nearest, ties to even) to a <= 16-bit float format, on the
    host.

    Args:
      x: the number (inf and NaN pass through; a format without inf gives NaN).
      d: a float format of at most 16 bits (one ``heddle.policy._lattice.finite_values`` lists).

    Returns:
      A 0-d NumPy array of dtype ``d``.

    Examples:
      >>> import numpy as np, ml_dtypes
      >>> from heddle.ops._scalars import round_scalar
      >>> float(round_scalar(1 + 2**-8, np.dtype(ml_dtypes.bfloat16)))  # a tie: to even
      1.0
    """
    if isinstance(x, float) and not math.isfinite(x):
        return np.asarray(x).astype(d)  # inf and NaN: no rounding (a format without inf gives NaN)
    values = _lattice.finite_values(d)
    exact = Fraction(x)
    if values[0] > 0 and exact < Fraction(float(values[0])):  # no zero (float8_e8m0fnu), as astype:
        return np.asarray(values[0] if exact > 0 else math.nan).astype(d)  # the smallest, or NaN
    i = int(np.searchsorted(values, float(x)))
    lo, hi = values[max(i - 1, 0)], values[min(i, len(values) - 1)]
    if Fraction(float(hi)) < exact or exact < Fraction(float(lo)):  # past the ends: overflow rule
        top = Fraction(float(values[-1]))
        half = (top - Fraction(float(values[-2]))) / 2
        if abs(exact) >= top + half:
            return np.asarray(math.copysign(math.inf, x)).astype(d)
        return np.asarray(math.copysign(float(top), x)).astype(d)
    dlo, dhi = exact - Fraction(float(lo)), Fraction(float(hi)) - exact
    if dlo != dhi:
        pick = lo if dlo < dhi else hi
    else:
        bits = np.asarray(lo).astype(d).view(np.uint8 if d.itemsize == 1 else np.uint16)
        pick = lo if int(bits) % 2 == 0 else hi
    return np.asarray(math.copysign(float(pick), x) if pick == 0 else pick).astype(d)


def materialise(x: Any, d: np.dtype) -> Any:
    """A Python scalar (or a nested list/tuple of them: fill values) as a NumPy value of dtype
    ``d``, each rounded once; arrays unchanged.

    Args:
      x: a value operand.
      d: the dtype its op converts it to.

    Returns:
      A NumPy value of dtype ``d`` for Python data; ``x`` itself otherwise.

    Examples:
      >>> import numpy as np, ml_dtypes
      >>> from heddle.ops._scalars import materialise
      >>> materialise([0.1, 3], np.dtype(ml_dtypes.bfloat16)).tolist()
      [0.10009765625, 3.0]
    """
    t = type(x)
    if t in REPRESENTATIVE:
        if not x:  # 0.0 == -0.0 (and 0j == -0j): a cache would give one sign for both
            return _python_scalar_as.__wrapped__(x, t, d)
        return _python_scalar_as(x, t, d)
    leaves = fill_values(x)
    if leaves is not None:
        return np.asarray([materialise(v, d) for v in leaves], d).reshape(np.shape(x))
    return x


def fill_values(x: Any) -> list[Any] | None:
    """The Python scalars of a nested list/tuple made only of them, or None.

    Args:
      x: any value.

    Returns:
      The scalars in order, or None when ``x`` is not such a list or tuple (or holds none).

    Examples:
      >>> from heddle.ops._scalars import fill_values
      >>> fill_values((0, [1.5, 2])), fill_values([]), fill_values(3)
      ([0, 1.5, 2], None, None)
    """
    if not isinstance(x, list | tuple):
        return None
    leaves: list[Any] = []

    def walk(v: Any) -> bool:
        if type(v) in REPRESENTATIVE:
            leaves.append(v)
            return True
        return isinstance(v, list | tuple) and all(map(walk, v))

    return leaves if walk(x) and leaves else None


def fill_signature(x: Any) -> type | None:
    """Fill values written by a copy (``pad(x, 1, constant_values=(0, 255))``) have no dtype, like
    the Python scalars they are made of: the widest of their kinds, or None for other host data.

    Args:
      x: any value.

    Returns:
      ``bool``, ``int``, ``float`` or ``complex``; or None.

    Examples:
      >>> from heddle.ops._scalars import fill_signature
      >>> fill_signature((0, 255)), fill_signature([1, 2.5]), fill_signature("edge")
      (<class 'int'>, <class 'float'>, None)
    """
    leaves = fill_values(x)
    return None if leaves is None else max(map(type, leaves), key=KINDS.index)


def signature(x: Any) -> Any:
    """What an op's dtype plan depends on, of one value operand.

    Args:
      x: a value operand.

    Returns:
      A Python scalar's type, an array's ``(dtype, weak)``, or None for other host data.

    Examples:
      >>> import numpy as np
      >>> from heddle.ops._scalars import signature
      >>> signature(2.0), signature(np.ones(2, np.int8)), signature([1, 2])
      (<class 'float'>, (dtype('int8'), False), None)
    """
    t = type(x)
    if t in REPRESENTATIVE:
        return t
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    weak = getattr(x, "weak_type", None)
    if weak is None:
        weak = getattr(getattr(x, "aval", None), "weak_type", False)
    return (dt, bool(weak))


def representative(sig: Any) -> Any:
    """What stands in for an operand of signature ``sig`` while its op's dtypes are resolved.

    Args:
      sig: a ``signature``.

    Returns:
      A Python scalar of the signature's kind (a scalar, or a weakly typed array), or the dtype.

    Examples:
      >>> import numpy as np
      >>> from heddle.ops._scalars import representative
      >>> representative(float), representative((np.dtype("int8"), False))
      (0.0, dtype('int8'))
    """
    if isinstance(sig, type):
        return REPRESENTATIVE[sig]
    dt, weak = sig
    if weak:
        return REPRESENTATIVE[
            {"b": bool, "i": int, "u": int, "f": float, "c": complex}[D.kind(np.dtype(dt))]
        ]
    return np.dtype(dt)


@functools.lru_cache(maxsize=16384)
def range_checked(value: Any, d: np.dtype, p: Policy, typed: np.dtype | None) -> bool:
    """POLICY.md 3's range check of one Python scalar (or concrete weak value), memoised.

    Args:
      value: the scalar.
      d: the dtype its op resolved.
      p: the policy.
      typed: the promotion of the op's typed operands, or None.

    Returns:
      True (the check raises ``ScalarRangeError`` otherwise).

    Examples:
      >>> import numpy as np
      >>> from heddle.ops._scalars import range_checked
      >>> from heddle.policy._policy import active
      >>> range_checked(100, np.dtype("int8"), active(), np.dtype("int8"))
      True
    """
    _check_range(value, d, p, typed)
    return True
