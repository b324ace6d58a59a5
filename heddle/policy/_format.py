"""Shortest round-trip decimal strings (POLICY.md 9).

A float value prints as the shortest decimal that rounds back to the same bits under heddle's cast
(round to nearest, ties to even), and among those the one nearest to the value: ``bfloat16(0.1)``
stores 0.10009765625 and prints ``0.1``. The layout follows Python's ``repr`` of a float (positional
for decimal exponents -4 to 15, scientific outside, ``.0`` on integral values, ``nan``, ``inf``), so
for float64 the strings are exactly Python's.

Everything is exact integer arithmetic on the bit pattern, on the host.
"""

from __future__ import annotations

import decimal
import math

import jax
import numpy as np

from heddle.policy._bits import Layout, layout
from heddle.policy._dtypes import dtype as parse_dtype
from heddle.policy._dtypes import kind
from heddle.policy._errors import message


def _finite(lay: Layout, mag: int) -> tuple[int, int, int]:
    """``lay.decode`` of a magnitude pattern from 0 to ``max_mag``: always a finite value."""
    value = lay.decode(mag)
    assert not isinstance(value, str), "a magnitude pattern up to max_mag is finite"
    return value


def _magnitude(lay: Layout, mag: int) -> tuple[int, int]:
    """``(m, q)`` of a magnitude pattern; ``max_mag + 1`` is the value one step past the largest."""
    if mag > lay.max_mag:
        _, m, q = _finite(lay, lay.max_mag)
        return (m + 1, q) if lay.mbits else (m, q + 1)
    _, m, q = _finite(lay, mag)
    return m, q


def _interval(lay: Layout, mag: int) -> tuple[float, float, float, bool, bool]:
    """The reals that round to the positive value with magnitude pattern ``mag`` (formats of 32
    bits or fewer: the value and the bounds are float64 numbers exactly).

    Returns ``(v, lo, hi, lo_in, hi_in)``, ``hi`` inf where every larger value rounds to ``v``;
    a bound is included if a tie there rounds to ``v``.
    """
    m, q = _magnitude(lay, mag)
    v = math.ldexp(m, q)
    lo, lo_in = 0.0, False  # float8_e8m0fnu's smallest value: everything below rounds to it
    if mag > 0 or lay.specials != "e8m0":
        m_below, q_below = _magnitude(lay, mag - 1)
        lo = (math.ldexp(m_below, q_below) + v) / 2
        # ties go to the even integer significand on the grid of the binade the tie lies in:
        # below v that is the grid of the value below, above v it is v's own grid
        lo_in = (m << (q - q_below)) % 2 == 0
    hi = math.inf
    if not (lay.specials == "none" and mag == lay.max_mag):  # saturating: all above rounds to max
        hi = (math.ldexp(*_magnitude(lay, mag + 1)) + v) / 2
    # a tie above the largest finite value overflows (POLICY.md 6), even where its significand is even
    return v, lo, hi, lo_in, m % 2 == 0 and mag != lay.max_mag


def _inside(d: int, p: int, lo: float, hi: float, lo_in: bool, hi_in: bool) -> bool:
    """Whether the decimal ``d * 10**p`` lies in the interval; exact."""
    c = float(f"{d}e{p}")  # correctly rounded, so a strict float comparison is exact
    if lo < c < hi:
        return True
    if c < lo or c > hi:
        return False
    exact = decimal.Decimal(f"{d}e{p}")
    low, high = decimal.Decimal(lo), decimal.Decimal(hi)
    return (exact > low or (lo_in and exact == low)) and (exact < high or (hi_in and exact == high))


def _shortest(v: float, lo: float, hi: float, lo_in: bool, hi_in: bool) -> tuple[int, int]:
    """Digits ``d`` and exponent ``p`` of the shortest decimal ``d * 10**p`` in the interval, the
    nearest to ``v`` if several (of two equally near, the one with an even last digit)."""
    e10 = int(f"{v:.16e}".split("e")[1])  # exact for values of 26 significant bits or fewer
    for n in range(1, 18):
        p = e10 - n + 1
        mant, ex = f"{v:.{n - 1}e}".split("e")  # the nearest n-digit decimal, ties to even
        d = int(mant.replace(".", "")) * 10 ** (int(ex) - e10)  # on v's grid even if it carried
        if _inside(d, p, lo, hi, lo_in, hi_in):
            return d, p
        # the nearest is outside, so far from v: the float comparison decides the side
        other = d - 1 if float(f"{d}e{p}") > v else d + 1
        if _inside(other, p, lo, hi, lo_in, hi_in):
            return other, p
    raise AssertionError("unreachable: 17 digits hold every float64")


