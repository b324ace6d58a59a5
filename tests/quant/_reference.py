"""Plain-NumPy reference quantisers, written from the format specifications, not from heddle's code.

- Minifloats: a format is (fraction bits, smallest normal exponent, largest value). A value rounds
  to the nearest multiple of the spacing of its binade (``2**(e - m)``, or ``2**(emin - m)`` below
  the normal range), ties to even, in float64, where every step here is exact.
- MXFP4, OCP Microscaling Formats (MX) v1.0, section 6.3: per block of 32, shared exponent
  ``floor(log2(max |V|)) - emax_elem`` (``emax_elem = 2`` for E2M1), clamped to the E8M0 range
  ``[-127, 127]``; elements ``V / 2**shared`` rounded to FP4 E2M1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6
  and their negatives), clamped to +-6. E2M1 code: sign bit 3, value index bits 0-2.
- NF4, QLoRA (Dettmers et al. 2023) appendix E: the 16 printed levels; per block, ``x / absmax``
  (float32) goes to the nearest level, ties to the even code; dequantised ``level * absmax``.
  The levels are also rebuilt from the paper's construction (normal quantiles) to check the table.
"""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np

# (fraction bits, smallest normal exponent, largest finite value) from each format's definition
MINIFLOATS = {
    "float8_e4m3fn": (3, -6, 448.0),
    "float8_e5m2": (2, -14, 57344.0),
    "float6_e2m3fn": (3, 0, 7.5),
    "float6_e3m2fn": (2, -2, 28.0),
    "float4_e2m1fn": (1, 0, 6.0),
}

NF4_PAPER = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
]  # fmt: skip

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nf4_levels_from_construction(offset: float = 0.9677083) -> np.ndarray:
    """QLoRA's construction: 8 positive and 7 negative normal quantiles and 0, scaled to [-1, 1]."""
    nd = NormalDist()
    pos = [nd.inv_cdf(float(p)) for p in np.linspace(offset, 0.5, 9)[:-1]]
    neg = [-nd.inv_cdf(float(p)) for p in np.linspace(offset, 0.5, 8)[:-1]]
    v = np.sort(np.array([*pos, 0.0, *neg]))
    return v / v.max()


def spacing(a: np.ndarray, fmt: str) -> np.ndarray:
    """Grid spacing of ``fmt`` in the binade of each magnitude ``a`` (float64)."""
    m, emin, _ = MINIFLOATS[fmt]
    a = np.asarray(a, np.float64)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return np.exp2(np.maximum(e, emin) - m)


def round_minifloat(v: np.ndarray, fmt: str) -> np.ndarray:
    """``v`` rounded to nearest (ties to even) on the grid of ``fmt``, clamped to its largest value."""
    _, _, top = MINIFLOATS[fmt]
    v = np.asarray(v, np.float64)
    a = np.abs(v)
    step = spacing(a, fmt)
    q = np.round(a / step) * step  # np.round: half to even; a / step is exact (power of two)
    return np.copysign(np.minimum(q, top), v)


def pack_nibbles(codes: list[int]) -> list[int]:
    """Two 4-bit codes a byte, first in the low nibble (Python integers, one at a time)."""
    codes = list(codes) + [0] * (len(codes) % 2)
    return [codes[i] + 16 * codes[i + 1] for i in range(0, len(codes), 2)]


def pack_sixbit(codes: list[int]) -> list[int]:
    """Four 6-bit codes in three bytes, as one little-endian bit stream."""
    codes = list(codes) + [0] * (-len(codes) % 4)
    out = []
    for i in range(0, len(codes), 4):
        word = sum(c << (6 * k) for k, c in enumerate(codes[i : i + 4]))
        out += [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    return out


def mxfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MXFP4 of ``x`` (float32, last axis a multiple of 32), blocks along the last axis.

    Returns:
      (element codes uint8 of x's shape, E8M0 scale bytes of shape (..., n // 32),
      dequantised values float64).
    """
    x = np.asarray(x, np.float64)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    shared = np.zeros(amax.shape, np.int64)
    for idx in np.ndindex(amax.shape):
        a = amax[idx]
        if not math.isfinite(a):
            shared[idx] = 128  # the NaN scale, 0xFF
        elif a == 0:
            shared[idx] = -127
        else:
            shared[idx] = min(max(math.floor(math.log2(a)) - 2, -127), 127)
    finite = shared != 128
    scale = np.exp2(np.where(finite, shared, 0).astype(np.float64))
    p = round_minifloat(np.where(finite, blocks / scale, 0.0), "float4_e2m1fn")
    index = np.array([E2M1_VALUES.index(abs(float(v))) for v in p.reshape(-1)]).reshape(p.shape)
    codes = (np.signbit(p) * 8 + index).astype(np.uint8)
    deq = np.where(finite, p * scale, np.nan)
    return (
        codes.reshape(x.shape),
        (shared + 127).astype(np.uint8).reshape(*x.shape[:-1], -1),
        deq.reshape(x.shape),
    )


def nf4(x: np.ndarray, block: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NF4 of ``x`` (float32, last axis a multiple of ``block``), blocks along the last axis.

    Returns:
      (codes uint8 of x's shape, float32 absmax of shape (..., n // block), dequantised float32).
    """
    x = np.asarray(x, np.float32)
    levels = np.array(NF4_PAPER, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, block)
    absmax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(absmax == 0, np.float32(0), blocks / np.where(absmax == 0, 1, absmax))
    codes = np.empty(t.shape, np.uint8)
    lv = [Fraction(float(v)) for v in levels]
    for idx in np.ndindex(t.shape):
        ti = Fraction(float(t[idx]))
        dist = [abs(ti - v) for v in lv]
        best = min(dist)
        ties = [k for k, dk in enumerate(dist) if dk == best]
        codes[idx] = next((k for k in ties if k % 2 == 0), ties[0])
    deq = (levels[codes] * absmax).astype(np.float32)
    return codes.reshape(x.shape), absmax[..., 0], deq.reshape(x.shape)
