"""The notebooks: each ``notebooks/NN-name.py`` (jupytext percent format) runs in a fresh kernel on
CPU without error, and the committed ``NN-name.ipynb`` holds the same cells, executed in order without
error, with its figures, and small.

Regenerate the committed notebooks with ``python notebooks/execute.py``.
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
    # the same kinds of output as the committed copy: a figure where it has one, text where it has text
    assert output_kinds(nb) == output_kinds(committed), (
        f"{name}: the outputs of a fresh run differ in kind from the committed notebook; "
        f"run python notebooks/execute.py {name[:2]}"
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
