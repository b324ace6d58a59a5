"""The notebooks: each ``notebooks/NN-name.py`` (jupytext percent format) runs in a fresh kernel on
CPU without error, and the committed ``NN-name.ipynb`` holds the same cells, executed in order without
error, with its figures, small, and with the text outputs of a fresh run (``compare`` in
notebooks/execute.py: integers exactly, floats within a tolerance, lines marked ``# volatile`` not).

Regenerate the committed notebooks with ``python notebooks/execute.py`` (writes only those that differ).
"""

from __future__ import annotations

import pathlib
import runpy
import time
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = [
    "01-promotion-lattice",
    "02-accumulation",
    "03-casts",
    "04-mixed-precision",
    "05-audit",
    "06-quantisation",
    "07-autocast",
]
TIMEOUT_S = 300  # per cell; each notebook takes well under a minute on an idle 2-core machine


@pytest.fixture(scope="module")
def nbx():
    """The functions of notebooks/execute.py."""
    pytest.importorskip("nbclient")
    pytest.importorskip("jupytext")
    pytest.importorskip("ipykernel")
    return runpy.run_path(str(NOTEBOOKS / "execute.py"))


def sources() -> list[str]:
    return sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]-*.py"))


def output_kinds(nb) -> list[tuple[str, ...]]:
    """Per code cell, the sorted kinds of output it produced (stream, image/png, text/plain, error)."""
    kinds = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        found = set()
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                found.add("stream")
            elif out.output_type == "error":
                found.add("error")
            else:
                found.update(k for k in out.get("data", {}) if k in ("image/png", "text/plain"))
        kinds.append(tuple(sorted(found)))
    return kinds


def test_every_planned_notebook_has_a_source():
    assert sources() == EXPECTED


@pytest.mark.parametrize("name", sources())
def test_committed_notebook_matches_its_source_and_was_executed(nbx, name):
    import nbformat

    py, ipynb = NOTEBOOKS / f"{name}.py", NOTEBOOKS / f"{name}.ipynb"
    assert ipynb.exists(), f"{ipynb.name} is missing: run python notebooks/execute.py {name[:2]}"
    committed = nbformat.read(ipynb, as_version=4)
    nbformat.validate(committed)
    assert nbx["cells"](committed) == nbx["cells"](nbx["load"](py)), (
        f"{ipynb.name} is out of sync with {py.name}: run python notebooks/execute.py {name[:2]}"
    )
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert code and [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
        f"{ipynb.name} was not executed top to bottom in one kernel"
    )
    errors = [c.source[:60] for c in code if any(o.output_type == "error" for o in c.outputs)]
    assert not errors, f"{ipynb.name} has cells that failed: {errors}"
    assert sum("image/png" in k for k in output_kinds(committed)) >= 1, "no figure"
    size = ipynb.stat().st_size
    assert size < nbx["MAX_BYTES"], f"{ipynb.name} is {size} bytes"


@pytest.mark.slow
@pytest.mark.parametrize("name", sources())
def test_notebook_runs_in_a_fresh_kernel(nbx, name):
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb = nbx["load"](NOTEBOOKS / f"{name}.py")
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # jupyter_core and the zmq loop warn about their own configuration; not the notebook's
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            nbx["execute"](nb, timeout=TIMEOUT_S)
    except CellExecutionError as e:
        pytest.fail(f"{name}.py failed:\n{str(e)[-3000:]}")
    seconds = time.perf_counter() - start
    committed = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # the same cells, figures and text outputs as the committed copy (numbers within the tolerance)
    differences = nbx["compare"](nb, committed)
    shown = "\n".join(differences[:20]) + (
        f"\n... and {len(differences) - 20} more" if len(differences) > 20 else ""
    )
    assert not differences, (
        f"{name}: a fresh run differs from the committed notebook "
        f"(run python notebooks/execute.py {name[:2]}, or mark a line that legitimately varies "
        f"'# volatile: REGEX', see notebooks/README.md):\n{shown}"
    )
    print(f"{name}: {seconds:.1f}s")


def test_execute_script_refuses_an_unknown_prefix(nbx, capsys):
    assert nbx["main"](["99"]) == 2
    assert "no notebook matches" in capsys.readouterr().out


def test_cells_compares_sources_and_types_only(nbx):
    import nbformat

    a = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\n")])
    b = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    b.cells[0].outputs = [nbformat.v4.new_output("stream", text="1")]
    c = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x = 1")])
    assert nbx["cells"](a) == nbx["cells"](b)
    assert nbx["cells"](a) != nbx["cells"](c)


# --- compare: synthetic notebooks ----------------------------------------------------------------------


