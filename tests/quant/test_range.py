"""The round-trip bound at the edges of the float32 and bfloat16 ranges, for every format.

docs/quantisation.md: ``|x - dequantize(q)| <= s * h(t) + 2**-24 * (|x| + |dq|) + f`` with ``f``
the smallest normal of the computation dtype (``2**-126`` for float32), for the subnormals that
XLA on CPU flushes to zero on input and output. The edges: the largest finite values (scales above
``2**126``, whose reciprocal is subnormal), the smallest normal values (scales that would be
subnormal), and subnormal inputs. Reference: float64, where each of these values is exact.
"""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.quant as hq
from heddle.quant._quantize import codes as unpacked_codes

from .test_roundtrip import _expand, half_step

F32 = np.finfo(np.float32)
BF16 = ml_dtypes.finfo(ml_dtypes.bfloat16)
FLUSH = 2.0**-126  # float32's (and bfloat16's) smallest normal


def _edge_blocks(fi) -> np.ndarray:
    """Blocks of 32 (one per row) at the ends of a float type's range."""
    big, tiny, sub = float(fi.max), float(fi.tiny), float(fi.smallest_subnormal)
    rows = [
        [big, -big, big / 3, big * 2**-20, 1.0, 0.0],
        [2.0**127, -(2.0**126) * 1.5, 8.6e37, 1e30, -3.0, 2.0**-20],
        [1e38, -9e37, 3e37, 1e37, -1e36, 1e20],  # NF4 scales in (8.5e37, max]: 1/s subnormal
        [tiny, -tiny / 2, sub, -sub * 3, tiny * 0.75, 0.0],  # subnormal block scale
        [tiny * 64, -tiny * 3, tiny, -tiny / 2, sub, tiny * 100],
        [tiny * 127 * 7, tiny * 448, -tiny * 5.5, tiny * 2.5, tiny / 4, sub * 7],
        [sub, -sub, sub * 5, sub * 100, -sub * 2, 0.0],  # only subnormals
        [1e-37, -1e-38, 5e-39, -1e-40, 1e-44, 2e-38],
    ]
    out = np.zeros((len(rows), 32), np.float64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
        out[i, len(r) :] = np.linspace(-1, 1, 32 - len(r)) * abs(r[0])
    return out


def _check(x64: np.ndarray, q: hq.QArray, deq: np.ndarray) -> None:
    s = _expand(q)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(deq))
    t = np.where(s == 0, 0.0, x64 / np.where(s == 0, 1.0, s))
    slack = 0.0 if q.format.startswith("mx") else 2.0**-24 * (np.abs(x64) + np.abs(deq))
    bound = s * half_step(t, q.format) + slack + FLUSH
    err = np.abs(x64 - deq)
    bad = np.argwhere(err > bound)
    assert bad.size == 0, [(x64[tuple(i)], deq[tuple(i)], s[tuple(i)]) for i in bad[:4]]


@pytest.mark.parametrize("fmt", hq.FORMATS)
@pytest.mark.parametrize("src", ["float32", "bfloat16"])
def test_bound_holds_at_the_ends_of_the_range(fmt, src):
    fi = F32 if src == "float32" else BF16
    x = jnp.asarray(_edge_blocks(fi).astype(np.dtype(src)))
    x64 = np.asarray(x.astype(jnp.float32), np.float64)  # exact: the values as stored

    def run(a):
        q = hq.quantize(a, fmt, block_size=32)
        return q, hq.dequantize(q, jnp.float32)  # float32: the bound's product, not bf16's

    for q, deq in (jax.jit(run)(x), run(x)):
        _check(x64, q, np.asarray(deq, np.float64))


def test_large_nf4_blocks_keep_their_values():
    """The case that dequantised to 0: absmax above ~8.5e37, where 1/absmax is subnormal."""
    x = np.array([1e38, -5e37, 2.5e37, 0.0] * 16, np.float32)
    deq = np.asarray(hq.dequantize(hq.quantize(x, "nf4")), np.float64)
    assert deq[0] == np.float32(1e38) and deq[1] < -4e37 and deq[2] > 2e37


@pytest.mark.parametrize("fmt", ["int8", "float8_e4m3fn", "nf4"])
def test_scales_are_normal_float32(fmt):
    """A block whose absmax / qmax would be subnormal gets the smallest normal scale instead."""
    x = np.array([F32.tiny, -F32.tiny / 2, 1e-40, 0.0] * 16, np.float32)
    q = hq.quantize(x, fmt)
    s = float(np.asarray(q.scales).reshape(()))
    assert s == max(float(F32.tiny) / {"int8": 127, "float8_e4m3fn": 448, "nf4": 1}[fmt], FLUSH)
    assert float(hq.dequantize(q)[0]) == float(F32.tiny)


@pytest.mark.parametrize(("j", "s"), [(2, 1.6819), (3, 1.28125)])
def test_the_quotient_is_one_division(j, s):
    """x / s lands exactly on j + 1/2, where x * (1/s) in float32 does not: the code is the
    exact quotient rounded half to even, not the reciprocal product's rounding."""
    s = np.float32(s)
    x = np.float32((j + 0.5) * float(s))
    assert Fraction(float(x)) / Fraction(float(s)) == Fraction(2 * j + 1, 2)  # exact tie
    assert np.float32(x * (np.float32(1) / s)) != np.float32(j + 0.5)  # the reciprocal misses it
    a = np.array([127 * s, x, 0.0, 0.0], np.float32)
    q = jax.jit(lambda v: hq.quantize(v, "int8"))(a)
    assert float(q.scales.reshape(())) == float(s)
    want = round(Fraction(2 * j + 1, 2))  # Python rounds Fractions half to even
    assert int(unpacked_codes(q)[1]) == want


def test_float64_blocks_past_the_float32_scales():
    """float64 keeps float32 scales: within them the bound holds, past them the block is NaN."""
    with jax.enable_x64(True):
        ok = np.array([1e40, -3e39, 1.0, 2.0**-140] * 16)  # absmax / 127 below float32's max
        q = hq.quantize(ok, "int8")
        deq = np.asarray(hq.dequantize(q))
        assert deq.dtype == np.float64
        s = float(np.asarray(q.scales).reshape(()))
        assert np.all(np.abs(ok - deq) <= s / 2 + 2.0**-52 * (np.abs(ok) + np.abs(deq)))
        past = np.array([1e300, 1.0, 0.0, -2.0] * 16)
        assert np.isnan(np.asarray(hq.dequantize(hq.quantize(past, "int8")))).all()
        mx = np.asarray(hq.dequantize(hq.quantize(past[:32], "mxfp4")))
        assert mx[0] == 6 * 2.0**127  # saturated at the largest e8m0 scale
