"""The examples of heddle.autodiff's docstrings and of docs/autodiff.md run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ["heddle.autodiff", "heddle.autodiff._api"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def run_markdown(path: pathlib.Path) -> doctest.TestResults:
    """Runs every ```python block of a markdown page as one doctest session."""
    text = "\n".join(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))
    test = doctest.DocTestParser().get_doctest(text, {}, path.name, str(path), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    return runner.summarize(verbose=False)


def test_docs_page():
    result = run_markdown(ROOT / "docs" / "autodiff.md")
    assert result.attempted > 0 and result.failed == 0
