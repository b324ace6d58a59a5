"""Executes the notebooks: each ``NN-name.py`` (jupytext percent format) into ``NN-name.ipynb``.

Usage:
  python notebooks/execute.py               # every notebook; writes those whose outputs changed
  python notebooks/execute.py 01 03         # those whose name starts with 01 or 03
  python notebooks/execute.py --check       # writes nothing; exits 1 when a notebook differs
  python notebooks/execute.py --force 02    # writes even when nothing differs (e.g. only a figure changed)

The ``.py`` files are the source; the ``.ipynb`` files are written by this script, with their outputs,
and committed. A notebook is written only when ``compare`` finds a difference between the fresh run and
the committed copy (its cells, or the text of its outputs beyond the tolerance), so a run that changes
nothing leaves the tree clean. ``tests/test_notebooks.py`` executes every ``.py`` in a fresh kernel and
checks the committed ``.ipynb`` with the same ``compare``.

Comparison (``compare``), per code cell, of the text outputs only (stdout, stderr, ``text/plain``; figures
are counted, not compared), line by line: the text between numbers must match (runs of whitespace count
as one space); integers must match exactly; floats must match within ``RTOL`` relative, or within one
unit of the last digit printed. Lines that legitimately vary (timings, plain-JAX narrow reductions whose
order depends on the machine) are marked in the cell's source:

  # volatile            -- the whole cell's output: numbers not compared, the text between them still is
  # volatile: REGEX     -- only the output lines in which REGEX is found (``re.search``); may repeat

or with the cell tag ``volatile`` (``# %% tags=["volatile"]``), which marks the whole cell.

Notebooks run on CPU (``JAX_PLATFORMS=cpu``) with matplotlib's Agg backend, in this directory.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import pathlib
import re
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

RTOL = 1e-3
"""Relative tolerance of a float in a text output (heddle's results are deterministic on one machine;
this absorbs the last bits that another CPU or XLA build may change)."""

MAX_REPORTED = 20
"""Differences printed per notebook by ``main``."""


def sources(root: pathlib.Path = HERE) -> list[pathlib.Path]:
    """The notebook sources, in order."""
    return sorted(p for p in root.glob("[0-9][0-9]-*.py"))


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
        coalesce_streams=True,  # one stream output per run of prints, however the kernel flushed them
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute(env=env)
    return nb


def cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell type, source) of every cell: what must agree between a .py and its .ipynb."""
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


# --- comparison ------------------------------------------------------------------------------------

_VOLATILE = re.compile(r"#\s*volatile\b[ \t]*(?::[ \t]*(?P<pattern>\S.*?))?[ \t]*$", re.MULTILINE)
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|inf|nan)(?![\w]|\.\d)", re.IGNORECASE
)
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")  # reprs such as <Figure at 0x7f...>


def volatility(cell) -> tuple[bool, list[re.Pattern]]:
    """(whole cell volatile, patterns of volatile output lines) of a code cell, from its source and tags."""
    whole = "volatile" in cell.get("metadata", {}).get("tags", [])
    patterns = []
    for m in _VOLATILE.finditer(cell.source):
        if m.group("pattern") is None:
            whole = True
        else:
            patterns.append(re.compile(m.group("pattern")))
    return whole, patterns


def text_outputs(cell) -> dict[str, list[str]]:
    """The text of a code cell's outputs, as lines per channel (stdout, stderr, text/plain)."""
    text: dict[str, str] = {}
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            channel, body = out.name, out.text
        elif out.output_type in ("execute_result", "display_data") and "text/plain" in out.get(
            "data", {}
        ):
            channel, body = "text/plain", out.data["text/plain"]
        else:
            continue
        if isinstance(body, list):
            body = "".join(body)
        if channel == "text/plain" and not body.endswith("\n"):
            body += "\n"  # each result is its own line(s)
        text[channel] = text.get(channel, "") + body
    # a stream is joined before it is split into lines: the kernel splits it wherever it flushed
    return {channel: body.splitlines() for channel, body in text.items()}


def figures(cell) -> int:
    """How many image outputs a code cell has."""
    return sum(
        any(k.startswith("image/") for k in out.get("data", {})) for out in cell.get("outputs", [])
    )


