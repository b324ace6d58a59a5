"""Recipe 5 of docs/mixed-precision.md, executed as written: an equinox and a flax model, their
layers called as they are, trained under ``heddle.autocast`` on scikit-learn's digits in
``mixed_bfloat16`` and ``mixed_float16`` (dynamic loss scaling) reach float32's accuracy within
0.5 points."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import jax
import numpy as np
import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "mixed-precision.md"


_RECIPE = r"<!-- autocast: recipe -->\n```python\n(.*?)```\n\nprints\n\n```text\n(.*?)```"


def _namespace(steps: int | None = None) -> tuple[dict, str, str]:
    """The recipe executed after the setup block (its call with ``steps`` where given): its
    namespace, what it printed and what the page shows it printing."""
    text = DOC.read_text()
    setup = re.search(r"<!-- recipe: setup -->\n```python\n(.*?)```", text, re.S).group(1)
    recipe, shown = re.search(_RECIPE, text, re.S).groups()
    if steps is not None:
        call = "params, acc = train_autocast(eqx_model)"
        assert call in recipe
        recipe = recipe.replace(call, f"params, acc = train_autocast(eqx_model, steps={steps})")
    ns: dict = {}
    out = io.StringIO()
    with jax.numpy_dtype_promotion("standard"):  # flax and equinox use JAX's own promotion
        exec(compile(setup, f"{DOC}:setup", "exec"), ns)
        with contextlib.redirect_stdout(out):
            exec(compile(recipe, f"{DOC}:autocast", "exec"), ns)
    return ns, out.getvalue(), shown


def test_the_recipe_runs_and_keeps_float32_masters():
    ns, _, _ = _namespace(steps=20)
    assert {np.dtype(a.dtype) for a in jax.tree.leaves(ns["params"])} == {np.dtype("float32")}
    assert 0 <= ns["acc"] <= 100


def test_the_recipe_prints_what_the_page_shows(prints_as_shown):
    _, printed, shown = _namespace()  # as written: 2000 steps
    prints_as_shown(printed, shown)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["eqx_model", "flax_model"])
def test_mixed_precision_under_autocast_reaches_float32_accuracy(model):
    ns, _, _ = _namespace(steps=1)
    with jax.numpy_dtype_promotion("standard"):
        make = ns[model]
        acc = {
            p: ns["train_autocast"](make, p)[1]
            for p in ("float32", "mixed_bfloat16", "mixed_float16")
        }
    print(model, acc)
    assert abs(acc["mixed_bfloat16"] - acc["float32"]) <= 0.5
    assert abs(acc["mixed_float16"] - acc["float32"]) <= 0.5
    assert acc["float32"] > 90
