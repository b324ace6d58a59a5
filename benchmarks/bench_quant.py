"""Quantisation benchmark: bytes held by quantised weights, and qmatmul time against a plain matmul.

Memory: a 4096x4096 weight quantised to int4 / NF4 (blocks of 64) / MXFP4 (blocks of 32), bytes of
codes plus scales (the arrays' real buffers) against the float16 weight; JAX's own int4 dtype is shown
for comparison (one byte per element on CPU).

Time: ``x @ W`` with x (256, 4096) float32 and W (4096, 4096), every variant under ``jax.jit``, in the
same process: float32 ``jnp.matmul`` (the reference), ``heddle.quant.qmatmul`` for int8 per output
channel (the scale is applied after the contraction), int4/NF4/MXFP4 (dequantise, then contract), and
what a user would otherwise write for int8 (``x @ (w_int8.astype(float32) * scale)``). Each is run
``--warmup`` times, then timed ``--repeat`` rounds, round-robin (one run of each variant per round,
so load changes hit every variant alike); medians and the ratio to the float32 median.

Run:  .venv/bin/python benchmarks/bench_quant.py [--repeat 15] [--size 4096]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import heddle.quant as hq


def _medians(cases: list, warmup: int, repeat: int) -> list[float]:
    """Median seconds of each ``(fn, args)``, timed round-robin so that load drifts hit all alike."""
    for fn, args in cases:
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeat):
        for i, (fn, args) in enumerate(cases):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def memory(n: int) -> list[tuple[str, int, float]]:
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((n, n)), jnp.float16)
    rows = [("float16 (reference)", w.nbytes, 1.0)]
    for name, fmt, kw in [
        ("int8, per output channel", "int8", {"axis": 0}),
        ("int4, blocks of 64", "int4", {"axis": 0, "block_size": 64}),
        ("NF4, blocks of 64", "nf4", {"axis": 0}),
        ("MXFP4, blocks of 32", "mxfp4", {"axis": 0}),
    ]:
        q = hq.quantize(w, fmt, **kw)
        real = q.data.nbytes + q.scales.nbytes  # the buffers' own sizes
        assert real == q.nbytes
        rows.append((name, real, real / w.nbytes))
    jint4 = jnp.asarray(rng.integers(-7, 8, (n, n)), jnp.int4)
    rows.append(("jnp.int4 array, no scales (unpacked)", jint4.nbytes, jint4.nbytes / w.nbytes))
    return rows


def timing(n: int, m: int, warmup: int, repeat: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((n, n)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    q8 = hq.quantize(w, "int8", axis=0)
    w8, s8 = q8.data, q8.scales
    cases = [
        ("float32 jnp.matmul (reference)", jax.jit(jnp.matmul), (x, w)),
        ("qmatmul int8, per output channel", jax.jit(hq.qmatmul), (x, q8)),
        ("user's int8: x @ (w.astype(f32) * s)",
         jax.jit(lambda x, w, s: x @ (w.astype(jnp.float32) * s)), (x, w8, s8)),
        ("qmatmul int4, blocks of 64", jax.jit(hq.qmatmul),
         (x, hq.quantize(w, "int4", axis=0, block_size=64))),
        ("qmatmul NF4, blocks of 64", jax.jit(hq.qmatmul), (x, hq.quantize(w, "nf4", axis=0))),
        ("qmatmul MXFP4", jax.jit(hq.qmatmul), (x, hq.quantize(w, "mxfp4", axis=0))),
    ]  # fmt: skip
    medians = _medians([(fn, args) for _, fn, args in cases], warmup, repeat)
    return [(name, t, t / medians[0]) for (name, _, _), t in zip(cases, medians, strict=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=15)
    a = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs visible, "
          f"load average {os.getloadavg()[0]:.1f}; backend {jax.default_backend()}, "
          f"devices {jax.devices()}")  # fmt: skip
    print(f"python {platform.python_version()}, jax {jax.__version__}, numpy {np.__version__}, "
          f"ml_dtypes {ml_dtypes.__version__}")  # fmt: skip
    print(f"\n## Memory of a {a.size}x{a.size} weight\n")
    print("| storage | bytes | ratio to float16 |\n|---|---|---|")
    for name, b, r in memory(a.size):
        print(f"| {name} | {b:,} | {r:.4f} |")
    print(
        f"\n## ({a.rows}, {a.size}) x ({a.size}, {a.size}) under jax.jit, medians of {a.repeat}\n"
    )
    print("| variant | median ms | ratio to float32 matmul |\n|---|---|---|")
    for name, t, r in timing(a.size, a.rows, a.warmup, a.repeat):
        print(f"| {name} | {t * 1e3:.1f} | {r:.2f} |")


if __name__ == "__main__":
    main()
