"""safetensors I/O: round trips, correctly rounded casts on load, and bad files refused whole."""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.quant as hq
from heddle.policy import PrecisionError

from . import _reference as ref

pytest.importorskip("safetensors")
import safetensors.numpy

DTYPES_32 = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "float16", "bfloat16",
             "float32", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
             "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn"]  # fmt: skip


def _sample(dtype: str, shape=(3, 4), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = np.dtype(getattr(ml_dtypes, dtype, dtype))
    if d == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if d.kind in "iu":
        info = np.iinfo(d)
        return rng.integers(info.min, info.max, shape, dtype=d, endpoint=True)
    if d.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(d)
    if d == np.dtype(ml_dtypes.float8_e8m0fnu):
        return np.exp2(rng.integers(-20, 20, shape)).astype(d)
    return (rng.standard_normal(shape) * 2).astype(d)


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind not in "bc" else a


def test_round_trip_every_dtype(tmp_path):
    tensors = {d: _sample(d) for d in DTYPES_32}
    tensors["scalar"] = np.float32(3.5)
    tensors["empty"] = np.zeros((0, 5), np.float32)
    path = tmp_path / "all.safetensors"
    hq.save_safetensors({k: jnp.asarray(v) for k, v in tensors.items()}, path, metadata={"a": "1"})
    back = hq.load_safetensors(path)
    assert sorted(back) == sorted(tensors)  # safetensors orders the file itself
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        np.testing.assert_array_equal(_bits(back[k]), _bits(v), err_msg=k)
    header = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])
    assert header["__metadata__"] == {"a": "1"}
    assert header["float4_e2m1fn"]["dtype"] == "F4" and header["bfloat16"]["dtype"] == "BF16"


def test_float4_is_packed_low_nibble_first(tmp_path):
    v = np.array([[0.5, -6.0, 1.5, 0.0]], ml_dtypes.float4_e2m1fn)
    path = tmp_path / "f4.safetensors"
    hq.save_safetensors({"v": v}, path)
    raw = path.read_bytes()
    assert list(raw[-2:]) == ref.pack_nibbles([0x1, 0xF, 0x3, 0x0]) == [0xF1, 0x03]


def test_64_bit_tensors(tmp_path):
    path = tmp_path / "wide.safetensors"
    x = np.array([1 + 2.0**-8 + 2.0**-30, -3.0, 2.0**-140], np.float64)
    i = np.array([2**40, -1], np.int64)
    hq.save_safetensors({"x": x, "i": i}, path)
    hq.save_safetensors({"x": x}, tmp_path / "x.safetensors")
    hq.save_safetensors({"i": i}, tmp_path / "i.safetensors")
    with pytest.raises(PrecisionError, match=r"tensor 'x' is float64.*load with dtype='float32'"):
        hq.load_safetensors(tmp_path / "x.safetensors")
    assert hq.load_safetensors(tmp_path / "x.safetensors", dtype="float32")["x"].dtype == np.float32
    with pytest.raises(PrecisionError, match=r"tensor 'i' is int64.*jax_enable_x64', True\)\.$"):
        hq.load_safetensors(tmp_path / "i.safetensors")
    with jax.enable_x64(True):
        back = hq.load_safetensors(path)
        assert back["x"].dtype == np.float64 and back["i"].dtype == np.int64
        np.testing.assert_array_equal(np.asarray(back["x"]), x)
        assert np.asarray(back["i"]).tolist() == [2**40, -1]


def test_cast_on_load_rounds_once(tmp_path):
    """float64 -> bfloat16 directly (one rounding), also with x64 off; against a float64 reference."""
    rng = np.random.default_rng(5)
    ties = 1 + np.arange(1, 64) * 2.0**-8  # odd multiples of 2**-8 are bfloat16 halfway points
    x = np.concatenate([ties, ties + 2.0**-30, ties - 2.0**-30, rng.standard_normal(200)])
    path = tmp_path / "f64.safetensors"
    hq.save_safetensors({"x": x, "n": np.arange(3, dtype=np.int32)}, path)
    back = hq.load_safetensors(path, dtype="bfloat16")
    assert back["x"].dtype == jnp.bfloat16 and back["n"].dtype == jnp.int32  # ints keep theirs
    want = np.array([ref_round(v) for v in x])
    np.testing.assert_array_equal(np.asarray(back["x"], np.float64), want)
    # via float32 (what a two-step cast does) the values just above a tie would round down
    two_step = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert np.sum(two_step != want) >= 30


def ref_round(v: float) -> float:
    """bfloat16 rounding of a float64, from the definition (8 significant bits, ties to even)."""
    a = abs(v)
    step = 2.0 ** (np.floor(np.log2(a)) - 7)
    return float(np.copysign(np.round(a / step) * step, v))


