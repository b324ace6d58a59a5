"""``python -m heddle audit``: end to end in a subprocess, and the error paths in process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from heddle import __main__ as heddle_main
from heddle._cli_audit import add_audit_parser, parse_spec

MODEL = textwrap.dedent(
    """\
    import jax.numpy as jnp
    from jax import lax


    def loss(x, w):
        return jnp.sum(x @ w)


    def clean(x, w):
        return jnp.sum(lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32))


    def mixed(x, y):
        return x + y


    def broken(x, w):
        return x @ w @ w


    def rounded(x, w):
        return lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32).astype(x.dtype)


    RATE = 0.1


    def tree_loss(params, x):
        return jnp.sum(x @ params["w"] + params["b"])


    def make_args():
        import jax
        return ({"w": jax.ShapeDtypeStruct((16, 4), jnp.bfloat16), "b": jax.ShapeDtypeStruct((4,), jnp.bfloat16)},
                jax.ShapeDtypeStruct((8, 16), jnp.bfloat16))


    def failing_args():
        raise RuntimeError("no data")
    """
)


@pytest.fixture
def project(tmp_path):
    """A directory with a package ``pkg`` (module ``pkg.mod``) and a loose file ``model.py``."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(MODEL)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


def _wired() -> bool:
    try:
        heddle_main.build_parser().parse_args(["audit", "m:f"])
    except SystemExit:
        return False
    return True


# Until ``audit`` is registered in heddle/__main__.py, drive the subcommand through the same
# argparse registration a standalone ``python -m heddle`` would use.
_DRIVER = (
    "import argparse, sys\n"
    "from heddle._cli_audit import add_audit_parser\n"
    "p = argparse.ArgumentParser(prog='python -m heddle')\n"
    "add_audit_parser(p.add_subparsers(dest='command', required=True))\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "sys.exit(a.run(a))\n"
)


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    prefix = ["-m", "heddle"] if _wired() else ["-c", _DRIVER]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, *prefix, "audit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- end to end ------------------------------------------------------------------------------------


def test_findings_print_a_table_and_exit_1(project):
    r = cli("pkg.mod:loss", "--args", "bf16[8,16]", "bf16[16,4]", cwd=project)
    assert r.returncode == 1, r.stderr
    assert "narrow_accumulation" in r.stdout and "dot_general" in r.stdout
    assert "bf16,bf16 -> bf16" in r.stdout and "[8,16] [16,4]" in r.stdout
    assert "mod.py:6 (loss)" in r.stdout  # the line of `return jnp.sum(x @ w)`


def test_clean_function_exits_0(project):
    r = cli("model.py:clean", "--args", "bf16[8,16]", "bf16[16,4]", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "0 finding(s)" in r.stdout


def test_json_backward_and_fail_on(project):
    r = cli(
        "pkg.mod:loss",
        "--args",
        "bf16[8,16]",
        "bf16[16,4]",
        "--json",
        "--include-backward",
        "--fail-on",
        "implicit_promotion",
        cwd=project,
    )
    assert r.returncode == 0, r.stderr  # no implicit promotion, the only kind failed on
    report = json.loads(r.stdout)
    assert report["function"] == "loss" and report["include_backward"] is True
    # the matmul and its transposes sum in bf16; the backward pass's cotangents are bf16 (one line)
    counts = report["counts"]
    assert counts["narrow_accumulation"] > 1 and counts["narrow_cotangent"] == 1
    assert counts["narrow_accumulation"] + counts["narrow_cotangent"] == len(report["findings"])
    accumulations = [f for f in report["findings"] if f["kind"] == "narrow_accumulation"]
    assert {f["phase"] for f in accumulations} == {"forward", "backward"}
    assert all(f["primitive"] == "dot_general" for f in accumulations)


def test_mixed_dtypes_in_the_default_promotion_mode(project):
    r = cli(
        "pkg.mod:mixed", "--args", "bf16[4]", "f32[4]", "--fail-on", "lossy_conversion", cwd=project
    )
    assert r.returncode == 0, r.stderr
    assert "implicit_promotion" in r.stdout and "bf16,f32 -> f32" in r.stdout


def test_bad_spec_exits_2_with_the_format(project):
    r = cli("pkg.mod:loss", "--args", "bf16[8,x]", cwd=project)
    assert r.returncode == 2
    assert "'x' is not a dimension" in r.stderr and "DTYPE[D0,D1,...]" in r.stderr


def test_import_failure_exits_2_with_the_fix(project):
    r = cli("nosuch.module:loss", "--args", "f32[2]", cwd=project)
    assert r.returncode == 2
    assert "importing nosuch.module failed with ModuleNotFoundError" in r.stderr
    assert "PYTHONPATH" in r.stderr and "Traceback" not in r.stderr


def test_trace_failure_exits_2_with_the_fix(project):
    r = cli("pkg.mod:broken", "--args", "f32[8,16]", "f32[16,4]", cwd=project)
    assert r.returncode == 2
    assert "tracing it failed with TypeError" in r.stderr
    assert "one --args spec per positional argument" in r.stderr and "Traceback" not in r.stderr


# -- in process ------------------------------------------------------------------------------------


def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="python -m heddle")
    add_audit_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", *argv])
    code = args.run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_missing_attribute_lists_the_callables(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    code, _, err = _run(["model.py:los", "--args", "f32[2]"], capsys)
    assert code == 2
    assert (
        "model.py has no attribute 'los'" in err
        and "broken, clean, failing_args, loss, make_args, mixed, rounded" in err
    )


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("model.py:RATE", "RATE is a float, not a function"),
        ("model.loss", "package.module:function"),
        ("nofile.py:loss", "no such file: nofile.py"),
    ],
    ids=["not_a_function", "target_without_colon", "missing_file"],
)
def test_bad_target_is_a_usage_error(project, capsys, monkeypatch, target, expected):
    monkeypatch.chdir(project)
    code, _, err = _run([target], capsys)
    assert code == 2 and expected in err


