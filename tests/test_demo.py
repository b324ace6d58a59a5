"""``python -m heddle demo``: its claim, the table, the plot, the options, errors and fixes."""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import re
import resource
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from heddle import _demo as demo
from heddle._cli_demo import COLUMNS, Progress, add_demo_parser, format_table, plot

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The separation the demo claims, checked on a shorter run of the char model (60 of its 150 steps;
# the full demo's numbers, over 3 seeds, are in docs/mixed-precision.md).
SHORT = {"steps": 60}
HEDDLE_BOUND = 0.01  # nats: heddle's bfloat16 run within this of float32's held-out loss
JAX_GAP = 0.05  # nats: plain jax.numpy's bfloat16 run at least this much worse (training loss)
HELD_OUT_GAP = 0.05  # nats: and at least this much on the held-out loss


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m heddle")
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def _demo(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "heddle", "demo", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False,
    )  # fmt: skip


def _rows(stdout: str) -> list[dict[str, str]]:
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("regime"))
    assert tuple(re.split(r"\s{2,}", lines[head].strip())) == COLUMNS
    rows = []
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        rows.append(dict(zip(COLUMNS, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def text():
    return demo.load_text()


@pytest.fixture(scope="module")
def separation(text):
    cfg = demo.Config.defaults("char", **SHORT)
    runs = (("float32", "jax"), ("bf16", "jax"), ("bf16", "heddle"), ("bf16", "autocast"))
    return {(r, b): demo.train(r, b, cfg, text) for r, b in runs}


@pytest.mark.slow
def test_char_bf16_separation_the_demo_claims(separation):
    # The demo's claim: with bfloat16 compute, plain jax.numpy trains the char model measurably
    # worse than float32 (training loss over the last 10% of the steps), and heddle, running the
    # same model code, stays within a bound of it, on the training and the held-out loss.
    f32 = separation["float32", "jax"]
    jax, ours = separation["bf16", "jax"], separation["bf16", "heddle"]
    gaps = {
        "train": (jax.final_loss - f32.final_loss, ours.final_loss - f32.final_loss),
        "held-out": (jax.eval_loss - f32.eval_loss, ours.eval_loss - f32.eval_loss),
    }
    assert gaps["train"][0] >= JAX_GAP, gaps
    assert gaps["held-out"][0] >= HELD_OUT_GAP, gaps
    assert abs(gaps["train"][1]) <= HEDDLE_BOUND and abs(gaps["held-out"][1]) <= HEDDLE_BOUND, gaps
    # heddle.autocast on the unchanged jax.numpy model: the same bound as the heddle namespace
    auto = separation["bf16", "autocast"]
    assert abs(auto.final_loss - f32.final_loss) <= HEDDLE_BOUND, auto.final_loss
    assert abs(auto.eval_loss - f32.eval_loss) <= HEDDLE_BOUND, auto.eval_loss
    assert all(r.nonfinite == 0 for r in separation.values())


@pytest.mark.slow
def test_the_explained_op_is_the_embedding_scatter_add(text):
    # The line under the table: the embedding's gradient (a scatter-add of every lookup into its
    # row) is what plain JAX sums in bfloat16. Against the float32 gradient it is far off with
    # jax.numpy and within a few bfloat16 roundings with heddle.
    cfg = demo.Config.defaults("char", batch=4096)
    jax_error = demo.gradient_error("bf16", "jax", cfg, "embed", text)
    heddle_error = demo.gradient_error("bf16", "heddle", cfg, "embed", text)
    assert jax_error > 0.3 and heddle_error < 0.02, (jax_error, heddle_error)
    # float32 against itself is exact: the measure has no error of its own
    assert demo.gradient_error("float32", "jax", cfg, "embed", text) == 0.0


def test_scatter_add_in_bfloat16_stops_growing():
    # The mechanism in isolation, against exact arithmetic: 10,000 lookups of one row, each with
    # cotangent 0.1 (bfloat16: 0.10009765625); the exact sum is 1000.9765625.
    import jax
    import jax.numpy as jnp

    import heddle.numpy as hnp
    from heddle import autodiff

    rows = jnp.zeros(10_000, jnp.int32)
    ct = jnp.full((10_000, 1), 0.1, jnp.bfloat16)
    table = jnp.zeros((3, 1), jnp.bfloat16)
    exact = 10_000 * float(ct[0, 0])
    plain = jax.vjp(lambda t: jnp.take(t, rows, axis=0), table)[1](ct)[0]
    ours = autodiff.vjp(lambda t: hnp.take(t, rows, axis=0), table)[1](ct)[0]
    assert float(plain[0, 0]) < exact / 10
    assert float(ours[0, 0]) == exact


def test_autocast_run_is_part_of_the_char_demo():
    from heddle import _cli_demo

    assert ("bf16", "autocast") in demo.MODELS["char"].runs
    assert sorted(_cli_demo.BACKEND_NAMES) == sorted(demo.BACKENDS)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "curves.png"
    proc = _demo("--steps", "4", "--batch", "256", "--output", str(out))
    return proc, out


@pytest.mark.slow
def test_table_has_every_run_with_its_precision(short_run):
    proc, _ = short_run
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    model = demo.MODELS["char"]
    assert [(r["regime"], r["backend"]) for r in rows] == list(model.runs)
    assert ("bf16", "jax") in model.runs and ("bf16", "heddle") in model.runs
    for r in rows:
        regime = model.regimes[r["regime"]]
        assert r["precision"].startswith(regime.precision)
        loss, held, acc = (
            float(r["train loss"]),
            float(r["held-out loss"]),
            float(r["held-out acc %"]),
        )
        assert 0 < loss < math.log(96) + 1 and 0 < held < math.log(96) + 1 and 0 <= acc <= 100
        assert float(r["steps/s (warm)"]) > 0 and int(r["NaN/inf steps"]) >= 0
        if regime.scaled:
            assert r["precision"].endswith("+ loss scale")
            assert re.fullmatch(r"2\^\d+", r["final scale"])  # a power of two, shown as one
            assert int(r["skipped"]) >= 0
        else:
            assert r["skipped"] == "-" and r["final scale"] == "-"
        if r["regime"] == "float32":
            assert r["train - f32"] == r["held-out - f32"] == "-"
        else:
            for delta, column in (
                ("train - f32", "train loss"),
                ("held-out - f32", "held-out loss"),
            ):
                expected = float(r[column]) - float(rows[0][column])
                assert math.isclose(float(r[delta]), expected, abs_tol=2e-4)


@pytest.mark.slow
def test_output_explains_the_difference_and_the_timing(short_run):
    proc, out = short_run
    assert "Why bf16 differs: the embedding's gradient is a scatter-add of 256 x 32" in proc.stdout
    assert re.search(
        r"at step 1: jax \d\.\d{3}, heddle \d\.\d{3}, autocast \d\.\d{3}\.", proc.stdout
    )
    assert "steps/s (warm): training steps per second after each run's first chunk" in proc.stdout
    for name, backend in demo.MODELS["char"].runs:
        assert re.search(rf"{name}\s+{backend}\s+\[#+\] 4/4 steps", proc.stderr), (name, backend)
    assert f"written to {out.resolve()}" in proc.stdout
    assert _png_size(out) == (1400, 450)


@pytest.mark.slow
def test_mlp_model_behind_the_flag(capsys, tmp_path):
    args = _parser().parse_args(["demo", "--model", "mlp", "--steps", "30", "--output", "none"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert [(r["regime"], r["backend"]) for r in rows] == [
        (name, backend) for name in demo.REGIMES for backend in ("heddle", "jax")
    ]
    by = {(r["regime"], r["backend"]): r for r in rows}
    # float32 has no dtype decision to make: heddle and jax.numpy train the same model alike
    f32 = [float(by["float32", b]["train loss"]) for b in ("heddle", "jax")]
    assert abs(f32[0] - f32[1]) <= 1e-3 * f32[1]
    assert all(float(r["held-out acc %"]) > 20 for r in rows)  # chance is 10%
    assert "--model char shows where they differ" in out


def test_help_documents_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["demo", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for option in ("--model", "--steps", "--batch", "--seed", "--output", "--regimes",
                   "--backends"):  # fmt: skip
        assert option in text
    for model in demo.MODELS.values():
        for name in model.regimes:
            assert name in text


def test_options_are_parsed():
    args = _parser().parse_args(["demo", "--model", "mlp", "--steps", "7", "--seed", "3",
                                 "--output", "x.png", "--regimes", "float32,f16-scaled",
                                 "--backends", "jax", "--batch", "32"])  # fmt: skip
    assert (args.model, args.steps, args.seed, args.output, args.regimes, args.backends,
            args.batch) == ("mlp", 7, 3, "x.png", "float32,f16-scaled", "jax", 32)  # fmt: skip
    defaults = _parser().parse_args(["demo"])
    assert (defaults.model, defaults.steps, defaults.regimes) == ("char", None, None)


@pytest.mark.parametrize("model", ["char", "mlp"])
@pytest.mark.parametrize("bad", ["float32,bf17", "nope", ","])
def test_unknown_regime_names_the_valid_ones(model, bad, capsys):
    args = _parser().parse_args(["demo", "--model", model, "--regimes", bad, "--output", "none"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert f"--regimes {bad!r}" in err
    fix = err.rsplit(": ", 1)[1].split()[0]
    assert fix.split(",") == list(demo.MODELS[model].regimes)  # exactly the valid names
    parsed = _parser().parse_args(["demo", "--model", model, "--regimes", fix])
    assert parsed.regimes == fix


def test_a_backend_no_selected_run_uses_is_refused_with_the_fix(capsys, tmp_path):
    args = _parser().parse_args(["demo", "--regimes", "float32", "--backends", "heddle"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "no run of these regimes uses that backend" in err and "--backends all" in err
    fixed = _parser().parse_args(["demo", "--regimes", "float32", "--backends", "both",
                                  "--steps", "2", "--batch", "64", "--output", "none"])  # fmt: skip
    assert fixed.run(fixed) == 0
    assert [r["regime"] for r in _rows(capsys.readouterr().out)] == ["float32"]


@pytest.mark.parametrize("flag", ["--steps", "--batch"])
def test_steps_or_batch_below_one_are_refused(flag, capsys):
    args = _parser().parse_args(["demo", flag, "0"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    default = getattr(demo.Config.defaults("char"), flag[2:])
    assert f"{flag} {default}" in err


def test_unknown_model_regime_or_backend_in_the_library():
    with pytest.raises(ValueError, match="not one of"):
        demo.train("float8", "heddle")
    with pytest.raises(ValueError, match="not one of"):
        demo.train("float32", "numpy")
    with pytest.raises(ValueError, match="model 'rnn' is not one of: char, mlp"):
        demo.Config.defaults("rnn")
    with pytest.raises(ValueError, match="not one of the char model's: float32, bf16"):
        demo.run(demo.Config.defaults("char"), runs=[("bf16-mixed", "jax")])


def test_plot_has_one_staircase_per_scaled_run_ending_at_the_tables_scale(tmp_path):
    # Two scaled runs that use the same scales at every step and differ only after the last one
    # (jax's last step overflowed: halved to 2^19; heddle's doubled to 2^21), as in the demo: each
    # gets its own staircase, ending on its final_scale (the table's column), and its own legend.
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from heddle._cli_demo import _plot_scales

    steps = 150
    used = np.float32(2.0**15) * 2.0 ** (np.arange(steps) // 25).astype(np.float32)
    ones = np.ones(steps, np.float32)
    jax_run = demo.Result("f16-scaled", "jax", ones, used, 40.0, 2.0, 5.0, 1.0, 1, 1, 2.0**19)
    ours = dataclasses.replace(
        jax_run, backend="heddle", nonfinite=0, skipped=0, final_scale=2.0**21
    )
    ax = Figure().subplots()
    _plot_scales(ax, [jax_run, ours], {"f16-scaled": "C2"}, {"heddle": "-", "jax": "--"})
    stairs = [line for line in ax.get_lines() if line.get_drawstyle().startswith("steps")]
    assert [line.get_ydata()[-1] for line in stairs] == [2.0**19, 2.0**21]
    assert len({line.get_color() for line in stairs}) == 2  # told apart although they coincide
    labels = [line.get_label() for line in stairs]
    assert labels == ["jax: 1 skipped, ends at 2^19", "heddle: 0 skipped, ends at 2^21"]
    assert sorted(t.get_text() for t in ax.texts) == ["$2^{19}$", "$2^{21}$"]


def test_plot_value_labels_do_not_overlap(tmp_path):
    # The middle panel writes each bar's value; on the demo's 7 runs x 2 bars, no two overlap.
    pytest.importorskip("matplotlib")
    ones = np.ones(10, np.float32)
    ref = demo.Result("float32", "jax", ones * 2.17, ones, 41.5, 2.30, 5.0, 1.0, 0, None, None)
    runs = [ref] + [
        dataclasses.replace(ref, regime=name, backend=b, losses=ones * (2.17 + d), eval_loss=2.3 + d)
        for (name, b), d in zip(demo.MODELS["char"].runs[1:], (0.377, 2e-4, -1e-4, 0.02, 0, 0.02, 0),
                                strict=True)
    ]  # fmt: skip
    captured = {}
    import matplotlib.backends.backend_agg as agg

    class Canvas(agg.FigureCanvasAgg):
        def print_png(self, path, *a, **k):
            captured["fig"] = self.figure
            return super().print_png(path, *a, **k)

    original = agg.FigureCanvasAgg
    agg.FigureCanvasAgg = Canvas
    try:
        plot(runs, str(tmp_path / "p.png"))
    finally:
        agg.FigureCanvasAgg = original
    fig = captured["fig"]
    renderer = fig.canvas.get_renderer()
    bar_ax = fig.axes[1]
    boxes = [t.get_window_extent(renderer) for t in bar_ax.texts]
    assert len(boxes) == 2 * (len(runs) - 1)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)


def test_the_training_code_is_loaded_by_the_demo_only():
    # heddle._demo holds the training code; import heddle does not load it, and heddle.demo (kept
    # for the notebooks) is the same module's names.
    code = (
        "import sys, heddle, heddle.numpy; assert 'heddle._demo' not in sys.modules; "
        "from heddle import demo, _demo; assert demo.train is _demo.train; "
        "assert demo._NAMESPACES is _demo._NAMESPACES; print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_missing_matplotlib_skips_the_plot(monkeypatch, tmp_path, capsys):
    ones = np.ones(3, np.float32)
    result = demo.Result("float32", "jax", ones, ones, 50.0, 1.0, 10.0, 1.0, 0, None, None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now fails
    assert plot([result], str(tmp_path / "p.png")) is None
    assert not (tmp_path / "p.png").exists()
    monkeypatch.setattr(demo, "train", lambda *a, **k: result)
    out = str(tmp_path / "q.png")
    args = _parser().parse_args(["demo", "--model", "mlp", "--regimes", "float32",
                                 "--backends", "jax", "--output", out])  # fmt: skip
    assert args.run(args) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "q.png").exists()


def test_missing_scikit_learn_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import now fails
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        demo.load_digits_split()
    args = _parser().parse_args(["demo", "--model", "mlp", "--steps", "3", "--output", "none"])
    assert args.run(args) == 2
    assert "pip install scikit-learn" in capsys.readouterr().err


@pytest.mark.slow
def test_missing_standard_library_sources_point_to_the_mlp_model(monkeypatch, tmp_path, capsys):
    import sysconfig

    paths = sysconfig.get_paths()
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {**paths, "stdlib": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="use python -m heddle demo --model mlp"):
        demo.load_text()
    args = _parser().parse_args(["demo", "--steps", "3", "--output", "none"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "--model mlp" in err
    fixed = _parser().parse_args(["demo", "--model", "mlp", "--steps", "2", "--regimes",
                                  "float32", "--output", "none"])  # fmt: skip
    assert fixed.run(fixed) == 0


def test_text_is_the_standard_library_in_the_vocabulary(text):
    train, test = text
    assert len(train) == 9 * len(test) == 9 * demo.TEXT_CHARS // 10
    assert len(demo.VOCAB) == 96 and train.max() < 96 and test.max() < 96
    decoded = "".join(demo.VOCAB[i] for i in train[:2000])
    assert "import" in decoded or "def " in decoded


@pytest.mark.slow
def test_partial_chunk_runs_exactly_the_steps():
    # 7 steps in chunks of 3: the last chunk is padded with inactive steps that change nothing
    cfg = demo.Config(steps=7, chunk=3)
    r = demo.train("f16-scaled", "jax", cfg)
    assert len(r.losses) == 7 and len(r.scales) == 7
    seven = demo.train("f16-scaled", "jax", demo.Config(steps=7, chunk=7))
    assert r.accuracy == seven.accuracy and list(r.losses) == list(seven.losses)


def test_steps_per_s_leaves_the_warm_up_chunk_out(monkeypatch):
    # A clock that jumps 1000 s while the first chunk runs (its 4th reading is the first after the
    # first chunk's start): a timing that included the warm-up chunk would see the jump.
    import heddle._demo as module

    real = module.time.perf_counter
    calls = {"n": 0}

    class Clock:
        @staticmethod
        def perf_counter():
            calls["n"] += 1
            return real() + (1000.0 if calls["n"] >= 4 else 0.0)

    monkeypatch.setattr(module, "time", Clock)
    r = demo.train("float32", "jax", demo.Config(steps=4, chunk=2))
    assert r.steps_per_s > 2 / 100  # 2 timed steps; with the 1000 s chunk it would be 0.002/s


def test_progress_bar_on_a_terminal_redraws_in_place():
    class Tty:
        def __init__(self):
            self.text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            pass

        def isatty(self):
            return True

    t = Tty()
    p = Progress(t)
    p("float32", "jax", 5, 10)
    p("float32", "jax", 10, 10)
    assert t.text.count("\r") == 2 and t.text.endswith("\n")
    assert "[############............] 5/10" in t.text


def test_format_table_aligns_columns():
    ones = np.ones(10, np.float32)
    r = demo.Result("float32", "jax", ones, ones, 97.5, 0.25, 1234.4, 1.0, 0, None, None)
    lines = format_table([r]).splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines[:2]}) == 1
    assert re.split(r"\s{2,}", lines[2]) == [
        "float32", "jax", "float32", "1.0000", "-", "0.2500", "-", "97.50", "1234", "0", "-", "-",
    ]  # fmt: skip
    scaled = dataclasses.replace(r, regime="f16-scaled", skipped=3, final_scale=2.0**21,
                                 eval_loss=0.375)  # fmt: skip
    row = format_table([r, scaled]).splitlines()[3]
    assert row.split()[-2:] == ["3", "2^21"] and "+0.1250" in row and "loss scale" in row
    odd = dataclasses.replace(scaled, final_scale=1000.0)
    assert format_table([odd]).splitlines()[2].split()[-1] == "1000"


@pytest.mark.slow
def test_default_demo_in_the_readmes_time_and_the_claim_over_three_seeds(tmp_path):
    # On a machine shared with other work the wall time says little, so the bound is on the CPU
    # time the demo used (all threads): on 2 otherwise idle cores the wall time is at most half
    # of it when both are busy, and at most all of it. The README says about 80 s on a 2-core
    # machine (134-164 s of CPU measured for its 8 runs); 180 s of CPU is 90 s of 2 busy cores.
    for seed in (0, 1, 2):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = _demo("--seed", str(seed), "--output", str(tmp_path / "d.png"))
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert proc.returncode == 0, proc.stderr
        assert cpu < 180, (seed, cpu, wall)
        rows = {(r["regime"], r["backend"]): r for r in _rows(proc.stdout)}
        for column, gap in (("train loss", JAX_GAP), ("held-out loss", HELD_OUT_GAP)):
            by = {key: float(r[column]) for key, r in rows.items()}
            f32 = by["float32", "jax"]
            assert by["bf16", "jax"] - f32 >= gap, (seed, column, by)
            for regime in ("bf16", "f16", "f16-scaled"):
                assert abs(by[regime, "heddle"] - f32) <= HEDDLE_BOUND, (seed, regime, by)
        acc = {key: float(r["held-out acc %"]) for key, r in rows.items()}
        assert acc["bf16", "jax"] <= acc["float32", "jax"] - 2.0, (seed, acc)
        assert abs(acc["bf16", "heddle"] - acc["float32", "jax"]) <= 0.5, (seed, acc)
