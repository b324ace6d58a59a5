"""Ratio benchmark: heddle's correctly rounded cast against XLA's convert, same process, under jit.

Run: ``python benchmarks/bench_casts.py [--n LOG2_ELEMENTS] [--repeats R]``.

Prints a markdown table of median times and ratios heddle / XLA. Targets: float32 -> bfloat16,
float16, float8_e4m3fn at most 1.05 (heddle takes XLA's path there); float64 -> bfloat16, float16,
float8_e4m3fn and int32 -> bfloat16 (XLA's convert double-rounds there, on CPU or on GPU; heddle
does not) at most 1.5.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import ml_dtypes
import numpy as np
from _harness import update_doc
from jax import lax

from heddle.policy._casts import astype, path_name

CASES = (  # source, target, largest acceptable ratio
    ("float32", "bfloat16", 1.05),
    ("float32", "float16", 1.05),
    ("float32", "float8_e4m3fn", 1.05),
    ("float64", "bfloat16", 1.5),
    ("float64", "float16", 1.5),
    ("float64", "float8_e4m3fn", 1.5),
    ("int32", "bfloat16", 1.5),
)


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _data(src: str, n: int) -> jax.Array:
    rng = np.random.default_rng(0)
    if src == "int32":
        x = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    else:
        x = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    return jax.device_put(x.astype(_dtype(src)))


def _time(f, x: jax.Array) -> float:
    t0 = time.perf_counter()
    f(x).block_until_ready()
    return time.perf_counter() - t0


def _hlo(f, x: jax.Array) -> list[str]:
    """The compiled instructions, without metadata."""
    text = f.lower(x).compile().as_text()
    ops = [ln.strip().split(", metadata=")[0] for ln in text.splitlines()]
    return [op for op in ops if op.startswith(("%", "ROOT")) and " = " in op]


def run(log2_n: int = 24, repeats: int = 21) -> list[tuple]:
    """Times every case, heddle and XLA alternately (so a shared machine's drift hits both).

    Returns rows (source, target, path, same_hlo, xla_s, heddle_s, ratio, limit): medians of the
    times and the median of the per-pair ratios.
    """
    rows = []
    n = 1 << log2_n
    with jax.enable_x64(True):
        for src, dst, limit in CASES:
            x = _data(src, n)
            d = _dtype(dst)
            xla = jax.jit(lambda a, d=d: lax.convert_element_type(a, d))
            ours = jax.jit(lambda a, d=d: astype(a, d))
            same = _hlo(xla, x) == _hlo(ours, x)
            for f in (xla, ours, xla, ours):  # compile and warm up
                f(x).block_until_ready()
            t_xla, t_ours = [], []
            for i in range(repeats):
                pair = (xla, ours) if i % 2 == 0 else (ours, xla)
                t = {id(f): _time(f, x) for f in pair}
                t_xla.append(t[id(xla)])
                t_ours.append(t[id(ours)])
            ratio = statistics.median(b / a for a, b in zip(t_xla, t_ours, strict=True))
            rows.append(
                (
                    src,
                    dst,
                    path_name(_dtype(src), d),
                    same,
                    statistics.median(t_xla),
                    statistics.median(t_ours),
                    ratio,
                    limit,
                )
            )
            del x
    return rows


def main() -> None:
    """Prints the table (and with ``--update FILE`` writes it into FILE between markers)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="log2 of the number of elements")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--update", metavar="FILE", help="write the table into FILE between markers")
    args = ap.parse_args()
    rows = run(args.n, args.repeats)
    dev = jax.devices()[0]
    lines = [
        f"Measured by `python benchmarks/bench_casts.py`: jax {jax.__version__}, ml_dtypes "
        f"{ml_dtypes.__version__}, numpy {np.__version__}, {dev.platform} ({dev.device_kind}), "
        f"{platform.machine()}, {os.cpu_count()} CPUs; 2**{args.n} elements, jit; medians of "
        f"{args.repeats} alternating runs after warm-up; ratio: median of the per-run ratios "
        "heddle / XLA.",
        "",
        "| source | target | heddle path | same HLO as XLA | XLA convert (ms) | heddle (ms) "
        "| ratio | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for src, dst, path, same, a, b, r, limit in rows:
        ok = "ok" if r <= limit else "over"
        lines.append(
            f"| {src} | {dst} | {path} | {'yes' if same else 'no'} | {a * 1e3:.2f} | "
            f"{b * 1e3:.2f} | {r:.3f} | <= {limit} {ok} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.update:
        update_doc(args.update, text, "bench_casts")


if __name__ == "__main__":
    main()
