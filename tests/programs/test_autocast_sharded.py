"""autocast on arrays sharded over 8 host devices (a subprocess): jit keeps the sharding, shard_map
with its defaults, gradients."""

from __future__ import annotations

import pathlib

import ml_dtypes

SCRIPT = pathlib.Path(__file__).with_name("_autocast_sharded.py")


def test_sharded_arrays_and_shard_map(on_8_devices):
    out = on_8_devices(SCRIPT)
    tenth = float(ml_dtypes.bfloat16(0.1))
    want = float(ml_dtypes.bfloat16(4096 * tenth))  # the float32 sum rounded once
    assert out["jit_shards"] == 8 and out["jit_spec"] == "P('d', None)"
    assert out["jit_last"] == want
    # 8 rows of 4096 x 0.1, each row summed in float32 and stored as bfloat16, then psum'd in float32
    assert out["psum"] == float(ml_dtypes.bfloat16(8 * want))
    # d/dx[0, 0] of the sum of every running sum of a row: 4096 terms, summed in float32
    assert out["grad_shards"] == 8 and out["grad_first"] == 4096.0
