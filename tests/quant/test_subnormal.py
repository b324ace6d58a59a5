"""Blocks of float32 subnormals keep the format's error bound, for every format.

XLA on CPU flushes float32 subnormals to zero wherever they meet float arithmetic (as operands and
as results). A block whose largest magnitude is subnormal (``8e-39`` is about ``2**-126.6``) used
to get a zero absmax, hence a zero scale, and came back as zeros. The bound checked here is the
format's own (docs/quantisation.md, "The bound"): with ``s`` the stored scale and ``t = x / s``,
``|x - dequantize(q)| <= s * h(t)``, plus ``2**-24 * (|x| + |dq|)`` for the float32-scale formats
(one rounding each for the quotient and the product) and one float32 subnormal step, ``2**-149``,
for a product rounded into the subnormal range; the MX formats are exact. No allowance for
flushing. Reference: float64, where every float32 value and scale here is exact.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle.quant as hq

from .test_roundtrip import half_step

F32 = np.finfo(np.float32)
TINY = float(F32.tiny)  # 2**-126
SUB = float(F32.smallest_subnormal)  # 2**-149, printed 1.4e-45


def _blocks() -> np.ndarray:
    """Rows of 32 float32 values: each row is one block."""
    lin = np.linspace(-1.0, 1.0, 32)
    rows = [
        lin * 8e-39,  # all subnormal, max 8e-39
        np.where(lin > 0, 8e-39, -3e-39) * np.abs(lin),  # all subnormal, mixed signs
        np.r_[8e-39, -5e-39, 1e-40, -1e-42, SUB, -SUB, np.zeros(26)],
        np.r_[SUB, np.zeros(31)],  # the smallest subnormal alone
        np.r_[-SUB, SUB, -SUB * 3, np.zeros(29)],
        np.r_[SUB * 7, SUB * 2**20, -(SUB * 2**22), np.zeros(29)],  # up to 2**-127
        np.zeros(32),
        -np.zeros(32),
        # mixed normal and subnormal
        np.r_[TINY, -TINY / 2, 8e-39, -SUB, TINY * 0.75, 1e-40, lin[:26] * TINY],
        np.r_[TINY * 4, 3e-39, -1e-39, 5e-41, SUB * 9, lin[:27] * 2e-39],
        np.r_[448 * 1.5 * TINY, -TINY * 0.3, 2e-39, -SUB, lin[:28] * 1e-38],  # e4m3 range
        np.r_[127 * 1.3 * TINY, 3e-39, -6e-39, lin[:29] * 1e-37],  # int8 scale just normal
        np.r_[2.0**-100, -(2.0**-110), 8e-39, SUB, lin[:28] * 2.0**-105],
        np.r_[1e-30, -4e-39, SUB, lin[:29] * 1e-32],
        np.r_[1.0, 8e-39, -SUB, lin[:29]],  # a normal block: subnormals are far below a step
    ]
    out = np.stack([np.asarray(r, np.float64) for r in rows]).astype(np.float32)
    assert out.shape[1] == 32
    return out


def _scales(q: hq.QArray) -> np.ndarray:
    """The stored scales in float64, one per element (ml_dtypes' conversion: exact)."""
    s = np.asarray(q.scales).astype(np.float64)
    return np.broadcast_to(np.repeat(s, q.shape[-1] // s.shape[-1], axis=-1), q.shape)


def _check(x: np.ndarray, q: hq.QArray, deq: np.ndarray) -> None:
    x64 = x.astype(np.float64)
    s = _scales(q)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(deq))
    t = np.where(s == 0, 0.0, x64 / np.where(s == 0, 1.0, s))
    mx = q.format.startswith("mx")
    slack = 0.0 if mx else 2.0**-24 * (np.abs(x64) + np.abs(deq)) + SUB
    bound = s * half_step(t, q.format) + slack
    err = np.abs(x64 - deq)
    bad = np.argwhere(err > bound)
    assert bad.size == 0, [
        (q.format, tuple(i), x64[tuple(i)], deq[tuple(i)], s[tuple(i)], bound[tuple(i)])
        for i in bad[:4]
    ]


def _run(a, fmt):
    q = hq.quantize(a, fmt, block_size=32)
    return q, hq.dequantize(q, "float32")


@pytest.mark.parametrize("fmt", hq.FORMATS)
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_subnormal_blocks_keep_the_bound(fmt, mode):
    x = _blocks()
    run = (lambda a: _run(a, fmt)) if mode == "eager" else jax.jit(lambda a: _run(a, fmt))
    q, deq = run(x)
    deq = np.asarray(deq, np.float64)
    _check(x, q, deq)
    # zero blocks come back as zeros; a block of subnormals does not vanish
    assert np.all(deq[6:8] == 0)
    assert np.any(deq[0] != 0) and np.any(deq[2] != 0)
    if q.scales.dtype == np.float32:  # float32 scales are 0 or normal, never subnormal
        s = np.abs(np.asarray(q.scales, np.float64))
        assert np.all((s == 0) | (s >= TINY)), s.ravel()


@pytest.mark.parametrize("fmt", ["int8", "mxfp8_e4m3", "float8_e4m3fn", "nf4"])
def test_block_of_8e_39(fmt):
    """The reported case: a block whose largest magnitude is 8e-39."""
    x = (np.linspace(-1.0, 1.0, 64) * 8e-39).astype(np.float32)
    q = hq.quantize(x, fmt, block_size=32)
    deq = np.asarray(hq.dequantize(q), np.float64)
    assert abs(deq[0] + 8e-39) < 4e-39, deq[:4]
    _check(x, q, deq)


@pytest.mark.parametrize("fmt", ["int8", "mxfp4", "mxfp8_e5m2", "float8_e5m2"])
def test_bfloat16_subnormal_blocks(fmt):
    """bfloat16 shares float32's exponent range: its subnormals take the same path."""
    x = _blocks().astype(ml_dtypes.bfloat16)
    x32 = x.astype(np.float32)
    for q, deq in (_run(x, fmt), jax.jit(lambda a: _run(a, fmt))(x)):
        _check(x32, q, np.asarray(deq, np.float64))


def test_scale_bits_of_the_subnormal_block():
    """MX: the shared exponent clamps to e8m0's smallest, ``2**-127`` (OCP MX v1.0 6.3 and its
    reference code clamp below); int8: ``absmax / 127`` is below ``2**-126``, so ``2**-126``."""
    x = (np.linspace(-1.0, 1.0, 32) * 8e-39).astype(np.float32)
    mx = hq.quantize(x, "mxfp8_e4m3")
    assert float(np.asarray(mx.scales).astype(np.float64).reshape(())) == 2.0**-127
    i8 = hq.quantize(x, "int8")
    assert float(np.asarray(i8.scales).reshape(())) == TINY
