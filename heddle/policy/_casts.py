"""The correctly rounded cast of POLICY.md 6: ``astype(x, dtype)`` rounds once.

Each (source, target) pair takes one of a few paths, chosen from the table ``_ROUTES`` (data, first
matching row wins). Where XLA's ``convert`` is already the correctly rounded cast it is used as is;
the other rows say what XLA gets wrong, as measured by ``benchmarks/cast_errors.py``. The ``round``
path computes the result from bit patterns with integer arithmetic only, so it is the same on every
backend and immune to flushing subnormals to zero.

The ``round`` path, and why it rounds once. A source value is written exactly as
``sig * 2**(e - f)`` (``sig`` an unsigned integer with its leading bit at ``f``, ``e`` the exponent
of that bit). For a target with ``t`` fraction bits and smallest normal exponent ``emin`` the grid
at that magnitude has spacing ``2**(max(e, emin) - t)``, so the rounded significand is
``N = round_half_even(sig / 2**k)`` with ``k = f - t + max(emin - e, 0)``: one right shift with the
usual bias (``2**(k-1) - 1`` plus the bit that becomes the last). The encoding is
``((max(e, emin) + bias - 1) << t) + N``: a carry of ``N`` to ``2**(t + 1)`` steps into the next
binade by itself, and a result subnormal in the target gets exponent field 0. For a float source
whose exponent and fraction fields sit side by side in one word, rebiasing the word and rounding it
by the same shift gives that encoding directly. An encoding past the largest finite one overflows.

float64 sources narrowed to 16 bits or fewer are first reduced to 32-bit words by round-to-odd: the
top 21 fraction bits plus a sticky bit (any of the 32 dropped bits set). That grid is at least 4
times finer than the target's at every magnitude, so every target value and halfway point is an even
point of it; a value off the fine grid lands on the odd point between its two fine neighbours, on the
same side of every target value and halfway point, and rounding it once more to nearest-even gives
the same result as rounding the original once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.policy._dtypes import (
    DTYPES,
    finfo,
    int_range,
    kind,
    real_dtype,
    require_available,
    x64_enabled,
)
from heddle.policy._dtypes import (
    dtype as parse_dtype,
)
from heddle.policy._errors import PromotionError, message

_FLOATS = tuple(d.name for d in DTYPES if kind(d) == "f")
_INTS = tuple(d.name for d in DTYPES if kind(d) in "iu")
_ALL = tuple(d.name for d in DTYPES)

_ROUTES: tuple[tuple[tuple[str, ...], tuple[str, ...], str, str], ...] = (
    # (sources, targets, path, why XLA's convert is not used; measured on jax 0.10.2 CPU)
    (_FLOATS, ("bool",), "nonzero", "XLA CPU compares with subnormals flushed: 1e-45 != 0 is False"),
    (_FLOATS, _INTS, "truncate", "XLA reads float4_e2m1fn's +-6 as infinities; clamps made explicit"),
    (("float64",), ("float32", "bfloat16", "float16", "float8_e8m0fnu"), "round",
     "rounds through float32 (double rounding) and flushes float32-subnormal results to zero"),
    (("float32", "bfloat16"), ("float64", "float8_e8m0fnu"), "round",
     "flushes subnormal inputs to zero; rounds float32 subnormals up to 2**-126 in e8m0"),
    (("int32", "uint32", "int64", "uint64"), ("bfloat16", "float8_e8m0fnu"), "round",
     "rounds through float32 (double rounding)"),
    (_FLOATS, ("float4_e2m1fn",), "round", "NaN becomes -0; heddle gives +0"),
    (_ALL, _ALL, "convert", "XLA's convert is the correctly rounded cast"),
)  # fmt: skip


@functools.cache
def route(src: np.dtype, dst: np.dtype) -> str:
    """The path of a (source, target) pair: the first row of ``_ROUTES`` that holds it."""
    if src == dst:
        return "identity"
    return next(p for s, d, p, _ in _ROUTES if src.name in s and dst.name in d)


def path_name(src: np.dtype, dst: np.dtype) -> str:
    """The path of a pair as the docs' tables name it: ``route``, with ``+ tie`` where the exact
    tie at the overflow threshold is sent to NaN after it (``float8_e4m3fn`` targets)."""
    p = route(src, dst)
    return f"{p} + tie" if p in ("convert", "round") and _top_tie(src, dst) is not None else p


# ---------------------------------------------------------------------------------------------
# Format parameters

_SPECIALS = {
    "float4_e2m1fn": "none",  # no inf, no NaN
    "float8_e4m3fn": "fn",  # no inf; NaN only with exponent and fraction all ones
    "float8_e4m3fnuz": "fnuz",  # no inf, no -0; NaN is the -0 pattern
    "float8_e4m3b11fnuz": "fnuz",
    "float8_e5m2fnuz": "fnuz",
    "float8_e8m0fnu": "e8m0",  # unsigned powers of two, no zero; NaN is all ones
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """The bit layout of a float dtype: widths, bias, range and which patterns are special."""

    nbits: int
    mbits: int
    bias: int
    emin: int  # exponent of the smallest normal value
    emax: int  # exponent of the largest finite value
    specials: str  # "ieee", "fn", "fnuz", "none", "e8m0"
    max_mag: int  # the pattern of the largest finite value (its magnitude, without the sign)

    def pattern(self, sign: int, mag: int) -> int:
        """The pattern of a magnitude pattern with a sign (formats without -0 or sign drop it)."""
        if (self.specials == "fnuz" and mag == 0) or self.specials == "e8m0":
            return mag
        return (sign << (self.nbits - 1)) | mag

    @property
    def nan(self) -> int:
        """The NaN pattern heddle writes (``none`` formats have no NaN: +0)."""
        return {"ieee": self.max_mag + 1 + (1 << max(self.mbits - 1, 0)), "fn": self.max_mag + 1,
                "fnuz": 1 << (self.nbits - 1), "e8m0": 0xFF, "none": 0}[self.specials]  # fmt: skip

    def overflow(self, sign: int, saturate: bool) -> int:
        """Pattern of a finite value past the largest finite one."""
        if self.specials == "e8m0" and sign:
            return self.nan
        if saturate or self.specials == "none":
            return self.pattern(sign, self.max_mag)
        return self.pattern(sign, self.max_mag + 1) if self.specials == "ieee" else self.nan

    def infinity(self, sign: int, saturate: bool) -> int:
        """Pattern an infinity of the given sign becomes."""
        if self.specials == "ieee":
            return self.pattern(sign, self.max_mag + 1)
        return self.overflow(sign, saturate)

    def decode(self, bits: int) -> tuple[int, int, int] | str:
        """The exact value of a pattern: ``(sign, m, q)`` meaning ``(-1)**sign * m * 2**q``, or one
        of ``"nan"``, ``"inf"``, ``"-inf"``."""
        signed = self.specials != "e8m0"
        sign = (bits >> (self.nbits - 1)) & 1 if signed else 0
        mag = bits & ((1 << (self.nbits - signed)) - 1)
        if (self.specials == "fnuz" and bits == 1 << (self.nbits - 1)) or (
            self.specials in ("fn", "e8m0") and mag == self.max_mag + 1
        ):
            return "nan"
        if self.specials == "ieee" and mag > self.max_mag:
            return "nan" if mag > self.max_mag + 1 else ("-inf" if sign else "inf")
        big_e, frac = mag >> self.mbits, mag & ((1 << self.mbits) - 1)
        if big_e == 0 and self.specials != "e8m0":
            return sign, frac, self.emin - self.mbits
        return sign, frac | (1 << self.mbits), big_e - self.bias - self.mbits


@functools.cache
def layout(d: np.dtype) -> Layout:
    """The ``Layout`` of a float dtype, read off ml_dtypes' ``finfo`` and the specials table."""
    fi = finfo(d)
    specials = _SPECIALS.get(d.name, "ieee")
    subnormals = specials != "e8m0"
    bias = 1 - fi.minexp if subnormals else -fi.minexp
    top = (1 << (fi.bits - subnormals)) - 1  # all magnitude bits set (e8m0 has no sign bit)
    max_mag = {"ieee": top - (1 << fi.nmant), "fn": top - 1, "e8m0": top - 1}.get(specials, top)
    return Layout(fi.bits, fi.nmant, bias, fi.minexp, fi.maxexp - 1, specials, max_mag)


