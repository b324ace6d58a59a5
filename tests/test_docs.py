"""The user docs: the examples of docs/differences.md and docs/index.md run and print what the page
says, the differences page covers every difference from JAX, links resolve, and docs/api.md is what
docs/gen_api.py renders from the code.
"""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re
import runpy
import warnings

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# The differences from JAX that POLICY.md lists, each with words its section title must contain.
DIFFERENCES = {
    1: ("narrow floats", "float32"),
    2: ("backward",),
    3: ("integer", "int32"),
    4: ("casts round once",),
    5: ("index", "int32", "float32"),
    6: ("python numbers", "errors"),
    7: ("uint64", "float8"),
    8: ("float64", "float32", "x64"),
    9: ("gradients", "integer", "zero"),
}


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of every ```python block of a Markdown text."""
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S)
    ]


def run_examples(text: str, name: str) -> doctest.TestResults:
    """Runs every ``>>>`` example of ``text`` in order, as one session (JAX's default promotion)."""
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    session: dict = {}
    for line, block in python_blocks(text):
        if ">>> " not in block:
            continue
        test = parser.get_doctest(block, session, f"{name}:{line}", name, line - 1)
        with jax.numpy_dtype_promotion("standard"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # JAX's float64 warnings are part of what pages show
            runner.run(test, clear_globs=False, out=lambda s: None)
        session.update(test.globs)
    return runner.summarize(verbose=False)


def sections(text: str) -> dict[int, tuple[str, str]]:
    """Numbered ``## N. Title`` sections: number -> (title, body)."""
    parts = re.split(r"^## (\d+)\. (.*)$", text, flags=re.M)
    return {int(parts[i]): (parts[i + 1], parts[i + 2]) for i in range(1, len(parts), 3)}


# ---- docs/differences.md ---------------------------------------------------------------------


@pytest.mark.slow
def test_differences_examples_print_what_the_page_says():
    text = (DOCS / "differences.md").read_text()
    result = run_examples(text, "differences.md")
    assert result.failed == 0, f"{result.failed} examples of docs/differences.md failed"
    assert result.attempted >= 50, result


def test_differences_page_has_one_section_per_difference_each_with_jax_and_heddle_side_by_side():
    found = sections((DOCS / "differences.md").read_text())
    assert sorted(found) == sorted(DIFFERENCES)
    for number, words in DIFFERENCES.items():
        title, body = found[number]
        for word in words:
            assert word in title.lower(), (number, title, word)
        calls = [
            line for _, block in python_blocks(body) for line in block.splitlines()
            if line.startswith((">>> ", "... "))
        ]  # fmt: skip
        jax_side = [c for c in calls if re.search(r"\b(jnp|jax|np)\.", c)]
        heddle_side = [
            c for c in calls if re.search(r"\b(hnp|hnn|hlax|heddle|policy|autodiff)\.", c)
        ]
        assert jax_side and heddle_side, f"section {number} needs both a JAX and a heddle call"


def test_the_example_runner_fails_on_a_wrong_output():
    text = "```python\n>>> 1 + 1\n3\n>>> 2 + 2\n4\n```\n"
    result = run_examples(text, "probe.md")
    assert (result.failed, result.attempted) == (1, 2)


def test_the_example_runner_sees_names_from_earlier_blocks():
    text = "```python\n>>> a = 41\n```\ntext\n```python\n>>> a + 1\n42\n```\n"
    assert run_examples(text, "probe.md") == doctest.TestResults(failed=0, attempted=2)


def test_the_example_runner_restores_jax_config():
    before = (jax.config.jax_enable_x64, jax.config.jax_numpy_dtype_promotion)
    run_examples("```python\n>>> with jax.enable_x64(True):\n...     pass\n```\n", "probe.md")
    assert (jax.config.jax_enable_x64, jax.config.jax_numpy_dtype_promotion) == before


# ---- docs/index.md and links -------------------------------------------------------------------


def test_index_examples_run():
    text = (DOCS / "index.md").read_text()
    result = run_examples(text, "index.md")
    assert result.failed == 0 and result.attempted >= 3, result


@pytest.mark.parametrize("page", ["index.md", "differences.md", "api.md"])
def test_relative_links_resolve(page):
    text = (DOCS / page).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local or page == "api.md"
    missing = [t for t in local if not (DOCS / t).resolve().exists()]
    assert not missing, f"docs/{page} links to missing files: {missing}"


def test_index_links_every_page_of_the_docs():
    text = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w\-]+\.md)\)", text))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs/index.md does not link: {sorted(pages - linked)}"


def test_changelog_names_the_version_of_the_package():
    import heddle

    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(heddle.__version__)}\]?", text, flags=re.M), (
        f"CHANGELOG.md has no section for version {heddle.__version__}"
    )


# ---- docs/api.md -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen():
    return runpy.run_path(str(DOCS / "gen_api.py"))


@pytest.fixture(scope="module")
def rendered(gen):
    return gen["render"]()


def test_api_reference_is_up_to_date(rendered):
    assert (DOCS / "api.md").read_text() == rendered, (
        "docs/api.md is stale: run python docs/gen_api.py"
    )


@pytest.mark.parametrize(
    "modname", ["heddle", "heddle.policy", "heddle.autodiff", "heddle.scaling", "heddle.quant"]
)
def test_api_reference_has_a_heading_for_every_public_name(rendered, modname):
    module = importlib.import_module(modname)
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    headings = set(re.findall(r"^### `([\w.]+)", rendered, flags=re.M))
    missing = [n for n in names if f"{modname}.{n}" not in headings]
    assert not missing, f"{modname}: no entry for {missing}"


