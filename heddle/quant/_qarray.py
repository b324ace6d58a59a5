"""``QArray``: a quantised array as a pytree of its packed codes and its scales.

The two leaves are ordinary arrays, so a ``QArray`` passes through ``jax.jit``, ``vmap``,
``device_put`` with a sharding and ``tree_map``; everything else (format, original dtype, axis,
length along that axis) is static metadata, part of the pytree structure. The axis is kept counted
from the end, so leaves that gain leading batch axes under ``vmap`` still describe the same layout.

Codes narrower than a byte are packed into uint8 along the quantised axis (``pack``/``unpack``, by reshapes
and slices, never transposes). Bit layouts (little-endian bit streams; a test checks them bit by bit):

- 4-bit codes, two per byte: element ``2i`` in the low nibble (bits 0-3) of byte ``i``, element
  ``2i + 1`` in the high nibble (bits 4-7); heddle writes safetensors ``F4`` data in the same order.
  An odd length gets one zero nibble of padding.
- 6-bit codes, four per three bytes: elements ``4i .. 4i + 3`` form the 24-bit word
  ``c0 | c1 << 6 | c2 << 12 | c3 << 18``, stored low byte first in bytes ``3i .. 3i + 2``. A length
  that is not a multiple of 4 gets zero codes of padding.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from heddle.quant import _sharding
from heddle.quant._formats import Format, parse_format


def packed_length(n: int, bits: int) -> int:
    """Bytes along the packed axis for ``n`` codes of ``bits`` bits (8: ``n`` itself)."""
    if bits == 4:
        return (n + 1) // 2
    if bits == 6:
        return 3 * ((n + 3) // 4)
    return n


def _split(x: jax.Array, axis: int, parts: int) -> tuple[jax.Array, ...]:
    """Zero-pads ``axis`` to a multiple of ``parts`` and splits it into ``(n // parts, parts)``:
    returns the ``parts`` interleaved slices (element ``parts * i + j`` is slice ``j``'s ``i``)."""
    k = axis % x.ndim
    extra = -x.shape[k] % parts
    if extra:
        x = jnp.pad(x, [(0, extra) if i == k else (0, 0) for i in range(x.ndim)])
    g = _sharding.split(x, k, parts)
    return tuple(jax.lax.index_in_dim(g, j, k + 1, keepdims=False) for j in range(parts))


def _interleave(parts: list[jax.Array], axis: int, n: int) -> jax.Array:
    """Inverse of ``_split``: the first ``n`` elements along ``axis``."""
    k = axis % parts[0].ndim
    g = _sharding.merge(jnp.stack(parts, axis=k + 1), k)
    return g if g.shape[k] == n else jax.lax.slice_in_dim(g, 0, n, axis=k)


def pack(codes: jax.Array, bits: int, axis: int = -1) -> jax.Array:
    """Packs uint8 codes of ``bits`` bits (4 or 6) along ``axis`` into uint8 bytes.

    Args:
      codes: uint8 array, each value below ``2**bits``.
      bits: 4 or 6.
      axis: the axis to pack along (no transposes: reshapes and slices only).

    Returns:
      uint8 array whose ``axis`` has ``packed_length(n, bits)`` bytes.
    """
    if bits == 4:
        lo, hi = _split(codes, axis, 2)
        return lo | (hi << np.uint8(4))
    c = [p.astype(jnp.uint32) for p in _split(codes, axis, 4)]
    w = c[0] | (c[1] << np.uint32(6)) | (c[2] << np.uint32(12)) | (c[3] << np.uint32(18))
    b = [((w >> np.uint32(s)) & np.uint32(0xFF)).astype(jnp.uint8) for s in (0, 8, 16)]
    return _interleave(b, axis, 3 * w.shape[axis % w.ndim])


def unpack(data: jax.Array, bits: int, n: int, axis: int = -1) -> jax.Array:
    """Inverse of ``pack``: the first ``n`` codes along ``axis``, as uint8.

    Args:
      data: uint8 array from ``pack``.
      bits: 4 or 6.
      n: the number of codes before padding.
      axis: the packed axis.

    Returns:
      uint8 array whose ``axis`` has ``n`` codes.
    """
    if bits == 4:
        return _interleave([data & np.uint8(0x0F), data >> np.uint8(4)], axis, n)
    b = [p.astype(jnp.uint32) for p in _split(data, axis, 3)]
    w = b[0] | (b[1] << np.uint32(8)) | (b[2] << np.uint32(16))
    c = [((w >> np.uint32(s)) & np.uint32(0x3F)).astype(jnp.uint8) for s in (0, 6, 12, 18)]
    return _interleave(c, axis, n)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QArray:
    """A quantised array: ``dequantize(q)[i] = decode(code[i]) * scale[block(i)]``.

    Attributes:
      data: the element codes. 8-bit formats: the native element array (int8, float8) of the
        array's shape. 4- and 6-bit formats: uint8 bytes packed along ``axis`` (bit layout in
        this module's docstring).
      scales: one scale per block, with the array's number of dimensions: size 1 along every axis a
        scale is shared over, ``length // block_size`` along ``axis``. float32, or float8_e8m0fnu
        for the MX formats.
      format: the format's canonical name (static).
      dtype: the dtype of the quantised array; ``dequantize``'s default (static).
      axis: the blocked (and packed) axis, counted from the end: -1 is the last (static).
      length: the number of elements along ``axis`` (static; packing may pad the data).

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> q = hq.quantize(jnp.ones((64, 32), jnp.float16), "int4", axis=0)
      >>> q.shape, q.data.shape, q.scales.shape, q.nbytes
      ((64, 32), (32, 32), (1, 32), 1152)
    """

    data: jax.Array
    scales: jax.Array
    format: str = dataclasses.field(metadata=dict(static=True))
    dtype: np.dtype = dataclasses.field(metadata=dict(static=True))
    axis: int = dataclasses.field(metadata=dict(static=True))
    length: int = dataclasses.field(metadata=dict(static=True))

    @property
    def fmt(self) -> Format:
        """The ``Format`` record of ``format``."""
        return parse_format(self.format)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dequantised array."""
        s = list(self.data.shape)
        s[self.axis] = self.length
        return tuple(s)

    @property
    def ndim(self) -> int:
        """Number of dimensions of the dequantised array."""
        return len(self.data.shape)

    @property
    def size(self) -> int:
        """Number of elements of the dequantised array."""
        return math.prod(self.shape)

    @property
    def block_size(self) -> int:
        """Elements along ``axis`` that share one scale (``length`` when the whole axis does)."""
        return self.length // self.scales.shape[self.axis]

    @property
    def nbytes(self) -> int:
        """Bytes held: packed codes plus scales (works on tracers too)."""
        return sum(
            math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in (self.data, self.scales)
        )

    def dequantize(self, dtype: jax.typing.DTypeLike | None = None) -> jax.Array:
        """Same as ``heddle.quant.dequantize(self, dtype)``."""
        from heddle.quant._quantize import dequantize

        return dequantize(self, dtype)

    def __repr__(self) -> str:
        return (
            f"QArray(format={self.format!r}, shape={self.shape}, dtype={self.dtype.name}, "
            f"axis={self.axis}, block_size={self.block_size}, nbytes={self.nbytes})"
        )
