"""quantize / dequantize on 8 host devices with jax.make_mesh's defaults (explicit axes).

Run as a script by test_quant_sharded.py; prints one JSON line: per case, what was observed.
Each sharded result is compared bit for bit with the same call on the unsharded array; a refusal
is recorded with its message, and the reshard the message names is run to show it works.
"""

from __future__ import annotations

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import heddle.quant as hq

MESH = jax.make_mesh((8,), ("d",))  # the default: AxisType.Explicit
AUTO = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))


def _bits(a) -> bytes:
    a = np.asarray(a)
    return a.tobytes()


def _same(q, deq, q0, deq0) -> bool:
    return (
        _bits(q.data) == _bits(q0.data)
        and _bits(q.scales) == _bits(q0.scales)
        and _bits(deq) == _bits(deq0)
        and q.scales.shape == q0.scales.shape
    )


def _nan_mask_ok(x: np.ndarray, deq: np.ndarray, q: hq.QArray, per_tensor: bool) -> bool:
    """NaN exactly on the blocks holding a non-finite input (an independent block map)."""
    k = x.ndim + q.axis
    bad = ~np.isfinite(x)
    if per_tensor:
        want = np.full(x.shape, bad.any())
    else:
        b = q.block_size
        idx = np.indices(x.shape)
        idx[k] //= b
        keys = np.ravel_multi_index(tuple(idx), x.shape)
        want = np.isin(keys, keys[bad])
    return bool(np.array_equal(np.isnan(deq), want))


def _fix_from(msg: str, arrays: dict):
    """Runs the reshard that the message names; returns the resharded value."""
    m = re.search(r"jax\.sharding\.reshard\((\w+), (NamedSharding\(mesh, P\([^)]*\)\))\)", msg)
    assert m, msg
    target = eval(m.group(2), {"NamedSharding": NamedSharding, "mesh": MESH, "P": P})
    return jax.sharding.reshard(arrays[m.group(1)], target)


def _layouts(fmt: str) -> list[dict]:
    if fmt.startswith("mx"):
        return [{}, {"axis": 0}]
    if fmt == "nf4":
        return [{}, {"axis": 0}, {"axis": 0, "block_size": 8}]
    return [{}, {"axis": 0}, {"axis": 0, "block_size": 8}, {"block_size": 32}]


def quantize_case(x: np.ndarray, fmt: str, layout: dict, spec: P, jit: bool, mesh=MESH) -> dict:
    try:
        return _quantize_case(x, fmt, layout, spec, jit, mesh)
    except Exception as e:  # any other error is a failed case, reported with the rest
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def _quantize_case(x: np.ndarray, fmt: str, layout: dict, spec: P, jit: bool, mesh) -> dict:
    def run(a):
        q = hq.quantize(a, fmt, **layout)
        return q, hq.dequantize(q)

    q0, deq0 = run(x)
    xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))
    f = jax.jit(run) if jit else run
    out = {"shards": len(xs.addressable_shards)}
    try:
        q, deq = f(xs)
    except hq.FormatError as e:
        out["refused"] = str(e)
        q, deq = f(_fix_from(str(e), {"x": xs}))
    out["same"] = _same(q, deq, q0, deq0)
    per_tensor = not layout and not fmt.startswith(("nf4", "mx"))
    out["nan_ok"] = _nan_mask_ok(x, np.asarray(deq), q, per_tensor)
    return out


QUICK = ("int8", "int4", "float4_e2m1fn", "nf4", "mxfp4", "mxfp6_e2m3")


def sweep(full: bool) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[10, 20] = np.nan
    x[41, 3] = np.inf
    res = {}
    for fmt in hq.FORMATS if full else QUICK:
        for layout in _layouts(fmt) if full else [{}, {"axis": 0}]:
            for spec in (P("d"), P(None, "d")):
                key = f"{fmt} {layout} {spec}"
                res[key] = quantize_case(x, fmt, layout, spec, jit=False)
    for fmt in ("int8", "nf4", "mxfp4", "mxfp6_e3m2", "float4_e2m1fn"):  # under an outer jit
        res[f"{fmt} {{'axis': 0}} P('d',) jit"] = quantize_case(
            x, fmt, {"axis": 0}, P("d"), jit=True
        )
    for fmt in ("int8", "nf4", "mxfp4"):  # AxisType.Auto: XLA's partitioner places the blocks
        for layout in ({}, {"axis": 0}):
            res[f"{fmt} {layout} P('d',) auto jit"] = quantize_case(
                x, fmt, layout, P("d"), jit=True, mesh=AUTO
            )
    return res


