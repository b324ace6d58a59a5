"""quantize / dequantize on 8 host devices with jax.make_mesh's defaults (explicit axes).

A subprocess (``_quant_sharded.py``) runs the cases and reports (the layout sweeps run only under
``-m slow``): a sharded result must equal the unsharded one bit for bit, NaN on exactly the blocks
that hold inf or NaN, and a layout whose blocks straddle devices is refused with a ``FormatError``
whose reshard, run, gives that result.
"""

from __future__ import annotations

import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).with_name("_quant_sharded.py")


@pytest.fixture(scope="module")
def observed(on_8_devices):
    return on_8_devices(SCRIPT)


def _check_sweep(cases: dict) -> None:
    assert cases
    for key, r in cases.items():
        assert "error" not in r, (key, r)
        assert r["shards"] == 8, key
        assert r["same"], key  # bit for bit the unsharded result (after the named fix if refused)
        assert r["nan_ok"], key  # NaN everywhere on a non-finite block, nowhere else
        if "refused" in r:
            assert "would straddle devices" in r["refused"], key
            assert "jax.sharding.reshard(x, NamedSharding(mesh, P(" in r["refused"], key


@pytest.mark.slow
def test_non_finite_blocks_stay_nan_when_sharded(on_8_devices):
    sweep = on_8_devices(SCRIPT, "quick")["sweep"]
    _check_sweep(sweep)
    # blocks inside one device and a per-channel block across all 8: neither is refused
    for fmt in ("int8", "int4", "float4_e2m1fn", "nf4"):
        assert "refused" not in sweep[f"{fmt} {{'axis': 0}} P('d',)"], fmt
        assert "refused" not in sweep[f"{fmt} {{}} P('d',)"], fmt


def test_row_sharded_nf4_weight_and_sharded_vectors(observed):
    r = observed["issue"]
    _check_sweep({k: v for k, v in r.items() if "nan_ok" in v})
    assert "refused" not in r["nf4 weight axis=0"]  # 64 rows a device: whole blocks of 64
    for fmt in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nf4"):
        assert "refused" not in r[f"{fmt} vector 512"], fmt
    for fmt in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2"):  # 8 elements a device, blocks of 32
        assert "blocks of 32 elements along axis 0" in r[f"{fmt} vector 64"]["refused"], fmt
    assert "refused" not in r["nf4 vector 64"]  # one block of 64 across the 8 devices


def test_sharded_nf4_dequantize(observed):
    r = observed["issue"]
    assert r["nf4 dequantize, leaves sharded 8 ways"] == {"shards": 8, "same": True}
    bad = r["nf4 dequantize, blocks over 2 devices"]
    assert "jax.sharding.reshard(q, NamedSharding(mesh, P(None,)))" in bad["refused"]
    assert bad["same"]  # the named reshard, then dequantize: the unsharded values


def test_qmatmul_with_a_sharded_weight(observed):
    """Rows split over devices: one contraction across them (no slabs), within the f32 bound."""
    r = observed["issue"]
    for key in [k for k in r if k.startswith("qmatmul")]:
        assert r[key] == {"within_bound": True}, (key, r[key])


def test_shard_map_with_its_defaults(observed):
    r = observed["issue"]
    for key in [k for k in r if k.startswith("shard_map")]:
        assert r[key] == {"same": True}, (key, r[key])


@pytest.mark.slow
def test_every_format_and_layout_sharded(on_8_devices):
    _check_sweep(on_8_devices(SCRIPT, "full")["sweep"])