def _split(line: str) -> tuple[str, list[str]]:
    """(the line with every number replaced by #, whitespace runs as one space; the numbers)."""
    line = _ADDRESS.sub("at 0x…", line)
    numbers = _NUMBER.findall(line)
    skeleton = " ".join(_NUMBER.sub("#", line).split())
    return skeleton, numbers


def _last_digit(token: str) -> float:
    """One unit of the last digit printed in a float token: 1e-4 for 0.0104, 1e-3 for 2.81e-01."""
    m = re.fullmatch(r"[-+]?\d+(?:\.(\d+))?(?:[eE]([-+]?\d+))?", token)
    if not m:
        return 0.0
    return 10.0 ** (int(m.group(2) or 0) - len(m.group(1) or ""))


def numbers_match(a: str, b: str, rtol: float = RTOL) -> bool:
    """Whether two printed numbers agree: integers exactly, floats within ``rtol`` or one last digit."""
    integer = re.compile(r"[-+]?\d+")
    if integer.fullmatch(a) and integer.fullmatch(b):
        return int(a) == int(b)
    x, y = float(a), float(b)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    diff = abs(x - y)
    return diff <= rtol * max(abs(x), abs(y)) or diff <= max(_last_digit(a), _last_digit(b)) * (
        1 + 1e-9
    )


def _compare_lines(
    where: str, fresh: list[str], committed: list[str], whole: bool, patterns: list[re.Pattern]
) -> list[str]:
    if len(fresh) != len(committed):
        diff = list(
            difflib.unified_diff(committed, fresh, "committed", "fresh run", n=0, lineterm="")
        )
        shown = "\n".join("      " + d for d in diff[2:12])
        return [
            f"{where}: {len(fresh)} lines in the fresh run, {len(committed)} committed\n{shown}"
        ]
    found = []
    for i, (f, c) in enumerate(zip(fresh, committed, strict=True), 1):
        volatile = whole or any(p.search(f) or p.search(c) for p in patterns)
        (fs, fn), (cs, cn) = _split(f), _split(c)
        if fs != cs or len(fn) != len(cn):
            found.append(
                f"{where} line {i}: text differs\n      committed: {c}\n      fresh run: {f}"
            )
        elif not volatile and not all(numbers_match(a, b) for a, b in zip(fn, cn, strict=True)):
            found.append(
                f"{where} line {i}: numbers differ\n      committed: {c}\n      fresh run: {f}"
            )
    return found


def compare(fresh: nbformat.NotebookNode, committed: nbformat.NotebookNode) -> list[str]:
    """The differences that matter between a fresh run and the committed notebook, one string each.

    Cells (type and source) must be the same; per code cell, the same number of figures, and the same
    text outputs line by line: text exactly, integers exactly, floats within ``RTOL`` (or one unit of
    the last digit printed), nothing for the numbers of lines marked volatile (see the module's doc).
    """
    found = []
    a, b = cells(fresh), cells(committed)
    if a != b:
        i = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        found.append(
            f"cells differ from the committed notebook from cell {i + 1} on "
            f"({len(a)} cells in the source, {len(b)} committed)"
        )
    code_f = [(i, c) for i, c in enumerate(fresh.cells) if c.cell_type == "code"]
    code_c = [c for c in committed.cells if c.cell_type == "code"]
    if len(code_f) != len(code_c):
        found.append(f"{len(code_f)} code cells in the fresh run, {len(code_c)} committed")
        return found
    for (i, f), c in zip(code_f, code_c, strict=True):
        first = next(
            (ln for ln in f.source.splitlines() if ln.strip() and not ln.startswith("#")), ""
        )
        where = f"cell {i + 1} ({first[:40]!r})"
        if any(o.output_type == "error" for o in f.get("outputs", [])):
            found.append(f"{where}: raised in the fresh run")
        if figures(f) != figures(c):
            found.append(
                f"{where}: {figures(f)} figure(s) in the fresh run, {figures(c)} committed"
            )
        whole, patterns = volatility(f)
        tf, tc = text_outputs(f), text_outputs(c)
        for channel in sorted(set(tf) | set(tc)):
            found += _compare_lines(
                f"{where} {channel}", tf.get(channel, []), tc.get(channel, []), whole, patterns
            )
    return found


