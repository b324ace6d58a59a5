"""Narrow contractions: heddle against jax.numpy's defaults and hand-written float32 accumulation.

A matrix of shapes (square 256-2048, skinny, batched, a 3-D lhs and a vmapped lhs with an unbatched
weight, NHWC 3x3 convolution, einsum attention, an MLP's gradient), forward and forward+backward,
bfloat16 and float16. Per row: heddle, jax.numpy's defaults (narrow result, XLA's own accumulation)
and the explicit code a careful user writes (``preferred_element_type=float32``, one rounding),
timed in interleaved rounds in one process (heddle, jax.numpy, explicit in turn, the order rotated
from round to round so that none always runs first); the ratio is the
median over the odd rounds of heddle's time over the time, in the same round, of the faster of the
other two (the one with the lower median over the even rounds: choosing it on the rounds it is
measured on would bias the ratio of identical programs above 1).

Run: python benchmarks/bench_contractions.py [--quick]
(benchmarks/bench_gpu.py runs the same matrix on a GPU.)
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import block, machine, table
from jax import lax

import heddle.lax as hlax
import heddle.numpy as hnp

F32 = jnp.float32
IMPLS = ("heddle", "jnp", "explicit")


def _explicit_matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=F32).astype(a.dtype)


def _conv(conv: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
    def f(x, w):
        return conv(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), **kw)

    return f


def _explicit_conv(x, w):
    return _conv(lax.conv_general_dilated, preferred_element_type=F32)(x, w).astype(x.dtype)


_ATTN = "bhqd,bhkd->bhqk"
# kind -> the three implementations of one call on the case's operands
KINDS: dict[str, dict[str, Callable[..., Any]]] = {
    "matmul": {"heddle": hnp.matmul, "jnp": jnp.matmul, "explicit": _explicit_matmul},
    "conv": {
        "heddle": _conv(hlax.conv_general_dilated),
        "jnp": _conv(lax.conv_general_dilated),
        "explicit": _explicit_conv,
    },
    "attention": {
        "heddle": lambda q, k: hnp.einsum(_ATTN, q, k),
        "jnp": lambda q, k: jnp.einsum(_ATTN, q, k),
        "explicit": lambda q, k: jnp.einsum(_ATTN, q, k, preferred_element_type=F32).astype(
            q.dtype
        ),
    },
}


def _mlp(impl: str) -> Callable[..., Any]:
    """X @ W1, tanh, @ W2 (each namespace's own matmul and tanh); the loss is the MSE."""
    mm = KINDS["matmul"][impl]
    tanh = {
        "heddle": hnp.tanh,
        "jnp": jnp.tanh,
        "explicit": lambda h: jnp.tanh(h.astype(F32)).astype(h.dtype),
    }[impl]
    return lambda x, w1, w2: mm(tanh(mm(x, w1)), w2)


@dataclasses.dataclass(frozen=True)
class Case:
    """One row family of the matrix: operand shapes, what it computes, whether it is vmapped."""

    shapes: tuple[tuple[int, ...], ...]
    kind: str
    vmapped: bool = False
    quick: bool = False


CASES: dict[str, Case] = {
    **{f"square {n}": Case(((n, n), (n, n)), "matmul", quick=n == 512) for n in (256, 512, 1024)},
    "square 2048": Case(((2048, 2048), (2048, 2048)), "matmul"),
    "skinny 4096x64 @ 64x512": Case(((4096, 64), (64, 512)), "matmul", quick=True),
    "skinny 64x4096 @ 4096x64": Case(((64, 4096), (4096, 64)), "matmul"),
    "batched 16x128x128 @ 16x128x128": Case(((16, 128, 128), (16, 128, 128)), "matmul"),
    "3-D 32x32x64 @ W 64x256": Case(((32, 32, 64), (64, 256)), "matmul"),
    "vmapped 32x[32x64] @ W 64x256": Case(((32, 32, 64), (64, 256)), "matmul", True, True),
    "vmapped 8x[128x512] @ W 512x512": Case(((8, 128, 512), (512, 512)), "matmul", True),
    "conv NHWC 8x32x32x32, 3x3x32x64": Case(((8, 32, 32, 32), (3, 3, 32, 64)), "conv", quick=True),
    "einsum attention 8x4x128x32": Case(
        ((8, 4, 128, 32), (8, 4, 128, 32)), "attention", quick=True
    ),
    "MLP 256x512 @ 512x1024, tanh, @ 1024x10": Case(
        ((256, 512), (512, 1024), (1024, 10)), "mlp", quick=True
    ),
}


def _step(case: Case, impl: str, backward: bool) -> Callable[..., Any]:
    f = _mlp(impl) if case.kind == "mlp" else KINDS[case.kind][impl]
    if case.vmapped:
        f = jax.vmap(f, in_axes=(0,) + (None,) * (len(case.shapes) - 1))
    if not backward:
        return jax.jit(f)
    if case.kind == "mlp":  # the MSE against zero targets
        loss = lambda *a: jnp.mean(jnp.square(f(*a).astype(F32)))
    else:
        loss = lambda *a: jnp.sum(jnp.tanh(f(*a).astype(F32)))
    return jax.jit(jax.grad(loss, argnums=tuple(range(len(case.shapes)))))


def _times(f: Callable[[], Any], runs: int) -> tuple[float, float]:
    """(median wall time, median process CPU time) of ``runs`` calls of ``f``, after one warm-up."""
    block(f())
    wall, cpu = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        block(f())
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _hlo(compiled_text: str) -> str:
    """A whole optimised HLO module (every computation, fused ones included) without its header,
    names and metadata, to compare two programs."""
    # from the first computation on: the header names the module, the tables after it the source
    text = compiled_text[re.search(r"^(%|ENTRY )", compiled_text, flags=re.M).start() :]
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"%[\w.\-]+", "%v", text)
    return re.sub(r"[\w.\-]+(?=: [a-z0-9]+\[)", "p", text)  # parameter names in signatures


