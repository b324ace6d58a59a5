"""Runs heddle's ratio benchmarks and prints (or records) their tables.

Usage:
  python benchmarks/run.py                 # every benchmarks/bench_*.py, printed
  python benchmarks/run.py ops casts       # only bench_ops.py and bench_casts.py
  python benchmarks/run.py --update        # also rewrite benchmarks/RESULTS.md

Each benchmark runs in its own process (a fresh JAX), one after another, so they do not share a warm
cache or compete for the cores. Ratios, not absolute times, are the results: each script times heddle
and the alternative in the same process, alternating.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def discover(names: list[str]) -> list[pathlib.Path]:
    """The benchmark scripts to run: all ``bench_*.py``, or those named."""
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        wanted = {f"bench_{n.removeprefix('bench_').removesuffix('.py')}.py" for n in names}
        missing = wanted - {s.name for s in scripts}
        if missing:
            raise SystemExit(
                f"no such benchmark: {', '.join(sorted(missing))}; have {', '.join(s.name for s in scripts)}"
            )
        scripts = [s for s in scripts if s.name in wanted]
    return scripts


def run(script: pathlib.Path, timeout: float) -> tuple[int, str]:
    """Runs one benchmark script; returns (exit code, its output)."""
    r = subprocess.run(
        [sys.executable, script.name], cwd=HERE, capture_output=True, text=True, timeout=timeout
    )
    return r.returncode, r.stdout + (f"\n(stderr)\n{r.stderr[-2000:]}" if r.returncode else "")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument(
        "--update", action="store_true", help="rewrite benchmarks/RESULTS.md with the output"
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    args = ap.parse_args(argv)
    sections, failed = [], 0
    for script in discover(args.names):
        print(f"== {script.name}", flush=True)
        code, out = run(script, args.timeout)
        print(out, flush=True)
        failed += code != 0
        sections.append(
            f"<!-- {script.name} -->\nCommand: `python benchmarks/{script.name}` (exit {code})\n\n{out.strip()}\n"
        )
    if args.update:
        stamp = datetime.date.today().isoformat()
        head = (
            f"# Benchmark results\n\nRecorded {stamp} with `python benchmarks/run.py --update`.\n\n"
        )
        (HERE / "RESULTS.md").write_text(head + "\n".join(sections))
        print(f"wrote {HERE / 'RESULTS.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