def test_float32_file_to_float16(tmp_path):
    x = np.linspace(-3, 3, 101).astype(np.float32)
    path = tmp_path / "f32.safetensors"
    safetensors.numpy.save_file({"x": x}, str(path))  # written by the safetensors package itself
    back = hq.load_safetensors(path, dtype="float16")["x"]
    np.testing.assert_array_equal(np.asarray(back), x.astype(np.float16))  # NumPy rounds once
    # and what heddle writes, the package reads
    hq.save_safetensors({"x": x}, tmp_path / "h.safetensors")
    np.testing.assert_array_equal(
        safetensors.numpy.load_file(str(tmp_path / "h.safetensors"))["x"], x
    )


# ---- bad files ---------------------------------------------------------------------------------


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.safetensors"
    hq.save_safetensors({"a": np.arange(6, dtype=np.float32), "b": np.ones(4, np.int8)}, path)
    return path


def _write(tmp_path, data: bytes):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(data)
    return p


def test_truncated_files(tmp_path, good):
    raw = good.read_bytes()
    for cut, pattern in [
        (len(raw) - 3, r"truncated: its header places data up to byte \d+, but the file has"),
        (20, r"truncated or corrupt: its header length says \d+ bytes, but only 12 bytes follow"),
        (5, r"truncated: 5 bytes, less than the 8-byte header length"),
    ]:
        with pytest.raises(hq.CheckpointError, match=pattern) as e:
            hq.load_safetensors(_write(tmp_path, raw[:cut]))
        assert "Nothing was loaded" in str(e.value) and "bad.safetensors" in str(e.value)


def test_corrupt_header(tmp_path, good):
    raw = good.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    bad = raw[:8] + b"{" + b"x" * (n - 1) + raw[8 + n :]
    with pytest.raises(hq.CheckpointError, match="the header is corrupt: not valid JSON"):
        hq.load_safetensors(_write(tmp_path, bad))
    bad = raw[:8] + b"[" + b" " * (n - 2) + b"]" + raw[8 + n :]
    with pytest.raises(hq.CheckpointError, match="not a JSON object"):
        hq.load_safetensors(_write(tmp_path, bad))
    bad = raw.replace(b'"data_offsets"', b'"data_offzets"')
    with pytest.raises(hq.CheckpointError, match="header entry of tensor 'a' is corrupt"):
        hq.load_safetensors(_write(tmp_path, bad))


def test_wrong_dtype_tags(tmp_path, good):
    raw = good.read_bytes()
    with pytest.raises(
        hq.CheckpointError, match=r"tensor 'a' has dtype tag 'Q32'.*known tags: BOOL"
    ):
        hq.load_safetensors(_write(tmp_path, raw.replace(b'"F32"', b'"Q32"')))
    # a tag that exists but whose size does not match the data: the package's own check
    with pytest.raises(hq.CheckpointError, match="the safetensors package rejects it"):
        hq.load_safetensors(_write(tmp_path, raw.replace(b'"F32"', b'"F64"')))
    header = {"c": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}
    with pytest.raises(hq.CheckpointError, match="'F6_E2M3', which heddle cannot read"):
        hq.load_safetensors(_write(tmp_path, _file(header, bytes(3))))


def _file(header: dict, data: bytes) -> bytes:
    """A safetensors file from its parts: 8-byte length, JSON header, data."""
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


def test_load_errors(tmp_path, good):
    with pytest.raises(FileNotFoundError):
        hq.load_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match=r"dtype=.*'int8'.*Pass a float dtype"):
        hq.load_safetensors(good, dtype="int8")
    assert hq.load_safetensors(good, dtype="bfloat16")["a"].dtype == jnp.bfloat16


# ---- saving ------------------------------------------------------------------------------------


def test_a_failed_save_leaves_the_old_file_and_no_litter(tmp_path, good):
    before = good.read_bytes()
    with pytest.raises(TypeError, match=r"no dtype tag for int4.*astype\(x, 'float32'\)"):
        hq.save_safetensors({"ok": np.ones(3, np.float32), "bad": jnp.ones(3, jnp.int4)}, good)
    with pytest.raises(TypeError, match=r"names tensors with strings"):
        hq.save_safetensors({1: np.ones(3, np.float32)}, good)
    with pytest.raises(ValueError, match=r"float4 in pairs along the last axis"):
        hq.save_safetensors({"f": np.ones(3, ml_dtypes.float4_e2m1fn)}, good)
    assert good.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["good.safetensors"]


def test_missing_package_gives_a_clear_error(monkeypatch, good):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(
        ImportError, match=r"need the 'safetensors' package.*pip install safetensors"
    ):
        hq.load_safetensors(good)
    with pytest.raises(ImportError, match="pip install safetensors"):
        hq.save_safetensors({"a": np.ones(2, np.float32)}, good)
