"""An exact reference for casts and printing, independent of XLA and ml_dtypes.

Formats are described by their defining parameters (written out below from the format definitions,
not read from ml_dtypes). Values are exact: a finite value is ``(-1)**sign * M * 2**q`` with integer
``M >= 0``. Two implementations of rounding are given:

* ``round_scalar``: one value at a time with ``fractions.Fraction`` (``round`` on a Fraction rounds
  half to even), the definition written as directly as possible;
* ``round_array``: the same rounding on NumPy integer arrays (int64, or object arrays of Python ints
  for integer sources wider than 62 bits), for bulk checks. The tests check it against
  ``round_scalar``.

Nothing here runs inside XLA, so nothing is flushed to zero.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

FINITE, INF, NAN = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    ``specials`` says which encodings are not finite numbers:
    ``ieee``: exponent all ones is inf (fraction 0) or NaN; ``fn``: only exponent and fraction all
    ones is NaN, no inf; ``fnuz``: only the negative-zero encoding is NaN, no inf, no -0;
    ``none``: every encoding is finite; ``e8m0``: unsigned, no zero, no subnormals, all ones is NaN.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    specials: str

    @property
    def signed(self) -> bool:
        return self.specials != "e8m0"

    @property
    def nbits(self) -> int:
        return self.ebits + self.mbits + int(self.signed)

    @property
    def subnormals(self) -> bool:
        return self.specials != "e8m0"

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - self.bias if self.subnormals else -self.bias

    @property
    def max_mag(self) -> int:
        """Encoding of the largest finite magnitude."""
        top = (1 << (self.ebits + self.mbits)) - 1
        return {"ieee": top - (1 << self.mbits), "fn": top - 1, "e8m0": top - 1}.get(
            self.specials, top
        )

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def max_value(self) -> Fraction:
        _, m, q = decode_scalar(self.max_mag, self)
        return Fraction(m) * Fraction(2) ** q


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("float4_e2m1fn", 2, 1, 1, "none"),
        Format("float8_e3m4", 3, 4, 3, "ieee"),
        Format("float8_e4m3", 4, 3, 7, "ieee"),
        Format("float8_e4m3fn", 4, 3, 7, "fn"),
        Format("float8_e4m3fnuz", 4, 3, 8, "fnuz"),
        Format("float8_e4m3b11fnuz", 4, 3, 11, "fnuz"),
        Format("float8_e5m2", 5, 2, 15, "ieee"),
        Format("float8_e5m2fnuz", 5, 2, 16, "fnuz"),
        Format("float8_e8m0fnu", 8, 0, 127, "e8m0"),
        Format("float16", 5, 10, 15, "ieee"),
        Format("bfloat16", 8, 7, 127, "ieee"),
        Format("float32", 8, 23, 127, "ieee"),
        Format("float64", 11, 52, 1023, "ieee"),
    )
}

# ---------------------------------------------------------------------------------------------
# Decoding


def decode_scalar(bits: int, fmt: Format) -> tuple[int, int, int] | tuple[int, int, None]:
    """Returns ``(sign, M, q)`` for a finite pattern, ``(sign, INF, None)``/``(sign, NAN, None)``."""
    sign = (bits >> (fmt.nbits - 1)) & 1 if fmt.signed else 0
    mag = bits & ((1 << (fmt.ebits + fmt.mbits)) - 1)
    e = mag >> fmt.mbits
    f = mag & ((1 << fmt.mbits) - 1)
    eall = (1 << fmt.ebits) - 1
    if fmt.specials == "ieee" and e == eall:
        return sign, (INF if f == 0 else NAN), None
    if fmt.specials == "fn" and mag == (1 << (fmt.ebits + fmt.mbits)) - 1:
        return sign, NAN, None
    if fmt.specials == "fnuz" and sign and mag == 0:
        return 0, NAN, None
    if fmt.specials == "e8m0" and e == eall:
        return 0, NAN, None
    if e == 0 and fmt.subnormals:
        return sign, f, 1 - fmt.bias - fmt.mbits
    return sign, f | (1 << fmt.mbits), e - fmt.bias - fmt.mbits


def value_scalar(bits: int, fmt: Format) -> Fraction | float:
    """The exact value of a pattern: a Fraction, or ``float('inf')``/``-inf``/``nan``."""
    sign, m, q = decode_scalar(bits, fmt)
    if q is None:
        return math.nan if m == NAN else (-math.inf if sign else math.inf)
    v = Fraction(m << q) if q >= 0 else Fraction(m, 1 << -q)
    return -v if sign else v


def is_nan_scalar(bits: int, fmt: Format) -> bool:
    """Whether a pattern is a NaN of ``fmt``."""
    _, m, q = decode_scalar(bits, fmt)
    return q is None and m == NAN


def decode_array(bits: np.ndarray, fmt: Format) -> tuple[np.ndarray, ...]:
    """Vectorised ``decode_scalar``: ``(cls, sign, M, q)`` as int64 arrays (cls: FINITE/INF/NAN)."""
    b = np.asarray(bits).astype(np.uint64)
    nb = np.uint64(fmt.nbits - 1)
    sign = (
        ((b >> nb) & np.uint64(1)).astype(np.int64) if fmt.signed else np.zeros(b.shape, np.int64)
    )
    mag = b & np.uint64((1 << (fmt.ebits + fmt.mbits)) - 1)
    e = (mag >> np.uint64(fmt.mbits)).astype(np.int64)
    f = (mag & np.uint64((1 << fmt.mbits) - 1)).astype(np.int64)
    eall = (1 << fmt.ebits) - 1
    cls = np.zeros(b.shape, np.int64)
    if fmt.specials == "ieee":
        cls = np.where(e == eall, np.where(f == 0, INF, NAN), FINITE)
    elif fmt.specials == "fn":
        cls = np.where(mag == np.uint64((1 << (fmt.ebits + fmt.mbits)) - 1), NAN, FINITE)
    elif fmt.specials == "fnuz":
        cls = np.where((sign == 1) & (mag == 0), NAN, FINITE)
    elif fmt.specials == "e8m0":
        cls = np.where(e == eall, NAN, FINITE)
    sub = (e == 0) & fmt.subnormals
    m = np.where(sub, f, f | (1 << fmt.mbits))
    q = np.where(sub, 1 - fmt.bias - fmt.mbits, e - fmt.bias - fmt.mbits)
    return cls, sign, m, q


def float_bits(x: np.ndarray) -> np.ndarray:
    """The bit patterns of a NumPy float array as uint64."""
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}").astype(np.uint64)


# ---------------------------------------------------------------------------------------------
# Rounding to a float format


def _encode_rounded(
    sign: int, n: int, qq: int, fmt: Format, saturate: bool
) -> int:  # n * 2**qq, n already on the format's grid
    if fmt.specials == "e8m0" and (sign or n == 0):
        return 0xFF
    if n == 1 << (fmt.mbits + 1):
        n, qq = n >> 1, qq + 1
    if n < (1 << fmt.mbits):
        mag = n
    else:
        e = qq + fmt.mbits + fmt.bias
        mag = (e << fmt.mbits) | (n - (1 << fmt.mbits))
    if mag > fmt.max_mag:
        return overflow_scalar(sign, fmt, saturate)
    return _with_sign(sign, mag, fmt)


def _with_sign(sign: int, mag: int, fmt: Format) -> int:
    if fmt.specials == "fnuz" and mag == 0:
        return 0
    return (sign << (fmt.nbits - 1)) | mag if fmt.signed else mag


def nan_scalar(fmt: Format) -> int:
    """The canonical NaN pattern (``none``: NaN has no encoding and becomes +0)."""
    top = (1 << (fmt.ebits + fmt.mbits)) - 1
    return {
        "ieee": top ^ ((1 << (fmt.mbits - 1)) - 1) if fmt.mbits else top,
        "fn": top,
        "fnuz": 1 << (fmt.nbits - 1),
        "e8m0": top,
        "none": 0,
    }[fmt.specials]


def overflow_scalar(sign: int, fmt: Format, saturate: bool) -> int:
    """Pattern for a finite value that rounds past the largest finite value (or an infinity)."""
    if fmt.specials == "e8m0" and sign:
        return nan_scalar(fmt)
    if saturate or fmt.specials == "none":
        return _with_sign(sign, fmt.max_mag, fmt)
    if fmt.has_inf:
        return _with_sign(sign, fmt.max_mag + 1, fmt)
    return nan_scalar(fmt)


def inf_scalar(sign: int, fmt: Format, saturate: bool) -> int:
    """Pattern an infinity becomes: inf where the format has it, else NaN (saturate: +-max)."""
    if fmt.has_inf:
        return _with_sign(sign, fmt.max_mag + 1, fmt)
    return overflow_scalar(sign, fmt, saturate)


def round_scalar(
    x: Fraction | float, fmt: Format, saturate: bool = False, negative_zero: bool = False
) -> int:
    """Rounds an exact value (Fraction, or float inf/nan) to ``fmt`` once: the reference.

    Ties go to the even integer significand on the format's grid (for ``e8m0``, which has one
    significand digit, that is the larger power of two). ``negative_zero``: ``x`` is a zero with
    its sign bit set.
    """
    if isinstance(x, float):
        if math.isnan(x):
            return nan_scalar(fmt)
        if math.isinf(x):
            return inf_scalar(int(x < 0), fmt, saturate)
        x = Fraction(x)
    sign = int(x < 0 or (x == 0 and negative_zero))
    a = abs(x)
    if a == 0:
        return nan_scalar(fmt) if fmt.specials == "e8m0" else _with_sign(sign, 0, fmt)
    *_, q_max = decode_scalar(fmt.max_mag, fmt)
    if fmt.specials != "e8m0" and a >= fmt.max_value + Fraction(2) ** (q_max - 1):
        return overflow_scalar(sign, fmt, saturate)  # at or past max + ulp/2 (POLICY.md 6)
    num, den = a.numerator, a.denominator
    e = num.bit_length() - den.bit_length()  # floor(log2(a)) is e or e - 1
    if (num << max(-e, 0)) < (den << max(e, 0)):
        e -= 1
    qq = max(e, fmt.emin) - fmt.mbits
    top, bottom = num << max(-qq, 0), den << max(qq, 0)  # a / 2**qq
    n, rem = divmod(top, bottom)
    if 2 * rem > bottom or (2 * rem == bottom and n % 2 == 1):  # to nearest, half to even
        n += 1
    if fmt.specials == "e8m0" and n == 0:
        n = 1  # no zero: the nearest value is the smallest one
    return _encode_rounded(sign, n, qq, fmt, saturate)


def _bit_length(m: np.ndarray) -> np.ndarray:
    if m.dtype == object:
        return np.frompyfunc(int.bit_length, 1, 1)(m).astype(np.int64)
    _, ex = np.frexp(m.astype(np.float64))  # may be one too large after rounding up
    ex = ex.astype(np.int64)
    too_big = (ex > 0) & (m < np.left_shift(np.int64(1), np.maximum(ex - 1, 0)))
    return ex - too_big


def round_array(
    cls: np.ndarray,
    sign: np.ndarray,
    m: np.ndarray,
    q: np.ndarray,
    fmt: Format,
    saturate: bool = False,
) -> np.ndarray:
    """Vectorised ``round_scalar`` on exact values ``(-1)**sign * m * 2**q``; returns uint64 patterns.

    ``m`` is int64 (values below 2**62) or an object array of Python ints; ``q`` int64.
    """
    obj = m.dtype == object
    cls, sign, q = (np.asarray(a, np.int64) for a in (cls, sign, q))
    fin = (cls == FINITE) & (m != 0)
    mm = np.where(fin, m, 1)
    e = _bit_length(mm) - 1 + q
    qq = np.maximum(e, fmt.emin) - fmt.mbits
    k = qq - q
    if obj:
        kk = np.maximum(k, 0).astype(object)
        lo = mm >> kk
        rem = mm - (lo << kk)
        twice = rem << 1
        one = np.ones_like(kk) << kk
        up = (twice > one) | ((twice == one) & ((lo & 1) == 1) & (kk > 0))
        tie_down = (twice == one) & ~up & (kk > 0)
        n = np.where(k <= 0, mm << np.maximum(-k, 0).astype(object), lo + up)
        n = n.astype(object)
        big = n >= (1 << 62)  # only when the value overflows any format
        n = np.where(big, 1 << 62, n).astype(np.int64)
    else:
        kk = np.minimum(np.maximum(k, 0), 62)
        lo = mm >> kk
        rem = mm - (lo << kk)
        half = np.where(kk > 0, np.left_shift(np.int64(1), np.maximum(kk - 1, 0)), 1)
        up = (kk > 0) & ((rem > half) | ((rem == half) & ((lo & 1) == 1)))
        tie_down = (kk > 0) & (rem == half) & ~up
        n = np.where(k <= 0, mm << np.minimum(np.maximum(-k, 0), 62), lo + up)
        big = np.zeros(n.shape, bool)
    if fmt.specials == "e8m0":
        n = np.where(n == 0, 1, n)
    carry = n == (1 << (fmt.mbits + 1))
    n = np.where(carry, n >> 1, n)
    qq = qq + carry
    sub = n < (1 << fmt.mbits)
    ebiased = qq + fmt.mbits + fmt.bias
    over = big | (~sub & (ebiased >= (1 << fmt.ebits)))
    ebiased = np.where(over, 0, ebiased)
    mag = np.where(sub, n, (ebiased << fmt.mbits) | (n - (1 << fmt.mbits)))
    over |= mag > fmt.max_mag
    if fmt.specials != "e8m0":  # max + ulp/2 overflows even where max's significand is even
        over |= (mag == fmt.max_mag) & np.asarray(tie_down, bool) & fin
    # every pattern as uint64 (a 64-bit format's sign bit does not fit an int64 Python scalar)
    u = np.uint64
    out = _with_sign_array(sign, mag, fmt).astype(u)
    out = np.where(
        over, np.where(sign == 1, u(_ovf(1, fmt, saturate)), u(_ovf(0, fmt, saturate))), out
    )
    zero = (cls == FINITE) & (m == 0)
    out = np.where(zero, _with_sign_array(sign, np.zeros_like(mag), fmt).astype(u), out)
    if fmt.specials == "e8m0":
        out = np.where(zero | (sign == 1), u(nan_scalar(fmt)), out)
    inf = np.where(sign == 1, u(inf_scalar(1, fmt, saturate)), u(inf_scalar(0, fmt, saturate)))
    out = np.where(cls == INF, inf, out)
    out = np.where(cls == NAN, u(nan_scalar(fmt)), out)
    return out.astype(u)


def _ovf(sign: int, fmt: Format, saturate: bool) -> int:
    return overflow_scalar(sign, fmt, saturate)


def _with_sign_array(sign: np.ndarray, mag: np.ndarray, fmt: Format) -> np.ndarray:
    if not fmt.signed:
        return mag
    out = (sign << (fmt.nbits - 1)) | mag
    if fmt.specials == "fnuz":
        out = np.where(mag == 0, 0, out)
    return out


def is_nan_bits(bits: np.ndarray, fmt: Format) -> np.ndarray:
    """Whether each pattern is a NaN of ``fmt``."""
    return decode_array(bits, fmt)[0] == NAN


# ---------------------------------------------------------------------------------------------
# Other kinds of target


def to_int_array(cls, sign, m, q, lo: int, hi: int) -> np.ndarray:
    """Truncates exact values toward zero; NaN -> 0; clamps to [lo, hi]. Returns an object array."""
    out = np.empty(np.shape(m), object)
    for i, (c, s, mi, qi) in enumerate(
        zip(cls.ravel(), sign.ravel(), m.ravel(), q.ravel(), strict=True)
    ):
        if c == NAN:
            v = 0
        elif c == INF:
            v = lo if s else hi
        else:
            mi, qi = int(mi), int(qi)
            mag = mi << qi if qi >= 0 else mi >> -qi
            v = min(max(-mag if s else mag, lo), hi)
        out.flat[i] = v
    return out


def wrap_int(v: int, bits: int, signed: bool) -> int:
    """Two's-complement wrap of an integer to ``bits`` bits."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v


