"""Loss scaling over 8 data-parallel devices (host devices, in a subprocess)."""

from __future__ import annotations

import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).with_name("_scaling_data_parallel.py")


@pytest.fixture(scope="module")
def observed(on_8_devices):
    return on_8_devices(SCRIPT)


@pytest.mark.slow
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
    """Without axis_name each replica checks its own gradients: device 5 backs off alone (the
    gradients are per device, as with pmap; shard_map runs with its defaults)."""
    r = observed["shard_map_per_replica"]
    assert r["scales"] == [1024.0] * 5 + [512.0] + [1024.0] * 2
    assert r["skipped"] == [0] * 5 + [1] + [0] * 2


def test_autodiff_grad_under_shard_map(observed):
    """float32 gradient within float32 sums of the exact one; jax.grad's is rounded to bfloat16."""
    r = observed["autodiff"]
    assert r["dtype"] == "float32" and r["rel_err"] <= 2.0**-20, r
    assert r["jax_rel_err"] > 2.0**-10, r


def _ok(r):
    assert "error" not in r, r.get("error")
    return r


def test_grads_finite_sees_nan_inf_and_minus_inf_in_every_shard(observed):
    """A 64-element array sharded over 8 devices under jax.jit: one bad element in any shard."""
    r = _ok(observed["grads_finite_sharded"])
    assert r["all_finite"] is True
    assert r["nan"] == r["inf"] == r["-inf"] == [False] * 8


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_fsdp_sharded_params_skip_a_non_finite_step(observed, bad):
    """The reproducer: w sharded P("data"), sum(sqrt(w)) with one negative element; Adam."""
    r = _ok(observed["fsdp_adam"])[bad]
    assert r["w_shards"] == 8
    assert (r["finite"], r["skipped"], r["nan_params"]) == (False, 1, 0)
    assert r["params_bit_identical"] and r["adam_bit_identical"]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_data_parallel_batch_skips_a_non_finite_step(observed, bad):
    r = _ok(observed["batch_sharded"])[bad]
    assert (r["finite"], r["skipped"], r["bit_identical"]) == (False, 1, True)


@pytest.mark.parametrize("path", ["branch", "select"])
@pytest.mark.parametrize("kind", ["local", "summed"])
def test_shard_map_with_its_defaults(observed, path, kind):
    """jax.shard_map without a check_vma argument: the skipped and the taken step have one type,
    on both skip mechanisms, with per-device gradients and with gradients shard_map summed."""
    r = _ok(observed[f"shard_map_vma_{path}_{kind}"])
    assert r["finite"]["skipped"] == [0] * 8 and r["finite"]["scales"] == [1024.0] * 8
    assert not any(r["finite"]["bit_identical"])  # the finite step moved everything
    for bad in ("nan", "inf", "-inf"):
        assert r[bad]["skipped"] == [1] * 8 and r[bad]["scales"] == [512.0] * 8
        assert all(r[bad]["bit_identical"])
