"""MXFP4 and NF4 against the independent plain-NumPy references in ``_reference.py``, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle.quant as hq
from heddle.quant._quantize import codes as unpacked_codes

from . import _reference as ref


def _mx_inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 128)).astype(np.float32) * np.float32(3.0)
    x[0, :32] = np.linspace(-8, 8, 32)  # amax 8: scale 2, 7 and 8 saturate to 6 * 2
    x[1, :32] = 0.0  # an all-zero block: scale 2**-127
    x[1, 32:64] = np.array(ref.E2M1_VALUES * 4, np.float32) * np.float32(2**-10)  # exact codes
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.9], np.float32)
    x[2, :32] = np.concatenate([mids, -mids, mids * 2, [6.0] * 8]).astype(np.float32)  # ties
    x[3, :32] = np.float32(1e-30) * np.arange(32, dtype=np.float32)  # tiny block
    x[3, 32:64] = np.float32(3e38) * np.sign(np.arange(32) - 15.5).astype(np.float32)  # huge
    x[4, 5] = np.nan
    x[5, 40] = -np.inf
    x[5, 64:96] = -0.0
    return x


def test_mxfp4_matches_the_reference(transform):
    x = _mx_inputs()
    codes_ref, scale_ref, deq_ref = ref.mxfp4(x)
    q = transform(lambda a: hq.quantize(a, "mxfp4"))(jnp.asarray(x))
    assert q.scales.dtype == jnp.float8_e8m0fnu
    np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(q.scales, jnp.uint8)),
                                  scale_ref)  # fmt: skip
    finite = scale_ref != 255
    finite_el = np.repeat(finite, 32, axis=-1)
    got_codes = np.asarray(unpacked_codes(q))
    np.testing.assert_array_equal(got_codes[finite_el], codes_ref[finite_el])
    # the packed bytes: low nibble first
    want_bytes = np.array([ref.pack_nibbles(row) for row in codes_ref.tolist()], np.uint8)
    np.testing.assert_array_equal(np.asarray(q.data)[finite.all(-1)], want_bytes[finite.all(-1)])
    deq = np.asarray(transform(hq.dequantize)(q), np.float64)
    ok = np.isfinite(deq_ref) & (np.abs(deq_ref) >= 2.0**-126)  # float32 flushes subnormals on CPU
    np.testing.assert_array_equal(deq[ok], deq_ref[ok])
    assert np.isnan(deq[~finite_el]).all()


def test_mxfp4_blocks_along_axis_0_match_the_reference_on_the_transpose():
    x = _mx_inputs()[:4, :64].T.copy()  # (64, 4): blocks of 32 down each column
    q = hq.quantize(jnp.asarray(x), "mxfp4", axis=0)
    codes_ref, scale_ref, _ = ref.mxfp4(x.T)
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(q.scales, jnp.uint8)), scale_ref.T
    )
    assert q.data.shape == (32, 4)
    np.testing.assert_array_equal(np.asarray(unpacked_codes(q)), codes_ref.T)


def test_nf4_table_is_qlora_construction():
    built = ref.nf4_levels_from_construction()
    np.testing.assert_allclose(hq.NF4_LEVELS, built, rtol=0, atol=2e-7)
    np.testing.assert_array_equal(hq.NF4_LEVELS, np.array(ref.NF4_PAPER, np.float32))


def _nf4_inputs() -> np.ndarray:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    lv = np.array(ref.NF4_PAPER, np.float64)
    mids = ((lv[:-1] + lv[1:]) / 2).astype(np.float32)  # midpoints, near and exactly
    x[0, :64] = np.concatenate([[1.0], mids, -mids, np.nextafter(mids, 2), np.nextafter(mids, -2),
                                [0.0, -0.0, 0.5, -0.5]])[:64]  # fmt: skip
    x[1, :64] = 0.0
    x[2, :64] = lv.astype(np.float32).tolist() * 4  # the levels themselves, absmax 1
    return x


def test_nf4_matches_the_reference(transform):
    x = _nf4_inputs()
    codes_ref, absmax_ref, deq_ref = ref.nf4(x)
    q = transform(lambda a: hq.quantize(a, "nf4"))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(q.scales), absmax_ref)
    np.testing.assert_array_equal(np.asarray(unpacked_codes(q)), codes_ref)
    want_bytes = np.array([ref.pack_nibbles(row) for row in codes_ref.tolist()], np.uint8)
    np.testing.assert_array_equal(np.asarray(q.data), want_bytes)
    np.testing.assert_array_equal(np.asarray(transform(hq.dequantize)(q)), deq_ref)
    np.testing.assert_array_equal(np.asarray(unpacked_codes(q))[2, :16], np.arange(16))


@pytest.mark.parametrize("block", [16, 128])
def test_nf4_block_sizes(block):
    x = _nf4_inputs()
    _, absmax_ref, deq_ref = ref.nf4(x, block)
    q = hq.quantize(jnp.asarray(x), "nf4", block_size=block)
    assert q.block_size == block
    np.testing.assert_array_equal(np.asarray(q.scales), absmax_ref)
    np.testing.assert_array_equal(np.asarray(hq.dequantize(q)), deq_ref)