# ---------------------------------------------------------------------------------------------
# Array namespaces: the integer constructions run on device (JAX) or on host (NumPy) alike


class _Jax:
    abs = staticmethod(jnp.abs)
    where = staticmethod(jnp.where)
    maximum = staticmethod(jnp.maximum)
    minimum = staticmethod(jnp.minimum)

    @staticmethod
    def convert(x: Any, d: np.dtype) -> Any:
        return lax.convert_element_type(x, d)

    @staticmethod
    def bitcast(x: Any, d: np.dtype) -> Any:
        if d.name == "float4_e2m1fn":
            return lax.bitcast_convert_type(lax.convert_element_type(x, jnp.uint4), d)
        return lax.bitcast_convert_type(x, d)

    @staticmethod
    def bit_length(v: Any) -> Any:
        return (8 * v.dtype.itemsize - lax.clz(v)).astype(np.int32)


class _NumPy:
    abs = staticmethod(np.abs)
    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def convert(x: Any, d: np.dtype) -> Any:
        return np.asarray(x).astype(d)

    @staticmethod
    def bitcast(x: Any, d: np.dtype) -> Any:
        x = np.asarray(x)
        if x.dtype.itemsize != d.itemsize:
            x = x.astype(f"u{d.itemsize}")
        return x.view(d)

    @staticmethod
    def bit_length(v: Any) -> Any:
        v = np.array(v, copy=True)
        for s in (1, 2, 4, 8, 16, 32)[: 5 + (v.dtype.itemsize == 8)]:
            v |= v >> v.dtype.type(s)  # smear the leading one down
        return np.bitwise_count(v).astype(np.int32)


