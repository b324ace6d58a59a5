"""The audit's ``narrow_cotangent`` kind: a backward pass that stores cotangents narrower than
``grad_dtype`` (POLICY.md 7), as ``jax.grad``/``jax.vjp`` do for every bfloat16, float16 or float8
value. The rule reads the backward pass JAX traced; one finding per source line and dtype."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import _models as M  # tests/programs is on sys.path (pytest rootdir-less import)
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import heddle
from heddle import autodiff
from heddle.autodiff._scaled import MODES
from heddle.programs import _audit

audit = _audit.audit
NC = "narrow_cotangent"
BF, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32


def small_loss(p, x):  # x: float16 activations, p["w"]: float32 parameters, no loss scaling
    h = x @ p["w"].astype(jnp.float16)
    return jnp.mean(h.astype(jnp.float32)) * 1e-6


P = {"w": jax.ShapeDtypeStruct((256, 1), F32)}
X = jax.ShapeDtypeStruct((4096, 256), F16)


def test_the_kind_is_listed_everywhere():
    assert NC in _audit.KINDS and NC in heddle.policy.AUDIT_KINDS
    from heddle import _cli_audit

    assert NC in _cli_audit.KINDS


def test_float16_cotangents_that_underflow_are_reported():
    # The values: jax.grad stores h's cotangent (2.4e-10) in float16, where it is 0; heddle keeps it.
    p = {"w": jnp.ones((256, 1), F32)}
    x = jnp.full((4096, 256), 1e-3, F16)
    assert float(jnp.abs(jax.grad(small_loss)(p, x)["w"]).max()) == 0.0
    assert float(autodiff.grad(small_loss)(p, x)["w"][0, 0]) == pytest.approx(1e-9, rel=1e-3)

    report = audit(small_loss, P, X, include_backward=True)
    found = report.of_kind(NC)
    assert report.counts[NC] == len(found) == 2  # one per source line
    rounding, contraction = found
    # the transpose of h.astype(float32) rounds the float32 cotangent to float16: the flush
    assert (rounding.primitive, rounding.dtypes, rounding.out_dtype) == (
        "convert_element_type",
        ("f32",),
        "f16",
    )
    assert (
        rounding.shapes == ((4096, 1),)
        and rounding.code == "return jnp.mean(h.astype(jnp.float32)) * 1e-6"
    )
    assert contraction.primitive == "dot_general" and contraction.out_dtype == "f16"
    assert contraction.code == 'h = x @ p["w"].astype(jnp.float16)'
    for f in found:
        assert f.backward and f.phase == "backward" and f.expected == "float32"
        assert f.file == __file__ and f.function == "small_loss"
        assert "6e-8" in f.note and "flushes" in f.note
        assert "heddle.autodiff.grad" in f.note and "value_and_grad" in f.note
        assert "heddle.autodiff.grad(heddle.autocast(f))" in f.note
        assert "heddle.scaling" in f.note
    assert "narrow_cotangent" in str(report) and "narrow_cotangent 2" in str(report).splitlines()[0]


def test_jax_grad_of_the_function_is_reported_and_heddles_gradient_is_not():
    # A function that differentiates itself holds the same backward pass.
    assert audit(jax.grad(small_loss), P, X).counts[NC] == 2
    assert audit(autodiff.grad(small_loss), P, X).counts[NC] == 0
    assert audit(autodiff.value_and_grad(small_loss), P, X).counts[NC] == 0


@pytest.mark.parametrize(
    "fn",
    [jnp.tanh, lambda x: jnp.sin(x) * x, lambda x: x @ jnp.ones((8, 4), x.dtype), jnp.exp],
    ids=["tanh", "sin_times_x", "matmul", "exp"],
)
@pytest.mark.parametrize("dtype", [BF, F16], ids=["bf16", "f16"])
def test_a_narrow_output_seeds_narrow_cotangents(fn, dtype):
    # jax.vjp of a function with narrow outputs takes narrow cotangents and transposes every op in
    # that dtype; a lone op whose transpose multiplies the seed by a residual is one of them
    x = jax.ShapeDtypeStruct((8,), dtype)
    _, pullback = jax.vjp(fn, jnp.ones(8, dtype))
    assert pullback(fn(jnp.ones(8, dtype)))[0].dtype == dtype  # what the audit reports
    found = audit(fn, x, include_backward=True).of_kind(NC)
    assert len(found) == 1 and found[0].out_dtype == {BF: "bf16", F16: "f16"}[dtype], found


@pytest.mark.parametrize("dtype", [BF, F16], ids=["bf16", "f16"])
def test_the_narrow_copy_of_a_scaled_backward_contraction_is_no_cotangent(dtype):
    # contractions="scaled" reads a narrow copy of the float32 cotangent in each backward
    # contraction; the cotangents themselves stay float32
    w = jax.ShapeDtypeStruct((16, 4), F32)
    x = jax.ShapeDtypeStruct((8, 16), F32)

    def loss(w, x):
        return jnp.sum(jnp.tanh(x.astype(dtype) @ w.astype(dtype)).astype(F32))

    for contractions in MODES:
        report = audit(autodiff.grad(loss, contractions=contractions), w, x)
        assert report.counts[NC] == 0, (contractions, str(report))
    assert audit(jax.grad(loss), w, x).counts[NC] > 0


def test_a_float32_model_reports_none():
    params, x, labels = M.mlp_specs(dtype=F32)
    report = audit(M.mlp_loss, params, x, labels, include_backward=True)
    assert report.counts[NC] == 0 and len(report) == 0, str(report)
    bparams, bx = M.block_specs(dtype=F32)
    report = audit(M.block_loss, bparams, bx, include_backward=True)
    assert report.counts[NC] == 0 and len(report) == 0, str(report)
    assert audit(jax.grad(M.block_loss), bparams, bx).counts[NC] == 0


def test_a_bfloat16_model_reports_a_handful_one_per_line():
    params, x, labels = M.mlp_specs()  # bfloat16, hidden layers in a Python loop
    report = audit(M.mlp_loss, params, x, labels, include_backward=True)
    found = report.of_kind(NC)
    assert len(found) == 4
    assert len({(f.file, f.line) for f in found}) == len(found)  # grouped by line
    assert {f.code for f in found} == {
        'h = nn.relu(np.add(np.matmul(h, layer["w"]), layer["b"]))',
        'return np.add(np.matmul(h, last["w"]), last["b"])',
        "logp = nn.log_softmax(mlp(params, x, np, nn), axis=-1)",
        "return np.negative(np.mean(np.sum(np.multiply(logp, labels), axis=-1)))",
    }
    for f in found:
        assert f.out_dtype == "bf16" and f.expected == "float32"
        # bfloat16 has float32's range: the risk is precision, and the note says so
        assert "8 significant bits" in f.note and "flushes" not in f.note
        assert "heddle.autodiff.grad" in f.note and "heddle.scaling" not in f.note
    hidden = next(f for f in found if "relu" in f.code)
    assert "dot_general" in hidden.primitive.split(",")
    assert "reduce_sum" in hidden.primitive and (32,) in hidden.shapes  # the bias gradient, bf16
    # a transformer block: still one finding per line (14 lines), not one per equation
    bparams, bx = M.block_specs()
    block = audit(M.block_loss, bparams, bx, include_backward=True).of_kind(NC)
    assert 0 < len(block) <= 16 and len({(f.line, f.out_dtype) for f in block}) == len(block)


def test_forward_only_audits_report_none_and_are_unchanged():
    params, x, labels = M.mlp_specs()
    forward = audit(M.mlp_loss, params, x, labels)
    assert forward.counts[NC] == 0
    both = audit(M.mlp_loss, params, x, labels, include_backward=True)
    assert [f for f in both if not f.backward] == list(forward)  # the same forward findings
    assert audit(small_loss, P, X).counts == {
        **dict.fromkeys(_audit.KINDS, 0),
        "narrow_accumulation": 1,
    }
    bparams, bx = M.block_specs()
    assert audit(M.block_loss, bparams, bx).counts[NC] == 0


def test_under_autocast_jax_grad_keeps_the_risk_and_heddles_grad_removes_it():
    params, x, labels = M.mlp_specs()
    checked = heddle.autocast(M.mlp_loss)
    report = audit(checked, params, x, labels, include_backward=True)
    assert report.counts["narrow_accumulation"] == 0 and report.counts[NC] > 0
    assert {f.primitive for f in report.of_kind(NC)} >= {"convert_element_type"}
    assert audit(jax.grad(checked), params, x, labels).counts[NC] > 0
    assert len(audit(autodiff.grad(checked), params, x, labels)) == 0


def test_residuals_are_not_cotangents():
    x = jax.ShapeDtypeStruct((8, 16), BF)
    w = jax.ShapeDtypeStruct((16, 16), BF)

    @jax.custom_vjp
    def sin(x):
        return jnp.sin(x)

    sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (jnp.cos(x) * g,))
    found = audit(lambda x: jnp.sum(sin(x).astype(F32)), x, include_backward=True).of_kind(NC)
    assert found and all("cos" not in f.primitive for f in found)  # cos(x) is a residual

    layer = jax.checkpoint(lambda x, w: jnp.tanh(x @ w))
    found = audit(lambda x, w: jnp.sum(layer(x, w).astype(F32)), x, w, include_backward=True)
    primitives = {p for f in found.of_kind(NC) for p in f.primitive.split(",")}
    assert "dot_general" in primitives and "tanh" not in primitives  # recomputed, not cotangents


def test_values_without_a_cotangent_are_not_reported():
    x32 = jax.ShapeDtypeStruct((8, 16), F32)
    y16 = jax.ShapeDtypeStruct((8, 16), BF)
    # a bfloat16 value behind stop_gradient gets no cotangent; float32 values are fine
    report = audit(
        lambda x, y: jnp.sum(x * lax.stop_gradient(y).astype(F32)), x32, y16, include_backward=True
    )
    assert report.counts[NC] == 0
    # integer arguments and outputs carry no cotangent
    report = audit(
        lambda x, n: (jnp.sum(x), n + 1),
        x32,
        jax.ShapeDtypeStruct((), jnp.int8),
        include_backward=True,
    )
    assert report.counts[NC] == 0


def test_loops_branches_and_jitted_train_steps():
    xs = jax.ShapeDtypeStruct((8, 16), BF)
    w = jax.ShapeDtypeStruct((16, 16), BF)

    def scanned(xs, w):
        return jnp.sum(
            lax.scan(lambda c, x: (jnp.tanh(c @ w + x), None), jnp.zeros(16, BF), xs)[0].astype(F32)
        )

    found = audit(scanned, xs, w, include_backward=True).of_kind(NC)
    assert any("scan" in f.path and "dot_general" in f.primitive for f in found)

    def branch(x, p):
        return jnp.sum(lax.cond(p, jnp.sin, lambda x: x * 2, x).astype(F32))

    found = audit(branch, xs, jax.ShapeDtypeStruct((), jnp.bool_), include_backward=True).of_kind(
        NC
    )
    assert any("cond" in f.path for f in found)

    # a jitted training step that calls jax.value_and_grad: its backward pass is reported, the
    # optimiser's bfloat16 arithmetic (no cotangent) is not
    def loss(p, x):
        return jnp.mean(jnp.square((x @ p).astype(F32)))

    @jax.jit
    def step(p, x):
        value, g = jax.value_and_grad(loss)(p, x)
        return p - jnp.asarray(0.1, BF) * g, value

    (f,) = audit(step, w, xs).of_kind(NC)
    assert f.path == "jit[step]" and f.code == "return jnp.mean(jnp.square((x @ p).astype(F32)))"


MODEL = textwrap.dedent(
    """\
    import jax.numpy as jnp


    def small_loss(p, x):
        h = x @ p["w"].astype(jnp.float16)
        return jnp.mean(h.astype(jnp.float32)) * 1e-6


    def loss32(x, w):
        return jnp.sum(x @ w)
    """
)


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "heddle", "audit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.slow
def test_cli_include_backward_reports_narrow_cotangents(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    args = ("model.py:small_loss", "--args", '{"w": "f32[256,1]"}', "f16[4096,256]")
    r = _cli(*args, "--include-backward", "--json", "--fail-on", NC, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["counts"][NC] == 2
    found = [f for f in report["findings"] if f["kind"] == NC]
    assert {f["phase"] for f in found} == {"backward"} and {f["out_dtype"] for f in found} == {
        "f16"
    }
    assert all("heddle.autodiff.grad" in f["note"] for f in found)
    assert {f["source"] for f in found} == {"model.py:5 (small_loss)", "model.py:6 (small_loss)"}

    # forward only: none, and --fail-on narrow_cotangent passes; a float32 function: none either
    r = _cli(*args, "--fail-on", NC, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "narrow_cotangent 0" in r.stdout.splitlines()[0]
    r = _cli(
        "model.py:loss32", "--args", "f32[8,16]", "f32[16,4]", "--include-backward", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert "0 finding(s)" in r.stdout and "narrow_cotangent 0" in r.stdout


def test_notes_by_dtype():
    from heddle.programs._audit_cotangent import cotangent_note

    f16, bf16, e4m3 = (np.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float8_e4m3fn))
    assert "f16 flushes a cotangent below 6e-8 to zero" in cotangent_note(f16)
    assert "bf16 keeps 8 significant bits" in cotangent_note(bf16)
    assert "flushes a cotangent below 2e-3 to zero" in cotangent_note(e4m3)
    for d in (f16, bf16, e4m3):
        note = cotangent_note(d)
        assert "heddle.autodiff.grad/value_and_grad" in note
        assert "jax.grad(heddle.autocast(f))" in note


def test_raise_if_any_names_the_fix_for_narrow_cotangents():
    report = audit(small_loss, P, X, include_backward=True)
    with pytest.raises(heddle.policy.PolicyError, match=r"heddle\.autodiff\.grad") as e:
        report.raise_if_any(kinds=[NC])
    assert "2 finding(s) of kind narrow_cotangent" in str(e.value)
    assert "heddle.autocast (heddle.autocast(fn))" not in str(e.value)  # autocast alone: no fix
    with pytest.raises(heddle.policy.PolicyError, match="For the narrow cotangents") as e:
        report.raise_if_any()
    assert "narrow_accumulation, narrow_cotangent" in str(e.value)
    report.raise_if_any(kinds=["implicit_promotion"])  # nothing of that kind
