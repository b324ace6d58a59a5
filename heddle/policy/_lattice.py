"""The promotion lattice, derived from what each format can hold.

The data is the dtype set (``_dtypes.DTYPES``) and one relation, ``holds(big, small)``: every value of
``small`` is exactly a value of ``big``. It is computed, never typed in:

- formats of 16 bits or fewer are enumerated: every bit pattern is decoded to its exact float64 value
  (exact for every such format) and the finite values compared as sets;
- wider formats (32 and 64 bits) are described by their value range and, for floats, their
  significand precision and smallest subnormal; a wide format never fits in an enumerated one (it has
  more values).

Promotion of two dtypes (POLICY.md 2) is then: a kind rule from ``KIND_RULES`` (bool gives way, integer
gives way to float, float gives way to complex) and, within a kind, the unique narrowest container: the
one minimal element of the set of dtypes that hold both. No unique minimal element is a
``PromotionError``. The table is computed once at import.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

import ml_dtypes
import numpy as np

from heddle.policy import _dtypes as D

_ENUM_MAX_BITS = 16


def _bits(d: np.dtype) -> int:
    return 1 if d == np.bool_ else 8 * d.itemsize if d.kind in "iufc" else _subbyte_bits(d)


def _subbyte_bits(d: np.dtype) -> int:
    if D.kind(d) in "iu":
        return int(ml_dtypes.iinfo(d).bits)
    return int(ml_dtypes.finfo(d).bits)


@functools.cache
def finite_values(d: np.dtype) -> np.ndarray | None:
    """Every finite value of a real dtype of 16 bits or fewer, sorted, as exact float64.

    Signed zeros are one value. Returns None for wider dtypes, which are described by parameters.
    """
    if D.kind(d) == "c" or _bits(d) > _ENUM_MAX_BITS:
        return None
    if d == np.bool_:
        return np.array([0.0, 1.0])
    if D.kind(d) in "iu":
        lo, hi = D.int_range(d)
        return np.arange(lo, hi + 1, dtype=np.float64)
    nbits = _bits(d)
    patterns = np.arange(2**nbits, dtype=np.uint16 if d.itemsize == 2 else np.uint8)
    values = patterns.view(d) if d.itemsize * 8 == nbits else patterns.astype(np.uint8).view(d)
    with np.errstate(invalid="ignore"):
        values = values.astype(np.float64)
    values = values[np.isfinite(values)]
    return np.unique(values + 0.0)  # + 0.0 folds -0 into 0


def _precision(d: np.dtype) -> int:
    return int(D.finfo(d).nmant) + 1


def _max(d: np.dtype) -> float:
    if D.kind(d) == "f":
        return float(D.finfo(d).max)
    return float(D.int_range(d)[1])


def _representable(values: np.ndarray, d: np.dtype) -> bool:
    """Whether every value (exact float64) is a value of ``d``."""
    mine = finite_values(d)
    if mine is not None:
        at = np.searchsorted(mine, values).clip(0, len(mine) - 1)
        return bool((mine[at] == values).all())
    if D.kind(d) in "iu":
        lo, hi = D.int_range(d)
        return bool(((values == np.round(values)) & (values >= lo) & (values <= hi)).all())
    with np.errstate(over="ignore"):
        return bool((values.astype(d).astype(np.float64) == values).all())


def _holds_wide(big: np.dtype, small: np.dtype) -> bool:
    """Containment between two dtypes wider than 16 bits, from their parameters."""
    kb, ks = D.kind(big), D.kind(small)
    if ks in "iu":
        lo, hi = D.int_range(small)
        if kb in "iu":
            blo, bhi = D.int_range(big)
            return blo <= lo and hi <= bhi
        # every integer of magnitude <= 2**p is a value of a binary format with p significand bits
        return max(-lo, hi) <= min(2.0 ** _precision(big), _max(big))
    if kb in "iu":
        return False  # a wide float has fractional values
    fb, fs = D.finfo(big), D.finfo(small)
    return (
        fb.nmant >= fs.nmant
        and float(fb.smallest_subnormal) <= float(fs.smallest_subnormal)
        and float(fb.max) >= float(fs.max)
    )


@functools.cache
def holds(big: np.dtype, small: np.dtype) -> bool:
    """Whether every value of ``small`` is exactly a value of ``big`` (ignoring the sign of zero).

    Complex dtypes compare by their real parts; nothing complex fits in a real dtype.
    """
    if D.kind(small) == "c" and D.kind(big) != "c":
        return False
    big, small = D.real_dtype(big), D.real_dtype(small)
    values = finite_values(small)
    if values is not None:
        return _representable(values, big)
    if finite_values(big) is not None:
        return False  # more values than an enumerated format has bit patterns
    return _holds_wide(big, small)


def _family(k: str) -> str:
    return {"b": "int", "i": "int", "u": "int", "f": "float", "c": "float"}[k]


def least_upper_bound(
    dtypes: Iterable[np.dtype], candidates: Iterable[np.dtype]
) -> np.dtype | None:
    """The unique minimal candidate that holds every dtype, or None when there is none or several."""
    dtypes = tuple(dtypes)
    upper = [c for c in candidates if all(holds(c, d) for d in dtypes)]
    minimal = [u for u in upper if not any(v != u and holds(u, v) for v in upper)]
    return minimal[0] if len(minimal) == 1 else None


INTEGERS = tuple(d for d in D.DTYPES if D.kind(d) in "iu")
REAL_FLOATS = tuple(d for d in D.DTYPES if D.kind(d) == "f")
COMPLEXES = tuple(d for d in D.DTYPES if D.kind(d) == "c")


def _complex_of(real: np.dtype) -> np.dtype | None:
    return least_upper_bound([real], COMPLEXES)


def _same_kind_lub(a: np.dtype, b: np.dtype) -> np.dtype | None:
    return least_upper_bound([a, b], INTEGERS if _family(D.kind(a)) == "int" else REAL_FLOATS)


def _complex_lub(a: np.dtype, b: np.dtype) -> np.dtype | None:
    real = least_upper_bound([D.real_dtype(a), D.real_dtype(b)], REAL_FLOATS)
    return None if real is None else _complex_of(real)


# The kind rules of POLICY.md 2, as data: (kind of a, kind of b) -> how the result is found.
# 'a' / 'b' take that operand unchanged; 'lub' is the narrowest container of the same kind;
# 'complex' is the complex whose real part is the narrowest container of both real parts.
KIND_RULES: dict[tuple[str, str], str] = {}
for _ka, _kb in itertools.product("biufc", repeat=2):
    if _ka == "b" or _kb == "b":
        _rule = "b" if _ka == "b" else "a"  # rule 2: bool gives way
    elif (_ka in "iu") != (_kb in "iu"):
        _rule = "b" if _ka in "iu" else "a"  # rule 4: the float or complex, unchanged
    elif "c" in (_ka, _kb):
        _rule = "complex"  # rule 6
    else:
        _rule = "lub"  # rules 3 and 5
    KIND_RULES[_ka, _kb] = _rule

_RULES = {
    "a": lambda a, b: a,
    "b": lambda a, b: b,
    "lub": _same_kind_lub,
    "complex": _complex_lub,
}


def derive_promotion(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """heddle's promotion of two dtypes from the kind rules and containment; None is an error."""
    if a == b:
        return a
    return _RULES[KIND_RULES[D.kind(a), D.kind(b)]](a, b)


def derive_table() -> dict[tuple[np.dtype, np.dtype], np.dtype | None]:
    """The full pairwise table of heddle's lattice over ``DTYPES``."""
    return {(a, b): derive_promotion(a, b) for a in D.DTYPES for b in D.DTYPES}


def lossless(src: np.dtype, dst: np.dtype) -> bool:
    """Whether every value of ``src`` is exactly a value of ``dst`` (NaN and inf aside)."""
    return src == dst or holds(dst, src)