# ---------------------------------------------------------------------------------------------
# The round path


@dataclasses.dataclass
class _Word:
    """Source values as ``(-1)**sign * sig * 2**(e - bias - f)``, ``e`` an int32 array.

    ``sig`` (uint32 or uint64) has its leading bit at position ``f``, except for source subnormals
    where the target's result does not depend on their leading bit (they are subnormal in the target
    too, or below half its smallest value): there ``e`` is the smallest exponent field.
    """

    sign: Any  # 0 or 1, sig's dtype
    e: Any
    sig: Any
    f: int
    bias: int
    nan: Any = None  # None: the source has no NaN (no inf)
    inf: Any = None
    zero: Any = None  # None: a zero sig rounds to zero by itself
    mag: Any = None  # the source's exponent and fraction fields, where sig and e come from them


def _float_word(xp: Any, x: Any, fmt: Layout, w: int) -> _Word:
    """float64 / float32 bits (narrow floats widen to float32 exactly first)."""
    u = np.dtype(f"u{w // 8}").type
    src = np.dtype(x.dtype)
    if src == np.float64:
        b = xp.bitcast(x, np.dtype(np.uint64))
        if w == 32:  # round to odd on 21 fraction bits: a sticky bit for the 32 low bits
            hi = xp.convert(b >> np.uint64(32), np.dtype(np.uint32))
            sticky = xp.minimum(xp.convert(b, np.dtype(np.uint32)), np.uint32(1))
            mag, sign, f = (hi << np.uint32(1)) | sticky, hi >> np.uint32(31), 21
        else:
            mag, sign, f = b & u((1 << 63) - 1), b >> u(63), 52
        ebits, bias = 11, 1023
    else:
        if src != np.float32:
            x = xp.convert(x, np.dtype(np.float32))
        b = xp.convert(xp.bitcast(x, np.dtype(np.uint32)), np.dtype(u))
        mag, sign, f, ebits, bias = b & u(0x7FFFFFFF), b >> u(31), 23, 8, 127
    m = mag.dtype.type
    big_e = xp.convert(mag >> m(f), np.dtype(np.int32))
    frac = mag & m((1 << f) - 1)
    if 1 - bias <= fmt.emin - fmt.mbits - 1:
        # every source value with exponent field 0 lies below half the target's smallest value,
        # with or without the implicit bit: set it everywhere
        sig, e = frac | m(1 << f), big_e
    else:
        sig, e = xp.where(big_e != 0, frac | m(1 << f), frac), xp.maximum(big_e, np.int32(1))
    inf_word = m(((1 << ebits) - 1) << f)
    word = _Word(
        sign=xp.convert(sign, np.dtype(u)),
        e=e,
        sig=xp.convert(sig, np.dtype(u)),
        f=f,
        bias=bias,
        nan=mag > inf_word,
        inf=mag == inf_word,
        zero=mag == m(0) if fmt.specials == "e8m0" else None,
        mag=xp.convert(mag, np.dtype(u)),
    )
    if f < fmt.mbits + 2:  # widening: room for the target's fraction and two more bits
        word.sig, word.f, word.mag = word.sig << u(fmt.mbits + 2 - f), fmt.mbits + 2, None
    if 1 - bias > fmt.emin:  # source subnormals are normal in the target: normalise them
        shift = xp.maximum(
            xp.bit_length(word.sig) * np.int32(-1) + np.int32(word.f + 1), np.int32(0)
        )
        shift = xp.minimum(shift, np.int32(w - 1))
        word.zero, word.mag = word.sig == u(0), None
        word.sig, word.e = word.sig << xp.convert(shift, np.dtype(u)), word.e - shift
    return word


