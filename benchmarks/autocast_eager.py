"""Eager ``heddle.autocast``: peak memory and per-call time against the same function in plain eager
JAX, and against both under ``jax.jit``.

The program is 40 statements of bfloat16 elementwise arithmetic on a 4 MiB input (2**21 bfloat16
values), followed by a sum: each statement makes a new array, so a runner that keeps every
intermediate alive until the call returns holds 40 of them (and their float32 versions) at once.

Peak memory is the growth of the process's peak resident set (Linux ``VmHWM``, reset through
``/proc/self/clear_refs`` after warm-up) during one call, each variant in a fresh process: the
median and range of five processes (the allocator may or may not reuse the warm-up call's buffers,
so a variant's growth can be about 0 in one process and one array in the next). Time is the median of per-round ratios of interleaved rounds in one process.

Usage: ``python benchmarks/autocast_eager.py [--shape ROWS,COLS]`` (Linux; the default shape is
1024,2048; a small one such as 256,256 measures dispatch rather than arithmetic).
"""

from __future__ import annotations

import json
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

VARIANTS = ("plain eager", "autocast eager", "plain jit", "autocast jit")
SHAPE = (1024, 2048)  # 2**21 bfloat16 values: 4 MiB


def program(x):
    """40 statements, each a new bfloat16 array, then a float32 sum."""
    import jax.numpy as jnp

    for i in range(40):
        x = x * 0.999 + jnp.sin(x) * (1.0 / (i + 2))
    return jnp.sum(x.astype(jnp.float32))


def _runner(variant: str):
    import jax

    import heddle

    fn = heddle.autocast(program) if variant.startswith("autocast") else program
    return jax.jit(fn) if variant.endswith("jit") else fn


def _kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_child(variant: str) -> None:
    """In a fresh process: the peak resident growth (MiB) of one call, after a warm-up call."""
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.random.default_rng(0).normal(size=SHAPE), jnp.bfloat16)
    run = _runner(variant)
    jax.block_until_ready(run(x))  # compiles every kernel the call uses
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _kib("VmRSS")
    jax.block_until_ready(run(x))
    print(json.dumps({"peak_mib": (_kib("VmHWM") - before) / 1024}))


def peaks(processes: int = 5) -> dict[str, list[float]]:
    """Peak growth per variant in each of ``processes`` fresh processes (sorted)."""
    out = {}
    for v in VARIANTS:
        got = []
        for _ in range(processes):
            shape = ",".join(map(str, SHAPE))
            res = subprocess.run(
                [sys.executable, __file__, "--shape", shape, "--peak", v],
                capture_output=True,
                text=True,
                check=True,
            )
            got.append(json.loads(res.stdout.strip().splitlines()[-1])["peak_mib"])
        out[v] = sorted(got)
    return out


def times(rounds: int = 15) -> dict[str, float]:
    """Median per-call seconds of each variant, interleaved round by round, after warm-up."""
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.random.default_rng(0).normal(size=SHAPE), jnp.bfloat16)
    runs = {v: _runner(v) for v in VARIANTS}
    for r in runs.values():
        jax.block_until_ready(r(x))
    got: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v, r in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(r(x))
            got[v].append(time.perf_counter() - t0)
    return {v: statistics.median(t) for v, t in got.items()}


def main() -> None:
    import jax

    p = peaks()
    t = times()
    mib = np.prod(SHAPE) * 2 / 2**20
    print(f"jax {jax.__version__}, {SHAPE} bfloat16 input ({mib:g} MiB), 40 statements")
    print("| variant | peak memory growth, MiB: median (min-max) | time vs plain eager |")
    print("|---|---|---|")
    for v in VARIANTS:
        m = p[v]
        print(
            f"| {v} | {statistics.median(m):.1f} ({m[0]:.1f}-{m[-1]:.1f}) | "
            f"{t[v] / t['plain eager']:.2f}x |"
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--shape"]:
        SHAPE = tuple(int(n) for n in args[1].split(","))
        args = args[2:]
    if len(args) == 2 and args[0] == "--peak":
        _peak_child(args[1])
    else:
        main()
