"""Executes the notebooks: each ``NN-name.py`` (jupytext percent format) into ``NN-name.ipynb``.

Usage:
  python notebooks/execute.py               # every notebook
  python notebooks/execute.py 01 03         # those whose name starts with 01 or 03

The ``.py`` files are the source; the ``.ipynb`` files are written by this script, with their outputs,
and committed. ``tests/test_notebooks.py`` executes every ``.py`` in a fresh kernel and checks that the
committed ``.ipynb`` holds the same cells and was executed without error.

Notebooks run on CPU (``JAX_PLATFORMS=cpu``) with matplotlib's Agg backend, in this directory.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT_S = 240
"""Seconds a single cell may run before execution fails."""

MAX_BYTES = 300_000
"""Largest committed .ipynb, in bytes."""


def sources() -> list[pathlib.Path]:
    """The notebook sources, in order."""
    return sorted(p for p in HERE.glob("[0-9][0-9]-*.py"))


def load(py: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook of a jupytext percent-format source, unexecuted."""
    return jupytext.read(py, fmt="py:percent")


def execute(nb: nbformat.NotebookNode, timeout: int = TIMEOUT_S) -> nbformat.NotebookNode:
    """Runs every cell in a fresh kernel on CPU; raises ``CellExecutionError`` on the first error."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    root = str(HERE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute(env=env)
    return nb


def cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell type, source) of every cell: what must agree between a .py and its .ipynb."""
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def build(py: pathlib.Path) -> tuple[pathlib.Path, float, int]:
    """Executes one source and writes its .ipynb; returns (path, seconds, bytes)."""
    start = time.perf_counter()
    nb = execute(load(py))
    nb.metadata.pop("jupytext", None)
    out = py.with_suffix(".ipynb")
    nbformat.write(nb, out)
    return out, time.perf_counter() - start, out.stat().st_size


def main(argv: list[str]) -> int:
    """Builds the notebooks named by prefix in ``argv`` (all by default)."""
    chosen = [p for p in sources() if not argv or any(p.name.startswith(a) for a in argv)]
    if not chosen:
        print(f"no notebook matches {argv}; have {[p.name for p in sources()]}")
        return 2
    status = 0
    for py in chosen:
        out, seconds, size = build(py)
        flag = "" if size <= MAX_BYTES else f"  TOO LARGE (> {MAX_BYTES} bytes)"
        status |= size > MAX_BYTES
        print(f"{out.name}: {seconds:.1f}s, {size / 1000:.0f} kB{flag}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
