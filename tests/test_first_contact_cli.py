"""The command line's first contact: ``--help`` without importing JAX, and the usage line naming the
command as it was called."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from heddle import __main__ as heddle_main
from heddle import _cli_audit
from heddle.programs import KINDS

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs the command line's --help paths in a fresh interpreter with the heddle package registered
# but its __init__ not executed, so that what the command-line modules import themselves shows.
_BARE = r"""
import contextlib, io, json, sys, types
pkg = types.ModuleType("heddle")
pkg.__path__ = [sys.argv[1]]
sys.modules["heddle"] = pkg
sys.argv[0] = sys.argv[2]
from heddle.__main__ import main
out = {}
for argv in (["--help"], ["audit", "--help"], ["table", "--help"], ["demo", "--help"]):
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        main(argv)
    out[" ".join(argv)] = text.getvalue()
out["jax"] = sorted(m for m in sys.modules if m == "jax" or m.startswith("jax."))
print(json.dumps(out))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEDDLE_")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return env


def _bare(argv0: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _BARE, str(ROOT / "heddle"), argv0],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_help_of_the_command_line_and_of_audit_imports_no_jax():
    out = _bare("/venv/bin/heddle")
    assert out["jax"] == []
    assert "--model {char,mlp}" in out["demo --help"] and "2000 steps" in out["demo --help"]
    assert "{table,demo,audit}" in out["--help"]
    assert "--fail-on KIND" in out["audit --help"] and "--include-backward" in out["audit --help"]
    assert "--format {markdown,html,csv}" in out["table --help"]


def test_usage_line_names_the_console_script_as_called():
    out = _bare("/venv/bin/heddle")
    assert out["--help"].startswith("usage: heddle [-h] {table,demo,audit}")
    assert out["audit --help"].startswith("usage: heddle audit [-h]")
    out = _bare(str(ROOT / "heddle" / "__main__.py"))  # what python -m heddle sets
    assert out["--help"].startswith("usage: python -m heddle [-h]")


def test_prog_name():
    assert heddle_main.prog_name("/usr/local/bin/heddle") == "heddle"
    assert heddle_main.prog_name(r"C:\venv\Scripts\heddle.exe".replace("\\", "/")) == "heddle"
    assert heddle_main.prog_name("/src/heddle/__main__.py") == "python -m heddle"
    assert heddle_main.prog_name("-c") == "python -m heddle"
    assert heddle_main.prog_name("/usr/bin/pytest") == "python -m heddle"


def test_the_real_console_script_and_module_name_themselves():
    script = pathlib.Path(sys.executable).with_name("heddle")
    if not script.exists():
        pytest.skip("the heddle console script is not installed next to this Python")
    runs = {
        "script": subprocess.Popen([str(script), "--help"], env=_env(), **_PIPES),
        "module": subprocess.Popen(
            [sys.executable, "-m", "heddle", "--help"], env=_env(), **_PIPES
        ),
    }
    out = {k: p.communicate(timeout=180) for k, p in runs.items()}
    assert out["script"][0].startswith("usage: heddle [-h]"), out["script"][1]
    assert out["module"][0].startswith("usage: python -m heddle [-h]"), out["module"][1]


_PIPES = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "cwd": ROOT}


def test_python_m_heddle_help_imports_no_jax():
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "heddle", "--help"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
    assert "jax" not in imported


def test_the_help_lines_listed_without_building_a_parser_are_the_parsers_own():
    full, listed = heddle_main.build_parser(), heddle_main.build_parser(commands=())
    assert listed.format_help() == full.format_help()
    assert heddle_main.build_parser(prog="x").format_usage().startswith("usage: x ")


def test_audit_kinds_spelled_out_for_the_parser_are_the_audits():
    assert _cli_audit.KINDS == KINDS


def test_main_runs_the_subcommand_it_builds(capsys):
    assert heddle_main.main(["table", "i8", "u8", "--format", "csv"]) == 0
    assert capsys.readouterr().out == ",int8,uint8\nint8,int8,int16\nuint8,int16,uint8\n"
    with pytest.raises(SystemExit):  # a subcommand listed by name only is never the one run
        heddle_main.main(["table", "--format", "latex"])


def test_the_demo_catalog_lists_the_models_own_regimes_and_steps():
    from heddle._demo import MODELS
    from heddle._demo_catalog import CATALOG

    assert tuple(CATALOG) == tuple(MODELS)
    for name, entry in CATALOG.items():
        model = MODELS[name]
        assert entry.regimes == tuple(model.regimes), name
        assert entry.steps == model.config.steps, name
        assert entry.description == model.description, name
