"""Quantisation formats as data: what an element code means and how a scaled value rounds to it.

Every format stores ``code * scale``. The table ``_TABLE`` is the only list of formats; the largest
element magnitude (``qmax``) and the OCP MX ``emax`` are derived from ml_dtypes, never typed in.

Rounding. Float elements (float8, float6, float4, and the elements of the MX formats) are clamped to
the element format's largest value and rounded by ``heddle.numpy.astype``: one round-to-nearest-even
from the scaled value, saturating (the same as ``saturate=True``, and a cheaper cast).
float6 cannot be held by XLA, so it is rounded in a float8 "container" with the same fraction bits
and a wider exponent range: scaled by ``2**shift`` the float6 grid, subnormals included, is exactly
the container's grid, and the float6 code is the container's sign and low five bits. Integer
elements round half to even (``heddle.numpy.round``) and then cast exactly, because a cast from
float to integer truncates (POLICY.md 6). NF4 codes are the nearest of the 16 levels, ties to the
even code, decided by exact comparisons with the midpoints between levels.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

import heddle.numpy as hnp
from heddle.policy._errors import PolicyError, message


class FormatError(PolicyError, ValueError):
    """An unknown quantisation format, or a layout (axis, block) the format cannot take."""


# The 16 NF4 levels (QLoRA, Dettmers et al. 2023, appendix E), as float32, in code order.
NF4_LEVELS = np.array(
    [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
     -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
     0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
     0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0],
    dtype=np.float32,
)  # fmt: skip
"""The 16 NF4 levels in code order (code 7 is 0.0): QLoRA's normal-float table, as float32."""

_CONTAINERS = {"float6_e2m3fn": "float8_e4m3fn", "float6_e3m2fn": "float8_e5m2"}


@dataclasses.dataclass(frozen=True)
class Format:
    """One quantisation format.

    Attributes:
      name: the canonical name (``"int4"``, ``"mxfp4"``, ...).
      family: ``"int"`` (symmetric integers), ``"float"`` (a float element format with a float32
        absmax scale), ``"nf4"`` (normal-float levels with a float32 absmax scale) or ``"mx"``
        (OCP Microscaling: a float element format with a power-of-two float8_e8m0fnu scale).
      bits: bits of one element code: 4 and 6 are packed into bytes, 8 is stored natively.
      element: the element dtype name (``int8`` for both integer formats).
      block: the block size: fixed for MX (32), the default for NF4 (64), None otherwise.
    """

    name: str
    family: str
    bits: int
    element: str
    block: int | None = None

    @property
    def qmax(self) -> float:
        """The largest element magnitude: 127, 7, 1 (NF4) or the element format's largest value."""
        if self.family == "int":
            return float(2 ** (self.bits - 1) - 1)
        if self.family == "nf4":
            return 1.0
        return float(ml_dtypes.finfo(self.element).max)

    @property
    def emax(self) -> int:
        """OCP MX ``emax_elem``: the exponent of the element format's largest normal value."""
        return math.floor(math.log2(self.qmax))

    @property
    def scale_dtype(self) -> np.dtype:
        """float8_e8m0fnu for MX formats, float32 for every other format."""
        return np.dtype(ml_dtypes.float8_e8m0fnu if self.family == "mx" else np.float32)

    @property
    def packed(self) -> bool:
        """True where codes narrower than a byte are packed (4 and 6 bits)."""
        return self.bits < 8


_TABLE = (
    Format("int8", "int", 8, "int8"),
    Format("int4", "int", 4, "int8"),
    Format("float8_e4m3fn", "float", 8, "float8_e4m3fn"),
    Format("float8_e5m2", "float", 8, "float8_e5m2"),
    Format("float6_e2m3fn", "float", 6, "float6_e2m3fn"),
    Format("float6_e3m2fn", "float", 6, "float6_e3m2fn"),
    Format("float4_e2m1fn", "float", 4, "float4_e2m1fn"),
    Format("nf4", "nf4", 4, "float32", block=64),
    Format("mxfp8_e4m3", "mx", 8, "float8_e4m3fn", block=32),
    Format("mxfp8_e5m2", "mx", 8, "float8_e5m2", block=32),
    Format("mxfp6_e2m3", "mx", 6, "float6_e2m3fn", block=32),
    Format("mxfp6_e3m2", "mx", 6, "float6_e3m2fn", block=32),
    Format("mxfp4", "mx", 4, "float4_e2m1fn", block=32),
)

FORMATS: tuple[str, ...] = tuple(f.name for f in _TABLE)
"""Every quantisation format name ``quantize`` takes, in table order."""
_BY_NAME = {f.name: f for f in _TABLE}
_ALIASES = {
    "fp8": "float8_e4m3fn",
    "e4m3fn": "float8_e4m3fn",
    "bf8": "float8_e5m2",
    "e5m2": "float8_e5m2",
    "e2m3fn": "float6_e2m3fn",
    "e3m2fn": "float6_e3m2fn",
    "fp4": "float4_e2m1fn",
    "e2m1fn": "float4_e2m1fn",
}


def parse_format(fmt: Any) -> Format:
    """The ``Format`` named by ``fmt``: a name, an alias, or an element dtype (``jnp.int8``)."""
    if isinstance(fmt, Format):
        return fmt
    name = fmt if isinstance(fmt, str) else None
    if name is None:
        try:
            name = np.dtype(fmt).name
        except TypeError:
            name = repr(fmt)
    name = _ALIASES.get(name.lower(), name.lower())
    if name not in _BY_NAME:
        raise FormatError(
            message(
                f"quantize(x, {fmt!r})",
                f"{fmt!r} is not a quantisation format; the formats are {', '.join(FORMATS)} "
                f"(aliases: {', '.join(sorted(_ALIASES))})",
                "Pass one of those names, e.g. heddle.quantize(x, 'int8').",
            )
        )
    return _BY_NAME[name]


