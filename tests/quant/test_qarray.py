"""``QArray`` as a pytree (jit, vmap, sharding) and the errors of quantize / dequantize."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle.quant as hq
from heddle.policy import PrecisionError


def _x(shape=(32, 64), seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_pytree_leaves_and_static_metadata():
    q = hq.quantize(_x(), "int4", axis=0, block_size=16)
    leaves, tree = jax.tree_util.tree_flatten(q)
    assert [leaf.shape for leaf in leaves] == [(16, 64), (2, 64)]
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert (back.format, back.dtype, back.axis, back.length) == ("int4", np.float32, -2, 32)
    assert back.data is leaves[0] and back.scales is leaves[1]
    # metadata is part of the structure: another axis or format is another treedef
    assert jax.tree_util.tree_structure(hq.quantize(_x(), "int4", block_size=16)) != tree
    assert jax.tree_util.tree_structure(hq.quantize(_x(), "nf4", axis=0, block_size=16)) != tree
    # the block size lives in the scales' shape, not in the treedef
    assert jax.tree_util.tree_structure(hq.quantize(_x(), "int4", axis=0, block_size=32)) == tree


def test_jit_round_trip_keeps_every_field():
    q = hq.quantize(_x(), "nf4", axis=0, block_size=16)
    r = jax.jit(lambda a: a)(q)
    assert isinstance(r, hq.QArray)
    for field in ("format", "dtype", "axis", "length", "shape", "block_size", "nbytes"):
        assert getattr(r, field) == getattr(q, field), field
    np.testing.assert_array_equal(np.asarray(r.data), np.asarray(q.data))
    np.testing.assert_array_equal(np.asarray(r.scales), np.asarray(q.scales))


def test_quantize_and_dequantize_under_vmap_match_a_loop():
    xs = _x((3, 16, 64))
    q = jax.vmap(lambda a: hq.quantize(a, "int4", block_size=32))(xs)
    assert q.data.shape == (3, 16, 32) and q.scales.shape == (3, 16, 2)
    assert q.shape == (3, 16, 64)  # the axis counts from the end, so the batch axis is just leading
    deq = jax.vmap(hq.dequantize)(q)
    for i in range(3):
        want = hq.dequantize(hq.quantize(xs[i], "int4", block_size=32))
        np.testing.assert_array_equal(np.asarray(deq[i]), np.asarray(want))
    # a batched QArray also dequantises directly
    np.testing.assert_array_equal(np.asarray(hq.dequantize(q)), np.asarray(deq))


def test_per_tensor_scale_under_vmap_is_per_example():
    xs = jnp.stack([_x((8, 32)), 100 * _x((8, 32), 1)])
    q = jax.vmap(lambda a: hq.quantize(a, "int8"))(xs)
    assert q.scales.shape == (2, 1, 1)
    assert float(q.scales[1, 0, 0]) > 50 * float(q.scales[0, 0, 0])


def test_sharded_quantize_qmatmul_match_unsharded():
    """Eight host devices (a subprocess): sharded leaves in, the same bits out."""
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import heddle.quant as hq
        assert jax.device_count() == 8
        mesh = Mesh(np.array(jax.devices()), ("d",))
        rng = np.random.default_rng(0)
        w = jnp.asarray(rng.standard_normal((256, 64)).astype(np.float32))
        x = jnp.asarray(rng.standard_normal((16, 256)).astype(np.float32))
        for fmt, kw in [("int8", {"axis": 0}), ("int4", {"axis": 0, "block_size": 64})]:
            plain = hq.quantize(w, fmt, **kw)
            ws = jax.device_put(w, NamedSharding(mesh, P(None, "d")))
            q = jax.jit(lambda a: hq.quantize(a, fmt, **kw))(ws)
            np.testing.assert_array_equal(np.asarray(q.data), np.asarray(plain.data))
            qs = jax.device_put(plain, NamedSharding(mesh, P(None, "d")))  # a pytree of leaves
            assert len(qs.data.sharding.device_set) == 8
            out = np.asarray(jax.jit(hq.qmatmul)(x, qs), np.float64)
            ref = np.asarray(hq.qmatmul(x, plain), np.float64)
            # another kernel may sum in another order: float32 partial sums allow K * 2**-24
            mag = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(hq.dequantize(plain)))
            assert np.all(np.abs(out - ref) <= 256 * 2.0**-23 * mag), fmt
            deq = jax.jit(hq.dequantize)(qs)
            np.testing.assert_array_equal(np.asarray(deq), np.asarray(hq.dequantize(plain)))
        print("ok")
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_repr_names_the_layout():
    q = hq.quantize(jnp.zeros((64, 32), jnp.bfloat16), "mxfp4", axis=0)
    assert repr(q) == (
        "QArray(format='mxfp4', shape=(64, 32), dtype=bfloat16, axis=-2, block_size=32, "
        "nbytes=1088)"
    )


def test_aliases_and_dtypes_name_formats():
    x = _x((4, 32))
    assert hq.quantize(x, "fp8").format == "float8_e4m3fn"
    assert hq.quantize(x, jnp.int8).format == "int8"
    assert hq.quantize(x, "E5M2").format == "float8_e5m2"


# ---- errors ------------------------------------------------------------------------------------


def test_unknown_format_lists_the_formats_and_the_fix_runs():
    with pytest.raises(hq.FormatError, match=r"'int3' is not a quantisation format.*nf4.*mxfp4"):
        hq.quantize(_x(), "int3")
    with pytest.raises(ValueError, match=r"heddle.quantize\(x, 'int8'\)"):
        hq.quantize(_x(), "int3")
    hq.quantize(_x(), "int8")


def test_blocks_that_do_not_tile_the_axis():
    with pytest.raises(
        hq.FormatError, match=r"blocks of 48 do not tile the 64 elements along axis -1"
    ):
        hq.quantize(_x(), "int4", block_size=48)
    with pytest.raises(hq.FormatError, match="blocks of 64 do not tile the 96"):
        hq.quantize(_x((2, 96)), "nf4")  # NF4's default block
    padded = jnp.pad(_x((2, 96)), ((0, 0), (0, 32)))  # the fix the message names
    assert hq.quantize(padded, "nf4").shape == (2, 128)


def test_mx_block_size_is_fixed():
    with pytest.raises(
        hq.FormatError, match=r"mxfp4 is defined by the OCP MX spec with blocks of 32"
    ):
        hq.quantize(_x(), "mxfp4", block_size=64)
    assert hq.quantize(_x(), "float4_e2m1fn", block_size=64).block_size == 64  # the fix


def test_axis_out_of_range_and_scalars():
    with pytest.raises(
        hq.FormatError, match=r"axis 2 is out of range .* Pass an axis in \[-2, 1\]"
    ):
        hq.quantize(_x(), "int8", axis=2)
    with pytest.raises(hq.FormatError, match="a scalar has no axis"):
        hq.quantize(jnp.float32(1.0), "int8")
    assert hq.quantize(jnp.float32(1.0).reshape(1), "int8").shape == (1,)


def test_non_float_input_is_refused():
    with pytest.raises(TypeError, match=r"quantize\(<int32 array>, 'int8'\).*heddle.numpy.astype"):
        hq.quantize(jnp.arange(8), "int8")
    import heddle.numpy as hnp

    hq.quantize(hnp.astype(jnp.arange(8), "float32"), "int8")


def test_float64_without_x64_is_a_precision_error():
    with pytest.raises(PrecisionError, match="quantize asked for float64"):
        hq.quantize(np.linspace(0, 1, 8), "int8")
    hq.quantize(np.linspace(0, 1, 8).astype(np.float32), "int8")


def test_dequantize_errors():
    with pytest.raises(TypeError, match=r"dequantize\(<ArrayImpl>\).*heddle.quantize\(x, 'int8'\)"):
        hq.dequantize(_x())
    q = hq.quantize(_x(), "int8")
    with pytest.raises(TypeError, match=r"dequantize\(q, 'int8'\).*heddle.numpy.astype"):
        hq.dequantize(q, "int8")
    with pytest.raises(PrecisionError):
        hq.dequantize(q, "float64")
