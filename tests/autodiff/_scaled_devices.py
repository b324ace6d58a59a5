"""``contractions="scaled"`` on 8 host devices: batch-sharded inputs under an explicit mesh (JAX's
default axis type) and an auto one, FSDP-style sharded weights, a scan over layers, contractions
with batch dimensions; run as a script by
test_ad_scaled.py. The reference is the float32 contractions' gradient (the default), which the
scaled one must match to the narrow cotangent's precision; every contraction of the scaled
gradient must read two narrow operands and each gradient keep its weight's sharding
(explicit axes). Prints one
JSON line: per case, the relative error, or what went wrong."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from heddle import autodiff
from heddle.ops.lowering import narrow_dot_needs_widening


def loss(w, x):
    h = jnp.tanh(jnp.matmul(x, w["a"].astype(x.dtype), preferred_element_type=jnp.float32))
    y = jnp.matmul(h.astype(x.dtype), w["b"].astype(x.dtype))  # a narrow-output contraction

    def layer(y, c):  # a scan over layers: its body's contractions
        return jnp.tanh(jnp.matmul(y, c.astype(y.dtype))), None

    y, _ = jax.lax.scan(layer, y, w["c"])
    q, k = w["q"].astype(x.dtype), w["k"].astype(x.dtype)  # batch dimensions
    s = jnp.einsum("bqd,bkd->bqk", q, k, preferred_element_type=jnp.float32)
    t = jnp.einsum("bqk,bkd->bqd", jnp.tanh(s).astype(x.dtype), k)
    e, f = w["e"].astype(x.dtype), w["f"].astype(x.dtype)  # batch dimensions not in front
    u = jax.lax.dot_general(e, f, (((2,), (0,)), ((1,), (2,))), preferred_element_type=jnp.float32)
    terms = (y.astype(jnp.float32), t.astype(jnp.float32), jnp.tanh(u))
    return sum(jnp.mean(z**2) for z in terms)


def dot_operands(closed) -> set[tuple[str, str]]:
    """The operand dtypes of every dot_general of a jaxpr, bodies included."""
    found = set()

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name == "dot_general":
                lhs, rhs = (v.aval for v in e.invars)
                dims = e.params["dimension_numbers"]
                if not narrow_dot_needs_widening(lhs.ndim, rhs.ndim, dims):  # XLA:CPU's
                    found.add(tuple(jnp.dtype(v.aval.dtype).name for v in e.invars))
            for q in e.params.values():
                for sub in q if isinstance(q, (list, tuple)) else (q,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(closed.jaxpr)
    return found


def two_axes() -> dict[str, float | str]:
    """A dot whose batch dimensions are not in front, its operands sharded over both axes of a 2-D
    explicit mesh: the backward contraction XLA:CPU has no bfloat16 kernel for (before: jitted,
    it failed at run time, "Unsupported element type for DotThunk")."""
    dims = (((2,), (0,)), ((1,), (2,)))
    rng = np.random.default_rng(1)
    a64, b64 = rng.standard_normal((6, 4, 8)), rng.standard_normal((8, 7, 4))

    def loss(a, b):
        u = jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
        return jnp.sum(jnp.tanh(u) ** 2)

    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    out = {}
    for dtype in (jnp.bfloat16, jnp.float16):
        name = f"Explicit-2d-{jnp.dtype(dtype).name}"
        try:
            with jax.set_mesh(mesh):
                a = jax.device_put(jnp.asarray(a64, dtype), NamedSharding(mesh, P(None, "a", "b")))
                b = jax.device_put(jnp.asarray(b64, dtype), NamedSharding(mesh, P(None, None, "a")))
                want = jax.jit(autodiff.grad(loss, argnums=(0, 1)))(a, b)
                got = jax.jit(autodiff.grad(loss, argnums=(0, 1), contractions="scaled"))(a, b)
            out[name] = max(
                float(np.abs(np.asarray(g) - np.asarray(w)).max() / np.abs(np.asarray(w)).max())
                for g, w in zip(got, want, strict=True)
            )
        except Exception as e:  # reported, so the test shows what failed
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def plain_weights(w64: dict[str, np.ndarray], x64: np.ndarray) -> dict[str, float | str]:
    """Weights that are plain arrays (on no mesh) with batch-sharded inputs on an explicit mesh,
    under jax.set_mesh (before: scaled raised ShardingTypeError, the default rule ran)."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    out: dict[str, float | str] = {}
    for dtype in (jnp.bfloat16, jnp.float16):
        name = f"Explicit-{jnp.dtype(dtype).name}-plain-weights"
        try:
            x = jax.device_put(jnp.asarray(x64, dtype), NamedSharding(mesh, P("data")))
            w = {k: jnp.asarray(v, jnp.float32) for k, v in w64.items()}
            with jax.set_mesh(mesh):
                want = jax.jit(autodiff.grad(loss))(w, x)
                got = jax.jit(autodiff.grad(loss, contractions="scaled"))(w, x)
            out[name] = max(
                float(np.abs(np.asarray(got[k]) - np.asarray(want[k])).max())
                / float(np.abs(np.asarray(want[k])).max())
                for k in w64
            )
        except Exception as e:  # reported, so the test shows what failed
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    w64 = {"a": rng.standard_normal((16, 32)) / 4, "b": rng.standard_normal((32, 8)) / 6}
    w64 |= {"c": rng.standard_normal((3, 8, 8)) / 3}
    w64 |= {n: rng.standard_normal((8, 16, 32)) / 4 for n in "qk"}
    w64 |= {"e": rng.standard_normal((6, 8, 8)) / 3, "f": rng.standard_normal((8, 7, 8)) / 3}
    fixed = {"c": P(), "q": P("data"), "k": P("data"), "e": P(None, "data"), "f": P()}
    x64 = rng.standard_normal((64, 16))
    results = {}
    for types in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((8,), ("data",), axis_types=(types,))
        for dtype in (jnp.bfloat16, jnp.float16):
            for wspec in (P(), P("data")):  # replicated, and FSDP-style sharded weights
                x = jax.device_put(jnp.asarray(x64, dtype), NamedSharding(mesh, P("data")))
                w = {
                    k: jax.device_put(
                        jnp.asarray(v, jnp.float32), NamedSharding(mesh, fixed.get(k, wspec))
                    )
                    for k, v in w64.items()
                }
                name = f"{types.name}-{jnp.dtype(dtype).name}-{'fsdp' if wspec else 'repl'}"
                try:
                    with jax.set_mesh(mesh):
                        want = jax.jit(autodiff.grad(loss))(w, x)
                        scaled = autodiff.grad(loss, contractions="scaled")
                        got = jax.jit(scaled)(w, x)
                        reads = dot_operands(jax.make_jaxpr(scaled)(w, x))
                    narrow = jnp.dtype(dtype).name
                    if reads != {(narrow, narrow)}:
                        results[name] = f"contractions read {sorted(reads)}"
                        continue
                    kept = [got[k].sharding.is_equivalent_to(w[k].sharding, w[k].ndim) for k in w]
                    if types == AxisType.Explicit and not all(kept):
                        results[name] = f"shardings {[got[k].sharding.spec for k in w64]}"
                        continue
                    err = max(
                        float(np.abs(np.asarray(got[k]) - np.asarray(want[k])).max())
                        / float(np.abs(np.asarray(want[k])).max())
                        for k in w64
                    )
                    results[name] = err
                    if types == AxisType.Explicit:  # jit called outside jax.set_mesh: the
                        # operands' own explicit mesh (before: ShardingTypeError)
                        outside = jax.jit(scaled)(w, x)
                        results[f"{name}-no-set_mesh"] = max(
                            float(np.abs(np.asarray(outside[k]) - np.asarray(want[k])).max())
                            / float(np.abs(np.asarray(want[k])).max())
                            for k in w64
                        )
                except Exception as e:  # reported, so the test shows what failed
                    results[name] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(results | two_axes() | plain_weights(w64, x64)))


if __name__ == "__main__":
    main()
