"""The recipes of docs/mixed-precision.md, executed as written, and the claims the page makes.

Each ```python block under a ``<!-- recipe: NAME -->`` marker runs after the blocks above it, as a
reader would run them (the equinox recipe needs only the setup). The trainings (2000 steps of a 64-128-10 MLP on scikit-learn's digits) run
once per module and are shared by the tests below.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import pathlib
import re

import jax
import ml_dtypes
import numpy as np
import pytest

from heddle import autodiff, policy, scaling

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "mixed-precision.md"
F32, BF16 = np.dtype("float32"), np.dtype(ml_dtypes.bfloat16)


def blocks() -> dict[str, str]:
    text = DOC.read_text()
    found = re.findall(r"<!-- recipe: (\w+) -->\n```python\n(.*?)```", text, re.S)
    return dict(found)


def shown() -> dict[str, str]:
    """What the page shows each recipe block printing (the ```text block after "prints"; "" for
    a block shown printing nothing)."""
    text = DOC.read_text()
    pattern = r"<!-- recipe: (\w+) -->\n```python\n.*?```\n(?:\nprints\n\n```text\n(.*?)```)?"
    return dict(re.findall(pattern, text, re.S))


def _run(code: str, ns: dict, name: str, printed: dict[str, str]) -> None:
    """Executes one block in ``ns``; what it prints goes to ``printed[name]``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{DOC}:{name}", "exec"), ns)
    printed[name] = out.getvalue()


@pytest.fixture(scope="module")
def runs():
    """Executes every recipe block once (in the strict promotion mode of the conftest)."""
    code = blocks()
    out: dict = {}
    printed: dict[str, str] = {}
    out["printed"] = printed
    with jax.numpy_dtype_promotion("strict"):
        base: dict = {}
        _run(code["setup"], base, "setup", printed)
        ns = dict(base)
        _run(code["masters"], ns, "masters", printed)
        out["mixed_bfloat16"] = (ns["params"], ns["opt_state"], ns["acc"])
        _run(code["baselines"], ns, "baselines", printed)
        out["float32"] = ns["baselines"]["float32"]
        out["bfloat16"] = ns["baselines"]["bfloat16"]
        out["masters_ns"] = ns
        ns = dict(ns)  # the page reads in order: recipe 2 reuses recipe 1's loss_fn
        _run(code["scaled"], ns, "scaled", printed)
        out["mixed_float16"] = (ns["params"], ns["opt_state"], ns["acc"])
        out["scaled_ns"] = ns
        ns = dict(ns)  # recipe 2 without the loss scale
        _run(code["unscaled"], ns, "unscaled", printed)
        out["unscaled_float16"] = ns["acc_unscaled"]
        ns = dict(base)
        _run(code["equinox"], ns, "equinox", printed)
        out["equinox"] = (ns["model"], ns["opt_state"], ns["acc"])
        out["equinox_ns"] = ns
    return out


def dtypes(tree) -> set[np.dtype]:
    return {np.dtype(x.dtype) for x in jax.tree.leaves(tree) if hasattr(x, "dtype")}


def float_dtypes(tree) -> set[np.dtype]:
    return {d for d in dtypes(tree) if d.kind == "f" or d == BF16}


def test_precision_examples_print_what_the_page_says():
    text = DOC.read_text()
    block = re.search(r"<!-- example: precision -->\n```python\n(.*?)```", text, re.S).group(1)
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block, {}, "mixed-precision.md:precision", str(DOC), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted >= 8, result


def test_every_recipe_is_present():
    assert set(blocks()) == {"setup", "masters", "baselines", "scaled", "unscaled", "equinox"}
    assert set(shown()) == set(blocks())


def test_every_recipe_prints_what_the_page_shows(runs, prints_as_shown):
    """Each block's accuracy as the page shows it (within 0.5 points: a sample of 899 is 0.11)."""
    for name, text in shown().items():
        if not text:
            assert runs["printed"][name] == "", name
        else:
            prints_as_shown(runs["printed"][name], text)


@pytest.mark.slow
def test_float32_baseline_learns(runs):
    params, opt_state, acc = runs["float32"]
    assert dtypes(params) == {F32} and float_dtypes(opt_state) == {F32}
    assert acc > 93.0  # 10 classes: chance is 10%


def test_pure_bfloat16_parameters_lose_accuracy(runs):
    params, opt_state, acc = runs["bfloat16"]
    assert dtypes(params) == {BF16} and float_dtypes(opt_state) == {BF16}
    # measured: 93.77% against 96.11% (docs/mixed-precision.md); small updates round away
    assert acc < runs["float32"][2] - 1.0


def test_bfloat16_compute_with_float32_masters_matches_float32(runs):
    params, opt_state, acc = runs["mixed_bfloat16"]
    assert dtypes(params) == {F32}
    assert float_dtypes(opt_state) == {F32}  # the momentum
    assert abs(acc - runs["float32"][2]) <= 0.5


def test_gradients_of_float32_masters_are_float32(runs):
    ns = runs["masters_ns"]
    params = runs["mixed_bfloat16"][0]
    x, y = next(ns["batches"](1))
    precision = policy.Precision.parse("mixed_bfloat16")
    loss, grads = jax.jit(autodiff.value_and_grad(ns["loss_fn"]), static_argnums=3)(
        params, x, y, precision
    )
    assert dtypes(grads) == {F32} and np.dtype(loss.dtype) == F32
    # the forward pass did run in bfloat16: the loss differs from the float32 forward pass
    loss32 = ns["loss_fn"](params, x, y, policy.Precision.parse("float32"))
    assert float(loss) != float(loss32)
    assert abs(float(loss) - float(loss32)) < 0.05 * float(loss32) + 1e-3


def test_float16_compute_with_dynamic_loss_scale_matches_float32(runs):
    params, opt_state, acc = runs["mixed_float16"]
    ns = runs["scaled_ns"]
    assert dtypes(params) == {F32}
    assert float_dtypes(scaling.loss_scale_state(opt_state)) == {F32}
    assert float_dtypes(opt_state.inner_state) == {F32}
    assert abs(acc - runs["float32"][2]) <= 0.5
    scale = ns["final_scale"]
    assert 1.0 <= scale <= 2.0**24 and np.log2(scale) == int(np.log2(scale))  # a power of two
    assert 0 <= ns["skipped"] < 2000 // 10


def test_float16_compute_without_loss_scaling_matches_float32(runs):
    """float32 cotangents (heddle.autodiff): no loss scale needed for the backward pass."""
    assert abs(runs["unscaled_float16"] - runs["float32"][2]) <= 0.5


def test_equinox_recipe(runs):
    import equinox as eqx

    model, opt_state, acc = runs["equinox"]
    ns = runs["equinox_ns"]
    assert isinstance(model, ns["MLP"])
    assert dtypes(eqx.filter(model, eqx.is_array)) == {F32}  # float32 masters
    assert float_dtypes(opt_state) == {F32}
    compute = policy.Precision.parse("mixed_bfloat16").cast_to_compute(model)
    assert dtypes(eqx.filter(compute, eqx.is_array)) == {BF16}
    # same data and optimiser as the dict MLP, different initialiser: within a point of float32
    assert abs(acc - runs["float32"][2]) <= 1.0


def test_documented_numbers_are_the_measured_ones(runs):
    text = DOC.read_text()
    table = text.split("<!-- numbers: begin -->")[1].split("<!-- numbers: end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].split("`")[1]] = float(cells[-1].rstrip("%"))
    assert set(rows) == {"float32", "bfloat16", "mixed_bfloat16", "mixed_float16"}
    for name, documented in rows.items():
        assert abs(documented - runs[name][2]) <= 0.5, name  # other CPUs may differ by a sample