def test_fail_on_none_and_kinds(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    specs = ["--args", "bf16[8,16]", "bf16[16,4]"]
    assert _run(["model.py:loss", *specs], capsys)[0] == 1
    assert _run(["model.py:loss", *specs, "--fail-on", "none"], capsys)[0] == 0
    assert _run(["model.py:loss", *specs, "--fail-on", "narrow_accumulation"], capsys)[0] == 1
    assert _run(["model.py:loss", *specs, "--fail-on", "lossy_conversion"], capsys)[0] == 0


def test_include_explicit_lists_the_rounding(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    argv = ["model.py:rounded", "--args", "bf16[8,16]", "bf16[16,4]", "--json"]
    code, out, _ = _run(argv, capsys)
    assert code == 0 and json.loads(out)["findings"] == []
    code, out, _ = _run([*argv, "--include-explicit"], capsys)
    findings = json.loads(out)["findings"]
    assert code == 1
    assert [(f["kind"], f["origin"], f["dtypes"], f["out_dtype"]) for f in findings] == [
        ("lossy_conversion", "explicit", ["f32"], "bf16")
    ]


@pytest.mark.parametrize(
    ("text", "shape", "dtype"),
    [
        ("bf16[128,784]", (128, 784), "bfloat16"),
        ("f32[]", (), "float32"),
        ("int8", (), "int8"),
        (" e4m3fn [ 2 , 3 ] ", (2, 3), "float8_e4m3fn"),
        ("u8[0]", (0,), "uint8"),
    ],
)
def test_parse_spec(text, shape, dtype):
    s = parse_spec(text)
    assert s.shape == shape and str(s.dtype) == dtype


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("bf16[2,-1]", "'-1' is not a dimension"),
        ("bf16(2)", "not an argument spec"),
        ("bq16[2]", "not a dtype of heddle's policy"),
        ("[2]", "not an argument spec"),
    ],
)
def test_parse_spec_errors(text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match) as e:
        parse_spec(text)
    assert "bf16" in str(e.value)  # every message shows a valid spelling


def test_float64_spec_needs_x64_and_the_fix_works():
    with pytest.raises(argparse.ArgumentTypeError, match="JAX_ENABLE_X64=1") as e:
        parse_spec("f64[3]")
    assert "jax_enable_x64" in str(e.value)
    with jax.enable_x64(True):
        assert str(parse_spec("f64[3]").dtype) == "float64"


def test_pytree_arguments_from_json_and_from_a_factory(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    tree = '{"w": "bf16[16,4]", "b": "bf16[4]"}'
    code, out, err = _run(["model.py:tree_loss", "--args", tree, "bf16[8,16]", "--json"], capsys)
    assert code == 1, err
    assert json.loads(out)["counts"]["narrow_accumulation"] == 1
    code, out2, err = _run(
        ["model.py:tree_loss", "--args-from", "model.py:make_args", "--json"], capsys
    )
    assert code == 1, err and json.loads(out2)["counts"] == json.loads(out)["counts"]


def test_autocast_flag_audits_what_is_left(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    argv = ["model.py:tree_loss", "--args-from", "model.py:make_args", "--include-backward"]
    assert _run(argv, capsys)[0] == 1
    code, out, _ = _run([*argv, "--autocast", "--fail-on", "narrow_accumulation"], capsys)
    assert code == 0 and "narrow_accumulation 0" in out


def test_bad_json_pytree_and_failing_factory_say_how_to_fix(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    with pytest.raises(argparse.ArgumentTypeError, match="JSON object or array of specs"):
        parse_spec('{"w": bf16[2]}')
    with pytest.raises(argparse.ArgumentTypeError, match="is not a spec string"):
        parse_spec('{"w": 3}')
    assert parse_spec('{"w": "bf16[2]"}')["w"].shape == (2,)  # the fix works
    code, _, err = _run(["model.py:tree_loss", "--args-from", "model.py:failing_args"], capsys)
    assert code == 2 and "def make_args(): return (params, x)" in err
    assert _run(["model.py:tree_loss", "--args-from", "model.py:make_args"], capsys)[0] == 1