def notebook(*cells):
    """A notebook of code cells, each given as (source, outputs), outputs as ("stdout", text),
    ("text/plain", text) or ("image", None)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    for n, (source, outputs) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, execution_count=n)
        for kind, text in outputs:
            if kind in ("stdout", "stderr"):
                cell.outputs.append(nbformat.v4.new_output("stream", name=kind, text=text))
            elif kind == "text/plain":
                cell.outputs.append(
                    nbformat.v4.new_output(
                        "execute_result", data={"text/plain": text}, execution_count=n
                    )
                )
            else:
                cell.outputs.append(
                    nbformat.v4.new_output(
                        "display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Image>"}
                    )
                )
        nb.cells.append(cell)
    return nb


AUDIT = "audit: 3 finding(s): lossy_conversion 3\n  forward dot_general bf16,bf16 -> bf16 [64,64]\n"


def test_compare_finds_nothing_between_equal_notebooks(nbx):
    a = notebook(("print(report)", [("stdout", AUDIT)]), ("show(fig)", [("image", None)]))
    b = notebook(("print(report)", [("stdout", AUDIT)]), ("show(fig)", [("image", None)]))
    assert nbx["compare"](a, b) == []


def test_compare_reports_a_changed_count(nbx):
    fresh = notebook(("print(report)", [("stdout", AUDIT.replace("3", "6"))]))
    committed = notebook(("print(report)", [("stdout", AUDIT)]))
    (difference,) = nbx["compare"](fresh, committed)
    assert (
        "cell 1" in difference and "stdout line 1" in difference and "numbers differ" in difference
    )
    assert "lossy_conversion 3" in difference and "lossy_conversion 6" in difference


def test_compare_reports_a_changed_shape_or_dtype(nbx):
    committed = notebook(("print(report)", [("stdout", AUDIT)]))
    for changed in (AUDIT.replace("[64,64]", "[64,65]"), AUDIT.replace("-> bf16", "-> f32")):
        assert (
            len(nbx["compare"](notebook(("print(report)", [("stdout", changed)])), committed)) == 1
        )


def test_compare_takes_floats_within_the_tolerance(nbx):
    committed = notebook(("print(loss)", [("stdout", "final loss 0.216012 after 600 steps\n")]))
    for close in ("0.216100", "0.2160", "2.16012e-01"):  # within 1e-3 relative
        fresh = notebook(("print(loss)", [("stdout", f"final loss {close} after 600 steps\n")]))
        assert nbx["compare"](fresh, committed) == [], close
    far = notebook(("print(loss)", [("stdout", "final loss 0.2174 after 600 steps\n")]))
    assert len(nbx["compare"](far, committed)) == 1
    steps = notebook(("print(loss)", [("stdout", "final loss 0.216012 after 601 steps\n")]))
    assert len(nbx["compare"](steps, committed)) == 1


def test_numbers_match_integers_exactly_and_floats_within_rtol_or_the_last_digit(nbx):
    match = nbx["numbers_match"]
    assert match("784", "784") and not match("784", "785") and not match("3", "6")
    assert match("0.2160", "0.21602") and not match("0.2160", "0.2174")
    assert match("0.0104", "0.0105")  # a value on a rounding boundary flips the last digit printed
    assert not match("0.0104", "0.0106")
    assert match("nan", "nan") and not match("nan", "1.0") and match("inf", "inf")
    assert not match("-inf", "inf")


def test_compare_ignores_the_numbers_of_a_volatile_line_but_not_its_text(nbx):
    source = "print(table)  # volatile: ^jax "
    committed = notebook((source, [("stdout", "heddle 0.2174 5\njax 0.2173 5\n")]))
    fresh = notebook((source, [("stdout", "heddle 0.2174 5\njax 0.2299 7\n")]))
    assert nbx["compare"](fresh, committed) == []
    heddle_changed = notebook((source, [("stdout", "heddle 0.2299 5\njax 0.2173 5\n")]))
    assert len(nbx["compare"](heddle_changed, committed)) == 1
    renamed = notebook((source, [("stdout", "heddle 0.2174 5\njax (scan) 0.2173 5\n")]))
    assert "text differs" in nbx["compare"](renamed, committed)[0]


def test_compare_ignores_the_numbers_of_a_volatile_cell(nbx):
    for source, tags in (
        ("# volatile\nprint(f'{rate:.0f} steps/s')", []),
        ("print(f'{rate:.0f} steps/s')", ["volatile"]),
    ):  # a comment, or a cell tag
        committed = notebook((source, [("stdout", "1234 steps/s in 3.1 s\n")]))
        fresh = notebook((source, [("stdout", "987 steps/s in 4.0 s\n")]))
        for nb in (committed, fresh):
            nb.cells[0].metadata["tags"] = tags
        assert nbx["compare"](fresh, committed) == [], source
    unmarked = ("print(f'{rate:.0f} steps/s')", [])
    assert (
        len(
            nbx["compare"](
                notebook((unmarked[0], [("stdout", "987 steps/s\n")])),
                notebook((unmarked[0], [("stdout", "1234 steps/s\n")])),
            )
        )
        == 1
    )


def test_compare_joins_a_stream_however_it_was_split(nbx):
    committed = notebook(("print(a); print(b)", [("stdout", "a 1\n"), ("stdout", "b 2\n")]))
    fresh = notebook(("print(a); print(b)", [("stdout", "a 1\nb 2\n")]))
    assert nbx["compare"](fresh, committed) == []


def test_compare_reports_lines_added_or_removed_figures_and_changed_cells(nbx):
    committed = notebook(("print(x)", [("stdout", "a 1\n"), ("image", None)]))
    more = notebook(("print(x)", [("stdout", "a 1\nb 2\n"), ("image", None)]))
    assert "2 lines in the fresh run, 1 committed" in nbx["compare"](more, committed)[0]
    no_figure = notebook(("print(x)", [("stdout", "a 1\n")]))
    assert "0 figure(s) in the fresh run, 1 committed" in nbx["compare"](no_figure, committed)[0]
    edited = notebook(("print(x)  # edited", [("stdout", "a 1\n"), ("image", None)]))
    assert "cells differ" in nbx["compare"](edited, committed)[0]
    result = notebook(("x", [("text/plain", "Array(3, dtype=int32)")]))
    other = notebook(("x", [("text/plain", "Array(4, dtype=int32)")]))
    assert "text/plain line 1" in nbx["compare"](other, result)[0]


def test_compare_ignores_object_addresses_in_reprs(nbx):
    committed = notebook(("fig", [("text/plain", "<Figure at 0x7f3a2c1b0e50>")]))
    fresh = notebook(("fig", [("text/plain", "<Figure at 0x7f00deadbeef>")]))
    assert nbx["compare"](fresh, committed) == []


# --- execute.py writes a notebook only when it changed ---------------------------------------------------

SOURCE = """# %% [markdown]
# # A notebook