# ---------------------------------------------------------------------------------------------
# Decimal strings


def parse_decimal(s: str) -> Fraction | float:
    """Parses a decimal string exactly (``nan``, ``inf``, ``-inf`` as floats)."""
    t = s.strip().lower()
    if t in ("nan", "-nan"):
        return math.nan
    if t in ("inf", "-inf"):
        return -math.inf if t.startswith("-") else math.inf
    return Fraction(t)


def significant_digits(s: str) -> int:
    """Number of significant decimal digits of a finite decimal string (0 for zero)."""
    mant = s.lower().lstrip("-").split("e")[0].replace(".", "").lstrip("0").rstrip("0")
    return len(mant)


def decimal_neighbours(x: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """The largest decimal at most ``x`` and the smallest at least ``x`` with ``digits``
    significant digits on ``x``'s own decimal grid (``x > 0``)."""
    num, den = x.numerator, x.denominator
    e = len(str(num)) - len(str(den))  # floor(log10(x)) is e or e - 1
    if num * 10 ** max(-e, 0) < den * 10 ** max(e, 0):
        e -= 1
    p = e - digits + 1
    k, r = divmod(num * 10 ** max(-p, 0), den * 10 ** max(p, 0))
    step = Fraction(10**p) if p >= 0 else Fraction(1, 10**-p)
    return k * step, (k + (r != 0)) * step


# ---------------------------------------------------------------------------------------------
# Whole casts on NumPy arrays

INT_BITS = {"int2": 2, "int4": 4, "int8": 8, "int16": 16, "int32": 32, "int64": 64}
INT_BITS |= {"u" + k: v for k, v in INT_BITS.items()}


def _uint_of(nbits: int) -> type:
    return {4: np.uint8, 8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[nbits]


def exact(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(cls, sign, M, q)`` of every element of a real NumPy array (``M`` object for 64-bit ints)."""
    x = np.asarray(x)
    name = x.dtype.name
    if name in FORMATS:
        fmt = FORMATS[name]
        raw = x.view(_uint_of(8 if fmt.nbits == 4 else fmt.nbits)).astype(np.uint64)
        if fmt.nbits == 4:
            raw &= np.uint64(0xF)
        return decode_array(raw, fmt)
    if name == "bool":
        v = x.astype(np.int64)
        return np.zeros_like(v), np.zeros_like(v), v, np.zeros_like(v)
    if name in ("int64", "uint64"):
        v = np.array([int(i) for i in x.ravel()], object).reshape(x.shape)
    else:
        v = x.astype(np.int64)
    sign = (v < 0).astype(np.int64)
    m = np.where(sign == 1, -v, v)
    if m.dtype == object:
        m = m.astype(object)
    zeros = np.zeros(x.shape, np.int64)
    return zeros, sign, m, zeros


def _trunc_int(cls, sign, m, q, nbits: int, signed: bool) -> np.ndarray:
    """Float (exact M, q; M < 2**62) to integer: truncate, clamp, NaN -> 0. Returns int64/uint64."""
    lo = -(1 << (nbits - 1)) if signed else 0
    hi = (1 << (nbits - 1)) - 1 if signed else (1 << nbits) - 1
    m = np.asarray(m, np.int64)
    big = (q >= 0) & (_bit_length(np.where(m > 0, m, 1)) + q > 64)
    mu = m.astype(np.uint64)
    mag = np.where(
        q >= 0,
        mu << np.clip(q, 0, 63).astype(np.uint64),
        mu >> np.clip(-q, 0, 63).astype(np.uint64),
    )
    mag = np.where(big, np.uint64(2**64 - 1), mag)
    neg = sign == 1
    under = neg & (mag > np.uint64(-lo))  # below lo
    over = ~neg & (mag > np.uint64(hi))
    two = ~mag + np.uint64(1)  # two's complement of the magnitude
    raw = np.where(neg, two, mag)
    rt = np.int64 if signed else np.uint64
    if signed:
        v = raw.view(np.int64)
    else:
        v = np.where(neg, np.uint64(0), raw)
    v = np.where(under, rt(lo), np.where(over, rt(hi), v))
    v = np.where(cls == NAN, rt(0), v)
    v = np.where(cls == INF, np.where(neg, rt(lo), rt(hi)), v)
    return v.astype(rt)


def _wrap_int(sign, m, nbits: int, signed: bool) -> np.ndarray:
    """Integer to integer: two's-complement wrap."""
    mask = (1 << nbits) - 1
    if m.dtype == object:
        out = [
            wrap_int(-int(mi) if s else int(mi), nbits, signed)
            for s, mi in zip(sign.ravel(), m.ravel(), strict=True)
        ]
        return np.array(out, np.int64 if signed else np.uint64).reshape(m.shape)
    v = np.where(sign == 1, -m, m)
    if nbits == 64:
        return v if signed else v.astype(np.uint64)
    v &= mask
    if signed:
        v = np.where(v >> (nbits - 1) == 1, v - (1 << nbits), v)
    return v


def reference_cast(x: np.ndarray, dst: str, saturate: bool = False) -> np.ndarray:
    """The exact result of casting the real NumPy array ``x`` to ``dst``, as a NumPy array."""
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, dst, None) or dst)
    x = np.asarray(x)
    cls, sign, m, q = exact(x)
    if dst == "bool":
        return ((cls != FINITE) | (m != 0)).astype(bool)
    if dst in INT_BITS:
        nb, signed = INT_BITS[dst], not dst.startswith("u")
        if (x.dtype.kind in "iub" or x.dtype.name in INT_BITS) and saturate:
            lo = -(1 << (nb - 1)) if signed else 0
            hi = (1 << (nb - 1)) - 1 if signed else (1 << nb) - 1
            v = [
                min(max(-int(mi) if s else int(mi), lo), hi)
                for s, mi in zip(sign.ravel(), m.ravel(), strict=True)
            ]
            v = np.array(v, np.int64 if signed else np.uint64).reshape(x.shape)
        elif x.dtype.kind in "iub" or x.dtype.name in INT_BITS:
            v = _wrap_int(sign, m, nb, signed)
        else:
            v = _trunc_int(cls, sign, m, q, nb, signed)
        return np.asarray(v).astype(dt)
    fmt = FORMATS[dst]
    bits = round_array(cls, sign, m, q, fmt, saturate)
    return bits.astype(_uint_of(8 if fmt.nbits == 4 else fmt.nbits)).view(dt)


def bits_of(a: np.ndarray) -> np.ndarray:
    """Raw patterns of a float array as uint64 (4-bit formats masked to their 4 bits)."""
    a = np.asarray(a)
    fmt = FORMATS[a.dtype.name]
    raw = a.view(_uint_of(8 if fmt.nbits == 4 else fmt.nbits)).astype(np.uint64)
    return raw & np.uint64(0xF) if fmt.nbits == 4 else raw


def mismatches(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Boolean mask of elements where ``got`` differs from ``want`` (any NaN equals any NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    name = want.dtype.name
    if name in FORMATS:
        g, w = bits_of(got), bits_of(want)
        bad = g != w
        i = np.flatnonzero(bad)  # any NaN equals any NaN: look only where the bits differ
        fmt = FORMATS[name]
        bad[i[is_nan_bits(g[i], fmt) & is_nan_bits(w[i], fmt)]] = False
        return bad
    return got != want


# ---------------------------------------------------------------------------------------------
# Inputs that exercise rounding: halfway points and their neighbours

SMALL = tuple(n for n, f in FORMATS.items() if f.nbits <= 16)


def all_patterns(fmt: Format) -> np.ndarray:
    """Every bit pattern of a format of 16 bits or fewer, as a NumPy array of that format."""
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, fmt.name, None) or fmt.name)
    raw = np.arange(1 << fmt.nbits, dtype=np.uint64)
    return raw.astype(_uint_of(8 if fmt.nbits == 4 else fmt.nbits)).view(dt)


def halfway(fmt: Format, encodings: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact positive midpoints ``(M, q)`` between magnitude encoding ``b`` and ``b + 1`` for each
    ``b`` in ``encodings`` (default: all finite ones), the top one being ``max + ulp/2``."""
    b = np.arange(fmt.max_mag + 1, dtype=np.uint64) if encodings is None else encodings
    b = np.asarray(b, np.uint64)
    _, _, ma, qa = decode_array(b, fmt)
    nxt = b + np.uint64(1)
    _, _, mb, qb = decode_array(np.minimum(nxt, np.uint64(fmt.max_mag)), fmt)
    top = nxt > np.uint64(fmt.max_mag)  # virtual next value: max + ulp(max)
    mb = np.where(top, ma + 1, mb)
    qb = np.where(top, qa, qb)
    if fmt.specials == "e8m0":  # one-digit significand: the next value is twice as large
        mb, qb = np.where(top, ma, mb), np.where(top, qa + 1, qb)
    q0 = np.minimum(qa, qb)
    m = (ma << (qa - q0)) + (mb << (qb - q0))
    return m, q0 - 1


def _to_float_exact(m: np.ndarray, q: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Values ``M * 2**q`` that ``dt`` (float32 or float64) holds exactly; the others are dropped."""
    with np.errstate(over="ignore"):
        x = np.ldexp(m.astype(np.float64), q.astype(np.int64)).astype(dt)
    cls, _, mm, qq = exact(x)
    shift = qq - q  # compare M * 2**q with mm * 2**qq on a common exponent
    lhs = np.where(shift >= 0, mm << np.clip(shift, 0, 60), mm)
    rhs = np.where(shift >= 0, m, m << np.clip(-shift, 0, 60))
    same = (cls == FINITE) & (m < (1 << 60)) & (np.abs(shift) <= 60) & (lhs == rhs)
    return x[same]


def neighbours(x: np.ndarray, steps: tuple[int, ...] = (-2, -1, 0, 1, 2)) -> np.ndarray:
    """``x`` and its neighbours ``steps`` ulps away (on the bit patterns), both signs."""
    nb = 8 * x.dtype.itemsize
    u = np.dtype(f"u{x.dtype.itemsize}")
    mag = (x.view(u) & u.type((1 << (nb - 1)) - 1)).astype(np.int64)
    out = []
    for s in steps:
        mm = mag + s
        mm = mm[mm >= 0].astype(u)
        out += [mm, mm | u.type(1 << (nb - 1))]
    return np.concatenate(out).view(x.dtype)


def special_floats(dt: type) -> np.ndarray:
    """Zeros, infinities, NaNs with payloads and signs, extremes."""
    fi = np.finfo(dt)
    u = np.uint32 if np.dtype(dt).itemsize == 4 else np.uint64
    nb = 8 * np.dtype(dt).itemsize
    nm = fi.nmant
    qnan = ((1 << (nb - 1)) - 1) ^ ((1 << (nm - 1)) - 1)
    nans = [qnan, qnan | 1, qnan ^ (1 << (nm - 1)) | 1, (1 << (nb - 1)) - 1]  # quiet, payload, sNaN
    nans += [n | (1 << (nb - 1)) for n in nans]
    vals = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            fi.max,
            -fi.max,
            fi.smallest_normal,
            fi.smallest_subnormal,
            -fi.smallest_subnormal,
            1.0,
            -1.0,
        ],
        dt,
    )
    return np.concatenate([vals, np.array(nans, u).view(dt)])