# --- writing ---------------------------------------------------------------------------------------


def clean(
    nb: nbformat.NotebookNode, committed: nbformat.NotebookNode | None = None
) -> nbformat.NotebookNode:
    """Strips what varies between runs and machines, so that a rewrite changes only what changed.

    Drops jupytext's header metadata, the Python version and other kernel details (``language_info``
    keeps its name), and per-cell execution timings; reuses the committed notebook's cell ids for cells
    whose type and source are unchanged (jupytext draws new random ids on every read), and derives the
    ids of new cells from their content.
    """
    nb.metadata.pop("jupytext", None)
    if "language_info" in nb.metadata:
        nb.metadata["language_info"] = {"name": nb.metadata["language_info"].get("name", "python")}
    old: dict[tuple[str, str], list[str]] = {}
    for c in committed.cells if committed is not None else []:
        if "id" in c:
            old.setdefault((c.cell_type, c.source.strip()), []).append(c.id)
    used: set[str] = set()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            out.pop("transient", None)
        key = (cell.cell_type, cell.source.strip())
        ids = [i for i in old.get(key, []) if i not in used]
        if ids:
            cell.id = ids[0]
        elif "id" in cell:
            digest = hashlib.sha1(f"{key[0]}\n{key[1]}".encode()).hexdigest()
            new = digest[:8]
            n = 0
            while new in used or any(new in v for v in old.values()):
                n += 1
                new = hashlib.sha1(f"{digest}{n}".encode()).hexdigest()[:8]
            cell.id = new
        if "id" in cell:
            used.add(cell.id)
    return nb


def build(py: pathlib.Path, *, check: bool = False, force: bool = False, run=None) -> dict:
    """Executes one source and compares it with its committed .ipynb; writes it when they differ.

    ``run`` executes a notebook (``execute`` by default). Returns a dict: ``path``, ``status``
    ("unchanged", "written", or with ``check`` "differs"), ``differences`` (from ``compare``),
    ``seconds`` and ``bytes`` (of the notebook as written, or as it would be).
    """
    start = time.perf_counter()
    nb = (run or execute)(load(py))
    out = py.with_suffix(".ipynb")
    committed = nbformat.read(out, as_version=4) if out.exists() else None
    nb = clean(nb, committed)
    differences = (
        compare(nb, committed) if committed is not None else [f"{out.name} does not exist"]
    )
    text = nbformat.writes(nb)
    if not text.endswith("\n"):
        text += "\n"
    if not differences and not force:
        status = "unchanged"
    elif check:
        status = "differs"
    else:
        out.write_text(text, encoding="utf-8")
        status = "written"
    return {
        "path": out,
        "status": status,
        "differences": differences,
        "seconds": time.perf_counter() - start,
        "bytes": len(text.encode()),
    }


def main(argv: list[str], *, root: pathlib.Path = HERE, run=None) -> int:
    """Builds the notebooks named by prefix in ``argv`` (all by default); see the module's doc."""
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - {"--check", "--force"}
    if unknown:
        print(f"unknown option(s) {sorted(unknown)}; have --check, --force")
        return 2
    prefixes = [a for a in argv if not a.startswith("--")]
    chosen = [
        p for p in sources(root) if not prefixes or any(p.name.startswith(a) for a in prefixes)
    ]
    if not chosen:
        print(f"no notebook matches {prefixes}; have {[p.name for p in sources(root)]}")
        return 2
    status = 0
    for py in chosen:
        r = build(py, check="--check" in flags, force="--force" in flags, run=run)
        flag = "" if r["bytes"] <= MAX_BYTES else f"  TOO LARGE (> {MAX_BYTES} bytes)"
        status |= r["bytes"] > MAX_BYTES or r["status"] == "differs"
        print(
            f"{r['path'].name}: {r['status']} ({r['seconds']:.1f}s, {r['bytes'] / 1000:.0f} kB){flag}"
        )
        for d in r["differences"][:MAX_REPORTED]:
            print(f"  {d}")
        if len(r["differences"]) > MAX_REPORTED:
            print(f"  ... and {len(r['differences']) - MAX_REPORTED} more")
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