# %%
print("findings", 3)
print("loss", 0.25)

# %%
print("42 steps/s")  # volatile: steps/s
"""


def fake_run(findings=3, loss=0.25, rate=42):
    """Stands in for execute: fills the outputs a kernel would, and metadata that varies per run."""
    import nbformat

    def run(nb):
        nb.metadata["language_info"] = {
            "name": "python",
            "version": "3.11.7",
            "mimetype": "text/x-python",
        }
        code = [c for c in nb.cells if c.cell_type == "code"]
        texts = [f"findings {findings}\nloss {loss}\n", f"{rate} steps/s\n"]
        for n, (cell, text) in enumerate(zip(code, texts, strict=True), 1):
            cell.execution_count = n
            cell.metadata["execution"] = {"iopub.execute_input": f"2025-01-0{n}T00:00:00Z"}
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        return nb

    return run


def test_build_writes_only_when_the_outputs_change(nbx, tmp_path):
    import nbformat

    py = tmp_path / "01-sample.py"
    py.write_text(SOURCE)
    ipynb = py.with_suffix(".ipynb")

    first = nbx["build"](py, run=fake_run())
    assert first["status"] == "written" and ipynb.exists()
    written = ipynb.read_text()
    nb = nbformat.read(ipynb, as_version=4)
    assert "jupytext" not in nb.metadata and nb.metadata["language_info"] == {"name": "python"}
    assert all("execution" not in c.metadata for c in nb.cells)

    # the same outputs, or only a volatile line changed, or a float within the tolerance: not rewritten
    for run in (fake_run(), fake_run(rate=7), fake_run(loss=0.2500001)):
        again = nbx["build"](py, run=run)
        assert again["status"] == "unchanged" and again["differences"] == []
        assert ipynb.read_text() == written

    # --check reports a changed count and writes nothing
    checked = nbx["build"](py, check=True, run=fake_run(findings=6))
    assert checked["status"] == "differs" and len(checked["differences"]) == 1
    assert ipynb.read_text() == written

    changed = nbx["build"](py, run=fake_run(findings=6))
    assert changed["status"] == "written" and "findings 6" in ipynb.read_text()
    # a rewrite keeps the cell ids of unchanged cells (jupytext draws new ones on every read)
    ids = [c.id for c in nbformat.read(ipynb, as_version=4).cells]
    assert ids == [c.id for c in nb.cells]

    py.write_text(SOURCE.replace("# # A notebook", "# # A notebook, retitled"))
    retitled = nbx["build"](py, run=fake_run(findings=6))
    assert retitled["status"] == "written" and "cells differ" in retitled["differences"][0]
    assert "retitled" in ipynb.read_text()


def test_main_says_unchanged_or_written_and_check_exits_1_on_a_difference(nbx, tmp_path, capsys):
    (tmp_path / "01-sample.py").write_text(SOURCE)
    assert nbx["main"]([], root=tmp_path, run=fake_run()) == 0
    assert "01-sample.ipynb: written" in capsys.readouterr().out
    assert nbx["main"](["--check"], root=tmp_path, run=fake_run()) == 0
    assert "01-sample.ipynb: unchanged" in capsys.readouterr().out
    before = (tmp_path / "01-sample.ipynb").read_text()
    assert nbx["main"](["--check", "01"], root=tmp_path, run=fake_run(findings=4)) == 1
    out = capsys.readouterr().out
    assert "01-sample.ipynb: differs" in out and "findings 4" in out
    assert (tmp_path / "01-sample.ipynb").read_text() == before
    assert nbx["main"](["--force"], root=tmp_path, run=fake_run()) == 0
    assert "01-sample.ipynb: written" in capsys.readouterr().out
    assert nbx["main"](["--bogus"], root=tmp_path, run=fake_run()) == 2