def _int_word(xp: Any, x: Any, w: int) -> _Word:
    u, i = np.dtype(f"u{w // 8}"), np.dtype(f"i{w // 8}")
    if kind(np.dtype(x.dtype)) == "i":
        v = xp.convert(x, i)  # sign-extends
        neg, bits = v < i.type(0), xp.convert(v, u)  # two's complement bits
    else:
        bits = xp.convert(x, u)
        neg = bits != bits
    mag = xp.where(neg, (~bits) + u.type(1), bits)
    lead = xp.bit_length(mag) - np.int32(1)  # -1 for zero
    sig = mag << xp.convert(xp.minimum(np.int32(w - 1) - lead, np.int32(w - 1)), u)
    return _Word(
        sign=xp.convert(neg, u),
        e=lead,
        sig=(sig >> u.type(1)) | (sig & u.type(1)),  # leading bit at w - 2, the last one sticky
        f=w - 2,
        bias=0,
        zero=mag == u.type(0),
    )


def _round(xp: Any, x: Any, dst: np.dtype, saturate: bool) -> Any:
    fmt, src = layout(dst), np.dtype(x.dtype)
    if src == np.float64:  # 32 bits hold 21 fraction bits and a sticky bit: enough up to float16
        w = 32 if fmt.mbits <= 19 else 64
    else:
        w = 64 if src.itemsize == 8 or fmt.mbits > 27 else 32
    word = _int_word(xp, x, w) if kind(src) in "biu" else _float_word(xp, x, fmt, w)
    u, i32, t = np.dtype(f"u{w // 8}").type, np.int32, fmt.mbits
    # right shift from sig to the target's grid: f - t, more for results subnormal in the target
    # (sig < 2**(f + 1) <= 2**(w - 1), so adding the rounding bias below cannot overflow)
    lo_k = word.f - t
    normal_from = fmt.emin + word.bias  # the first source exponent that is normal in the target
    k = xp.maximum(i32(normal_from + lo_k) - word.e, i32(lo_k))
    k = xp.convert(xp.minimum(k, i32(min(word.f + 2, w - 1))), np.dtype(u))

    def rne(v: Any) -> Any:  # v / 2**k, to nearest, ties to even
        return (v + ((u(1) << (k - u(1))) - u(1)) + ((v >> k) & u(1))) >> k

    if word.mag is not None and fmt.specials != "e8m0" and word.bias >= fmt.bias:
        # exponent and fraction lie side by side in the source's magnitude word: rebiased, the word
        # rounds straight to the target's encoding, a carry stepping into the next binade; results
        # subnormal in the target round from the significand alone, to exponent field 0
        rebiased = word.mag - u((word.bias - fmt.bias) << word.f)
        enc = rne(xp.where(word.e >= i32(normal_from), rebiased, word.sig))
    else:
        n = rne(word.sig)
        # biased target exponent minus one (0 for subnormal results; the carry of n steps it up)
        ebase = word.e - i32(word.bias - fmt.bias + 1)
        if fmt.specials == "e8m0":  # no zero: below the smallest value, the smallest is nearest
            enc = xp.convert(xp.maximum(ebase, i32(-1)) + xp.convert(xp.maximum(n, u(1)), i32), u)
        else:
            enc = (xp.convert(xp.maximum(ebase, i32(0)), np.dtype(u)) << u(t)) + n
    over = enc > u(fmt.max_mag)
    ovf = fmt.overflow(0, saturate)
    sign_bit = u(1 << (fmt.nbits - 1))
    if fmt.specials == "e8m0":
        zero = word.sig == u(0) if word.zero is None else word.zero
        out = xp.where(over, u(ovf), enc)
        out = xp.where((word.sign == u(1)) | zero, u(fmt.nan), out)
    else:
        out = xp.where(over, u(ovf & ~int(sign_bit)), enc)
        out = out | (word.sign << u(fmt.nbits - 1))
        if fmt.specials == "fnuz":  # no -0; NaN is the -0 pattern
            out = xp.where((out & ~sign_bit) == u(0), u(0), out)
            out = out if saturate else xp.where(over, u(fmt.nan), out)
        if word.zero is not None:
            out = xp.where(word.zero, out & sign_bit if fmt.specials != "fnuz" else u(0), out)
    # infinities: overflow already covers them unless the target's range reaches past the
    # source's (float32 -> float64) or overflow saturates
    if word.inf is not None and (saturate or word.bias + 1 <= fmt.emax):
        pos, neg = fmt.infinity(0, saturate), fmt.infinity(1, saturate)
        out = xp.where(word.inf, xp.where(word.sign == u(1), u(neg), u(pos)), out)
    if word.nan is not None:
        out = xp.where(word.nan, u(fmt.nan), out)
    return xp.bitcast(xp.convert(out, np.dtype(f"u{max(fmt.nbits, 8) // 8}")), dst)


