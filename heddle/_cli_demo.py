"""``python -m heddle demo``: train the digits MLP in five precision regimes and compare.

Prints a progress bar to stderr, then a table to stdout (final loss, test accuracy, steps/s, steps
with NaN/inf gradients, skipped steps, final loss scale) and writes a PNG of the loss curves and the
loss scale over time (when matplotlib is installed). The training itself lives in ``heddle.demo``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from heddle._cli_common import usage_error

_BAR = 24


class Progress:
    """A plain-text progress bar on a stream: redrawn in place on a terminal, one line otherwise.

    Args:
      stream: where to write (stderr by default).

    Examples:
      >>> import io
      >>> from heddle._cli_demo import Progress
      >>> out = io.StringIO()
      >>> p = Progress(out)
      >>> p("float32", "heddle", 10, 10)
      >>> "float32" in out.getvalue() and "10/10" in out.getvalue()
      True
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()

    def __call__(self, regime: str, backend: str, done: int, total: int) -> None:
        """Shows ``done`` of ``total`` steps of one run."""
        if done == total or self.tty:
            fill = _BAR * done // max(total, 1)
            line = (
                f"{regime:<12} {backend:<7} [{'#' * fill}{'.' * (_BAR - fill)}] "
                f"{done}/{total} steps  {time.perf_counter() - self.start:6.1f}s"
            )
            end = "\n" if done == total else ""
            self.stream.write(("\r" if self.tty else "") + line + end)
            self.stream.flush()


def _scale_text(scale: float) -> str:
    exponent = math.log2(scale) if scale > 0 else math.nan
    return f"2^{exponent:.0f}" if exponent == int(exponent) else f"{scale:g}"