def row(name: str, dtype: Any, backward: bool, rounds: int, budget_s: float) -> list[Any]:
    """One row: case, dtype, pass, wall us of each, which program heddle's equals, the ratios."""
    case = CASES[name]
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal(s) / np.sqrt(s[-1]), dtype) for s in case.shapes]
    fns = [_step(case, impl, backward) for impl in IMPLS]
    hlo = [_hlo(f.lower(*args).compile().as_text()) for f in fns]
    same = "+".join(i for i, h in zip(IMPLS[1:], hlo[1:], strict=True) if h == hlo[0]) or "-"
    for f in fns:  # compile and warm up; heddle's call sets how many runs fit the budget
        block(f(*args))
    t0 = time.perf_counter()
    block(fns[0](*args))
    runs = int(min(15, max(3, budget_s / max(time.perf_counter() - t0, 1e-6))))
    wall: list[list[float]] = [[], [], []]
    cpu: list[list[float]] = [[], [], []]
    for r in range(rounds):
        for i in (r % 3, (r + 1) % 3, (r + 2) % 3):  # each program first in a third of the rounds
            w, c = _times(lambda f=fns[i]: f(*args), runs)
            wall[i].append(w)
            cpu[i].append(c)

    def faster(t: list[list[float]]) -> int:
        # the faster alternative, chosen on the even rounds and measured on the odd ones: a choice
        # made on the rounds it is measured on (or a per-round minimum of the two) is biased low,
        # so a program identical to both would measure above 1
        return 1 if statistics.median(t[1][::2]) <= statistics.median(t[2][::2]) else 2

    def ratio(t: list[list[float]]) -> float:
        best = t[faster(t)]
        return statistics.median(a / b for a, b in zip(t[0][1::2], best[1::2], strict=True))

    us = [f"{statistics.median(t) * 1e6:.0f}" for t in wall]
    kind = "fwd+bwd" if backward else "fwd"
    best = f"{IMPLS[faster(wall)]}, {IMPLS[faster(cpu)]}"
    return [name, jnp.dtype(dtype).name, kind, *us, same, best, ratio(wall), ratio(cpu)]


