"""Counts the inputs where ``autocast`` of a JAX unary function differs from heddle's own version.

Run: ``python benchmarks/autocast_unary.py [--all] [NAME ...]``.

For every elementwise unary float function of ``jax.numpy``, ``jax.nn``, ``jax.scipy.special`` and
``jax.scipy.stats``' distributions (with their default parameters) that heddle's namespaces define, on all 65,536 bit
patterns of bfloat16 and of float16 (one array per dtype): ``jax.jit(heddle.autocast(jax_fn))``
against ``jax.jit(heddle_fn)``. A result differs when its bits differ (any NaN matches any NaN).
Prints a markdown table of the functions with a difference (``--all``: every function) and the
seconds the sweep took; ``--primitive-by-primitive`` measures autocast without its known calls
(``heddle/programs/_known.py``), as it was before them. ``NAME`` restricts it to the functions named (``log10``, ``nn.gelu``,
``special.i1``, ``stats.norm.pdf``; ``nn.gelu_exact`` is ``approximate=False``).

``spence`` is left out: JAX's refuses bfloat16 and float16 inputs.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import heddle  # noqa: E402
import heddle.nn  # noqa: E402
import heddle.numpy as hnp  # noqa: E402
import heddle.scipy.special  # noqa: E402
import heddle.scipy.stats  # noqa: E402
from heddle.ops import _nn, _special, _table  # noqa: E402
from heddle.policy._rules import OpClass  # noqa: E402

DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
SLOW = frozenset({"special.spence"})  # JAX refuses bfloat16 and float16
# not elementwise (along an axis, or splitting it)
NOT_ELEMENTWISE = frozenset(
    {"nn.softmax", "nn.log_softmax", "nn.logmeanexp", "nn.glu", "special.softmax",
     "special.log_softmax"}
)  # fmt: skip


def _elementwise(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes one bfloat16 array and gives arrays of its shape (the first bfloat16)."""
    try:
        out = jax.tree.leaves(jax.eval_shape(fn, jax.ShapeDtypeStruct((5,), jnp.bfloat16)))
    except Exception:
        return False
    return bool(out) and all(o.shape == (5,) for o in out) and out[0].dtype == jnp.bfloat16


def functions() -> Iterator[tuple[str, Callable[..., Any], Callable[..., Any]]]:
    """(name, JAX's function, heddle's) for every elementwise unary float function."""
    unary = (OpClass.FLOAT_ONLY, OpClass.INTEGRAL)
    for name, (op_class, _, values) in sorted(_table.OPS.items()):
        if op_class in unary and values in ("all", (0,)) and hasattr(hnp, name):
            yield name, getattr(jnp, name), getattr(hnp, name)
    for name, (_, values, _) in sorted(_nn.FLOAT_OPS.items()):
        if values == ("x",):
            yield f"nn.{name}", getattr(jax.nn, name), getattr(heddle.nn, name)
    yield (
        "nn.gelu_exact",
        functools.partial(jax.nn.gelu, approximate=False),
        functools.partial(heddle.nn.gelu, approximate=False),
    )
    for name in sorted(_nn.CLIP_OPS):
        yield f"nn.{name}", getattr(jax.nn, name), getattr(heddle.nn, name)
    for name, values in sorted(_special.SPECIAL.items()):
        if len(values) == 1 and hasattr(heddle.scipy.special, name):
            yield (
                f"special.{name}",
                getattr(jax.scipy.special, name),
                getattr(heddle.scipy.special, name),
            )
    dists = getattr(heddle.scipy.stats, "_DISTRIBUTIONS", sorted(_special.STATS))
    for dist in dists:
        mine = getattr(heddle.scipy.stats, dist)
        for name in sorted(getattr(mine, "__all__", ())):
            yield (
                f"stats.{dist}.{name}",
                getattr(getattr(jax.scipy.stats, dist), name),
                getattr(mine, name),
            )


def patterns(dtype: np.dtype) -> np.ndarray:
    """All 65,536 values of a 16-bit float format, in bit order."""
    return np.arange(2**16, dtype=np.uint16).view(dtype)


def differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where two arrays of one dtype differ in their bits (any NaN matches any NaN)."""
    bits = np.dtype(f"u{a.dtype.itemsize}")
    out = a.view(bits) != b.view(bits)
    if np.issubdtype(a.dtype, np.inexact) or a.dtype.kind == "V" or "float" in a.dtype.name:
        with np.errstate(invalid="ignore"):
            out &= ~(np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32)))
    return out


def count(jfn: Callable[..., Any], hfn: Callable[..., Any], x: np.ndarray) -> tuple[int, str]:
    """(inputs where an output differs, first examples) of ``autocast(jfn)`` against ``hfn``, both
    jitted."""
    got = [np.asarray(o) for o in jax.tree.leaves(jax.jit(heddle.autocast(jfn))(x))]
    want = [np.asarray(o) for o in jax.tree.leaves(jax.jit(hfn)(x))]
    kinds = [o.dtype for o in got], [o.dtype for o in want]
    if kinds[0] != kinds[1]:
        return -1, f"dtypes {kinds[0]} vs {kinds[1]}"
    bad = np.flatnonzero(np.any([differ(g, w) for g, w in zip(got, want, strict=True)], axis=0))
    g, w = got[0], want[0]
    ex = ", ".join(f"{float(x[i]):.6g}: {float(g[i]):.6g} vs {float(w[i]):.6g}" for i in bad[:2])
    return int(bad.size), ex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="list every function, not only differences")
    ap.add_argument(
        "--primitive-by-primitive",
        action="store_true",
        help="autocast without its known calls (heddle/programs/_known.py): every equation under "
        "its rule, as before they were recognised",
    )
    ap.add_argument("names", nargs="*", help="only these functions")
    args = ap.parse_args()
    if args.primitive_by_primitive:
        from heddle.programs import _known

        _known.calls = lambda *a, **k: None
    start = time.perf_counter()
    xs = {d: patterns(d) for d in DTYPES}
    print("| function | bfloat16 | float16 | e.g. (input: autocast vs heddle) |")
    print("|---|---:|---:|---|")
    swept = 0
    for name, jfn, hfn in functions():
        if (args.names and name not in args.names) or name in SLOW or name in NOT_ELEMENTWISE:
            continue
        if not _elementwise(jfn):
            continue
        swept += 1
        counts, example = [], ""
        for d in DTYPES:
            n, ex = count(jfn, hfn, xs[d])
            counts.append(n)
            example = example or ex
        if args.all or any(counts):
            print(f"| `{name}` | {counts[0]:,} | {counts[1]:,} | {example} |", flush=True)
    print(f"\n{swept} functions, {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