# ---------------------------------------------------------------------------------------------
# The other paths


def _truncate(xp: Any, x: Any, dst: np.dtype) -> Any:
    """Float to integer: toward zero, NaN -> 0, clamped to the range, same on every backend."""
    if np.dtype(x.dtype) not in (np.float32, np.float64):
        x = xp.convert(x, np.dtype(np.float32))  # narrow floats widen exactly
    lo, hi = int_range(dst)
    ft = np.dtype(x.dtype).type
    big = x >= ft(hi + 1)  # hi + 1 and lo are powers of two (or 0): exact in every float
    small = x < ft(lo)
    nan = x != x
    ok = ~(big | small | nan)
    inner = xp.convert(xp.where(ok, x, ft(0)), dst)
    t = dst.type
    return xp.where(big, t(hi), xp.where(small, t(lo), inner))


def _nonzero(xp: Any, x: Any) -> Any:
    """Float to bool from the bit pattern: NaN is True, +-0 is False, subnormals are True."""
    if np.dtype(x.dtype) not in (np.float32, np.float64):
        x = xp.convert(x, np.dtype(np.float32))
    u = np.dtype(f"u{np.dtype(x.dtype).itemsize}").type
    mag = xp.bitcast(x, np.dtype(u)) & u((1 << (8 * np.dtype(u).itemsize - 1)) - 1)
    return mag != u(0)


def _clamp_int(xp: Any, x: Any, dst: np.dtype) -> Any:
    src = np.dtype(x.dtype)
    (slo, shi), (dlo, dhi) = int_range(src), int_range(dst)
    t = src.type
    if src == np.bool_:
        return xp.convert(x, dst)
    return xp.convert(xp.minimum(xp.maximum(x, t(max(slo, dlo))), t(min(shi, dhi))), dst)