HEADERS = [
    "case",
    "dtype",
    "pass",
    "heddle us",
    "jnp us",
    "explicit us",
    "heddle's HLO equals",
    "faster alternative (wall, CPU)",
    "heddle / best (wall)",
    "heddle / best (CPU time)",
]


def matrix(
    quick: bool, rounds: int, budget_s: float, names: list[str] | None = None
) -> list[list[Any]]:
    """Every row of the matrix (``quick``: the rows marked quick, bfloat16 only; ``names``: only
    those cases)."""
    if names is None:
        names = [n for n, c in CASES.items() if c.quick or not quick]
    dtypes = [jnp.bfloat16] if quick else [jnp.bfloat16, jnp.float16]
    return [
        row(n, d, bwd, rounds, budget_s)
        for n in names
        for d in dtypes
        for bwd in ((True,) if CASES[n].kind == "mlp" else (False, True))
    ]


def summary(rows: list[list[Any]], col: int = -1, what: str = "CPU time") -> str:
    """The targets, on column ``col``: every row <= 1.05, the median row <= 1.0."""
    r = [x[col] for x in rows]
    worst = max(rows, key=lambda x: x[col])
    over = [f"{x[0]} {x[1]} {x[2]} ({x[col]:.3g}, HLO = {x[6]})" for x in rows if x[col] > 1.05]
    own = [x[col] for x in rows if x[6] == "-"]
    same = len(rows) - len(own)
    # a row whose optimised HLO is the faster alternative's runs the same compiled program: a tie
    ties = [x[6] != "-" and x[7].split(", ")[col == -1] in x[6].split("+") for x in rows]
    measured = [x[col] for x, tie in zip(rows, ties, strict=True) if not tie]
    settled = [1.0 if tie else x[col] for x, tie in zip(rows, ties, strict=True)]
    return (
        f"{what}: median row {statistics.median(r):.3f} (target <= 1.0), worst {max(r):.3f} "
        f"({worst[0]}, {worst[1]}, {worst[2]}; target <= 1.05); {len(r)} rows, "
        f"{len(over)} over 1.05{': ' + '; '.join(over) if over else ''}. {same} rows compile to "
        f"the same optimised HLO as jax.numpy's or the explicit program (their ratio is 1 but for "
        f"noise); the {len(own)} rows where heddle's program is its own: median "
        f"{statistics.median(own) if own else float('nan'):.3f}, worst "
        f"{max(own) if own else float('nan'):.3f}. Counting the {sum(ties)} rows whose program "
        f"is the faster alternative's own as ties (1.0): median row {statistics.median(settled):.3f}, "
        f"worst {max(settled):.3f}; the {len(measured)} rows measured against another program: "
        f"median {statistics.median(measured) if measured else float('nan'):.3f}, worst "
        f"{max(measured) if measured else float('nan'):.3f}."
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="a few rows, bfloat16, 3 rounds: a smoke run"
    )
    args = ap.parse_args(argv)
    rounds, budget = (4, 0.05) if args.quick else (12, 0.07)
    t0 = time.perf_counter()
    rows = matrix(args.quick, rounds, budget)
    print(f"# Narrow contractions{' (--quick)' if args.quick else ''}\n\nMachine: {machine()}\n")
    print(table(HEADERS, rows))
    print(f"\n{summary(rows)}\n\n{summary(rows, -2, 'Wall time')}\n")
    print(
        f"Interleaved rounds: {rounds} (heddle, jnp, explicit in turn, the order rotated each "
        f"round); each a median of 3-15 runs "
        f"(about {budget:.2g} s of heddle per round); the faster alternative (jnp or explicit) is "
        f"the one with the lower median over the even rounds; ratio: median over the odd rounds "
        f"of heddle's time over that round's time of the faster alternative. "
        f"{time.perf_counter() - t0:.0f} s in all."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
