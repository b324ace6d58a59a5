"""``quantize`` and ``dequantize``: scales per tensor, per channel or per block, then element codes.

Layouts. ``axis`` is the axis a scale is computed along (the reduction axis; for a weight ``W`` of
``x @ W``, axis 0, the contraction axis):

| call                               | one scale per                                   |
|------------------------------------|-------------------------------------------------|
| ``quantize(x, f)``                 | tensor                                          |
| ``quantize(x, f, axis=k)``         | line along axis ``k`` (per channel of the rest) |
| ``quantize(x, f, block_size=B)``   | ``B`` consecutive elements along the last axis  |
| ``quantize(x, f, axis=k, block_size=B)`` | ``B`` consecutive elements along axis ``k`` |

MX formats always use blocks of 32 and NF4 blocks of 64 unless told otherwise. Scales: float32
``absmax / qmax`` for the integer, float and NF4 formats (0 for an all-zero block); for MX, OCP MX
v1.0 section 6.3: ``2**(floor(log2(absmax)) - emax_elem)``, clamped to float8_e8m0fnu's exponents
``[-127, 127]``. A block holding inf or NaN gets a NaN scale, so it dequantises to NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import heddle.numpy as hnp
from heddle.policy import _dtypes as D
from heddle.policy._errors import message
from heddle.quant import _qarray as _packing
from heddle.quant import _sharding
from heddle.quant._formats import Format, FormatError, decode, encode, parse_format
from heddle.quant._qarray import QArray

_TINY = float(np.finfo(np.float32).tiny)  # 2**-126: the smallest float32 scale above zero


def _layout(shape: tuple[int, ...], fmt: Format, axis: int | None, block: int | None):
    """(axis from the end, block size or None for the whole axis, per-tensor?) after checks."""
    call = f"quantize(<array of shape {shape}>, {fmt.name!r}, axis={axis}, block_size={block})"
    if len(shape) == 0:
        raise FormatError(
            message(call, "a scalar has no axis to block or pack along", "Quantise x.reshape(1).")
        )
    if fmt.family == "mx" and block not in (None, fmt.block):
        raise FormatError(
            message(
                call,
                f"{fmt.name} is defined by the OCP MX spec with blocks of {fmt.block}",
                f"Drop block_size, or use a scaled float format: heddle.quantize(x, "
                f"{fmt.element!r}, block_size={block}).",
            )
        )
    per_tensor = axis is None and block is None and fmt.block is None
    block = block if block is not None else fmt.block
    if axis is None:
        axis = -1
    if not -len(shape) <= axis < len(shape):
        raise FormatError(
            message(
                call,
                f"axis {axis} is out of range for an array of {len(shape)} dimensions",
                f"Pass an axis in [{-len(shape)}, {len(shape) - 1}].",
            )
        )
    axis = axis - len(shape) if axis >= 0 else axis
    n = shape[axis]
    if block is not None and (block < 1 or n % block):
        raise FormatError(
            message(
                call,
                f"blocks of {block} do not tile the {n} elements along axis {axis}",
                "Pad that axis to a multiple of the block size first (heddle.numpy.pad), or pick "
                f"a block size that divides {n}.",
            )
        )
    return axis, block, per_tensor


def _mx_scale(absmax: jax.Array, bad: jax.Array, fmt: Format) -> tuple[jax.Array, jax.Array]:
    """(float8_e8m0fnu scales, their unbiased exponents as int32); NaN scales where ``bad``.

    The shared exponent is clamped to e8m0's ``[-127, 127]``: a block below ``2**(-127 +
    emax_elem)`` keeps the scale ``2**-127`` and its values are rounded relative to it (OCP MX
    v1.0 6.3's reference code clamps the same way), so whatever the elements can hold at that
    scale survives.
    """
    if absmax.dtype == np.float32:  # from the bits: frexp of a subnormal reads it as zero
        e = _floor_log2_f32(absmax) + np.int32(1)
    else:
        _, e = jnp.frexp(absmax)  # absmax = m * 2**e with m in [0.5, 1): floor(log2) = e - 1
    shared = jnp.clip(e - np.int32(1 + fmt.emax), -127, 127).astype(jnp.int32)
    zero = _abs_bits(absmax) == 0 if absmax.dtype == np.float32 else absmax == 0
    shared = jnp.where(zero, np.int32(-127), shared)
    shared = jnp.where(bad, np.int32(0), shared)  # codes at scale 1: the same on any layout
    bits = (shared + np.int32(127)).astype(jnp.uint8)
    bits = jnp.where(bad, np.uint8(0xFF), bits)  # 0xFF: e8m0 NaN
    return lax.bitcast_convert_type(bits, jnp.dtype(fmt.scale_dtype)), shared


# float32 subnormals. XLA on CPU flushes them to zero as operands and as results of float
# arithmetic (max, frexp, products and quotients alike), but integer and bit operations see them.
# The float32 path therefore finds a block's absmax and exponent from the bits, and moves a block
# whose absmax is below ``2**-60`` up by ``2**64`` (exactly, in the bits) before dividing, so that
# no operand of the quotient is subnormal; products that land below ``2**-126`` are moved back down
# by ``_ldexp_f32``, which rounds into the subnormal range itself.
_LIFT = 64
_LIFT_BELOW = np.uint32((127 - 60) << 23)  # the bits of 2**-60 as a float32 magnitude


def _abs_bits(x: jax.Array) -> jax.Array:
    """The magnitude bits of float32 ``x`` (uint32): ordered as the magnitudes, NaN above inf."""
    return lax.bitcast_convert_type(x, jnp.uint32) & np.uint32(0x7FFFFFFF)


def _floor_log2_f32(a: jax.Array) -> jax.Array:
    """``floor(log2(a))`` (int32) of float32 magnitudes ``a > 0``, subnormals included."""
    b = _abs_bits(a)
    ex = (b >> np.uint32(23)).astype(jnp.int32)
    frac = b & np.uint32(0x7FFFFF)
    sub = np.int32(31 - 149) - lax.clz(frac).astype(jnp.int32)  # frac * 2**-149
    return jnp.where(ex == 0, sub, ex - np.int32(127))


def _ldexp_f32(x: jax.Array, k: jax.Array) -> jax.Array:
    """``x * 2**k`` for float32 ``x`` (subnormals included) and int32 ``k``, in the bits.

    Exact unless the result is subnormal, where it is rounded to nearest, ties to even; past
    float32's largest value it is inf. Zeros, inf and NaN are returned unchanged.
    """
    b = lax.bitcast_convert_type(x, jnp.uint32)
    sign = b & np.uint32(0x80000000)
    mag = b & np.uint32(0x7FFFFFFF)
    ex = (mag >> np.uint32(23)).astype(jnp.int32)
    frac = mag & np.uint32(0x7FFFFF)
    lz = jnp.maximum(lax.clz(frac).astype(jnp.int32) - np.int32(8), 0)  # subnormal: to bit 23
    sig = jnp.where(ex == 0, frac << lz.astype(jnp.uint32), frac | np.uint32(0x800000))
    ne = jnp.where(ex == 0, np.int32(1) - lz, ex) + k  # biased exponent of the result
    normal = (jnp.clip(ne, 1, 254).astype(jnp.uint32) << np.uint32(23)) | (
        sig & np.uint32(0x7FFFFF)
    )
    sh = jnp.clip(np.int32(1) - ne, 1, 25).astype(jnp.uint32)  # subnormal result: shift right
    q = sig >> sh
    rem = sig & ((np.uint32(1) << sh) - np.uint32(1))
    half = np.uint32(1) << (sh - np.uint32(1))
    up = (rem > half) | ((rem == half) & ((q & np.uint32(1)) == 1))
    sub = q + up.astype(jnp.uint32)  # a carry to 2**23 is the smallest normal: still right
    out = jnp.where(ne >= 255, np.uint32(0x7F800000), jnp.where(ne >= 1, normal, sub))
    out = jnp.where((mag == 0) | (ex == 255), mag, out)
    return lax.bitcast_convert_type(out | sign, jnp.float32)


def _lift(a_bits: jax.Array) -> jax.Array:
    """The exponent (int32) a float32 block is moved up by: ``_LIFT`` below ``2**-60``, else 0."""
    return jnp.where(a_bits < _LIFT_BELOW, np.int32(_LIFT), np.int32(0))


def _pow2(k: jax.Array, d: np.dtype) -> jax.Array:
    """Exact ``2.0**k`` in float32/float64 for integer arrays ``k`` within the normal range."""
    if d == np.float64:
        bits = (k.astype(jnp.int64) + np.int64(1023)) << np.int64(52)
        return lax.bitcast_convert_type(bits, jnp.float64)
    bits = (k + np.int32(127)) << np.int32(23)
    return lax.bitcast_convert_type(bits, jnp.float32)


def quantize(
    x: jax.typing.ArrayLike,
    fmt: str | jax.typing.DTypeLike,
    *,
    axis: int | None = None,
    block_size: int | None = None,
) -> QArray:
    """Quantises ``x`` to a format: element codes times one scale per tensor, channel or block.

    Formats (``heddle.quant.FORMATS``): ``int8``, ``int4`` (symmetric, codes in [-127, 127] and
    [-7, 7]); ``float8_e4m3fn``, ``float8_e5m2``, ``float6_e2m3fn``, ``float6_e3m2fn``,
    ``float4_e2m1fn`` (absmax scaled to the format's largest value); ``nf4`` (QLoRA's 16 normal-float
    levels, absmax blocks of 64 by default); ``mxfp4``, ``mxfp6_e2m3``, ``mxfp6_e3m2``,
    ``mxfp8_e4m3``, ``mxfp8_e5m2`` (OCP Microscaling: float8_e8m0fnu power-of-two scales per
    block of 32, elements saturated). 4- and 6-bit codes are packed into uint8.

    Dtypes: the values are divided by their scale in float32 (float64 for float64 input) and
    rounded once to the element format with ``heddle.numpy.astype`` (integers: half to even).
    Error bound: half a step of the element format at the block's scale; for MX formats, values
    above the largest element times the scale saturate there (OCP MX), so the error is at most
    ``absmax - qmax * scale`` for those.

    Args:
      x: a float array (float16, bfloat16, float32; float64 with ``jax_enable_x64``; float8).
      fmt: a format name, alias (``fp8``, ``bf8``, ``fp4``, ...) or element dtype (``jnp.int8``).
      axis: the axis each scale is computed along: per channel without ``block_size``, the axis
        blocked with it (default: the last axis). Packing runs along this axis too.
      block_size: elements along ``axis`` per scale; must divide that axis. MX formats: only 32.

    Returns:
      A ``QArray`` (a pytree: works under ``jax.jit``, ``vmap`` and with shardings).

    Raises:
      FormatError: an unknown format, a bad axis, or blocks that do not tile the axis.
      TypeError: ``x`` is not a float array.
      PrecisionError: ``x`` is float64 and ``jax_enable_x64`` is off.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> w = jnp.linspace(-1.0, 1.0, 4096, dtype=jnp.float32).reshape(64, 64)
      >>> q = hq.quantize(w, "mxfp4", axis=0)
      >>> q.nbytes, w.nbytes  # 64*64/2 bytes of codes + 2*64 one-byte scales
      (2176, 16384)
      >>> float(jnp.abs(hq.dequantize(q) - w).max())  # half of fp4's step 2 at the scale 1/4
      0.24951171875
    """
    f = parse_format(fmt)
    if not isinstance(x, jax.Array):
        x = np.asarray(x)
    src = D.dtype(x.dtype)
    if D.kind(src) != "f":
        raise TypeError(
            message(
                f"quantize(<{src.name} array>, {f.name!r})",
                "quantisation scales float values; integer, bool and complex arrays have no "
                "scale to take",
                f"Convert first: heddle.quantize(heddle.numpy.astype(x, 'float32'), {f.name!r}).",
            )
        )
    D.require_available(src, "quantize")
    ax, block, per_tensor = _layout(tuple(x.shape), f, axis, block_size)
    k = x.ndim + ax
    call = f"quantize(<array of shape {tuple(x.shape)}>, {f.name!r}, axis={axis}, block_size={block_size})"
    _sharding.check(x, k, x.shape[k], _groups(f, block or x.shape[k]), call, "x")
    return _quantize(jnp.asarray(x), f, ax, block, per_tensor)


def _groups(f: Format, b: int) -> tuple[tuple[int, str], ...]:
    """The runs of consecutive elements along the quantised axis that go together."""
    packing = ((2 if f.bits == 4 else 4, f"packed groups of {f.bits}-bit codes"),)
    return ((b, "blocks"), *(packing if f.packed else ()))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _quantize(x: jax.Array, f: Format, ax: int, block: int | None, per_tensor: bool) -> QArray:
    cd = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    xc = hnp.astype(x, cd)  # exact widening
    k = x.ndim + ax
    n = x.shape[k]
    b = block or n
    xb = _sharding.split(xc, k, b)  # blocks: no transposes
    red = tuple(range(xb.ndim)) if per_tensor else (k + 1,)
    # Explicit, not by max propagating NaN: a cross-device max can drop it.
    bad = jnp.any(~jnp.isfinite(xb), axis=red, keepdims=True)
    if cd == np.float32:  # the bits: a float max reads subnormals as zero
        a_bits = jnp.max(_abs_bits(xb), axis=red, keepdims=True)
        absmax = lax.bitcast_convert_type(a_bits, jnp.float32)
    else:
        absmax = jnp.max(jnp.abs(xb), axis=red, keepdims=True)
    if f.family == "mx":
        scales, shared = _mx_scale(absmax, bad, f)
        if cd == np.float32:
            v = _ldexp_f32(xb, -shared)  # exact: the element range is normal in float32
        else:
            half = -shared // 2  # two exact power-of-two steps: 2**-shared may not be normal
            v = xb * _pow2(half, cd) * _pow2(-shared - half, cd)
    elif cd == np.float32:
        # A block below 2**-60 is moved up by 2**64 in the bits, its scale computed there and
        # moved back down: the scale is absmax / qmax rounded once (or 2**-126, the smallest
        # normal, below that) and the quotient x / s one rounding, subnormal x included.
        lift = _lift(a_bits)
        s_up = _ldexp_f32(absmax, lift) / np.float32(f.qmax)
        s_up = jnp.maximum(s_up, _pow2(lift - np.int32(126), cd))
        s = jnp.where(a_bits == 0, np.float32(0), s_up * _pow2(-lift, cd))  # normal: exact
        s = jnp.where(bad, np.float32(np.nan), s)
        safe = jnp.where((s == 0) | bad, np.float32(1), s_up)
        v = _ldexp_f32(xb, lift) / _divisor(safe, xb)
        scales = s
    else:
        s = absmax / np.array(f.qmax, cd)
        s = jnp.where(absmax == 0, s, jnp.maximum(s, np.array(_TINY, cd)))  # a normal float32
        s = hnp.astype(s, np.float32)
        s = jnp.where(bad, np.float32(np.nan), s)
        safe = jnp.where((s == 0) | bad, np.float32(1), s)
        v = xb / _divisor(hnp.astype(safe, cd), xb)
        scales = s
    data = _sharding.merge(encode(v, f), k)
    if f.packed:
        data = _packing.pack(data, f.bits, k)
    if per_tensor:
        scales = scales.reshape((1,) * x.ndim)
    else:
        scales = _sharding.merge(scales, k)
    return QArray(data, scales, f.name, np.dtype(x.dtype), ax, n)


def _divisor(s: jax.Array, xb: jax.Array) -> jax.Array:
    """``s`` broadcast to ``xb``'s shape behind an optimisation barrier, so that ``xb / s`` is a
    division: XLA rewrites a division by a broadcast as a product with the reciprocal, which rounds
    twice and flushes to zero for scales above ``2**126``."""
    return lax.optimization_barrier(_sharding.broadcast_like(s, xb))


def dequantize(q: QArray, dtype: jax.typing.DTypeLike | None = None) -> jax.Array:
    """Returns the values a ``QArray`` stands for: element value times its block's scale.

    Dtypes: the product is formed in float32 (float64 for a float64 ``dtype``) and rounded once to
    ``dtype`` with ``heddle.numpy.astype``. For MX formats the product is exact.

    Args:
      q: a ``QArray`` from ``quantize``.
      dtype: the result dtype (a float dtype); default: the dtype ``q`` was quantised from.

    Returns:
      An array of ``q.shape`` in ``dtype``.

    Raises:
      TypeError: ``q`` is not a ``QArray``, or ``dtype`` is not a float dtype.
      PrecisionError: ``dtype`` is float64 and ``jax_enable_x64`` is off.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> q = hq.quantize(jnp.array([0.5, -1.0, 0.25, 0.0]), "int8")
      >>> hq.dequantize(q).tolist()
      [0.5039370059967041, -1.0, 0.25196850299835205, 0.0]
    """
    if not isinstance(q, QArray):
        raise TypeError(
            message(
                f"dequantize(<{type(q).__name__}>)",
                "only a QArray made by heddle.quantize can be dequantised",
                "Quantise first: q = heddle.quantize(x, 'int8'); heddle.dequantize(q).",
            )
        )
    d = q.dtype if dtype is None else D.dtype(dtype)
    if D.kind(d) != "f":
        raise TypeError(
            message(
                f"dequantize(q, {d.name!r})",
                "a dequantised array holds scaled float values",
                f"Dequantise to a float dtype, round and convert (a float-to-integer cast "
                f"truncates): heddle.numpy.astype(heddle.numpy.round(heddle.dequantize(q)), "
                f"{d.name!r}).",
            )
        )
    D.require_available(d, "dequantize")
    k = q.ndim + q.axis
    _sharding.check(q.data, k, q.length, _groups(q.fmt, q.block_size), f"dequantize(<{q!r}>)", "q")
    return _dequantize(q, d)


@functools.partial(jax.jit, static_argnums=(1,))
def _dequantize(q: QArray, d: np.dtype) -> jax.Array:
    return hnp.astype(values(q, np.dtype(np.float64 if d == np.float64 else np.float32)), d)


def codes(q: QArray) -> jax.Array:
    """The unpacked element codes of ``q`` (uint8 for 4/6-bit formats), in ``q``'s layout."""
    f = q.fmt
    return _packing.unpack(q.data, f.bits, q.length, q.axis) if f.packed else q.data


def values(q: QArray, cd: np.dtype, *, subnormals: bool = True) -> jax.Array:
    """Element value times scale, in ``cd`` (float32 or float64), in ``q``'s layout.

    ``subnormals=False`` skips the exponent arithmetic that keeps float32 products below 2**-126
    (two plain multiplications instead): for ``qmatmul``, whose contraction flushes subnormal
    operands on CPU anyway and whose bound allows 2**-126 (the bit path made its 4-bit formats
    2x slower)."""
    exact = cd == np.float32 and subnormals
    el = hnp.astype(decode(codes(q), q.fmt), cd)
    k = el.ndim + q.axis
    blocks = _sharding.split(el, k, q.length // q.scales.shape[k])
    if q.fmt.family == "mx":  # times 2**e, exactly: 2**-127 is no normal float32
        bits = lax.bitcast_convert_type(q.scales, jnp.uint8)
        e = bits.astype(jnp.int32) - np.int32(127)
        e = jnp.expand_dims(jnp.where(bits == 0xFF, np.int32(0), e), k + 1)
        if exact:  # in the bits: a product below 2**-126 would be flushed to zero
            v = _ldexp_f32(blocks, e)
        else:
            half = e // 2
            v = blocks * _pow2(half, cd) * _pow2(e - half, cd)
        v = jnp.where(jnp.expand_dims(bits == 0xFF, k + 1), np.array(np.nan, cd), v)
    elif exact:  # a small scale moved up by 2**64 and the product moved back down
        s = jnp.expand_dims(hnp.astype(q.scales, cd), k + 1)
        lift = jnp.where(jnp.abs(s) < np.float32(2.0**-60), np.int32(_LIFT), np.int32(0))
        v = _ldexp_f32(blocks * (s * _pow2(lift, cd)), -lift)
    else:
        v = blocks * jnp.expand_dims(hnp.astype(q.scales, cd), k + 1)
    return _sharding.merge(v, k)
