"""pmax/pmin across 8 host devices with NaN in one device's values; run as a script by
test_nanprop.py. The reference is NumPy's max/min over the devices (NaN wherever one is NaN),
rounded to the input dtype. Prints one JSON line: the number of checks and the cases that disagree."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import heddle
import heddle.lax as hlax

MESH = Mesh(np.array(jax.devices()), ("i",))
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _cases() -> dict[str, np.ndarray]:
    base = (np.arange(16, dtype=np.float64).reshape(8, 2) - 5) / 4
    one_nan = base.copy()
    one_nan[3, 1] = np.nan
    infs = base.copy()
    infs[0, 0], infs[5, 0] = np.inf, -np.inf
    return {"finite": base, "one NaN": one_nan, "infinities": infs}


def main() -> None:
    checks, bad = 0, []
    for cname, x64 in _cases().items():
        for dname, d in DTYPES.items():
            x = jnp.asarray(x64.astype(d))
            for op, jfn in (("pmax", jax.lax.pmax), ("pmin", jax.lax.pmin)):
                want = (np.max if op == "pmax" else np.min)(x64.astype(d).astype(np.float64), 0)
                runs = {
                    "heddle.lax": lambda a, op=op: getattr(hlax, op)(a, "i"),
                    "autocast": heddle.autocast(lambda a, jfn=jfn: jfn(a, "i")),
                }
                for how, f in runs.items():
                    g = jax.jit(jax.shard_map(f, mesh=MESH, in_specs=P("i"), out_specs=P("i")))
                    got = np.asarray(g(x), np.float64).reshape(8, 2)
                    checks += 1
                    ok = got.dtype == np.float64 and all(
                        np.array_equal(row, want, equal_nan=True) for row in got
                    )
                    if not ok:
                        bad.append([cname, dname, op, how, got[0].tolist(), want.tolist()])
    print(json.dumps({"checks": checks, "bad": bad}))


if __name__ == "__main__":
    main()