def issue_cases() -> dict:
    rng = np.random.default_rng(1)
    out = {}
    w = rng.standard_normal((512, 64)).astype(np.float32)  # a row-sharded weight, 64 rows each
    out["nf4 weight axis=0"] = quantize_case(w, "nf4", {"axis": 0}, P("d"), jit=True)
    v = rng.standard_normal(512).astype(np.float32)
    for fmt in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nf4"):
        out[f"{fmt} vector 512"] = quantize_case(v, fmt, {}, P("d"), jit=False)
        out[f"{fmt} vector 64"] = quantize_case(v[:64].copy(), fmt, {}, P("d"), jit=False)
    for fmt in ("int8", "nf4", "mxfp4"):
        out[f"qmatmul {fmt} 2048 rows sharded"] = qmatmul_case(2048, P("d"), fmt)
    out["qmatmul int8 64 columns sharded"] = qmatmul_case(64, P(None, "d"), "int8")
    for fmt in ("int8", "nf4", "mxfp6_e2m3"):
        out[f"shard_map {fmt}"] = shard_map_case(fmt)
    for name, case in (
        ("leaves sharded 8 ways", _dequantize_sharded),
        ("blocks over 2 devices", _dequantize_refused),
    ):
        try:
            out[f"nf4 dequantize, {name}"] = case(v)
        except Exception as e:  # reported with the rest
            out[f"nf4 dequantize, {name}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def _dequantize_sharded(v: np.ndarray) -> dict:
    """nf4 dequantize of a QArray whose leaves are put on the mesh, 8 blocks on 8 devices."""
    q0 = hq.quantize(v, "nf4")
    deq0 = hq.dequantize(q0)
    qs = jax.device_put(q0, NamedSharding(MESH, P("d")))
    return {
        "shards": len(qs.data.addressable_shards),
        "same": _bits(hq.dequantize(qs)) == _bits(deq0)
        and _bits(jax.jit(hq.dequantize)(qs)) == _bits(deq0),
    }


def _dequantize_refused(v: np.ndarray) -> dict:
    """4 blocks of 64 whose codes are split over 8 devices (32 each), scales replicated."""
    q1 = hq.quantize(v[:256], "nf4")
    leaves = hq.QArray(
        jax.device_put(q1.data, NamedSharding(MESH, P("d"))),
        jax.device_put(q1.scales, NamedSharding(MESH, P())),
        q1.format,
        q1.dtype,
        q1.axis,
        q1.length,
    )
    case = {"shards": len(leaves.data.addressable_shards)}
    try:
        hq.dequantize(leaves)
        case["refused"] = None
    except hq.FormatError as e:
        case["refused"] = str(e)
        fixed = hq.dequantize(_fix_from(str(e), {"q": leaves}))
        case["same"] = _bits(fixed) == _bits(hq.dequantize(q1))
    return case


def qmatmul_case(k: int, spec: P, fmt: str) -> dict:
    """qmatmul with a sharded weight, against float64 with the float32 accumulation bound."""
    rng = np.random.default_rng(k)
    w = rng.standard_normal((k, 64)).astype(np.float32)
    a = rng.standard_normal((4, k)).astype(np.float32)
    try:
        q = hq.quantize(jax.device_put(jnp.asarray(w), NamedSharding(MESH, spec)), fmt, axis=0)
        y = np.asarray(jax.jit(hq.qmatmul)(jnp.asarray(a), q), np.float64)
    except Exception as e:  # reported with the rest
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    deq = np.asarray(hq.dequantize(hq.quantize(w, fmt, axis=0)), np.float64)  # unsharded
    bound = k * 2.0**-24 * (np.abs(a) @ np.abs(deq)) + 2.0**-24 * np.abs(a @ deq)
    return {"within_bound": bool(np.all(np.abs(y - a.astype(np.float64) @ deq) <= bound))}


def shard_map_case(fmt: str) -> dict:
    """quantize inside shard_map (its defaults): each device's rows on their own, NaN included."""
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    x[10, 3] = np.nan
    f = jax.jit(
        jax.shard_map(
            lambda a: hq.dequantize(hq.quantize(a, fmt, block_size=32)),
            mesh=MESH,
            in_specs=P("d"),
            out_specs=P("d"),
        )
    )
    try:
        got = f(jax.device_put(jnp.asarray(x), NamedSharding(MESH, P("d"))))
    except Exception as e:  # reported with the rest
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"same": _bits(got) == _bits(hq.dequantize(hq.quantize(x, fmt, block_size=32)))}


if __name__ == "__main__":
    assert jax.device_count() == 8
    mode = sys.argv[1] if sys.argv[1:] else "issue"
    if mode == "issue":
        print(json.dumps({"issue": issue_cases()}))
    else:
        print(json.dumps({"sweep": sweep(full=mode == "full")}))
