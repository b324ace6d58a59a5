"""heddle.quant's public surface: every name documented, every example run, the docs page too."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import pkgutil
import re

import jax
import pytest

import heddle.quant as hq

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTIONS = ("Args:", "Returns:", "Examples:")


def test_all_is_explicit_and_complete():
    public = {n for n in vars(hq) if not n.startswith("_")}
    assert set(hq.__all__) == public
    assert hq.__all__ == sorted(hq.__all__, key=lambda n: (not n.isupper(), n))


@pytest.mark.parametrize("name", hq.__all__)
def test_every_public_name_is_documented(name):
    obj = getattr(hq, name)
    if name in ("FORMATS", "NF4_LEVELS"):  # data: an attribute docstring in _formats.py
        source = (ROOT / "heddle/quant/_formats.py").read_text()
        assert re.search(rf"^{name}\b.*?\n\"\"\"\S", source, flags=re.S | re.M), name
        return
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    assert doc and len(doc.strip()) > 20, name
    if callable(obj) and not isinstance(obj, type):
        for section in SECTIONS:
            assert section in doc, (name, section)


def _modules() -> list[str]:
    return ["heddle.quant"] + [f"heddle.quant.{m.name}" for m in pkgutil.iter_modules(hq.__path__)]


@pytest.mark.parametrize("modname", _modules())
def test_doctests(modname):
    module = importlib.import_module(modname)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in doctest.DocTestFinder(exclude_empty=True).find(module, modname):
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} doctest examples failed in {modname}"


@pytest.mark.slow
def test_docs_page_examples_run():
    path = ROOT / "docs" / "quantisation.md"
    text = path.read_text()
    blocks = [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S)
    ]
    blocks = [(line, b) for line, b in blocks if ">>> " in b]
    assert len(blocks) >= 4
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for line, block in blocks:  # each block on its own, as a reader would paste it
        test = doctest.DocTestParser().get_doctest(
            block, {}, f"quantisation.md:{line}", str(path), line
        )
        with jax.numpy_dtype_promotion("standard"):
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} examples failed in docs/quantisation.md"


def test_docs_page_lists_every_format():
    text = (ROOT / "docs" / "quantisation.md").read_text()
    for name in hq.FORMATS:
        assert f"`{name}`" in text, name
