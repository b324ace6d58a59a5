"""Cost of a ``heddle.policy.default_dtypes(...)`` block around one eager op, against the op alone.

Run: ``python benchmarks/default_dtypes.py [--rounds N] [--calls N] [--float NAME] [--cpu]``.

Each row times one eager ``heddle.numpy`` call on small inputs three ways in one process:
``op()`` alone; ``with policy.default_dtypes(float=...): op()`` (a block entered and left around
every call); and ``op()`` inside one such block held open for all the calls (the op's own cost under
the block's policy: where the policy changes the result dtype, as for ``ones``, the kernel differs).
The three alternate in interleaved rounds after a warm-up (which compiles every kernel each way); a
round times ``--calls`` calls of each, and a ratio is the median over rounds of the per-round ratio
block / alone. ``block / held`` (the block's ratio over the held block's) is the cost of entering
and leaving the block alone. ``--cpu`` times with this process's CPU time instead of wall time
(steadier on a shared machine). The last row is the empty block against the first op, for scale.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _harness import machine, table  # noqa: E402

import heddle.numpy as hnp  # noqa: E402
from heddle import policy  # noqa: E402


def ops() -> dict[str, Callable[[], Any]]:
    """The eager calls timed, by the label of their row."""
    x = jnp.linspace(0.0, 1.0, 64, dtype=jnp.float32)
    xb = x.astype(jnp.bfloat16)
    i = jnp.arange(64, dtype=jnp.int32)
    return {
        "add(x, 1.0) float32": lambda: hnp.add(x, 1.0),
        "multiply(xb, 2.0) bfloat16": lambda: hnp.multiply(xb, 2.0),
        "sum(x) float32": lambda: hnp.sum(x),
        "sum(x, axis=0) float32": lambda: hnp.sum(x, axis=0),
        "exp(i) int32 (float result)": lambda: hnp.exp(i),
        "mean(i) int32": lambda: hnp.mean(i),
        "ones(64)": lambda: hnp.ones(64),
        "asarray(1.5)": lambda: hnp.asarray(1.5),
    }


def per_call(fn: Callable[[], Any], calls: int, clock: Callable[[], float]) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls, waiting for the last result."""
    t0 = clock()
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (clock() - t0) / calls


def in_block(fn: Callable[[], Any], dtype: str) -> Callable[[], Any]:
    """``fn`` called inside a ``default_dtypes(float=dtype)`` block entered for that call."""

    def call() -> Any:
        with policy.default_dtypes(float=dtype):
            return fn()

    return call


Timer = Callable[[int, Callable[[], float]], float]


def timer(fn: Callable[[], Any], held: str | None = None) -> Timer:
    """A timer of ``fn`` (seconds per call); ``held``: inside one ``default_dtypes(float=held)``
    block held open for all the calls (the op's own cost under the block's policy)."""

    def run(calls: int, clock: Callable[[], float]) -> float:
        if held is None:
            return per_call(fn, calls, clock)
        with policy.default_dtypes(float=held):
            return per_call(fn, calls, clock)

    return run


def measure(timers: list[Timer], rounds: int, calls: int, clock: Callable[[], float]) -> list[Any]:
    """The median seconds per call of each timer, then the median per-round ratio of each later
    timer to the first, over ``rounds`` interleaved rounds (the order rotates every round)."""
    for _ in range(3):  # warm-up: every kernel, each way, compiled
        for t in timers:
            t(max(calls // 10, 1), clock)
    times: list[list[float]] = [[] for _ in timers]
    for r in range(rounds):
        order = list(range(len(timers)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            times[i].append(timers[i](calls, clock))
    ratios = [statistics.median(a / b for a, b in zip(t, times[0], strict=True)) for t in times[1:]]
    return [statistics.median(t) for t in times] + ratios


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: prints the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--float", default="bfloat16", help="the block's default float")
    ap.add_argument("--cpu", action="store_true", help="time with process CPU time")
    args = ap.parse_args(argv)
    clock = time.process_time if args.cpu else time.perf_counter
    print(machine())
    print(
        f"block: `with policy.default_dtypes(float={args.float!r}): op()`; {args.rounds} "
        f"interleaved rounds of {args.calls} calls each, {'CPU' if args.cpu else 'wall'} time\n"
    )
    rows = []
    todo = ops()
    for name, fn in todo.items():
        timers = [timer(fn), timer(in_block(fn, args.float)), timer(fn, held=args.float)]
        a, b, h, ratio, held = measure(timers, args.rounds, args.calls, clock)
        rows.append([name, a * 1e6, b * 1e6, h * 1e6, f"**{ratio:.2f}**", f"{ratio / held:.2f}"])
    first = next(iter(todo.values()))

    def empty() -> None:
        with policy.default_dtypes(float=args.float):
            pass

    _, b, ratio = measure([timer(first), timer(empty)], args.rounds, args.calls, clock)
    rows.append(["empty block (vs the first op)", "", b * 1e6, "", f"{ratio:.2f}", ""])
    headers = [
        "op",
        "alone us",
        "in a block us",
        "in a held block us",
        "block / alone",
        "block / held",
    ]
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
