"""``python -m heddle table``: the promotion table on the command line."""

from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys

import pytest

from heddle.__main__ import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "policy" / "promotion.csv"


def golden_rows() -> list[list[str]]:
    with GOLDEN.open() as f:
        return list(csv.reader(f))


def run_module(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEDDLE_")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-m", "heddle", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def module_runs():
    """``python -m heddle`` in fresh interpreters, started together."""
    procs = {
        "csv": run_module("table", "--format", "csv"),
        "readme": run_module("table", "bf16", "f16", "fp8", "bf8", "i8", "u8", "f32"),
        "bad": run_module("table", "float33"),
    }
    return {k: (p.wait(timeout=180), *p.communicate()) for k, p in procs.items()}


def test_python_m_heddle_table_csv_is_the_golden_table(module_runs):
    rc, out, err = module_runs["csv"]
    assert rc == 0, err
    assert out == GOLDEN.read_text()


def test_python_m_heddle_table_readme_command(module_runs):
    """The README's first command: a markdown table of seven dtypes, cells from the golden table."""
    rc, out, err = module_runs["readme"]
    assert rc == 0, err
    names = ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "float32"]
    rows = golden_rows()
    col = {n: i for i, n in enumerate(rows[0])}
    want = {r[0]: r for r in rows[1:]}
    lines = out.strip().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["", *names]
    assert len(lines) == 2 + len(names)
    for line in lines[2:]:
        row, *cells = [c.strip() for c in line.strip("|").split("|")]
        row = row.strip("*")
        assert cells == [want[row][col[n]] for n in names]
    # the cells the README's example relies on
    assert (
        "| **bfloat16** | bfloat16 | float32 | bfloat16 | bfloat16 | bfloat16 | bfloat16 |" in out
    )
    assert "| **float8_e4m3fn** | bfloat16 | float16 | float8_e4m3fn | error |" in out


def test_python_m_heddle_table_unknown_dtype(module_runs):
    rc, out, err = module_runs["bad"]
    assert rc == 2 and out == ""
    assert err.startswith("error: dtype('float33'): that is not a dtype of heddle's policy")
    assert "Traceback" not in err and "bfloat16" in err  # the valid names, no traceback


def test_table_formats_in_process(capsys):
    assert main(["table", "--format", "csv"]) == 0
    assert capsys.readouterr().out == GOLDEN.read_text()
    assert main(["table", "i8", "u8", "--format", "html"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<table>") and '<td class="int16">int16</td>' in out
    assert main(["table", "i8", "u8"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "| | int8 | uint8 |",
        "|---|---|---|",
        "| **int8** | int8 | int16 |",
        "| **uint8** | int16 | uint8 |",
    ]


def test_table_policy_option(capsys):
    assert main(["table", "uint64", "int8", "--format", "csv", "--policy", "jax"]) == 0
    assert capsys.readouterr().out == ",uint64,int8\nuint64,uint64,float64\nint8,float64,int8\n"
    assert main(["table", "uint64", "int8", "--format", "csv"]) == 0
    assert capsys.readouterr().out == ",uint64,int8\nuint64,uint64,error\nint8,error,int8\n"


def test_table_bad_arguments(capsys):
    assert main(["table", "nope"]) == 2
    assert "not a dtype of heddle's policy" in capsys.readouterr().err
    for argv in (["table", "--format", "latex"], ["table", "--policy", "torch"], []):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert "usage: python -m heddle" in capsys.readouterr().err
