"""Narrow contractions: heddle against jax.numpy's defaults and hand-written float32 accumulation.

A matrix of shapes (square 256-2048, skinny, batched, vmapped with an unbatched weight, NHWC 3x3
convolution, einsum attention), forward and forward+backward, bfloat16 and float16. Per row: heddle,
jax.numpy defaults (narrow result, XLA's own accumulation), and the explicit code a careful user
writes (``preferred_element_type=float32`` then one rounding), timed in interleaved rounds in one
process; the ratio is the median per-round ratio of heddle to the faster of the two others.

Run: python benchmarks/bench_contractions.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from _harness import machine, median_seconds, table
from jax import lax

import heddle.lax as hlax
import heddle.numpy as hnp

F32 = jnp.float32


def _explicit_matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=F32).astype(a.dtype)


def _explicit_einsum(s, a, b):
    return jnp.einsum(s, a, b, preferred_element_type=F32).astype(a.dtype)


def _conv(conv, **kw):
    def f(x, w):
        return conv(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), **kw)

    return f


def _explicit_conv(x, w):
    return _conv(lax.conv_general_dilated, preferred_element_type=F32)(x, w).astype(x.dtype)


# name -> (shapes, heddle, jax.numpy defaults, explicit, vmapped over the first operand)
CASES = {
    **{
        f"square {n}": (((n, n), (n, n)), hnp.matmul, jnp.matmul, _explicit_matmul, False)
        for n in (256, 512, 1024, 2048)
    },
    "skinny 4096x64 @ 64x512": (
        ((4096, 64), (64, 512)),
        hnp.matmul,
        jnp.matmul,
        _explicit_matmul,
        False,
    ),
    "skinny 64x4096 @ 4096x64": (
        ((64, 4096), (4096, 64)),
        hnp.matmul,
        jnp.matmul,
        _explicit_matmul,
        False,
    ),
    "batched 16x128x128 @ 16x128x128": (
        ((16, 128, 128), (16, 128, 128)),
        hnp.matmul,
        jnp.matmul,
        _explicit_matmul,
        False,
    ),
    "3-D x 32x32x64 @ W 64x256": (
        ((32, 32, 64), (64, 256)),
        hnp.matmul,
        jnp.matmul,
        _explicit_matmul,
        False,
    ),
    "vmapped x 32x[32x64] @ W 64x256": (
        ((32, 32, 64), (64, 256)),
        hnp.matmul,
        jnp.matmul,
        _explicit_matmul,
        True,
    ),
    "conv NHWC 8x32x32x32, 3x3x32x64": (
        ((8, 32, 32, 32), (3, 3, 32, 64)),
        _conv(hlax.conv_general_dilated),
        _conv(lax.conv_general_dilated),
        _explicit_conv,
        False,
    ),
    "einsum attention 8x4x128x32": (
        ((8, 4, 128, 32), (8, 4, 128, 32)),
        lambda q, k: hnp.einsum("bhqd,bhkd->bhqk", q, k),
        lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k),
        lambda q, k: _explicit_einsum("bhqd,bhkd->bhqk", q, k),
        False,
    ),
}
QUICK = [
    "square 512",
    "skinny 4096x64 @ 64x512",
    "vmapped x 32x[32x64] @ W 64x256",
    "conv NHWC 8x32x32x32, 3x3x32x64",
    "einsum attention 8x4x128x32",
]


def _step(f, vmapped: bool, backward: bool):
    g = (lambda a, b: jax.vmap(lambda ai: f(ai, b))(a)) if vmapped else f
    if not backward:
        return jax.jit(g)
    return jax.jit(jax.grad(lambda a, b: jnp.sum(jnp.tanh(g(a, b).astype(F32))), argnums=(0, 1)))


def row(name: str, dtype, backward: bool, rounds: int, runs: int) -> list:
    shapes, h, j, e, vmapped = CASES[name]
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal(s), dtype) for s in shapes)
    fns = [_step(f, vmapped, backward) for f in (h, j, e)]
    times = [[], [], []]
    for _ in range(rounds):
        for i, f in enumerate(fns):
            times[i].append(median_seconds(lambda f=f: f(a, b), warmup=2, runs=runs))
    ratios = [th / min(tj, te) for th, tj, te in zip(*times, strict=True)]
    th, tj, te = (statistics.median(t) * 1e6 for t in times)
    return [
        name,
        jnp.dtype(dtype).name,
        "fwd+bwd" if backward else "fwd",
        f"{th:.0f}",
        f"{tj:.0f}",
        f"{te:.0f}",
        statistics.median(ratios),
    ]


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few rows, few rounds: a smoke run")
    args = ap.parse_args(argv)
    names = QUICK if args.quick else list(CASES)
    rounds, runs = (3, 5) if args.quick else (5, 7)
    dtypes = [jnp.bfloat16] if args.quick else [jnp.bfloat16, jnp.float16]
    rows = [row(n, d, bwd, rounds, runs) for n in names for d in dtypes for bwd in (False, True)]
    print(f"# Narrow contractions\n\nMachine: {machine()}\n")
    heads = ["case", "dtype", "pass", "heddle us", "jnp us", "explicit us", "heddle / best"]
    print(table(heads, rows))
    r = [x[-1] for x in rows]
    print(
        f"\nMedian row {statistics.median(r):.3f}, worst {max(r):.3f} ({len(r)} rows); interleaved "
        f"rounds of {rounds}, medians of {runs} runs each."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
