"""Packed bit layouts, checked bit by bit, and the byte accounting of ``QArray.nbytes``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.quant as hq
from heddle.quant import _qarray as _packing

from . import _reference as ref


def test_int4_nibble_order_by_hand():
    # scale 1 (absmax 7): codes are the values; two's complement nibbles, first in the low nibble
    x = jnp.array([1.0, -2.0, 7.0, -7.0, 0.0, 3.0, -1.0], jnp.float32)
    q = hq.quantize(x, "int4")
    assert float(q.scales.reshape(())) == 1.0
    # (1, -2) -> 0xE1; (7, -7) -> 0x97; (0, 3) -> 0x30; (-1, pad 0) -> 0x0F
    assert np.asarray(q.data).tolist() == [0xE1, 0x97, 0x30, 0x0F]
    assert q.data.shape == (4,) and q.shape == (7,)
    np.testing.assert_array_equal(np.asarray(hq.dequantize(q)), np.asarray(x))


def test_fp4_nibbles_are_e2m1_bit_patterns():
    # MXFP4 with amax 6 * 2**0 / 4 ... use exact E2M1 values with scale 1: amax in [4, 8)
    vals = [0.5, -6.0, 1.5, 0.0, 4.0, -0.5, 3.0, 2.0] * 4
    q = hq.quantize(jnp.array(vals, jnp.float32), "mxfp4")
    assert np.asarray(jax.lax.bitcast_convert_type(q.scales, jnp.uint8)).tolist() == [127]
    e2m1 = np.array(vals, np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    want = ref.pack_nibbles(e2m1.tolist())
    assert np.asarray(q.data).tolist() == want
    assert want[:4] == [0xF1, 0x03, 0x96, 0x45]  # 0.5=0x1, -6=0xF, 1.5=0x3, 0=0x0, 4=0x6, -0.5=0x9


def test_sixbit_stream_by_hand():
    codes = jnp.array([[0x3F, 0x00, 0x15, 0x2A, 0x01]], jnp.uint8)
    packed = jax.jit(_packing.pack, static_argnums=1)(codes, 6)
    want = ref.pack_sixbit([0x3F, 0x00, 0x15, 0x2A, 0x01])
    # word 0: 0x3F | 0x15 << 12 | 0x2A << 18 = 0xA9_503F -> bytes 3F 50 A9
    assert want[:3] == [0x3F, 0x50, 0xA9]
    assert np.asarray(packed).tolist() == [want]
    back = jax.jit(_packing.unpack, static_argnums=(1, 2))(packed, 6, 5)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(codes))


@pytest.mark.parametrize("bits", [4, 6])
@pytest.mark.parametrize("n", [3, 8, 33])
def test_pack_matches_the_reference_stream(bits, n):
    rng = np.random.default_rng(n * bits)
    codes = rng.integers(0, 2**bits, (3, n), dtype=np.uint8)

    @jax.jit
    def run(c):
        packed = _packing.pack(c, bits)
        return packed, _packing.unpack(packed, bits, n), _packing.pack(c.T, bits, axis=0)

    packed, back, packed0 = (np.asarray(a) for a in run(jnp.asarray(codes)))
    pack_ref = ref.pack_nibbles if bits == 4 else ref.pack_sixbit
    np.testing.assert_array_equal(packed, np.array([pack_ref(r) for r in codes.tolist()]))
    assert packed.shape[-1] == _packing.packed_length(n, bits)
    np.testing.assert_array_equal(back, codes)
    np.testing.assert_array_equal(packed0, packed.T)  # along axis 0: the same stream per column


def test_float6_codes_are_ml_dtypes_bytes_packed():
    x = np.array([7.5, -0.125, 1.0, 3.25, -7.0, 0.0, 0.875, 5.5], np.float32)  # absmax 7.5
    q = hq.quantize(jnp.asarray(x), "float6_e2m3fn")
    bytes_ = x.astype(ml_dtypes.float6_e2m3fn).view(np.uint8)
    assert np.asarray(q.data).tolist() == ref.pack_sixbit(bytes_.tolist())
    assert q.data.shape == (6,)


# (format, kwargs) -> (code bytes, scale bytes) for a (256, 192) float32 array, from the layout rules
CASES = [
    ("int8", {}, 256 * 192, 4),
    ("int8", {"axis": 0}, 256 * 192, 4 * 192),
    ("int4", {"axis": 0}, 128 * 192, 4 * 192),
    ("int4", {"block_size": 64}, 256 * 96, 4 * 256 * 3),
    ("float8_e5m2", {"axis": 1}, 256 * 192, 4 * 256),
    ("float6_e3m2fn", {"block_size": 32}, 256 * 144, 4 * 256 * 6),
    ("float4_e2m1fn", {}, 256 * 96, 4),
    ("nf4", {}, 256 * 96, 4 * 256 * 3),
    ("nf4", {"axis": 0}, 128 * 192, 4 * 4 * 192),
    ("mxfp4", {"axis": 0}, 128 * 192, 8 * 192),
    ("mxfp6_e2m3", {}, 256 * 144, 256 * 6),
    ("mxfp8_e4m3", {}, 256 * 192, 256 * 6),
]


@pytest.mark.parametrize(("fmt", "kw", "code_bytes", "scale_bytes"), CASES)
def test_nbytes_accounts_codes_and_scales(fmt, kw, code_bytes, scale_bytes):
    x = jax.ShapeDtypeStruct((256, 192), jnp.float32)
    q = jax.eval_shape(lambda a: hq.quantize(a, fmt, **kw), x)  # no compilation needed
    assert math.prod(q.data.shape) * q.data.dtype.itemsize == code_bytes
    assert math.prod(q.scales.shape) * q.scales.dtype.itemsize == scale_bytes
    assert q.nbytes == code_bytes + scale_bytes


def test_nbytes_is_the_real_size_of_the_leaves():
    q = hq.quantize(jnp.ones((64, 64), jnp.float16), "int4", axis=0)
    assert q.nbytes == q.data.nbytes + q.scales.nbytes == 32 * 64 + 4 * 64


@pytest.mark.parametrize("fmt", ["int4", "nf4", "mxfp4"])
def test_4bit_weights_take_at_most_0_3_of_float16(fmt):
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.float16)
    kw = {"axis": 0, "block_size": 64} if fmt != "mxfp4" else {"axis": 0}
    q = jax.eval_shape(lambda a: hq.quantize(a, fmt, **kw), w)
    ratio = q.nbytes / (4096 * 4096 * 2)
    assert ratio <= 0.3, ratio
    assert ratio >= 0.25  # the codes alone are a quarter