def float32_near(target: str) -> np.ndarray:
    """float32 inputs: every halfway point of ``target`` (a format of 16 bits or fewer) with its
    neighbours 1 and 2 ulps either side, both signs."""
    m, q = halfway(FORMATS[target])
    return neighbours(_to_float_exact(m, q, np.dtype(np.float32)))


def float32_cases(n_random: int, seed: int = 0) -> np.ndarray:
    """float32 inputs: every halfway point of every narrower format with neighbours 1 and 2 ulps
    either side, specials, and ``n_random`` random bit patterns."""
    parts = [special_floats(np.float32), *(float32_near(name) for name in SMALL)]
    rng = np.random.default_rng(seed)
    parts.append(
        rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    )
    return np.concatenate(parts)


def float64_near(target: str, per_target: int = 1024, sample: int = 1 << 14, seed: int = 0):
    """float64 inputs near ``target``'s halfway points: every one (a sample of ``sample`` for
    float32, with its extremes) with neighbours 1 and 2 ulps away; relative perturbations
    2**-30 .. 2**-52 either side of ``per_target`` of them; the underflow boundary; both signs."""
    rng = np.random.default_rng(seed)
    fmt = FORMATS[target]
    enc = None
    if fmt.nbits > 16:
        top, sub = fmt.max_mag, 1 << fmt.mbits
        enc = np.concatenate(
            [
                np.arange(8, dtype=np.uint64),
                rng.integers(0, top, sample, dtype=np.uint64),
                np.arange(top - 8, top + 1, dtype=np.uint64),
                np.array([sub - 2, sub - 1, sub], np.uint64),
            ]
        )
    m, q = halfway(fmt, enc)
    x = _to_float_exact(m, q, np.dtype(np.float64))
    parts = [neighbours(x)]
    pick = x[rng.integers(0, len(x), min(per_target, len(x)))]
    for j in range(30, 53):
        for s in (1.0, -1.0):
            y = pick * (1.0 + s * 2.0**-j)
            parts += [y, -y]
    # underflow boundary: half the smallest subnormal (or smallest value), and around it
    smallest = np.ldexp(1.0, fmt.emin - fmt.mbits)
    parts.append(neighbours(np.array([smallest / 2, smallest, smallest * 0.75], np.float64)))
    return np.concatenate(parts)


