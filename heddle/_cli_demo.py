"""``python -m heddle demo``: train one small model in several precision regimes, heddle vs jax.

Prints a progress bar to stderr, then a table to stdout (the precision setup of each run, training
and held-out loss, held-out accuracy, steps/s after warm-up, steps with NaN/inf gradients, skipped
steps, final loss scale), a line that says where plain JAX and heddle differ, and writes a PNG of
the loss curves, the losses against float32 and the loss scale (when matplotlib is installed).
The training itself lives in ``heddle._demo``, which only this module imports.
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


COLUMNS = (
    "regime",
    "backend",
    "precision",
    "train loss",
    "train - f32",
    "held-out loss",
    "held-out - f32",
    "held-out acc %",
    "steps/s (warm)",
    "NaN/inf steps",
    "skipped",
    "final scale",
)
"""The table's header."""


def _reference(results: Sequence[Any]) -> Any:
    return next((r for r in results if r.regime == "float32"), None)


def format_table(results: Sequence[Any], regimes: dict[str, Any] | None = None) -> str:
    """The comparison table, one row per run.

    Args:
      results: ``heddle._demo.Result`` objects.
      regimes: the model's ``Regime`` s by name, for the precision column (``heddle._demo.REGIMES``,
        the ``mlp`` model's, if None).

    Returns:
      The table as aligned plain text, header first. ``train - f32`` and ``held-out - f32`` are the
      run's losses minus the float32 run's (``-`` without a float32 run, and on its own row).
    """
    from heddle._demo import REGIMES

    regimes = REGIMES if regimes is None else regimes
    ref = _reference(results)
    rows = [COLUMNS]
    for r in results:
        regime = regimes.get(r.regime)
        precision = regime.precision + (" + loss scale" if regime.scaled else "") if regime else "?"
        same = ref is None or r is ref
        d_train = "-" if same else f"{r.final_loss - ref.final_loss:+.4f}"
        d_held = "-" if same else f"{r.eval_loss - ref.eval_loss:+.4f}"
        rows.append(
            (
                r.regime,
                r.backend,
                precision,
                f"{r.final_loss:.4f}",
                d_train,
                f"{r.eval_loss:.4f}",
                d_held,
                f"{r.accuracy:.2f}",
                f"{r.steps_per_s:.0f}",
                str(r.nonfinite),
                "-" if r.skipped is None else str(r.skipped),
                "-" if r.final_scale is None else _scale_text(r.final_scale),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def explain_char(cfg: Any, data: Any, backends: Sequence[str]) -> str:
    """The line under the ``char`` model's table: which op differs, what each backend computed.

    Args:
      cfg: the run's ``heddle._demo.Config``.
      data: ``heddle._demo.load_text()``'s output.
      backends: the backends of the ``bf16`` runs made.

    Returns:
      One line: the embedding gradient's scatter-add, its size, and its relative error against
      float32 at the first step with each backend.
    """
    import numpy as np

    from heddle import _demo as demo

    lookups = cfg.batch * cfg.context
    space = float(np.mean(data[0] == demo.VOCAB.index(" "))) * 100
    errors = ", ".join(
        f"{b} {demo.gradient_error('bf16', b, cfg, 'embed', data):.3f}" for b in backends
    )
    return (
        f"Why bf16 differs: the embedding's gradient is a scatter-add of {cfg.batch:,} x "
        f"{cfg.context} = {lookups:,} lookups into {len(demo.VOCAB)} rows (' ' is {space:.0f}% of "
        "them); jax.numpy adds them in bfloat16, where a sum stops growing once it is about 2^8 "
        "times a lookup's contribution, heddle in float32, rounded once. Relative error of that "
        f"gradient against float32 at step 1: {errors}."
    )


def _minor_label(value: float, _: Any) -> str:
    """Labels the minor ticks 2, 3 and 5 of each decade of a log axis."""
    if value <= 0:
        return ""
    lead = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(lead, 6) in (2.0, 3.0, 5.0) else ""


_COLOURS = ("black", "C0", "C3", "C2", "C1", "C4", "C5")
_SCALE_COLOURS = {"heddle": "C2", "jax": "C1", "autocast": "C4"}


def _plot_scales(ax: Any, results: Sequence[Any], colours: dict, styles: dict) -> None:
    """One staircase per loss-scaled run: the scale in effect after each step, 0 to the last.

    ``Result.scales`` holds the scale each step used; the scale after the last step is
    ``final_scale`` (the table's column), so the staircase ends on the table's value. Runs whose
    staircases coincide for most steps are told apart by colour (one per backend), line style and
    a value written at each end; a skipped step (the scale halved) is marked with an x.
    """
    import numpy as np

    ax.set_yscale("log", base=2)
    ax.set(
        xlabel="step",
        ylabel="loss scale after the step",
        title="Dynamic loss scale (float16)",
    )
    regimes = {r.regime for r in results}
    for r in results:
        after = np.append(np.asarray(r.scales, np.float64), r.final_scale)  # after steps 0..N
        steps = np.arange(len(after))
        # one regime (the demo's f16-scaled): a colour per backend; several: the regime's colour
        one = len(regimes) == 1 and r.backend in _SCALE_COLOURS
        colour = _SCALE_COLOURS[r.backend] if one else colours[r.regime]
        end = _scale_text(r.final_scale)
        name = r.backend if len(regimes) == 1 else f"{r.regime} ({r.backend})"
        ax.step(
            steps,
            after,
            styles.get(r.backend, ":"),
            color=colour,
            linewidth=2.4 if r.backend == "heddle" else 1.4,
            alpha=0.7 if r.backend == "heddle" else 1.0,
            label=f"{name}: {r.skipped} skipped, ends at {end}",
            where="post",
            zorder=2 if r.backend == "heddle" else 3,
        )
        halved = np.flatnonzero(after[1:] < after[:-1]) + 1
        if len(halved):
            ax.plot(steps[halved], after[halved], "x", color=colour, markersize=7, zorder=4)
        ax.plot(steps[-1], after[-1], "o", color=colour, markersize=4, zorder=4)
        exponent = math.log2(r.final_scale) if r.final_scale > 0 else math.nan
        ax.annotate(
            f"$2^{{{exponent:.0f}}}$" if exponent == int(exponent) else end,
            (steps[-1], after[-1]),
            xytext=(8, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=colour,
        )
    if results:
        ax.set_xlim(right=max(len(r.scales) for r in results) * 1.2)
        ax.margins(y=0.12)


def plot(results: Sequence[Any], path: str, title: str = "", dpi: int = 100) -> str | None:
    """Writes the loss curves, the losses against float32 and the loss scale to a PNG.

    Each regime has one colour; heddle's run is solid, plain jax.numpy's dashed.

    Args:
      results: ``heddle._demo.Result`` objects.
      path: the PNG file to write.
      title: the figure's title.
      dpi: dots per inch (the figure is 14 x 4.5 inches).

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

    fig = Figure(figsize=(14, 4.5), dpi=dpi, layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10)
    loss_ax, bar_ax, scale_ax = fig.subplots(1, 3, width_ratios=(5, 4, 3))
    names = list(dict.fromkeys(r.regime for r in results))
    colours = dict(zip(names, _COLOURS * 2, strict=False))
    styles = {"heddle": "-", "jax": "--"}
    window, tops, lows, scaled = 1, [], [], []
    for r in results:
        window = max(1, len(r.losses) // 30)
        smooth = np.convolve(r.losses, np.ones(window) / window, mode="valid")
        label = f"{r.regime} ({r.backend})"
        reference = r.regime == "float32"
        loss_ax.plot(
            np.arange(len(smooth)) + window,
            smooth,
            "-" if reference else styles.get(r.backend, ":"),
            color=colours[r.regime],
            label=label,
            linewidth=2.4 if reference else 1.4,
            alpha=0.5 if reference else 1.0,
            zorder=1 if reference else 2,
        )
        tops.append(smooth[len(smooth) // 8] if len(smooth) else np.nan)
        lows.append(np.nanmin(smooth) if len(smooth) else np.nan)
        if r.final_scale is not None:
            scaled.append(r)
    smoothing = f" (mean of {window} steps)" if window > 1 else ""
    loss_ax.set(
        xlabel="step",
        ylabel=f"training loss, nats{smoothing}",
        title="Training loss: solid heddle, dashed plain jax.numpy",
    )
    tops, lows = [t for t in tops if np.isfinite(t)], [t for t in lows if np.isfinite(t)]
    top, low = (max(tops), min(lows)) if tops and lows else (0.0, 0.0)
    if top > low > 0:
        if top / low > 3:  # a wide range (the MLP's): a log axis
            loss_ax.set_yscale("log")
            loss_ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            loss_ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
        loss_ax.set_ylim(low * 0.98, top)  # the first eighth of the steps is off the top
    loss_ax.legend(fontsize=7, ncol=2)

    ref = _reference(results)
    others = [r for r in results if r is not ref]
    if ref is not None and others:
        x = np.arange(len(others))
        for offset, what, value, alpha in (
            (-0.2, "training (last 10% of steps)", lambda r: r.final_loss, 1.0),
            (0.2, "held-out", lambda r: r.eval_loss, 0.45),
        ):
            deltas = [value(r) - value(ref) for r in others]
            bars = bar_ax.bar(
                x + offset,
                deltas,
                width=0.4,
                color=[colours[r.regime] for r in others],
                alpha=alpha,
                label=what,
            )
            for bar, r, d in zip(bars, others, deltas, strict=True):
                if r.backend != "heddle":
                    bar.set_hatch("//")
                    bar.set_edgecolor("white")
                # the table's value, written along the bar: one bar's width apart, never overprinted
                bar_ax.annotate(
                    f"{d:+.4f}",
                    (bar.get_x() + bar.get_width() / 2, d),
                    xytext=(0, 2 if d >= 0 else -2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if d >= 0 else "top",
                    rotation=90,
                    fontsize=6.5,
                )
        # a long regime name broken at its hyphen, so neighbouring labels do not run together
        names = [r.regime.replace("-", "-\n") if len(r.regime) > 8 else r.regime for r in others]
        bar_ax.set_xticks(x, [f"{n}\n{r.backend}" for n, r in zip(names, others, strict=True)],
                          fontsize=7)  # fmt: skip
        bar_ax.axhline(0, color="black", linewidth=0.8)
        bar_ax.set(
            ylabel="loss - float32's, nats",
            title="Loss - float32's: left bar training, right held-out\n(hatched: jax.numpy)",
        )
        values = [
            v(r) - v(ref) for r in others for v in (lambda r: r.final_loss, lambda r: r.eval_loss)
        ]
        values = [v for v in values if np.isfinite(v)]
        if values:  # room for the labels: about a quarter of the span above and below
            low, high = min(0.0, *values), max(0.0, *values)
            pad = max(high - low, 1e-3) * 0.28
            bar_ax.set_ylim(low - pad, high + pad)
    else:
        bar_ax.text(0.5, 0.5, "no float32 run to compare", ha="center", transform=bar_ax.transAxes)
    _plot_scales(scale_ax, scaled, colours, styles)
    if scaled:
        scale_ax.legend(fontsize=7, loc="upper left")
    else:
        scale_ax.text(
            0.5, 0.5, "no loss-scaled regime run", ha="center", transform=scale_ax.transAxes
        )
    FigureCanvasAgg(fig).print_png(path)
    return os.path.abspath(path)


BACKEND_NAMES = ("heddle", "autocast", "jax")
"""The keys of ``heddle._demo.BACKENDS`` (named here so that ``--help`` does not import JAX)."""


def _select(model: Any, regimes: str | None, backends: str) -> tuple[list, str | None]:
    """The runs the options select, or ``([], error)``."""
    names = list(model.regimes) if regimes is None else [r.strip() for r in regimes.split(",")]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in model.regimes]
    if unknown or not names:
        return [], (
            f"demo --model {model.name} --regimes {regimes!r}: unknown regime "
            f"{', '.join(unknown) or '(none)'}. Use a comma-separated list of: "
            f"{','.join(model.regimes)}"
        )
    runs = [(r, b) for r, b in model.runs if r in names and backends in ("all", "both", b)]
    if not runs:
        made = ",".join(sorted({b for r, b in model.runs if r in names}))
        return [], (
            f"demo --model {model.name} --regimes {regimes!r} --backends {backends}: no run of "
            f"these regimes uses that backend. Use --backends all (they run with: {made})"
        )
    return runs, None


def run(args: argparse.Namespace) -> int:
    """Runs ``demo`` for parsed arguments; returns the exit status (0, or 2 for a usage error)."""
    from heddle import _demo as demo

    model = demo.MODELS[args.model]
    runs, error = _select(model, args.regimes, args.backends)
    if error:
        return usage_error(error)
    steps = model.config.steps if args.steps is None else args.steps
    if steps < 1:
        return usage_error(
            f"demo --steps {steps}: need at least 1 step. Use e.g. --steps {model.config.steps}"
        )
    if args.batch is not None and args.batch < 1:
        return usage_error(
            f"demo --batch {args.batch}: need at least 1 example per step. "
            f"Use e.g. --batch {model.config.batch}"
        )
    batch = model.config.batch if args.batch is None else args.batch
    cfg = demo.Config.defaults(model.name, steps=steps, seed=args.seed, batch=batch)
    start = time.perf_counter()
    try:
        data = model.load()
        progress = Progress()
        results = [
            demo.train(r, b, cfg, data, lambda done, r=r, b=b: progress(r, b, done, cfg.steps))
            for r, b in runs
        ]
    except (ImportError, FileNotFoundError) as e:
        return usage_error(str(e))
    print(f"{model.name}: {model.description}; seed {cfg.seed}, {cfg.steps} steps of {cfg.batch}")
    print()
    print(format_table(results, model.regimes))
    print()
    bf16 = [r.backend for r in results if r.regime == "bf16"]
    if model.name == "char" and bf16:
        print(explain_char(cfg, data, bf16))
    elif model.name == "mlp":
        print(
            "On CPU, XLA accumulates this MLP's dots in float32 whichever namespace calls them, "
            "so heddle and jax.numpy train it alike; --model char shows where they differ."
        )
    print()
    for name in dict.fromkeys(r for r, _ in runs):
        print(f"  {name:<12} {model.regimes[name].description}")
    for b in dict.fromkeys(b for _, b in runs):
        print(f"  {b:<12} {demo.BACKENDS[b]}")
    warm = min(cfg.chunk, cfg.steps)
    print(
        f"\n{len(results)} runs of {cfg.steps} steps in {time.perf_counter() - start:.0f}s. "
        "train loss: mean over the last 10% of the steps; held-out loss and accuracy: the "
        "regime's own forward pass on held-out data; steps/s (warm): training steps per second "
        f"after each run's first chunk of {warm} steps (its warm-up), compilation excluded"
    )
    if args.output.lower() == "none":
        return 0
    title = f"python -m heddle demo --model {model.name} --seed {cfg.seed}: {model.description}"
    written = plot(results, args.output, title)
    if written is None:
        print("matplotlib is not installed, so no plot was written (pip install matplotlib)")
    else:
        print(f"loss curves, losses against float32 and loss scale written to {written}")
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
    from heddle._demo_catalog import CATALOG  # --help imports no JAX

    models = "; ".join(
        f"{name}: {m.description}, regimes {', '.join(m.regimes)}, {m.steps} steps"
        for name, m in CATALOG.items()
    )
    p = subparsers.add_parser(
        "demo",
        help="train a small model in several precision regimes, with heddle and with jax.numpy",
        description=(
            "Train a small model from data that ships with Python or scikit-learn (no download) "
            "with momentum SGD in several precision regimes, each with heddle and with plain "
            "jax.numpy, then print a table (precision, training and held-out loss, held-out "
            "accuracy, steps/s after warm-up, steps with NaN/inf gradients, skipped steps, final "
            "loss scale) and write a PNG of the loss curves, the losses against float32 "
            f"and the loss scale. Models: {models}."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", choices=tuple(CATALOG), default="char", help="the model to train")
    # "%(default).0s" prints nothing: where the default is the model's, the help says so in words
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps per run (default: the model's%(default).0s)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="examples per step (default: the model's%(default).0s)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the initial weights and the batch order"
    )
    p.add_argument(
        "--output", default="heddle-demo.png", help="PNG file for the plot ('none' to skip it)"
    )
    p.add_argument(
        "--regimes",
        default=None,
        help="comma-separated regimes to run (default: all the model's%(default).0s)",
    )
    p.add_argument(
        "--backends",
        choices=("all", "both", *BACKEND_NAMES),
        default="all",
        help="run with one backend only (heddle's namespaces, heddle.autocast on the jax.numpy "
        "model, plain jax.numpy), or all of them (default; 'both' is the same)",
    )
    p.set_defaults(run=run)
    return p