@functools.cache
def _top_tie(src: np.dtype, dst: np.dtype) -> Any:
    """``max + ulp/2`` of ``dst`` as a ``src`` value, where ``dst``'s largest value has an even
    significand (``float8_e4m3fn``'s 448: the tie 464). Ties to even would keep the largest value;
    POLICY.md 6 overflows every value at or past it, to NaN (such formats have no inf). None where
    ``src`` cannot hold the tie exactly, or no such tie exists."""
    if kind(dst) != "f" or kind(src) not in "iuf" or src == dst:
        return None
    fmt = layout(dst)
    if fmt.specials == "e8m0" or fmt.max_mag & 1:
        return None  # odd largest significand: the tie already rounds up, past the range
    tie = float(finfo(dst).max) + 2.0 ** (fmt.emax - fmt.mbits - 1)
    if kind(src) in "iu":
        return src.type(tie) if tie <= int_range(src)[1] else None
    return src.type(tie) if float(src.type(tie)) == tie else None


def _cast_real(xp: Any, x: Any, dst: np.dtype, saturate: bool) -> Any:
    src = np.dtype(x.dtype)
    path = route(src, dst)
    if (saturate or xp is _NumPy) and kind(dst) == "f" and path == "convert":
        path = "round"  # one construction for saturating casts, and for host data
    if saturate and kind(src) in "iu" and kind(dst) in "iu":
        return _clamp_int(xp, x, dst)
    if path == "identity":
        return x
    if path == "truncate":
        return _truncate(xp, x, dst)
    if path == "nonzero":
        return _nonzero(xp, x)
    tie = None if saturate else _top_tie(src, dst)
    if tie is not None and kind(src) == "f":  # a NaN source is NaN in the target: select before
        x = xp.where(xp.abs(x) == tie, src.type(float("nan")), x)  # the cast, fused with it
    out = _round(xp, x, dst, saturate) if path == "round" else xp.convert(x, dst)
    if tie is not None and kind(src) != "f":
        out = xp.where(xp.abs(x) == tie, dst.type(float("nan")), out)
    return out


def _cast(xp: Any, x: Any, dst: np.dtype, saturate: bool) -> Any:
    src = np.dtype(x.dtype)
    if kind(src) == "c":
        if kind(dst) != "c":
            raise PromotionError(
                message(
                    f"astype(<{src.name} array>, {dst.name})",
                    "casting a complex array to a real dtype would drop the imaginary part",
                    f"Take the part you mean first: heddle.astype(x.real, '{dst.name}') "
                    f"(or jnp.abs(x), x.imag).",
                )
            )
        part = real_dtype(dst)
        re = _cast_real(xp, x.real, part, saturate)
        im = _cast_real(xp, x.imag, part, saturate)
        if xp is _Jax:
            return lax.complex(re, im)
        out = np.empty(np.shape(re), dst)
        out.real, out.imag = re, im
        return out
    if kind(dst) == "c":
        re = _cast_real(xp, x, real_dtype(dst), saturate)
        if xp is _Jax:
            return lax.complex(re, jnp.zeros_like(re))
        return re.astype(dst)
    return _cast_real(xp, x, dst, saturate)


def _is_64(d: np.dtype) -> bool:
    """Whether ``d`` needs ``jax_enable_x64`` (complex64 does not)."""
    return (d.itemsize == 8 and kind(d) != "c") or d == np.complex128