# ---------------------------------------------------------------------------------------------
# Element codes. ``encode`` takes values already divided by their scale (float32 or float64) and
# returns uint8 codes (bits < 8) or the native element array; ``decode`` returns float32 values.


def _pow2(k: int, d: Any) -> Any:
    return np.array(2.0**k, dtype=d)


def _float6_encode(v: jax.Array, element: str) -> jax.Array:
    container = _CONTAINERS[element]
    shift = ml_dtypes.finfo(container).minexp - ml_dtypes.finfo(element).minexp
    top = np.array(ml_dtypes.finfo(element).max, v.dtype)
    c = hnp.astype(jnp.clip(v, -top, top) * _pow2(shift, v.dtype), container)  # cannot overflow
    b = lax.bitcast_convert_type(c, jnp.uint8)
    mag = jnp.minimum(b & np.uint8(0x7F), np.uint8(0x1F))  # past float6's largest value: saturate
    return ((b >> np.uint8(7)) << np.uint8(5)) | mag


def _small_float_decode(codes: jax.Array, element: str) -> jax.Array:
    """float32 values of float4/float6 codes (no inf, no NaN), built from their bit fields.

    Normal codes become float32 bit patterns (exponent rebiased, fraction shifted up); subnormal
    codes are ``fraction * 2**(1 - bias - mbits)``, a small integer times a power of two: exact.
    """
    fi = ml_dtypes.finfo(element)
    m, bias = fi.nmant, 1 - fi.minexp
    e_bits = fi.bits - 1 - m
    c = codes.astype(jnp.uint32)
    sign = (c >> np.uint32(e_bits + m)) << np.uint32(31)
    ex = (c >> np.uint32(m)) & np.uint32((1 << e_bits) - 1)
    frac = c & np.uint32((1 << m) - 1)
    normal = ((ex + np.uint32(127 - bias)) << np.uint32(23)) | (frac << np.uint32(23 - m))
    sub = lax.bitcast_convert_type(hnp.astype(frac, np.float32), jnp.uint32)  # exact: < 2**m
    sub = jnp.where(frac == 0, sub, sub - np.uint32((bias - 1 + m) << 23))  # times 2**(1-bias-m)
    return lax.bitcast_convert_type(jnp.where(ex == 0, sub, normal) | sign, jnp.float32)


@functools.cache
def _nf4_thresholds(d: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each midpoint m between levels j and j+1, in dtype ``d``: the least value above m, m
    itself where ``d`` holds it exactly (else NaN, never equal), and whether a tie goes up."""
    lv = NF4_LEVELS.astype(np.float64)
    mids = (lv[:-1] + lv[1:]) / 2  # exact: float32 + float32 fits float64
    near = mids.astype(d)
    exact = near.astype(np.float64) == mids
    up = np.where(near.astype(np.float64) > mids, near, np.nextafter(near, d.type(np.inf)))
    tie_up = (np.arange(1, 16) % 2) == 0  # ties to the even code
    return up.astype(d), np.where(exact, near, d.type(np.nan)).astype(d), tie_up


def _nf4_encode(v: jax.Array) -> jax.Array:
    up, eq, tie_up = _nf4_thresholds(np.dtype(v.dtype))
    code = jnp.zeros_like(v, dtype=jnp.uint8)
    for j in range(15):  # one fused elementwise pass: count the midpoints below v
        above = v >= up[j]
        if tie_up[j] and not np.isnan(eq[j]):
            above = above | (v == eq[j])
        code = code + above.astype(jnp.uint8)
    return code


def encode(v: jax.Array, fmt: Format) -> jax.Array:
    """Element codes of ``v`` (already divided by its scale), rounded to nearest.

    Args:
      v: float32 or float64 values, finite where the scale is.
      fmt: the format.

    Returns:
      The native element array (int8, float8) for 8-bit formats; uint8 codes in ``[0, 2**bits)``
      otherwise (two's complement nibbles for int4, bit patterns for floats, level index for NF4).
    """
    if fmt.family == "nf4":
        return _nf4_encode(v)
    if fmt.family == "int":
        q = jnp.clip(hnp.round(v), -fmt.qmax, fmt.qmax)
        q = hnp.astype(q, np.int8)  # integral values: exact
        return q if fmt.bits == 8 else lax.bitcast_convert_type(q, jnp.uint8) & np.uint8(0x0F)
    if fmt.element in _CONTAINERS:
        return _float6_encode(v, fmt.element)
    top = np.array(fmt.qmax, v.dtype)  # saturating first: the same result, a cheaper cast
    e = hnp.astype(jnp.clip(v, -top, top), fmt.element)
    if fmt.bits == 8:
        return e
    return lax.convert_element_type(lax.bitcast_convert_type(e, jnp.uint4), jnp.uint8)


def decode(codes: jax.Array, fmt: Format) -> jax.Array:
    """float32 element values of ``codes`` (exact: every element value is a float32)."""
    if fmt.family == "nf4":  # a table lookup, split over the devices like the codes
        sh = getattr(jax.typeof(codes), "sharding", None)
        explicit = sh is not None and not sh.mesh.empty and any(e is not None for e in sh.spec)
        idx = codes.astype(jnp.int32)
        return jnp.asarray(NF4_LEVELS).at[idx].get(out_sharding=sh if explicit else None)
    if fmt.family == "int":
        if fmt.bits == 4:
            codes = lax.bitcast_convert_type(codes << np.uint8(4), jnp.int8) >> np.int8(4)
        return hnp.astype(codes, np.float32)
    if fmt.bits < 8:
        return _small_float_decode(codes, fmt.element)
    return hnp.astype(codes, np.float32)
