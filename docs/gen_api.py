"""Writes docs/api.md, the API reference, from the public names and docstrings of heddle.

Run ``python docs/gen_api.py`` after changing a public name or a docstring; ``tests/test_docs.py``
fails while docs/api.md differs from what this script renders.

Namespaces documented name by name: ``heddle``, ``heddle.policy``, ``heddle.autodiff``,
``heddle.scaling``, ``heddle.quant``. Summarised as tables: ``heddle.numpy`` (every name by op class,
from ``heddle/ops/_table.py``), ``heddle.nn`` and ``heddle.lax`` (heddle's own ops with their
"Dtypes:" line; the names passed through from JAX unchanged, listed). A namespace that does not import
is listed as unavailable, with the error.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import pathlib
import re
import runpy
import sys
import types
import typing
from typing import Any

PAGE = pathlib.Path(__file__).with_name("api.md")
_docgen = types.SimpleNamespace(**runpy.run_path(str(PAGE.with_name("_docgen.py"))))

FULL = ("heddle", "heddle.policy", "heddle.autodiff", "heddle.scaling", "heddle.quant")
"""Namespaces whose every public name is documented with its signature and docstring."""

SECTIONS = ("Args", "Arguments", "Attributes", "Returns", "Yields", "Raises", "Examples", "Example")
_ITEM_SECTIONS = ("Args", "Arguments", "Attributes", "Raises")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _import(name: str) -> tuple[types.ModuleType | None, str | None]:
    try:
        return importlib.import_module(name), None
    except Exception as e:  # any import failure is reported on the page, not raised
        return None, f"{type(e).__name__}: {e}"


def _public(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    names = [n for n in names if not _is_future(getattr(module, n, None))]
    return sorted(names, key=lambda n: (n.lower(), n))


def signature(obj: Any) -> str:
    """The call signature of ``obj`` as text, memory addresses removed; ``""`` when it has none.

    Args:
      obj: a function or class.

    Returns:
      ``"(x, dtype, *, saturate=False)"`` and the like.

    Examples:
      >>> signature(lambda x, y=2: None)
      '(x, y=2)'
    """
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return ""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = [p.replace(annotation=_plain(p.annotation)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=_plain(sig.return_annotation))
    return _ADDRESS.sub("", str(sig))


class _Raw:
    """An annotation shown as its text, without the quotes of a string annotation."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _plain(annotation: Any) -> Any:
    if isinstance(annotation, str):
        return _Raw(annotation)
    if isinstance(annotation, typing.ForwardRef):
        return _Raw(annotation.__forward_arg__)
    return annotation


def docstring_markdown(doc: str | None) -> str:
    """A Google-style docstring as Markdown: sections bold, argument lists as lists, examples as code.

    Args:
      doc: the docstring (any indentation) or None.

    Returns:
      Markdown text; ``"*(no docstring)*"`` for a missing or empty docstring.

    Examples:
      >>> print(docstring_markdown("Adds.\\n\\nArgs:\\n  x: a number.\\n"))
      Adds.
      <BLANKLINE>
      **Args**
      <BLANKLINE>
      - `x`: a number.
    """
    if not doc or not doc.strip():
        return "*(no docstring)*"
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    section: str | None = None
    block: list[str] = []

    def flush() -> None:
        if section is None:
            out.extend(block)
        elif section in ("Examples", "Example"):
            body = inspect.cleandoc("\n".join(block)).strip("\n")
            if body:
                out.extend(["", "```python", body, "```"])
        elif section in _ITEM_SECTIONS:
            out.append("")
            out.extend(_items(block))
        else:
            text = " ".join(s.strip() for s in block if s.strip())
            if text:
                out.extend(["", text])
        block.clear()

    for line in lines:
        header = line.strip().rstrip(":")
        if line.strip().endswith(":") and header in SECTIONS and not line.startswith(" "):
            flush()
            section = header
            out.extend(["", f"**{'Examples' if header == 'Example' else header}**"])
            continue
        block.append(line)
    flush()
    text = "\n".join(out).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text)


def _items(block: list[str]) -> list[str]:
    """``name: text`` items of an Args/Raises section as a Markdown list, continuations joined."""
    body = [s for s in block if s.strip()]
    if not body:
        return []
    indent = min(len(s) - len(s.lstrip()) for s in body)
    items: list[list[str]] = []
    for s in body:
        if len(s) - len(s.lstrip()) == indent or not items:
            items.append([s.strip()])
        else:
            items[-1].append(s.strip())
    out = []
    for parts in items:
        head, sep, rest = parts[0].partition(":")
        if sep and " " not in head.strip("*"):
            out.append(f"- `{head.strip()}`:{' ' + ' '.join([rest.strip(), *parts[1:]]).strip()}")
        else:
            out.append("- " + " ".join(parts))
    return out


