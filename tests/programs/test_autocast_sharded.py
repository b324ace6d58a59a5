"""autocast on arrays sharded over 8 host devices (a subprocess): jit keeps the sharding, shard_map
with its defaults, gradients."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import ml_dtypes

SCRIPT = pathlib.Path(__file__).with_name("_autocast_sharded.py")


def test_sharded_arrays_and_shard_map():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    root = SCRIPT.parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    tenth = float(ml_dtypes.bfloat16(0.1))
    want = float(ml_dtypes.bfloat16(4096 * tenth))  # the float32 sum rounded once
    assert out["jit_shards"] == 8 and out["jit_spec"] == "P('d', None)"
    assert out["jit_last"] == want
    # 8 rows of 4096 x 0.1, each row summed in float32 and stored as bfloat16, then psum'd in float32
    assert out["psum"] == float(ml_dtypes.bfloat16(8 * want))
    # d/dx[0, 0] of the sum of every running sum of a row: 4096 terms, summed in float32
    assert out["grad_shards"] == 8 and out["grad_first"] == 4096.0
