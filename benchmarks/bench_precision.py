"""Mixed-precision training steps: float32 masters with bfloat16 compute against the alternatives.

One momentum-SGD step (forward, backward, update) of an MLP, compiled with ``jax.jit``, in three
arrangements, each written with heddle (``heddle.numpy``/``heddle.nn``/``heddle.autodiff`` and
``Precision`` casts) and with plain ``jax.numpy``/``jax.nn``/``jax.value_and_grad``:

- ``float32``: parameters, momentum and compute in float32;
- ``bf16 pure``: parameters, momentum and compute in bfloat16 (what loses accuracy);
- ``bf16 masters``: float32 parameters and momentum, bfloat16 compute (``mixed_bfloat16``).

Reported: the step-time ratios (medians after warm-up, the two sides of each ratio alternating in
the same process; process CPU time and wall time) and XLA's compiled memory analysis of each step
(argument, output and temporary bytes). Absolute times are shown for scale only; the results are
the ratios.

Run: ``python benchmarks/bench_precision.py`` (``--width 1024 --batch 256`` for a larger model).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _harness import machine, table

import heddle.nn as hnn
import heddle.numpy as hnp
from heddle import autodiff
from heddle.policy._precision import Precision

ARRANGEMENTS = {"float32": "float32", "bf16 pure": "bfloat16", "bf16 masters": "mixed_bfloat16"}


def _init(sizes: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = (rng.standard_normal((m, n)) * np.sqrt(2 / m)).astype(np.float32)
        params[f"b{i}"] = np.zeros(n, np.float32)
    return params


def _plain_cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
    )


def make_step(name: str, backend: str) -> tuple[Callable[..., Any], optax.GradientTransformation]:
    """The jitted step ``(params, opt_state, x, y) -> (params, opt_state, loss)`` of one variant."""
    prec = Precision.parse(ARRANGEMENTS[name])
    if backend == "heddle":
        xp, nn, vg = hnp, hnn, autodiff.value_and_grad
        cast = lambda tree, d: Precision(d, d, d).cast_to_param(tree)
    else:
        xp, nn, vg, cast = jnp, jax.nn, jax.value_and_grad, _plain_cast

    def loss_fn(params, x, y):
        p, h = cast(params, prec.compute_dtype), cast(x, prec.compute_dtype)
        n = len(p) // 2
        for i in range(n):
            h = xp.add(xp.matmul(h, p[f"w{i}"]), p[f"b{i}"])
            if i < n - 1:
                h = nn.relu(h)
        logp = nn.log_softmax(cast(h, prec.output_dtype))
        return -xp.mean(xp.take_along_axis(logp, y[:, None], axis=1))

    opt = optax.sgd(1e-3, momentum=0.9)

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = vg(loss_fn)(params, x, y)
        grads = cast(grads, prec.param_dtype)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, opt


def _args(name: str, sizes: tuple[int, ...], batch: int, opt: Any) -> tuple[Any, ...]:
    prec = Precision.parse(ARRANGEMENTS[name])
    params = prec.cast_to_param(jax.tree.map(jnp.asarray, _init(sizes)))
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((batch, sizes[0])), jnp.float32)
    y = jnp.asarray(rng.integers(0, sizes[-1], batch), jnp.int32)
    return params, opt.init(params), x, y


def _time(fn: Callable[[], Any], runs: int, inner: int) -> tuple[float, float]:
    """Median CPU and wall seconds per call of ``fn`` over ``runs`` timings of ``inner`` calls."""
    cpu, wall = [], []
    for _ in range(runs):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(inner):
            out = fn()
        jax.block_until_ready(out)
        cpu.append((time.process_time() - c0) / inner)
        wall.append((time.perf_counter() - w0) / inner)
    return statistics.median(cpu), statistics.median(wall)


def _ratios(
    a: Callable[[], Any], b: Callable[[], Any], rounds: int, runs: int, inner: int
) -> tuple[float, float, float, float]:
    """(CPU-time ratio a/b, wall-time ratio a/b, CPU ms of a, CPU ms of b), a and b alternating.

    Each round times a then b after a warm-up; the ratios are medians of the per-round ratios, so
    drift in the load of a shared machine hits both sides of each ratio alike. Process CPU time
    (all threads) measures the work done and is far steadier than wall time when other processes
    compete for the cores.
    """
    for fn in (a, b):
        for _ in range(2):
            jax.block_until_ready(fn())
    cpu_r, wall_r, ca, cb = [], [], [], []
    for _ in range(rounds):
        (c1, w1), (c2, w2) = _time(a, runs, inner), _time(b, runs, inner)
        cpu_r.append(c1 / c2)
        wall_r.append(w1 / w2)
        ca.append(c1)
        cb.append(c2)
    med = statistics.median
    return med(cpu_r), med(wall_r), med(ca) * 1e3, med(cb) * 1e3


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=512, help="hidden width of the MLP")
    ap.add_argument("--batch", type=int, default=128, help="batch size")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds per ratio")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per round (median)")
    ap.add_argument("--inner", type=int, default=5, help="steps per timed run")
    args = ap.parse_args(argv)
    sizes = (784, args.width, args.width, 10)
    print(f"Machine: {machine()}")
    print(f"MLP {'-'.join(map(str, sizes))}, batch {args.batch}, momentum SGD, one jitted step.\n")

    calls, memory = {}, []
    for backend in ("heddle", "jax"):
        for name in ARRANGEMENTS:
            step, opt = make_step(name, backend)
            a = _args(name, sizes, args.batch, opt)
            ma = step.lower(*a).compile().memory_analysis()
            calls[name, backend] = functools.partial(step, *a)
            memory.append((name, backend, ma))

    pairs = []
    for backend in ("heddle", "jax"):
        pairs += [((name, backend), ("float32", backend)) for name in ("bf16 pure", "bf16 masters")]
        pairs.append((("bf16 masters", backend), ("bf16 pure", backend)))
    pairs += [((name, "heddle"), (name, "jax")) for name in ARRANGEMENTS]
    rows = []
    for a, b in pairs:
        cpu, wall, ms_a, ms_b = _ratios(calls[a], calls[b], args.rounds, args.runs, args.inner)
        label = f"{a[0]} / {b[0]}" if a[1] == b[1] else f"{a[0]}: heddle / jax"
        rows.append(
            (a[1] if a[1] == b[1] else "both", label, cpu, wall, f"{ms_a:.2f} / {ms_b:.2f}")
        )
    print(
        "Step time ratios (medians over alternating rounds; CPU time is the steadier measure on a"
    )
    print("shared machine, wall time is what a user waits; the CPU ms are for scale only):\n")
    print(table(("namespace", "ratio", "CPU-time ratio", "wall-time ratio", "CPU ms / ms"), rows))

    print("\nCompiled memory analysis (KiB; ratio to the float32 step of the same namespace):\n")
    base = {b: ma for n, b, ma in memory if n == "float32"}
    mrows = []
    for name, backend, ma in memory:
        b = base[backend]
        cells = []
        for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"):
            v, v0 = getattr(ma, field), getattr(b, field)
            cells.append(f"{v / 1024:.0f} ({v / v0:.2f}x)" if v0 else f"{v / 1024:.0f}")
        mrows.append((name, backend, *cells))
    print(table(("step", "namespace", "arguments", "outputs", "temporaries"), mrows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
