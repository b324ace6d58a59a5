"""The dtype set of POLICY.md 1 and name parsing.

The set is data: ``DTYPES`` lists every dtype in the order of ``promotion.csv``; ``ALIASES`` maps the
short names. Everything else (kinds, ranges, format parameters) is read off NumPy and ml_dtypes.

Names from other libraries are read where every library that uses the name means the same width,
and refused where they disagree:

- the ``fp`` family: ``fp16``, ``fp32``, ``fp64`` beside ``fp8``, ``fp4``, ``bf8`` (and ``bf16``);
- NumPy's C-type words that torch shares: ``half`` (float16, ``torch.half``), ``single``
  (float32), ``double`` (float64, ``torch.double``);
- ``float``, ``int``, ``long``, ``byte``, ``complex`` and ``cfloat`` are refused, as the Python
  types ``float``, ``int`` and ``complex`` are: ``"float"`` is float64 to NumPy and float32 to torch
  and Keras, ``"int"`` int64 to NumPy and int32 to torch, ``"long"`` int32 or int64 with the
  platform, ``"byte"`` int8 to NumPy and uint8 to torch, ``"complex"``/``"cfloat"`` complex128 to
  NumPy and complex64 to torch. The message names both widths;
- ``mixed_bfloat16`` and the other precision presets name three dtypes, not one: they belong to
  ``Precision.parse``, and the message says so.

In a ``Precision``, ``half`` and ``full`` stay refused: they are jmp's words, and jmp's ``half``
is float16 or bfloat16 with the platform.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import ml_dtypes
import numpy as np

from heddle.policy._errors import PrecisionError, UnknownDTypeError, message

_NAMES = (
    "bool",
    "int2", "int4", "int8", "int16", "int32", "int64",
    "uint2", "uint4", "uint8", "uint16", "uint32", "uint64",
    "float4_e2m1fn", "float8_e3m4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float16", "bfloat16", "float32", "float64",
    "complex64", "complex128",
)  # fmt: skip


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


DTYPES: tuple[np.dtype, ...] = tuple(_np_dtype(n) for n in _NAMES)
"""Every dtype of the policy, in the order of ``promotion.csv``."""

ALIASES: dict[str, str] = {
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "fp4": "float4_e2m1fn", "fp8": "float8_e4m3fn", "bf8": "float8_e5m2",
    "fp16": "float16", "fp32": "float32", "fp64": "float64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128",
}  # fmt: skip
"""Short names (POLICY.md 1); each float8 name also parses without its ``float8_`` prefix."""
# The fp16/fp32/fp64 entries come before f16/f32/f64: read backwards (a dtype to its short name,
# as reports do), the later entry wins.

_WORDS = {"half": "float16", "single": "float32", "double": "float64"}
"""NumPy's C-type words whose width torch gives them too."""

_AMBIGUOUS = {
    "float": ("float32", "float64", "float64 to NumPy and float32 to torch and Keras"),
    "int": ("int32", "int64", "int64 to NumPy and int32 to torch"),
    "long": ("int32", "int64", "int32 or int64 with the platform to NumPy, int64 to torch"),
    "byte": ("int8", "uint8", "int8 to NumPy and uint8 to torch"),
    "complex": ("complex64", "complex128", "complex128 to NumPy"),
    "cfloat": ("complex64", "complex128", "complex128 to NumPy and complex64 to torch"),
}
"""Words other libraries read as different widths: refused, naming both."""

_BY_NAME: dict[str, np.dtype] = {d.name: d for d in DTYPES}
_BY_NAME.update({a: _BY_NAME[n] for a, n in ALIASES.items()})
_BY_NAME.update(
    {n.removeprefix("float8_"): d for n, d in _BY_NAME.items() if n.startswith("float8_")}
)
_BY_NAME["bool_"] = _BY_NAME["bool"]
_BY_NAME.update({w: _BY_NAME[n] for w, n in _WORDS.items()})

