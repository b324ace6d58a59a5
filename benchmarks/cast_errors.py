"""Counts wrong casts of XLA's convert, ml_dtypes' astype and heddle's astype.

Run: ``python benchmarks/cast_errors.py [--random LOG2] [--all]``.

Every (source, target) pair of real dtypes is checked on inputs that exercise rounding: every bit
pattern of the formats of 16 bits or fewer and of the small integers; float32 halfway points of
every narrower format with neighbours 1 and 2 ulps away plus random patterns; float64 halfway points,
neighbours and relative perturbations; integers of 25 to 64 significant bits around halfway points.
The expected result comes from the exact reference of the test suite (``tests/policy/_reference.py``:
integer and Fraction arithmetic on bit patterns, no XLA, no ml_dtypes). A result is wrong when its
bits differ from the reference (any NaN matches any NaN). XLA's convert runs under ``jax.jit`` with
``jax_enable_x64`` on.

Prints a markdown table of the pairs where any of the three is wrong (``--all``: every pair), and a
summary. ``-`` means ml_dtypes refuses the cast.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "policy"))

import _reference as ref  # noqa: E402
import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from _harness import update_doc  # noqa: E402
from jax import lax  # noqa: E402

from heddle.policy._casts import astype, path_name  # noqa: E402
from heddle.policy._dtypes import DTYPES, kind  # noqa: E402

REAL = [d for d in DTYPES if kind(d) != "c"]


def inputs(d: np.dtype, log2_random: int) -> np.ndarray:
    """The test inputs of one source dtype."""
    if d.name in ref.FORMATS and ref.FORMATS[d.name].nbits <= 16:
        return ref.all_patterns(ref.FORMATS[d.name])
    if d == np.float32:
        return ref.float32_cases(1 << log2_random)
    if d == np.float64:
        return ref.float64_cases(per_target=1024)
    if d == np.bool_:
        return np.array([False, True])
    if d.itemsize >= 4:
        return ref.int_cases(d, per_binade=16)
    info = ml_dtypes.iinfo(d)
    return np.arange(int(info.min), int(info.max) + 1).astype(d)


def _ml_dtypes(x: np.ndarray, d: np.dtype) -> np.ndarray | None:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return x.astype(d)
        except (TypeError, ValueError):
            return None


def count(log2_random: int) -> tuple[list[tuple], int]:
    """Rows (source, target, n, xla, ml_dtypes, heddle, heddle path) and the number of values."""
    rows, values = [], 0
    with jax.enable_x64(True):
        for s in REAL:
            x = inputs(s, log2_random)
            xd = jax.device_put(x)
            values += len(x)
            xla = jax.jit(lambda a: [lax.convert_element_type(a, d) for d in REAL])(xd)
            ours = jax.jit(lambda a: [astype(a, d) for d in REAL])(xd)
            for d, got_xla, got_ours in zip(REAL, xla, ours, strict=True):
                want = ref.reference_cast(x, d.name)
                ml = _ml_dtypes(x, d)
                n_ml = None if ml is None else int(ref.mismatches(ml, want).sum())
                rows.append(
                    (
                        s.name,
                        d.name,
                        len(x),
                        int(ref.mismatches(np.asarray(got_xla), want).sum()),
                        n_ml,
                        int(ref.mismatches(np.asarray(got_ours), want).sum()),
                        path_name(s, d),
                    )
                )
            print(f"  {s.name}: {len(x)} values", file=sys.stderr, flush=True)
    return rows, values


def main() -> None:
    """Prints the table (and with ``--update FILE`` writes it into FILE between markers)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=20, help="log2 of the random float32 patterns")
    ap.add_argument("--all", action="store_true", help="print every pair, not only wrong ones")
    ap.add_argument("--update", metavar="FILE", help="write the table into FILE between markers")
    args = ap.parse_args()
    start = time.perf_counter()
    rows, values = count(args.random)
    dev = jax.devices()[0]
    lines = [
        f"Measured by `python benchmarks/cast_errors.py`: jax {jax.__version__}, ml_dtypes "
        f"{ml_dtypes.__version__}, numpy {np.__version__}, {dev.platform} ({dev.device_kind}), "
        f"{platform.machine()}; {len(rows)} pairs, {values} source values, "
        f"{time.perf_counter() - start:.0f} s.",
        "",
        "| source | target | values | XLA convert wrong | ml_dtypes astype wrong | heddle wrong "
        "| heddle path |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, d, n, a, b, c, path in rows:
        if args.all or a or b or c:
            lines.append(f"| {s} | {d} | {n} | {a} | {'-' if b is None else b} | {c} | {path} |")
    wrong = [sum(1 for r in rows if r[i]) for i in (3, 4, 5)]
    lines += [
        "",
        f"Pairs with wrong casts: XLA convert {wrong[0]}, ml_dtypes astype {wrong[1]}, "
        f"heddle {wrong[2]} (of {len(rows)}; `-`: ml_dtypes refuses the cast, "
        f"{sum(1 for r in rows if r[4] is None)} pairs).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.update:
        update_doc(args.update, text, "cast_errors")


if __name__ == "__main__":
    main()
