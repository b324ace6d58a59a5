"""Loss scaling over 8 data-parallel devices (host devices, in a subprocess)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).with_name("_scaling_data_parallel.py")


@pytest.fixture(scope="module")
def observed():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    root = SCRIPT.parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sharded_arrays_under_jit_skip_everywhere(observed):
    ok, bad = observed["sharded_jit"]["finite"], observed["sharded_jit"]["bad_shard_5"]
    assert ok["x_shards"] == bad["x_shards"] == 8
    assert ok["finite"] and not ok["params_unchanged"] and ok["scale"] == 1024.0
    assert not bad["finite"] and bad["params_unchanged"] and bad["skipped"] == 1
    assert bad["scale"] == 512.0 and bad["replicas_agree"] and ok["replicas_agree"]


def test_shard_map_with_axis_name_agrees_on_every_device(observed):
    r = observed["shard_map_axis"]
    assert r["scales"] == [512.0] * 8 and r["skipped"] == [1] * 8 and r["w_finite"]


def test_per_replica_check_trap(observed):
    """Without axis_name each replica checks its own gradients: device 5 backs off alone."""
    r = observed["shard_map_per_replica"]
    assert r["scales"] == [1024.0] * 5 + [512.0] + [1024.0] * 2
    assert r["skipped"] == [0] * 5 + [1] + [0] * 2


def test_autodiff_grad_under_shard_map(observed):
    assert observed["autodiff"] == {"dtype": "float32", "max_abs_diff": 0.0}