def _layout_digits(d: int, p: int, negative: bool, dot_zero: bool) -> str:
    while d % 10 == 0 and d:
        d //= 10
        p += 1
    digits = str(d)
    exp10 = p + len(digits) - 1
    if -4 <= exp10 < 16:
        if p >= 0:
            text = digits + "0" * p + (".0" if dot_zero else "")
        elif exp10 >= 0:
            text = digits[: exp10 + 1] + "." + digits[exp10 + 1 :]
        else:
            text = "0." + "0" * (-exp10 - 1) + digits
    else:
        text = digits[0] + ("." + digits[1:] if len(digits) > 1 else "") + f"e{exp10:+03d}"
    return ("-" if negative else "") + text


def _float_text(lay: Layout, bits: int, dot_zero: bool = True) -> str:
    value = lay.decode(bits)
    if isinstance(value, str):
        return value
    sign, m, q = value
    if m == 0:
        return ("-" if sign else "") + ("0.0" if dot_zero else "0")
    if lay.nbits == 64:  # Python's repr is the shortest round trip for float64, in this layout
        text = ("-" if sign else "") + repr(math.ldexp(m, q))
        return text.removesuffix(".0") if not dot_zero else text
    mag = bits & ((1 << (lay.nbits - (lay.specials != "e8m0"))) - 1)
    d, p = _shortest(*_interval(lay, mag))
    return _layout_digits(d, p, negative=bool(sign), dot_zero=dot_zero)


def _bits(a: np.ndarray) -> np.ndarray:
    raw = a.view(f"u{a.dtype.itemsize}").astype(np.uint64)
    return raw & np.uint64(0xF) if layout(a.dtype).nbits == 4 else raw


def _complex_text(re: str, im: str) -> str:
    if re == "0":  # Python's repr leaves out a +0 real part
        return im + "j"
    return f"({re}{'' if im.startswith('-') else '+'}{im}j)"


def format_values(x: jax.typing.ArrayLike) -> np.ndarray:
    """Formats every value of an array as ``format`` does.

    Args:
      x: an array or array-like of any dtype of the policy.

    Returns:
      A NumPy array of Python strings with ``x``'s shape.

    Raises:
      UnknownDTypeError: ``x``'s dtype is not a dtype of the policy.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.policy import format_values
      >>> format_values(jnp.array([0.1, 2.0, float("inf")], jnp.bfloat16)).tolist()
      ['0.1', '2.0', 'inf']
    """
    a = np.asarray(x)
    d = parse_dtype(a.dtype)
    out = np.empty(a.shape, object)
    k = kind(d)
    if k == "f":
        lay = layout(d)
        bits = _bits(a)
        uniq, inv = np.unique(bits.ravel(), return_inverse=True)
        texts = np.array([_float_text(lay, int(b)) for b in uniq], object)
        out.ravel()[:] = texts[inv] if a.size else []
    elif k == "c":
        lay = layout(np.dtype(np.float32 if d == np.complex64 else np.float64))
        part = np.dtype(np.float32 if d == np.complex64 else np.float64)
        re, im = (
            _bits(np.ascontiguousarray(a.real, part)),
            _bits(np.ascontiguousarray(a.imag, part)),
        )
        for i, (r, j) in enumerate(zip(re.ravel(), im.ravel(), strict=True)):
            out.ravel()[i] = _complex_text(
                _float_text(lay, int(r), dot_zero=False), _float_text(lay, int(j), dot_zero=False)
            )
    elif k == "b":
        out.ravel()[:] = ["True" if v else "False" for v in a.ravel()]
    else:
        out.ravel()[:] = [str(int(v)) for v in a.ravel()]
    return out


def format(x: jax.typing.ArrayLike) -> str:
    """The shortest decimal string that reads back to exactly the value of ``x`` (POLICY.md 9).

    For a float of any width, the shortest decimal that rounds to the same bits (round to nearest,
    ties to even, as ``heddle.astype`` rounds), and the nearest to the value if several are equally
    short. Laid out like Python's ``repr`` of a float: ``0.1``, ``448.0``, ``1e-05``, ``-inf``,
    ``nan``. Integers and bools print as Python's; complex values as Python's complex ``repr``.

    Args:
      x: one value: a 0-d array (JAX or NumPy) or a scalar.

    Returns:
      The string.

    Raises:
      ValueError: ``x`` holds more than one value (use ``format_values``).
      UnknownDTypeError: ``x``'s dtype is not a dtype of the policy.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.policy import format
      >>> format(jnp.bfloat16(0.1))
      '0.1'
      >>> format(jnp.float16(65504))
      '65500.0'
    """
    a = np.asarray(x)
    if a.ndim != 0:
        raise ValueError(
            message(
                f"format(<array of shape {a.shape}>)",
                "format prints one value",
                "Use heddle.policy._format.format_values(x) for the values of an array.",
            )
        )
    return str(format_values(a)[()])
