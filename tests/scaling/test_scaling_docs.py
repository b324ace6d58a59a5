"""The examples of heddle.scaling's docstrings and of docs/loss-scaling.md run as written."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = [
    "heddle.scaling._backward",
    "heddle.scaling._finite",
    "heddle.scaling._states",
    "heddle.scaling._transform",
]


@pytest.fixture(autouse=True)
def _standard_promotion():
    with jax.numpy_dtype_promotion("standard"):  # the examples use optax.adam, as users do
        yield


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_docs_page():
    text = "\n".join(
        re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "loss-scaling.md").read_text(), re.S)
    )
    test = doctest.DocTestParser().get_doctest(text, {}, "loss-scaling.md", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0