def float64_cases(per_target: int = 1024, seed: int = 0) -> np.ndarray:
    """``float64_near`` of every narrower format, zeros, NaNs with payloads and infinities."""
    parts = [special_floats(np.float64)]
    parts += [float64_near(name, per_target, seed=seed) for name in (*SMALL, "float32")]
    return np.concatenate(parts)


def int_near(dt: type, target: str, per_binade: int = 64, seed: int = 0) -> np.ndarray:
    """Integers of ``dt`` of 25 to 64 significant bits around ``target``'s halfway points (a sample
    of ``per_binade`` per binade where there are more), both signs where ``dt`` has them."""
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    rng = np.random.default_rng(seed)
    fmt = FORMATS[target]
    vals: set[int] = set()
    p = fmt.mbits + 1
    for e in range(p, 64):
        if e - fmt.mbits + fmt.bias > (1 << fmt.ebits) + 1:
            break  # past every value of the format: all overflow
        count = 1 << fmt.mbits
        ks = range(count) if count <= per_binade else rng.integers(0, count, per_binade)
        for k in ks:
            mid = ((2 * ((1 << fmt.mbits) + int(k)) + 1) << (e - fmt.mbits)) >> 1
            for j in range(2, e - p):
                vals.update((mid + (1 << j), -(mid + (1 << j)), mid - (1 << j), -(mid - (1 << j))))
            for d in (0, 1, -1, 2, -2, 3, -3):
                vals.update((mid + d, -(mid + d)))
    keep = sorted(v for v in vals if lo <= v <= hi)
    return np.array(keep, dtype=dt)


