"""Shared helpers for the ratio benchmarks: medians after warm-up, machine facts, markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


def block(x: Any) -> Any:
    """Waits for every array in ``x``."""
    return jax.block_until_ready(x)


def median_seconds(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    runs: int = 15,
    inner: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median time of ``fn()`` over ``runs`` timed runs of ``inner`` calls each, after warm-up.

    ``clock`` is wall time by default; ``time.process_time`` (this process's CPU time, all threads)
    is the steadier measure on a machine shared with other processes.
    """
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(runs):
        t0 = clock()
        for _ in range(inner):
            out = fn()
        block(out)
        times.append((clock() - t0) / inner)
    return statistics.median(times)


def interleaved_ratio(
    a: Callable[[], Any], b: Callable[[], Any], *, rounds: int = 7, **kw: Any
) -> tuple[float, float, float]:
    """(median time of a, median time of b, median of the per-round ratios a/b), alternating a and b.

    Alternating the two in rounds cancels most of the drift of a shared, noisy machine.
    """
    ta, tb, ratios = [], [], []
    for _ in range(rounds):
        x, y = median_seconds(a, **kw), median_seconds(b, **kw)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """One line naming the machine and versions."""
    import jaxlib
    import ml_dtypes
    import numpy as np

    dev = jax.devices()[0]
    return (
        f"{platform.machine()} {os.cpu_count()} cores ({cpu_model()}), "
        f"{dev.platform}:{dev.device_kind}; Python {platform.python_version()}, jax "
        f"{jax.__version__}, jaxlib {jaxlib.__version__}, numpy {np.__version__}, "
        f"ml_dtypes {ml_dtypes.__version__}"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        return f"{c:.3g}"
    return str(c)


def update_doc(path: str, text: str, marker: str) -> None:
    """Replaces the text between ``<!-- {marker}:begin -->`` and ``<!-- {marker}:end -->`` in ``path``."""
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    head, rest = doc.split(begin)
    _, tail = rest.split(end)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + text + end + tail)