def _is_future(obj: Any) -> bool:
    """A ``from __future__ import`` leaked into a namespace: not an API name."""
    import __future__

    return isinstance(obj, __future__._Feature)


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.ismodule(obj):
        return "module"
    if callable(obj):
        return "function"
    return "data"


def _summary(doc: str | None) -> str:
    if not doc or not doc.strip():
        return "*(no docstring)*"
    first = inspect.cleandoc(doc).split("\n\n")[0]
    return " ".join(first.split())


def render_full(module_name: str, module: types.ModuleType) -> list[str]:
    """The reference of one namespace, every public name with its signature and docstring.

    Args:
      module_name: the dotted name, e.g. ``"heddle.policy"``.
      module: the imported module.

    Returns:
      Markdown lines.
    """
    out = [f"## `{module_name}`", "", _summary(module.__doc__), ""]
    for name in _public(module):
        obj = getattr(module, name)
        kind = _kind(obj)
        qual = f"{module_name}.{name}"
        if kind == "module":
            out += [f"### `{qual}`", "", f"Module: {_summary(obj.__doc__)}", ""]
            continue
        if kind == "data":
            doc = _docgen.attribute_doc(module_name, name)
            out += [f"### `{qual}`", "", f"*data* ({type(obj).__name__})", ""]
            out += [docstring_markdown(doc), ""]
            continue
        sig = signature(obj)
        out += [f"### `{qual}{sig}`" if sig else f"### `{qual}`", "", f"*{kind}*", ""]
        out += [
            docstring_markdown(
                obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
            ),
            "",
        ]
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            values = ", ".join(f"`{m.name}` ({m.value!r})" for m in obj)
            out += [f"Members: {values}.", ""]
        elif inspect.isclass(obj) and obj.__module__.startswith("heddle"):
            members = _docgen.members(obj)
            if members:
                out += ["Members:", ""]
                for attr, value in members:
                    if isinstance(value, property):
                        out.append(f"- `{attr}` (property): {_summary(value.__doc__)}")
                    else:
                        out.append(f"- `{attr}{signature(value)}`: {_summary(value.__doc__)}")
                out.append("")
    return out


def _dtypes_line(doc: str | None) -> str:
    """The ``Dtypes:`` paragraph of an op's docstring, on one line (the summary if it has none)."""
    for para in inspect.cleandoc(doc or "").split("\n\n"):
        if para.startswith("Dtypes:"):
            return " ".join(para.removeprefix("Dtypes:").split())
    return _summary(doc)


def render_numpy(module: types.ModuleType) -> list[str]:
    """``heddle.numpy`` as tables: the ops by op class and plan, then the pass-throughs by reason.

    Args:
      module: the imported ``heddle.numpy``.

    Returns:
      Markdown lines.
    """
    from heddle.ops import _creation, _table

    public = {n for n in dir(module) if not n.startswith("_")}
    groups: dict[tuple[str, str], list[str]] = {}
    for name, (op_class, plan, _) in _table.OPS.items():
        if name in public:
            groups.setdefault((op_class.value, plan.value), []).append(name)
    n_ops = sum(len(v) for v in groups.values())
    out = [
        "## `heddle.numpy`",
        "",
        _summary(module.__doc__),
        "",
        f"{len(public)} public names. Every op takes the arguments of its `jax.numpy` namesake; its "
        "docstring starts with a `Dtypes:` line. The classification below is the data in "
        "`heddle/ops/_table.py` (a test compares it with `dir(jax.numpy)`).",
        "",
        f"### Ops under the policy ({n_ops})",
        "",
        "Op class fixes the result dtype (POLICY.md 4); the plan says how it computes: `upcast` "
        "(narrow floats computed in float32, rounded once), `native` (in the result dtype), "
        "`acc_dtype` (accumulates in `acc_dtype`, rounded once), `preferred` "
        "(`preferred_element_type=acc_dtype`).",
        "",
        "| op class | plan | names |",
        "|---|---|---|",
    ]
    for (cls, plan), names in sorted(groups.items()):
        out.append(f"| {cls} | {plan} | {' '.join(f'`{n}`' for n in sorted(names))} |")
    creation = sorted(n for n in _creation.CREATION if n in public)
    out += [
        "",
        f"### Creation ({len(creation)})",
        "",
        "The `dtype` argument; without one, the policy's defaults for Python numbers or the typed "
        "input's own dtype. Host float64 data converts with the correctly rounded cast.",
        "",
        " ".join(f"`{n}`" for n in creation),
        "",
        "### Passed through unchanged",
        "",
        "| group | why there is no dtype decision | names |",
        "|---|---|---|",
    ]
    for group, (reason, names) in _table.PASS_REASONS.items():
        present = sorted(n for n in names.split() if n in public)
        out.append(f"| {group} | {reason} | {' '.join(f'`{n}`' for n in present)} |")
    classified = set(_table.OPS) | set(_table.PASS) | set(_creation.CREATION) | {"astype"}
    rest = sorted(n for n in public - classified if not _is_future(getattr(module, n)))
    own = [
        n
        for n in rest
        if callable(getattr(module, n))
        and str(getattr(getattr(module, n), "__module__", "")).startswith("heddle")
    ]
    types_ = [n for n in rest if inspect.isclass(getattr(module, n)) and n not in own]
    others = [n for n in rest if n not in own and n not in types_]
    out += ["", "### Other names", ""]
    for n in own:
        obj = getattr(module, n)
        out.append(f"- `{n}{signature(obj)}`: {_summary(obj.__doc__)} (from `{obj.__module__}`)")
    out += [
        "",
        "Types and dtype scalars of `jax.numpy`, unchanged: " + " ".join(f"`{n}`" for n in types_),
    ]
    if others:
        out += ["", "Submodules and values of `jax.numpy`, unchanged: "]
        out[-1] += " ".join(f"`{n}`" for n in others)
    sig = signature(module.astype)
    out += [
        "",
        f"### `heddle.numpy.astype{sig}`",
        "",
        docstring_markdown(module.astype.__doc__),
        "",
    ]
    return out