_SET = frozenset(DTYPES)


def _valid_names() -> str:
    return ", ".join(d.name for d in DTYPES) + "; aliases " + ", ".join(ALIASES)


def _not_a_dtype(x: Any) -> UnknownDTypeError:
    why, fix = "that is not a dtype of heddle's policy", ""
    word = x.strip().lower() if isinstance(x, str) else None
    if word in _AMBIGUOUS:
        narrow, wide, meanings = _AMBIGUOUS[word]
        why += f": {word!r} is {meanings}, so its width depends on the library"
        fix = f"Name the width: heddle.policy.dtype('{narrow}') or heddle.policy.dtype('{wide}'). "
    elif word is not None and word.startswith(("mixed_", "mixed-")):
        preset = _preset_compute(word)
        if preset is not None:
            why += (
                f": {x.strip()!r} is a Precision preset, which names three dtypes (params, "
                "compute, output), not one"
            )
            fix = (
                f"Use heddle.policy.Precision.parse('{x.strip()}') for the preset (e.g. "
                f"heddle.autocast(fn, precision='{x.strip()}')), or its compute dtype alone: "
                f"heddle.policy.dtype('{preset}'). "
            )
    return UnknownDTypeError(message(f"dtype({x!r})", why, f"{fix}Use one of: {_valid_names()}."))


def _preset_compute(word: str) -> str | None:
    """The compute dtype of a ``mixed_<float>`` preset name, or ``None``."""
    d = _BY_NAME.get(word[len("mixed_") :])
    return d.name if d is not None and _kind_of(d) == "f" else None


@functools.lru_cache(maxsize=512)
def _parse_hashable(x: Any) -> np.dtype:
    if isinstance(x, str):
        d = _BY_NAME.get(x.strip().lower())
        if d is None:
            raise _not_a_dtype(x)
        return d
    if x is None:  # NumPy reads None as float64: heddle never picks a width silently
        raise UnknownDTypeError(
            message(
                "dtype(None)",
                "None names no dtype under heddle's policy",
                "Name one, e.g. heddle.policy.dtype('float32'), or use the default of the "
                "active policy: heddle.policy.current().default_float.",
            )
        )
    if x is bool:
        return _BY_NAME["bool"]
    if x is int or x is float or x is complex:
        raise UnknownDTypeError(
            message(
                f"dtype({x.__name__})",
                "a Python type has no fixed width under heddle's policy",
                "Name the width, e.g. heddle.policy.dtype('int32') or dtype('float32'), or use "
                "heddle.policy.current().default_float.",
            )
        )
    try:
        d = np.dtype(x)
    except TypeError:
        d = None
    if d is None or d not in _SET:
        raise _not_a_dtype(x)
    return d


def dtype(x: Any) -> np.dtype:
    """Parses a dtype name, alias, NumPy dtype or JAX scalar type.

    Args:
      x: a canonical name (``"bfloat16"``), a short alias (``"bf16"``, ``"fp16"``, ``"fp8"``), a
        float8 name without its prefix (``"e4m3fn"``), NumPy's ``"half"``, ``"single"`` or
        ``"double"``, a NumPy dtype, a JAX/ml_dtypes scalar type (``jnp.bfloat16``), or an object
        with a ``dtype`` attribute. ``"float"``, ``"int"`` and the Python types ``float`` and
        ``int`` are refused: NumPy, torch and Keras give them different widths.

    Returns:
      The ``numpy.dtype``.

    Raises:
      UnknownDTypeError: ``x`` names no dtype of the policy; the message lists the valid names (and,
        for ``"float"`` and the like, both widths it could mean; for a precision preset such as
        ``"mixed_bfloat16"``, the ``Precision.parse`` call).

    Examples:
      >>> from heddle import policy
      >>> policy.dtype("bf16"), policy.dtype("fp16"), policy.dtype("half")
      (dtype(bfloat16), dtype('float16'), dtype('float16'))
      >>> policy.dtype("e4m3fn")
      dtype(float8_e4m3fn)
    """
    if isinstance(x, np.dtype):
        if x in _SET:
            return x
        return _parse_hashable(x)
    if hasattr(x, "dtype") and not isinstance(x, type):
        return dtype(x.dtype)
    try:
        return _parse_hashable(x)
    except TypeError:  # unhashable
        raise _not_a_dtype(x) from None