def int_cases(dt: type, per_binade: int = 64, seed: int = 0) -> np.ndarray:
    """``int_near`` of every float format, plus powers of two, their neighbours and the extremes."""
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    vals: set[int] = {lo, hi, lo + 1, hi - 1, 0, 1, -1}
    for j in range(1, 64):
        vals.update((1 << j, (1 << j) - 1, (1 << j) + 1, -(1 << j), -(1 << j) + 1))
    extra = np.array(sorted(v for v in vals if lo <= v <= hi), dtype=dt)
    parts = [int_near(dt, name, per_binade, seed) for name in FORMATS]
    return np.unique(np.concatenate([extra, *parts]))


class Float32Sweep:
    """The expected cast of any float32 pattern to a format of 16 bits or fewer, by table lookup.

    Rounding is monotone, so a positive value rounds to encoding ``j`` exactly when it lies between
    the halfway points ``j - 1`` and ``j``. The halfway points (exact float32 numbers) are sorted
    once; a value that is a halfway point takes the result ``round_scalar`` gives for it. Much faster
    than ``round_array`` for sweeping all ``2**32`` patterns, and a second, independent construction.
    """

    def __init__(self, target: str) -> None:
        fmt = self.fmt = FORMATS[target]
        m, q = halfway(fmt)
        mids = _to_float_exact(m, q, np.dtype(np.float32))
        assert len(mids) == len(m), "every halfway point is a float32"
        self.mid_bits = mids.view(np.uint32)
        assert np.all(np.diff(self.mid_bits.astype(np.int64)) > 0)
        self.tie = np.array(
            [round_scalar(Fraction(float(v)), fmt) for v in mids], np.uint64
        )  # a tie's result (positive)

    def __call__(self, bits: np.ndarray, enc: np.ndarray | None = None) -> np.ndarray:
        """Expected result patterns for float32 patterns ``bits`` (``enc``: their magnitude
        encodings, if known)."""
        fmt = self.fmt
        bits = np.asarray(bits, np.uint32)
        sign = (bits >> np.uint32(31)).astype(np.int64)
        mag = bits & np.uint32(0x7FFFFFFF)
        if enc is None:
            j = np.searchsorted(self.mid_bits, mag, side="left")
            last = len(self.mid_bits) - 1
            on_tie = (j <= last) & (self.mid_bits[np.minimum(j, last)] == mag)
            enc = np.where(on_tie, self.tie[np.minimum(j, last)], j.astype(np.uint64))
        over = enc > np.uint64(fmt.max_mag)
        out = _with_sign_array(sign, enc.astype(np.int64), fmt).astype(np.uint64)
        ovf = np.where(sign == 1, overflow_scalar(1, fmt, False), overflow_scalar(0, fmt, False))
        out = np.where(over, ovf.astype(np.uint64), out)
        zero = mag == 0
        out = np.where(
            zero, _with_sign_array(sign, np.zeros_like(sign), fmt).astype(np.uint64), out
        )
        if fmt.specials == "e8m0":
            out = np.where(zero | (sign == 1), np.uint64(nan_scalar(fmt)), out)
        inf = mag == np.uint32(0x7F800000)
        infs = np.where(sign == 1, inf_scalar(1, fmt, False), inf_scalar(0, fmt, False))
        out = np.where(inf, infs.astype(np.uint64), out)
        return np.where(mag > np.uint32(0x7F800000), np.uint64(nan_scalar(fmt)), out)

    def run(self, start: int, n: int) -> np.ndarray:
        """The expected result patterns (uint32) for the ``n`` consecutive float32 patterns from
        ``start`` (one sign), built as constant runs between halfway points, with the special
        patterns patched by position: fast enough to sweep all ``2**32``."""
        fmt = self.fmt
        assert (start >> 31) == ((start + n - 1) >> 31), "one sign per run"
        sign, lo = start >> 31, start & 0x7FFFFFFF
        cuts = np.searchsorted(self.mid_bits, [lo, lo + n], side="left")
        # pattern p takes encoding j = the number of halfway points below p; ties from the table
        edges = self.mid_bits[cuts[0] : cuts[1]].astype(np.int64) - lo
        counts = np.diff(np.concatenate([[0], edges + 1, [n]]))
        out = np.repeat(np.arange(cuts[0], cuts[1] + 1, dtype=np.uint32), counts)
        out[edges] = self.tie[cuts[0] : cuts[1]]
        over = out > fmt.max_mag
        if sign and fmt.specials != "e8m0":
            nonzero = out != 0 if fmt.specials == "fnuz" else True
            out |= np.where(nonzero, np.uint32(1 << (fmt.nbits - 1)), np.uint32(0))
        out[over] = overflow_scalar(sign, fmt, False)
        if fmt.specials == "e8m0" and sign:
            out[:] = nan_scalar(fmt)
        inf, first_nan = 0x7F800000 - lo, 0x7F800001 - lo
        if lo == 0:
            out[0] = nan_scalar(fmt) if fmt.specials == "e8m0" else _with_sign(sign, 0, fmt)
        if 0 <= inf < n:
            out[inf] = inf_scalar(sign, fmt, False)
        if first_nan < n:
            out[max(first_nan, 0) :] = nan_scalar(fmt)
        return out