def render_twin(module_name: str, module: types.ModuleType, twin_name: str) -> list[str]:
    """``heddle.nn``/``heddle.lax``: heddle's own ops with their Dtypes line, then JAX's names.

    Args:
      module_name: ``"heddle.nn"`` or ``"heddle.lax"``.
      module: the imported module.
      twin_name: the JAX module it replaces.

    Returns:
      Markdown lines.
    """
    twin = importlib.import_module(twin_name)
    names = _public(module)
    own = [n for n in names if getattr(twin, n, None) is not getattr(module, n)]
    passed = [n for n in names if n not in own]
    out = [
        f"## `{module_name}`",
        "",
        _summary(module.__doc__),
        "",
        f"{len(names)} public names: {len(own)} heddle versions, {len(passed)} `{twin_name}` "
        "objects passed through unchanged. Each heddle version takes the arguments of its "
        f"`{twin_name}` namesake.",
        "",
        "| dtypes | names |",
        "|---|---|",
    ]
    groups: dict[str, list[str]] = {}
    for n in own:
        obj = getattr(module, n)
        line = _summary(obj.__doc__) if inspect.ismodule(obj) else _dtypes_line(obj.__doc__)
        groups.setdefault(line.replace("|", "\\|"), []).append(n)
    for line, group in groups.items():
        out.append(f"| {line} | {' '.join(f'`{n}`' for n in group)} |")
    out += ["", f"Passed through from `{twin_name}`: " + " ".join(f"`{n}`" for n in passed), ""]
    return out


def render() -> str:
    """The whole page.

    Returns:
      docs/api.md's text.
    """
    order = _docgen.NAMESPACES
    head = [
        "# API reference",
        "",
        "<!-- Generated by docs/gen_api.py from the code's docstrings; do not edit by hand. -->",
        "",
        "Generated from the public names and docstrings of the installed package by "
        "`python docs/gen_api.py`; a test fails while this page is stale. The dtype rules "
        "themselves are in [policy.md](policy.md); the differences from JAX in "
        "[differences.md](differences.md).",
        "",
    ]
    body: list[str] = []
    contents = []
    for name in order:
        module, error = _import(name)
        contents.append(f"- [`{name}`](#{name.replace('.', '')})")
        if module is None:
            body += [f"## `{name}`", "", f"Not available in this install ({error}).", ""]
        elif name == "heddle.numpy":
            body += render_numpy(module)
            for sub in ("linalg", "fft"):  # policy submodules, once heddle.numpy holds its own
                obj = getattr(module, sub, None)
                if inspect.ismodule(obj) and obj.__name__.startswith("heddle"):
                    body += render_twin(obj.__name__, obj, f"jax.numpy.{sub}")
                    contents.append(f"  - [`{obj.__name__}`](#{obj.__name__.replace('.', '')})")
        elif name in ("heddle.nn", "heddle.lax"):
            body += render_twin(name, module, name.replace("heddle", "jax"))
        else:
            body += render_full(name, module)
    text = "\n".join([*head, *contents, "", *body]).rstrip("\n") + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


def main() -> int:
    """Rewrites docs/api.md; prints whether it changed."""
    return _docgen.write_page(PAGE, render())


if __name__ == "__main__":
    sys.path.insert(0, str(PAGE.parents[1]))
    sys.exit(main())