def _kind_of(d: np.dtype) -> str:
    if d == np.bool_:
        return "b"
    if d.kind in "iufc":
        return d.kind
    try:  # ml_dtypes' own types have kind 'V': ask which info they support
        return "i" if int(ml_dtypes.iinfo(d).min) < 0 else "u"
    except ValueError:
        return "f"


_KIND = {d: _kind_of(d) for d in DTYPES}


def kind(d: np.dtype) -> str:
    """One of ``"b"`` (bool), ``"i"`` (signed), ``"u"`` (unsigned), ``"f"`` (float), ``"c"`` (complex)."""
    return _KIND[d]


def is_float(d: np.dtype) -> bool:
    """Whether ``d`` is a real floating dtype (any width)."""
    return kind(d) == "f"


def is_inexact(d: np.dtype) -> bool:
    """Whether ``d`` is a real floating or complex dtype."""
    return kind(d) in "fc"


def is_integer(d: np.dtype) -> bool:
    """Whether ``d`` is a signed or unsigned integer dtype (not bool)."""
    return kind(d) in "iu"


def finfo(d: np.dtype) -> ml_dtypes.finfo:
    """ml_dtypes' ``finfo`` for any float dtype of the set."""
    return ml_dtypes.finfo(d)


def iinfo(d: np.dtype) -> ml_dtypes.iinfo:
    """ml_dtypes' ``iinfo`` for any integer dtype of the set (bool: 0..1)."""
    return ml_dtypes.iinfo(d)


def int_range(d: np.dtype) -> tuple[int, int]:
    """The smallest and largest value of an integer or bool dtype, as Python ints."""
    if d == np.bool_:
        return 0, 1
    info = iinfo(d)
    return int(info.min), int(info.max)


def real_dtype(d: np.dtype) -> np.dtype:
    """The real part of a complex dtype; any other dtype unchanged."""
    return {"complex64": _BY_NAME["float32"], "complex128": _BY_NAME["float64"]}.get(d.name, d)


def is_64bit(d: np.dtype) -> bool:
    """Whether ``d`` needs ``jax_enable_x64`` (int64, uint64, float64, complex128)."""
    return d.name in _NARROWER  # complex64 is 8 bytes too, but two float32 parts


def x64_enabled() -> bool:
    """Whether JAX currently allows 64-bit arrays."""
    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]  # a flag the stubs omit


_NARROWER = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def require_available(d: np.dtype, what: str = "this operation") -> np.dtype:
    """Returns ``d`` if JAX can hold it now; else raises ``PrecisionError`` with the fix.

    Args:
      d: the dtype asked for.
      what: names what asked for it, for the message.

    Returns:
      ``d`` unchanged.

    Raises:
      PrecisionError: ``d`` is 64-bit and ``jax_enable_x64`` is off. heddle never narrows silently.

    Examples:
      >>> import numpy as np
      >>> from heddle.policy._dtypes import require_available
      >>> require_available(np.dtype("float32"))
      dtype('float32')
    """
    if is_64bit(d) and not x64_enabled():
        raise PrecisionError(
            message(
                f"{what} asked for {d.name}",
                "64-bit dtypes need jax_enable_x64, which is off, and heddle never narrows silently",
                f"Enable it with jax.config.update('jax_enable_x64', True) (or JAX_ENABLE_X64=1), "
                f"or convert explicitly to {_NARROWER[d.name]}, e.g. "
                f"heddle.astype(x, '{_NARROWER[d.name]}') or np.asarray(x, '{_NARROWER[d.name]}').",
            )
        )
    return d
