"""Rounding from bit patterns: the ``round`` path of ``heddle.astype`` (POLICY.md 6).

Integer arithmetic only, the same on every backend (JAX, ``JaxOps``) and on the host (NumPy,
``NumPyOps``), and immune to flushing subnormals to zero. ``layout`` gives each float format's
bit layout; ``round_from_bits`` rounds any real source to any float target once.

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

import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.policy._dtypes import finfo, kind

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


class JaxOps:
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


class NumPyOps:
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


def _nan_magnitude(word: _Word, fmt: Layout, u: Any) -> Any:
    """The pattern, without its sign, that a NaN source becomes in an IEEE or ``fn`` target (the
    sign is added with every other value's): for IEEE targets the leading fraction bits of its
    payload, quiet, as NumPy and XLA's convert do between float32, float16 and bfloat16 (to the
    IEEE float8 formats both give the one canonical NaN; heddle keeps the payload's bits there
    too); ``fn`` targets have one NaN per sign."""
    if fmt.specials == "fn":
        return u(fmt.nan)
    # sig's implicit bit lands on the exponent field's lowest bit, which is set in a NaN anyway
    return (word.sig >> u(word.f - fmt.mbits)) | u(fmt.max_mag + 1 | 1 << (fmt.mbits - 1))


def round_from_bits(xp: Any, x: Any, dst: np.dtype, saturate: bool) -> Any:
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
        if word.nan is not None and fmt.specials in ("ieee", "fn"):  # signed NaNs: keep the sign
            out = xp.where(word.nan, _nan_magnitude(word, fmt, u), out)
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
    if word.nan is not None and fmt.specials not in ("ieee", "fn"):
        out = xp.where(word.nan, u(fmt.nan), out)  # the one NaN pattern (+0 for "none" formats)
    return xp.bitcast(xp.convert(out, np.dtype(f"u{max(fmt.nbits, 8) // 8}")), dst)
