"""The correctly rounded cast of POLICY.md 6: ``astype(x, dtype)`` rounds once.

Each (source, target) pair takes one of a few paths, chosen from the table ``_ROUTES`` (data, first
matching row wins). Where XLA's ``convert`` is already the correctly rounded cast it is used as is;
the other rows say what XLA gets wrong, as measured by ``benchmarks/cast_errors.py``. The ``round``
path computes the result from bit patterns with integer arithmetic only, so it is the same on every
backend and immune to flushing subnormals to zero.

How the ``round`` path works, and why it rounds once: ``heddle/policy/_bits.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.policy._bits import JaxOps, NumPyOps, layout, round_from_bits
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
    # (sources, targets, path, why XLA's convert is not used; measured on jax 0.10.2 CPU and
    # jax 0.11.2 on an NVIDIA H200)
    (_FLOATS, ("bool",), "nonzero", "XLA CPU compares with subnormals flushed: 1e-45 != 0 is False"),
    (_FLOATS, _INTS, "truncate", "XLA reads float4_e2m1fn's +-6 as infinities; clamps made explicit"),
    (("float64",), tuple(n for n in _FLOATS if n != "float64"), "round",
     "rounds through float32 (double rounding: on CPU to bfloat16, float16 and e8m0; on an NVIDIA "
     "H200 to float8_e4m3fn too) and flushes float32-subnormal results to zero (float32 too)"),
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
    if (saturate or xp is NumPyOps) and kind(dst) == "f" and path == "convert":
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
    out = round_from_bits(xp, x, dst, saturate) if path == "round" else xp.convert(x, dst)
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
        if xp is JaxOps:
            return lax.complex(re, im)
        out = np.empty(np.shape(re), dst)
        out.real, out.imag = re, im
        return out
    if kind(dst) == "c":
        re = _cast_real(xp, x, real_dtype(dst), saturate)
        if xp is JaxOps:
            return lax.complex(re, jnp.zeros_like(re))
        return re.astype(dst)
    return _cast_real(xp, x, dst, saturate)


def _is_64(d: np.dtype) -> bool:
    """Whether ``d`` needs ``jax_enable_x64`` (complex64 does not)."""
    return (d.itemsize == 8 and kind(d) != "c") or d == np.complex128


def astype(
    x: jax.typing.ArrayLike | np.generic,  # np.generic: ml_dtypes scalars (not np.number)
    dtype: jax.typing.DTypeLike,
    *,
    saturate: bool = False,
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
            return jnp.asarray(_cast(NumPyOps, x, dst, saturate))
        x = jnp.asarray(x)
    elif _is_64(np.dtype(x.dtype)) and not x64_enabled() and not isinstance(x, jax.core.Tracer):
        return jnp.asarray(_cast(NumPyOps, np.asarray(x), dst, saturate))
    src = parse_dtype(x.dtype)
    if _computed_from_bits(src, dst, saturate):
        return _differentiable_cast(x, dst, saturate)
    return _cast(JaxOps, x, dst, saturate)


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
    return _cast(JaxOps, x, dst, saturate)


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