def format_table(results: Sequence[Any]) -> str:
    """The comparison table, one row per run.

    Args:
      results: ``heddle.demo.Result`` objects.

    Returns:
      The table as aligned plain text, header first.
    """
    header = (
        "regime",
        "backend",
        "final loss",
        "test acc %",
        "steps/s",
        "NaN/inf steps",
        "skipped",
        "final scale",
    )
    rows = [header]
    for r in results:
        rows.append(
            (
                r.regime,
                r.backend,
                f"{r.final_loss:.4f}",
                f"{r.accuracy:.2f}",
                f"{r.steps_per_s:.0f}",
                str(r.nonfinite),
                "-" if r.skipped is None else str(r.skipped),
                "-" if r.final_scale is None else _scale_text(r.final_scale),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _minor_label(value: float, _: Any) -> str:
    """Labels the minor ticks 2, 3 and 5 of each decade of a log axis."""
    if value <= 0:
        return ""
    lead = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(lead, 6) in (2.0, 3.0, 5.0) else ""


def plot(results: Sequence[Any], path: str) -> str | None:
    """Writes the loss curves and the loss scale over time to a PNG.

    Args:
      results: ``heddle.demo.Result`` objects.
      path: the PNG file to write.

    Returns:
      The absolute path written, or None when matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FormatStrFormatter, FuncFormatter
    except ImportError:
        return None
    import numpy as np

    from heddle.demo import REGIMES

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    loss_ax, scale_ax = fig.subplots(1, 2)
    colours = dict(zip(REGIMES, ("C0", "C3", "C2", "C1", "C4"), strict=True))
    for r in results:
        window = max(1, len(r.losses) // 50)
        smooth = np.convolve(r.losses, np.ones(window) / window, mode="valid")
        style = "-" if r.backend == "heddle" else "--"
        label = f"{r.regime} ({r.backend})"
        loss_ax.plot(
            np.arange(len(smooth)) + window,
            smooth,
            style,
            color=colours.get(r.regime),
            label=label,
            linewidth=1.2,
        )
        if r.final_scale is not None:
            scale_ax.step(
                np.arange(1, len(r.scales) + 1),
                r.scales,
                style,
                color=colours.get(r.regime),
                label=label,
                where="post",
            )
    smoothing = f" (moving mean over {window} steps)" if window > 1 else ""
    loss_ax.set(
        yscale="log",
        xlabel="step",
        ylabel=f"training loss{smoothing}",
        title="Loss: solid heddle, dashed plain jax.numpy",
    )
    loss_ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    loss_ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    loss_ax.legend(fontsize=7, ncol=2)
    scale_ax.set_yscale("log", base=2)
    scale_ax.set(xlabel="step", ylabel="loss scale", title="Dynamic loss scale (float16)")
    if scale_ax.get_legend_handles_labels()[0]:
        scale_ax.legend(fontsize=7)
    else:
        scale_ax.text(
            0.5, 0.5, "no loss-scaled regime run", ha="center", transform=scale_ax.transAxes
        )
    FigureCanvasAgg(fig).print_png(path)
    return os.path.abspath(path)


def run(args: argparse.Namespace) -> int:
    """Runs ``demo`` for parsed arguments; returns the exit status (0, or 2 for a usage error)."""
    from heddle import demo

    regimes = [r.strip() for r in args.regimes.split(",") if r.strip()]
    unknown = [r for r in regimes if r not in demo.REGIMES]
    if unknown or not regimes:
        return usage_error(
            f"demo --regimes {args.regimes!r}: unknown regime {', '.join(unknown) or '(none)'}."
            f" Use a comma-separated list of: {','.join(demo.REGIMES)}"
        )
    if args.steps < 1:
        return usage_error(
            f"demo --steps {args.steps}: need at least 1 step. Use e.g. --steps 2000"
        )
    cfg = demo.Config(steps=args.steps, seed=args.seed)
    backends = demo.BACKENDS if args.backends == "both" else (args.backends,)
    start = time.perf_counter()
    try:
        results = demo.run(cfg, regimes, backends, progress=Progress())
    except ImportError as e:
        return usage_error(str(e))
    print(format_table(results))
    print()
    for name in regimes:
        print(f"  {name:<12} {demo.REGIMES[name].description}")
    print(
        f"\n{len(results)} runs of {cfg.steps} steps in {time.perf_counter() - start:.0f}s "
        "(final loss: mean over the last 10% of the steps)"
    )
    if args.output.lower() == "none":
        return 0
    written = plot(results, args.output)
    if written is None:
        print("matplotlib is not installed, so no plot was written (pip install matplotlib)")
    else:
        print(f"loss curves and loss scale written to {written}")
    return 0


def add_demo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``demo`` subcommand on ``subparsers`` (from ``add_subparsers``).

    Args:
      subparsers: the object ``ArgumentParser.add_subparsers()`` returned.

    Returns:
      The subcommand's parser; its defaults set ``run`` to the function that executes it.

    Examples:
      >>> import argparse
      >>> from heddle._cli_demo import add_demo_parser
      >>> parser = argparse.ArgumentParser(prog="python -m heddle")
      >>> _ = add_demo_parser(parser.add_subparsers(dest="command"))
      >>> parser.parse_args(["demo", "--steps", "50"]).steps
      50
    """
    from heddle.demo import REGIMES, Config

    regime_help = "; ".join(f"{r.name}: {r.description}" for r in REGIMES.values())
    p = subparsers.add_parser(
        "demo",
        help="train a small model in five precision regimes, with heddle and with jax.numpy",
        description=(
            "Train a 64-128-10 MLP on scikit-learn's digits (no download) with momentum SGD in five "
            "precision regimes, each with heddle and with plain jax.numpy, then print a table "
            "(final loss, test accuracy, steps/s, steps with NaN/inf gradients, skipped steps, "
            "final loss scale) and write a PNG of the loss curves and the loss scale over time. "
            f"Regimes: {regime_help}."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = Config()
    p.add_argument("--steps", type=int, default=defaults.steps, help="training steps per run")
    p.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of the initial weights and the batch order",
    )
    p.add_argument(
        "--output", default="heddle-demo.png", help="PNG file for the plot ('none' to skip it)"
    )
    p.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regimes to run")
    p.add_argument(
        "--backends",
        choices=("both", "heddle", "jax"),
        default="both",
        help="run with heddle, with plain jax.numpy, or both",
    )
    p.set_defaults(run=run)
    return p
