"""NaN-propagating max/min on 8 host devices; run as a script by test_nanprop.py.

Every case is compared with NumPy in float64 (which propagates NaN) rounded to the input dtype:
bit for bit where the reference is not NaN, NaN where it is. Prints one JSON line with the number of
checks and the cases that disagree.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import heddle
import heddle.lax as hlax
import heddle.numpy as hnp

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _inputs() -> dict[str, np.ndarray]:
    base = (np.arange(64, dtype=np.float64).reshape(8, 8) - 20) / 8
    cases = {}
    for name, (r, c, v) in {
        "nan_first_shard": (0, 2, np.nan),
        "nan_last_shard": (7, 5, np.nan),
        "posinf": (3, 1, np.inf),
        "neginf": (4, 6, -np.inf),
    }.items():
        x = base.copy()
        x[r, c] = v
        cases[name] = x
    x = base.copy()
    x[:, 3] = np.nan  # an all-NaN column and a NaN beside +-inf
    x[2, 0], x[5, 0], x[6, 7] = np.inf, np.nan, -np.inf
    cases["mixed"] = x
    return cases


def _meshes():
    auto = (jax.sharding.AxisType.Auto,)
    m8 = jax.make_mesh((8,), ("i",), axis_types=auto)
    m24 = jax.make_mesh((2, 4), ("a", "b"), axis_types=auto * 2)
    return {
        "rows8": NamedSharding(m8, P("i", None)),
        "cols8": NamedSharding(m8, P(None, "i")),
        "mesh2x4": NamedSharding(m24, P("a", "b")),
        "replicated": NamedSharding(m8, P()),
    }


def main() -> None:
    mask = (np.arange(64).reshape(8, 8) % 3) != 1
    kwsets = {
        "all": {},
        "axis0": {"axis": 0},
        "axis1_keep": {"axis": 1, "keepdims": True},
        "initial": {"axis": 0, "initial": 1.5},
        "where": {"axis": 1, "initial": -1.0, "where": mask},
    }
    ops = {
        "max": (hnp.max, np.max),
        "min": (hnp.min, np.min),
        "amax": (hnp.amax, np.amax),
        "amin": (hnp.amin, np.amin),
        "nanmax": (hnp.nanmax, np.nanmax),
        "nanmin": (hnp.nanmin, np.nanmin),
        "ptp": (hnp.ptp, np.ptp),
        "autocast_max": (None, np.max),
        "autocast_min": (None, np.min),
    }
    fns = {}

    def takes(oname: str, kw: dict) -> bool:  # ptp has no initial= or where=
        return oname != "ptp" or not ({"initial", "where"} & set(kw))

    for (oname, (hfn, _)), (kname, kw) in itertools.product(ops.items(), kwsets.items()):
        if not takes(oname, kw):
            continue
        if oname.startswith("autocast"):
            jfn = jnp.max if oname.endswith("max") else jnp.min

            def f(v, jfn=jfn, kw=kw):
                return heddle.autocast(lambda u: jfn(u, **kw))(v)
        else:

            def f(v, hfn=hfn, kw=kw):
                return hfn(v, **kw)

        fns[oname, kname] = (f, jax.jit(f))
    every_dtype = {"max", "nanmin", "ptp", "autocast_max"}
    # --quick (the default suite): two of the shardings and two dtypes, every input and op; each
    # new sharding and dtype compiles every function again, which is what the full run pays for
    meshes, dtypes = _meshes(), DTYPES
    if "--quick" in sys.argv:
        meshes = {k: v for k, v in meshes.items() if k in ("rows8", "mesh2x4")}
        dtypes = {k: v for k, v in dtypes.items() if k in ("float32", "bfloat16")}
    checks, bad = 0, []
    for (xname, x64), (sname, sh), (dname, dt) in itertools.product(
        _inputs().items(), meshes.items(), dtypes.items()
    ):
        x = jax.device_put(jnp.asarray(x64.astype(dt)), sh)
        exact = np.asarray(x).astype(np.float64)
        for (oname, (_, nfn)), (kname, kw) in itertools.product(ops.items(), kwsets.items()):
            if (dname != "float32" and oname not in every_dtype) or not takes(oname, kw):
                continue
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NumPy's all-NaN slice warning
                ref = np.asarray(nfn(exact, **kw)).astype(dt)
            eager, jitted = fns[oname, kname]
            modes = (("eager", eager), ("jit", jitted)) if sname == "rows8" else (("jit", jitted),)
            for mode, g in modes:
                checks += 1
                got = np.asarray(g(x))
                nan = np.isnan(ref.astype(np.float64))
                same = (
                    got.dtype == ref.dtype
                    and got.shape == ref.shape
                    and np.array_equal(np.isnan(got.astype(np.float64)), nan)
                    and np.array_equal(got[~nan].view(np.uint8), ref[~nan].view(np.uint8))
                )
                if not same:
                    bad.append(f"{oname}/{kname}/{xname}/{sname}/{dname}/{mode}")
        # heddle.lax.reduce_max/min on the whole array and along the sharded rows
        for lname, nfn in (("reduce_max", np.max), ("reduce_min", np.min)):
            for axes in ((0, 1), (0,)):
                ref = np.asarray(nfn(exact, axis=axes)).astype(dt)
                got = np.asarray(jax.jit(lambda v, ln=lname, a=axes: getattr(hlax, ln)(v, a))(x))
                checks += 1
                nan = np.isnan(ref.astype(np.float64))
                if not (
                    np.array_equal(np.isnan(got.astype(np.float64)), nan)
                    and np.array_equal(got[~nan].view(np.uint8), ref[~nan].view(np.uint8))
                ):
                    bad.append(f"lax.{lname}/{axes}/{xname}/{sname}/{dname}")
    print(json.dumps({"devices": len(jax.devices()), "checks": checks, "bad": bad}))


if __name__ == "__main__":
    main()