def astype(
    x: jax.typing.ArrayLike, dtype: jax.typing.DTypeLike, *, saturate: bool = False
) -> jax.Array:
    """Casts ``x`` to ``dtype``, rounding once (POLICY.md 6).

    Every float result is the source value rounded directly to ``dtype``, to nearest with ties to
    even, whatever the source dtype (float64, float32, integers, narrow floats), eagerly and under
    ``jax.jit``/``vmap``, with the same bits on every backend. NumPy and Python float64 inputs are
    rounded from their float64 value (with ``jax_enable_x64`` off, on the host).

    - NaN stays NaN; +-inf stays +-inf where ``dtype`` has infinities and is NaN where it has none
      (``*fn``, ``*fnuz``, ``float8_e8m0fnu``).
    - A finite value at or past the largest finite value plus half an ulp becomes inf, or NaN where
      ``dtype`` has no inf. That includes the exact tie where the largest value has an even
      significand (``float8_e4m3fn``: 464 is NaN; XLA and ml_dtypes round it to 448).
    - ``float4_e2m1fn`` has neither: overflow and +-inf give +-6 and NaN gives +0.
    - ``float8_e8m0fnu`` (unsigned powers of two): zero, negative values and NaN give NaN, values
      below ``2**-127`` give ``2**-127``, and a tie (``1.5 * 2**k``) goes to the larger power
      (the even integer significand), as XLA and ml_dtypes do.
    - Float to integer truncates toward zero; NaN gives 0; out-of-range values clamp to the range.
      Integer to a narrower integer wraps (two's complement). Anything to bool: nonzero is True
      (NaN is True).
    - Real to complex sets the imaginary part to 0; complex to complex rounds each part once.
    - Derivatives: a float cast differentiates like ``lax.convert_element_type`` (the tangent is
      converted, whichever path computes the value).

    Args:
      x: an array or array-like (JAX or NumPy array, Python scalar or list).
      dtype: the target dtype: any name, alias or type of ``heddle.policy.dtype``.
      saturate: if True, finite values past the largest finite value of a float ``dtype`` clamp to
        +-max instead; infinities stay infinite where ``dtype`` has them and clamp to +-max where it
        has none. Integer to a narrower integer then clamps to its range instead of wrapping.

    Returns:
      A ``jax.Array`` of exactly ``dtype``.

    Raises:
      UnknownDTypeError: ``dtype`` or ``x``'s dtype is not a dtype of the policy.
      PrecisionError: ``dtype`` is 64-bit and ``jax_enable_x64`` is off.
      PromotionError: ``x`` is complex and ``dtype`` is not (take ``x.real`` first).

    Examples:
      >>> import numpy as np
      >>> from heddle.policy._casts import astype
      >>> x = np.float64(1 + 2**-8 + 2**-30)  # just above a bfloat16 halfway point
      >>> float(astype(x, "bfloat16"))  # one rounding: up (via float32 it would tie down to 1.0)
      1.0078125
      >>> float(astype(1e6, "float8_e4m3fn", saturate=True))
      448.0
    """
    dst = parse_dtype(dtype)
    if _is_64(dst):
        require_available(dst, "astype")
    if not isinstance(x, jax.Array):
        x = np.asarray(x)
        parse_dtype(x.dtype)
        if _is_64(x.dtype) and not x64_enabled():
            return jnp.asarray(_cast(_NumPy, x, dst, saturate))
        x = jnp.asarray(x)
    elif _is_64(np.dtype(x.dtype)) and not x64_enabled() and not isinstance(x, jax.core.Tracer):
        return jnp.asarray(_cast(_NumPy, np.asarray(x), dst, saturate))
    src = parse_dtype(x.dtype)
    if _computed_from_bits(src, dst, saturate):
        return _differentiable_cast(x, dst, saturate)
    return _cast(_Jax, x, dst, saturate)


def _computed_from_bits(src: np.dtype, dst: np.dtype, saturate: bool) -> bool:
    """Whether a float cast takes the ``round`` path, whose integer arithmetic JAX would
    differentiate as a constant. Casts on the ``convert`` path stay plain ``convert`` ops, which
    heddle.autodiff's float32 twins see through."""
    if kind(src) not in "fc" or kind(dst) not in "fc" or src == dst:
        return False
    return saturate or route(real_dtype(src), real_dtype(dst)) == "round"


@functools.partial(jax.jit, static_argnums=(1, 2))
def _cast_on_device(x: Any, dst: np.dtype, saturate: bool) -> Any:
    """The ``round`` path as one compiled program (a few dozen integer ops), not op by op eagerly."""
    return _cast(_Jax, x, dst, saturate)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _differentiable_cast(x: Any, dst: np.dtype, saturate: bool) -> Any:
    """A float cast with the derivative of ``lax.convert_element_type`` (the tangent converted).

    The ``round`` path is integer arithmetic on bit patterns, which JAX differentiates as a
    constant; without this every gradient through, e.g., float64 -> bfloat16 would be zero.
    """
    return _cast_on_device(x, dst, saturate)


@_differentiable_cast.defjvp
def _differentiable_cast_jvp(dst: np.dtype, saturate: bool, primals: tuple, tangents: tuple):
    (x,), (t,) = primals, tangents
    return _differentiable_cast(x, dst, saturate), lax.convert_element_type(t, dst)
