"""The examples of docs/autocast.md, docs/audit.md and docs/coming-from-torch-keras.md run as written
and print what the pages show.

Every ```python block of these pages is one of:

- ``>>>`` examples: run in order as one session per page (``run_examples`` of tests/test_docs.py:
  JAX's default promotion, warnings shown rather than raised);
- a script: run in a fresh scope; what it prints must be the ```text block that follows it (a
  script followed by no ```text block must print nothing);
- the listing of a file of ``docs/examples/``, which must be that file, byte for byte.

The audit page's examples run in ``docs/examples`` (as the page says), so ``import mlp`` finds the
module it shows. Its ```bash blocks are the audit command line: the first runs in a fresh process,
``python -m heddle audit ...`` as a reader types it; the error example runs in this process.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys
import warnings

import jax
import pytest

try:
    from test_docs import python_blocks, run_examples
except ImportError:  # tests/ is not on sys.path (another import mode): load the module by path
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_heddle_test_docs", pathlib.Path(__file__).with_name("test_docs.py")
    )
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    python_blocks, run_examples = _mod.python_blocks, _mod.run_examples

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"

# page -> (the least number of >>> examples, of scripts with shown output) that must have run
PAGES = {
    "autocast.md": (20, 3),
    "audit.md": (10, 5),
    "coming-from-torch-keras.md": (50, 0),
}


def fences(text: str) -> list[tuple[int, str, str]]:
    """(line number, language, body) of every fenced block of a Markdown text, in order."""
    return [
        (text[: m.start()].count("\n") + 1, m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
    ]


def shown_after(blocks: list[tuple[int, str, str]], i: int) -> str | None:
    """The body of the ```text block right after block ``i``, or None."""
    if i + 1 < len(blocks) and blocks[i + 1][1] == "text":
        return blocks[i + 1][2]
    return None


@contextlib.contextmanager
def in_examples_dir(monkeypatch):
    """The audit page's setting: the current directory is docs/examples, and ``import mlp`` works."""
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    before = set(sys.modules)
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name in {p.stem for p in EXAMPLES.glob("*.py")}:
                del sys.modules[name]


def run_script(body: str, name: str) -> str:
    """Runs a script block in a fresh scope; returns what it printed."""
    out = io.StringIO()
    with (
        jax.numpy_dtype_promotion("standard"),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(out),
    ):
        warnings.simplefilter("ignore")
        exec(compile(body, name, "exec"), {"__name__": "__main__"})
    return out.getvalue()


def check_page(page: str) -> tuple[int, int]:
    """Runs every python block of ``page``; returns (doctest examples attempted, scripts checked)."""
    text = (DOCS / page).read_text()
    result = run_examples(text, page)
    assert result.failed == 0, f"{result.failed} >>> examples of docs/{page} failed"
    listings = {p.read_text(): p for p in EXAMPLES.glob("*.py")}
    blocks = fences(text)
    checked = 0
    for i, (line, lang, body) in enumerate(blocks):
        if lang != "python" or ">>> " in body or body in listings:
            continue
        printed = run_script(body, f"docs/{page}:{line}")
        shown = shown_after(blocks, i)
        if shown is None:
            assert printed == "", f"docs/{page}:{line} prints output the page does not show"
        else:
            assert printed.rstrip("\n") == shown.rstrip("\n"), (
                f"docs/{page}:{line} printed\n{printed}\nwhere the page shows\n{shown}"
            )
            checked += 1
    return result.attempted, checked


def test_every_python_block_is_run_by_the_checks():
    """No block is skipped silently: each is >>> examples, a script, or a file's listing."""
    for page in PAGES:
        text = (DOCS / page).read_text()
        assert len(python_blocks(text)) == sum(lang == "python" for _, lang, _ in fences(text))
        for line, lang, _ in fences(text):
            assert lang in {"python", "text", "bash"}, f"docs/{page}:{line}: ```{lang} block"


@pytest.mark.slow
def test_autocast_page_runs_and_prints_what_it_shows():
    attempted, checked = check_page("autocast.md")
    want = PAGES["autocast.md"]
    assert attempted >= want[0] and checked >= want[1], (attempted, checked)


@pytest.mark.slow
def test_coming_from_torch_keras_page_runs_and_prints_what_it_shows():
    attempted, checked = check_page("coming-from-torch-keras.md")
    want = PAGES["coming-from-torch-keras.md"]
    assert attempted >= want[0] and checked >= want[1], (attempted, checked)


@pytest.mark.slow
def test_audit_page_runs_and_prints_what_it_shows(monkeypatch):
    with in_examples_dir(monkeypatch):
        attempted, checked = check_page("audit.md")
    want = PAGES["audit.md"]
    assert attempted >= want[0] and checked >= want[1], (attempted, checked)


def test_audit_page_shows_the_example_files_as_they_are():
    text = (DOCS / "audit.md").read_text()
    bodies = {body for _, lang, body in fences(text) if lang == "python"}
    files = sorted(EXAMPLES.glob("*.py"))
    assert files, "docs/examples/ has no example module"
    for path in files:
        assert path.read_text() in bodies, f"docs/audit.md does not show {path.name} as it is"
        assert f"(examples/{path.name})" in text, f"docs/audit.md does not link {path.name}"


def _python_m_heddle(command: str) -> list[str]:
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "heddle"], command
    return argv[3:]


@pytest.mark.slow
def test_audit_page_command_line_prints_what_it_shows():
    """The first ```bash block, run by bash in docs/examples with this interpreter as ``python``."""
    blocks = fences((DOCS / "audit.md").read_text())
    i = next(i for i, (_, lang, body) in enumerate(blocks) if lang == "bash" and "echo" in body)
    script, shown = blocks[i][2], shown_after(blocks, i)
    assert shown is not None and "exit status 1" in shown
    bin_dir = str(pathlib.Path(sys.executable).parent)
    env = dict(os.environ, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"
    for line in script.splitlines():  # every command is one the page explains
        assert line.startswith(("python -m heddle audit ", "echo ")), line
    out = subprocess.run(
        ["bash", "-c", script], cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.rstrip("\n") == shown.rstrip("\n"), out.stdout


def test_audit_page_error_example_prints_what_it_shows(monkeypatch):
    """The usage-error example, run in this process (``python -m heddle`` is ``heddle.__main__``)."""
    from heddle.__main__ import main

    blocks = fences((DOCS / "audit.md").read_text())
    i = next(i for i, (_, lang, body) in enumerate(blocks) if lang == "bash" and "nomod" in body)
    shown = shown_after(blocks, i)
    assert shown is not None
    err = io.StringIO()
    with in_examples_dir(monkeypatch), contextlib.redirect_stderr(err):
        rc = main(_python_m_heddle(blocks[i][2].strip()))
    assert rc == 2
    assert err.getvalue().rstrip("\n") == shown.rstrip("\n")


@pytest.mark.parametrize("page", list(PAGES))
def test_relative_links_resolve(page):
    text = (DOCS / page).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if "://" not in t and not (DOCS / t).resolve().exists()]
    assert not missing, f"docs/{page} links to missing files: {missing}"


def test_the_page_checker_catches_a_script_printing_what_the_page_does_not_show(tmp_path):
    body = 'print("one")\n'
    blocks = fences(f"```python\n{body}```\n\nprints\n\n```text\ntwo\n```\n")
    assert [lang for _, lang, _ in blocks] == ["python", "text"]
    assert run_script(blocks[0][2], "probe") != shown_after(blocks, 0)