def test_api_reference_lists_every_name_of_heddle_numpy_nn_and_lax(rendered):
    import jax.lax
    import jax.nn
    import jax.numpy

    import heddle.lax
    import heddle.nn
    import heddle.numpy

    listed = set(re.findall(r"`(\w+)[`(]", rendered))
    for ours, theirs in ((heddle.numpy, jax.numpy), (heddle.nn, jax.nn), (heddle.lax, jax.lax)):
        names = getattr(ours, "__all__", None) or dir(ours)
        # every public op (anything not a class or module: those are JAX's types and submodules)
        ops = [
            n for n in names
            if not n.startswith("_") and callable(getattr(ours, n)) and not isinstance(getattr(ours, n), type)
        ]  # fmt: skip
        missing = sorted(set(ops) - listed)
        assert not missing, f"{ours.__name__}: not in docs/api.md: {missing[:20]}"
        assert len(ops) > 20 and theirs is not None


def test_api_reference_numpy_table_matches_the_classification(rendered):
    from heddle.ops import _table

    section = rendered.split("\n## `heddle.numpy`\n")[1].split("\n## ")[0]
    for name, (op_class, plan, _) in list(_table.OPS.items())[::7]:
        row = next(
            (
                r
                for r in section.splitlines()
                if r.startswith(f"| {op_class.value} | {plan.value} |")
            ),
            None,
        )
        assert row is not None and f"`{name}`" in row, (name, op_class, plan)


def test_docstring_markdown_renders_google_sections(gen):
    doc = """Adds two numbers.

    More words
    on two lines.

    Args:
      x: the first
        number, continued.
      y: the second.

    Returns:
      The sum.

    Raises:
      TypeError: for strings.

    Examples:
      >>> 1 + 2
      3
    """
    out = gen["docstring_markdown"](doc)
    assert out == (
        "Adds two numbers.\n\nMore words\non two lines.\n\n**Args**\n\n"
        "- `x`: the first number, continued.\n- `y`: the second.\n\n**Returns**\n\nThe sum.\n\n"
        "**Raises**\n\n- `TypeError`: for strings.\n\n**Examples**\n\n```python\n>>> 1 + 2\n3\n```"
    )
    assert gen["docstring_markdown"](None) == "*(no docstring)*"
    assert gen["docstring_markdown"]("  \n ") == "*(no docstring)*"


def test_signature_drops_quotes_and_addresses(gen):
    def f(x: int, y: object = object()) -> str:  # a default whose repr has an address
        return ""

    sig = gen["signature"](f)
    assert sig.startswith("(x: int, y: object = <object object>) -> str"), sig
    assert gen["signature"](3) == ""


# ---- docs/autocast.md ------------------------------------------------------------------------


@pytest.mark.slow
def test_autocast_page_scripts_run_and_do_what_they_say():
    """The page's flax linen, flax nnx and equinox scripts, each run as written in a fresh scope."""
    blocks = python_blocks((DOCS / "autocast.md").read_text())
    scripts = [b for _, b in blocks if ">>> " not in b and "def " in b]  # not the one-line fragment
    ran = {}
    for block in scripts:
        scope: dict = {}
        with jax.numpy_dtype_promotion("standard"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(block, "autocast.md", "exec"), scope)
        marks = {"linen": "flax.linen", "nnx": "from flax import nnx", "equinox": "import equinox"}
        lib = next(k for k, mark in marks.items() if mark in block)
        ran[lib] = scope
    assert set(ran) == {"linen", "nnx", "equinox"}
    linen = ran["linen"]
    assert (
        linen["heddle"]
        .audit(linen["loss"], linen["params"], linen["x"], linen["y"])
        .counts["narrow_accumulation"]
        == 0
    )  # what the linen script prints
    bn = ran["nnx"]["model"].layers[1]
    assert bn.mean[...].dtype == jax.numpy.float32 and bool((bn.mean[...] != 0).any())
    g = ran["equinox"]["g"]
    assert g.layers[0].weight.shape == (256, 784) and bool(
        jax.numpy.isfinite(g.layers[0].weight).all()
    )
