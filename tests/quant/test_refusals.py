"""Every refusal in heddle.quant: a typed error whose message names a fix, and that fix, run, works.

Each case raises, matches the message (including the suggested call), then runs the suggested call
and checks its result against an independent value. The sharded refusals are covered in
test_quant_sharded.py (the reshard is run there, on 8 devices).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.numpy as hnp
import heddle.quant as hq
from heddle.policy import PrecisionError

X = jnp.asarray(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64))


def test_axis_out_of_range():
    with pytest.raises(hq.FormatError, match=r"axis 2 is out of range .*Pass an axis in \[-2, 1\]"):
        hq.quantize(X, "int8", axis=2)
    q = hq.quantize(X, "int8", axis=1)  # an axis in the range: per row
    assert q.scales.shape == (2, 1)


def test_scalar_input():
    with pytest.raises(hq.FormatError, match=r"Quantise x\.reshape\(1\)"):
        hq.quantize(jnp.float32(0.5), "int8")
    assert float(hq.dequantize(hq.quantize(jnp.float32(0.5).reshape(1), "int8"))[0]) == 0.5


def test_blocks_that_do_not_tile_run_the_pad():
    with pytest.raises(hq.FormatError, match=r"Pad that axis .*\(heddle\.numpy\.pad\)"):
        hq.quantize(X[:, :48], "nf4")
    q = hq.quantize(hnp.pad(X[:, :48], ((0, 0), (0, 16))), "nf4")
    assert q.shape == (2, 64) and q.block_size == 64


def test_mx_block_size_names_the_scaled_float_format():
    with pytest.raises(
        hq.FormatError, match=r"heddle\.quantize\(x, 'float6_e2m3fn', block_size=16\)"
    ):
        hq.quantize(X, "mxfp6_e2m3", block_size=16)
    q = heddle.quantize(X, "float6_e2m3fn", block_size=16)
    assert q.format == "float6_e2m3fn" and q.block_size == 16


def test_non_float_quantize_input():
    i = jnp.arange(8)
    with pytest.raises(TypeError, match=r"heddle\.quantize\(heddle\.numpy\.astype\(x, 'float32'\)"):
        hq.quantize(i, "int4")
    deq = hq.dequantize(heddle.quantize(heddle.numpy.astype(i, "float32"), "int4"))
    np.testing.assert_array_equal(np.asarray(deq), np.arange(8) * (7 / 7))  # scale 1: exact


def test_float64_without_x64():
    with pytest.raises(PrecisionError) as e:
        hq.quantize(np.linspace(0, 1, 8), "int8")
    assert "jax_enable_x64" in str(e.value)
    with jax.enable_x64(True):
        assert hq.quantize(np.linspace(0, 1, 8), "int8").dtype == np.float64


def test_dequantize_of_an_array():
    with pytest.raises(TypeError, match=r"q = heddle\.quantize\(x, 'int8'\); heddle\.dequantize"):
        hq.dequantize(X)
    q = heddle.quantize(X, "int8")
    assert np.max(np.abs(np.asarray(heddle.dequantize(q)) - np.asarray(X))) <= 0.5 / 127


def test_dequantize_to_an_integer_dtype():
    q = hq.quantize(jnp.asarray([3.0, -2.0, 1.0, 0.0]), "int8")  # 1.0 comes back as 42 * 3/127
    fix = r"heddle\.numpy\.astype\(heddle\.numpy\.round\(heddle\.dequantize\(q\)\), 'int8'\)"
    with pytest.raises(TypeError, match=fix):
        hq.dequantize(q, "int8")
    got = heddle.numpy.astype(heddle.numpy.round(heddle.dequantize(q)), "int8")
    assert got.dtype == np.int8 and got.tolist() == [3, -2, 1, 0]


def test_qmatmul_refusals():
    w = jnp.asarray(np.eye(4, dtype=np.float32) * 2)
    x = jnp.ones((3, 4), jnp.float32)
    with pytest.raises(TypeError, match=r"qmatmul\(x, heddle\.quantize\(w, 'int8', axis=0\)\)"):
        hq.qmatmul(x, w)
    np.testing.assert_array_equal(
        np.asarray(hq.qmatmul(x, heddle.quantize(w, "int8", axis=0))), np.full((3, 4), 2.0)
    )
    w3 = jnp.ones((4, 2, 3), jnp.float32)
    with pytest.raises(TypeError, match=r"heddle\.quantize\(w\.reshape\(K, -1\), 'int8', axis=0\)"):
        hq.qmatmul(x, hq.quantize(w3, "int8"))
    y = hq.qmatmul(x, heddle.quantize(w3.reshape(4, -1), "int8", axis=0)).reshape(3, 2, 3)
    np.testing.assert_array_equal(np.asarray(y), np.full((3, 2, 3), 4.0))
    with pytest.raises(TypeError, match=r"qmatmul\(heddle\.numpy\.astype\(x, 'float32'\), q\)"):
        hq.qmatmul(jnp.ones((3, 4), jnp.int32), heddle.quantize(w, "int8", axis=0))
    xi = heddle.numpy.astype(jnp.ones((3, 4), jnp.int32), "float32")
    assert hq.qmatmul(xi, heddle.quantize(w, "int8", axis=0)).tolist() == [[2.0] * 4] * 3
    with pytest.raises(ValueError, match=r"Transpose or reshape x so that its last axis"):
        hq.qmatmul(x.T, heddle.quantize(w, "int8", axis=0))  # (4, 3): the wrong axis last
    assert hq.qmatmul(x.T.T, heddle.quantize(w, "int8", axis=0)).shape == (3, 4)


def test_emulate_to_a_non_float_dtype():
    def f(v):
        return v * 3.0

    with pytest.raises(TypeError, match=r"heddle\.quant\.emulate\(fn, 'bfloat16'\)"):
        hq.emulate(f, "int8")
    got = heddle.quant.emulate(f, "bfloat16")(jnp.float32(1.01))
    assert float(got) == 3.03125  # 1.01 -> 1.0078125, times 3 -> 3.0234375 -> 3.03125 (tie, even)


# ---- safetensors -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int8", "nf4", "mxfp4", "float8_e4m3fn"])
def test_saving_a_qarray_names_the_calls_that_work(tmp_path, fmt):
    save, load = hq.save_safetensors, hq.load_safetensors
    w = jnp.asarray(np.linspace(-3, 3, 256, dtype=np.float32).reshape(4, 64), jnp.bfloat16)
    q = hq.quantize(w, fmt, axis=-1)
    path = tmp_path / "q.safetensors"
    with pytest.raises(TypeError) as e:
        save({"w": q}, path)
    msg = str(e.value)
    assert "save_safetensors({'w.data': q.data, 'w.scales': q.scales}, path)" in msg
    rebuild = (
        f"heddle.quant.QArray(t['w.data'], t['w.scales'], {q.format!r}, "
        f"jax.numpy.dtype('bfloat16'), {q.axis}, {q.length})"
    )
    assert rebuild in msg and "save_safetensors({'w': heddle.dequantize(q)}, path)" in msg
    assert not path.exists()  # bad input changes nothing
    # the first fix: the leaves, and the QArray rebuilt from them, exactly as the message says
    save({"w.data": q.data, "w.scales": q.scales}, path)
    t = load(path)
    back = eval(rebuild, {"heddle": heddle, "jax": jax, "t": t})
    assert back.nbytes == q.nbytes
    assert np.asarray(hq.dequantize(back)).tobytes() == np.asarray(hq.dequantize(q)).tobytes()
    # the second fix: the values
    save({"w": heddle.dequantize(q)}, path)
    np.testing.assert_array_equal(np.asarray(load(path)["w"]), np.asarray(hq.dequantize(q)))


def test_saving_a_non_array(tmp_path):
    path = tmp_path / "x.safetensors"
    for bad in (None, [[1.0], [1.0, 2.0]]):
        with pytest.raises(
            TypeError, match=r"a tensor must be an array of numbers.*leave the name"
        ):
            hq.save_safetensors({"w": np.ones(2, np.float32), "extra": bad}, path)
    assert not path.exists()
    hq.save_safetensors({"w": np.ones(2, np.float32)}, path)  # the name left out
    hq.save_safetensors(
        {"w": np.ones(2, np.float32), "extra": np.asarray([1.0, 2.0], "float32")}, path
    )
    assert hq.load_safetensors(path)["extra"].tolist() == [1.0, 2.0]


def test_saving_a_dtype_without_a_tag_runs_the_cast(tmp_path):
    path = tmp_path / "i.safetensors"
    i4 = jnp.asarray([1, -2, 7], jnp.int4)
    with pytest.raises(TypeError, match=r"heddle\.numpy\.astype\(x, 'float32'\)"):
        hq.save_safetensors({"i": i4}, path)
    hq.save_safetensors({"i": heddle.numpy.astype(i4, "float32")}, path)
    assert hq.load_safetensors(path)["i"].tolist() == [1.0, -2.0, 7.0]


def test_saving_non_string_names_and_odd_float4(tmp_path):
    path = tmp_path / "f.safetensors"
    with pytest.raises(TypeError, match=r"Use str keys, e\.g\. \{'1': \.\.\.\}"):
        hq.save_safetensors({1: np.ones(2, np.float32)}, path)
    hq.save_safetensors({"1": np.ones(2, np.float32)}, path)
    f4 = np.array([1.0, -0.5, 6.0], ml_dtypes.float4_e2m1fn)
    with pytest.raises(
        ValueError, match=r"Pad the last axis to an even size \(heddle\.numpy\.pad\)"
    ):
        hq.save_safetensors({"f": f4}, path)
    hq.save_safetensors({"f": hnp.pad(jnp.asarray(f4), (0, 1))}, path)
    assert hq.load_safetensors(path)["f"].astype(jnp.float32).tolist() == [1.0, -0.5, 6.0, 0.0]


def test_a_bad_file_is_fixed_by_saving_it_again(tmp_path):
    path = tmp_path / "bad.safetensors"
    hq.save_safetensors({"a": np.arange(4, dtype=np.float32)}, path)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(hq.CheckpointError, match=r"Re-create the file \(heddle\.quant\.save_safe"):
        hq.load_safetensors(path)
    heddle.quant.save_safetensors({"a": np.arange(4, dtype=np.float32)}, path)
    assert hq.load_safetensors(path)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_loading_to_an_integer_dtype(tmp_path):
    path = tmp_path / "a.safetensors"
    hq.save_safetensors({"a": np.array([1.5, 2.5], np.float32)}, path)
    with pytest.raises(TypeError, match=r"Pass a float dtype \(e\.g\. 'bfloat16'\)"):
        hq.load_safetensors(path, dtype="int8")
    assert hq.load_safetensors(path, dtype="bfloat16")["a"].dtype == jnp.bfloat16
