"""Helpers shared by the docs generators and the docstring tests: docstring lookup, page writing.

Used by ``docs/gen_api.py``, ``docs/gen_policy_table.py`` and ``tests/test_docstrings.py``, which load
it by path (``runpy.run_path``): the docs folder is not a package.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import pathlib
from typing import Any

NAMESPACES = (
    "heddle",
    "heddle.policy",
    "heddle.numpy",
    "heddle.nn",
    "heddle.lax",
    "heddle.scipy",
    "heddle.scipy.special",
    "heddle.scipy.stats.norm",
    "heddle.scipy.stats.logistic",
    "heddle.autodiff",
    "heddle.scaling",
    "heddle.quant",
)
"""The public namespaces, in the order docs/api.md lists them."""


def attribute_doc(module_name: str, name: str) -> str | None:
    """The attribute docstring of a data name: a non-empty string literal right after its assignment.

    A ``from heddle... import name`` is followed to the module that assigns the name.

    Args:
      module_name: the dotted name of the module where ``name`` is looked up.
      name: the data name.

    Returns:
      The docstring as written, or None when there is none.

    Examples:
      >>> attribute_doc("heddle.policy", "JAX")  # assigned in heddle.policy._policy
      "JAX's own promotion table (``jax.numpy.promote_types``), for comparison and migration."
      >>> attribute_doc("heddle.policy", "no_such_name") is None
      True
    """
    seen: set[tuple[str, str]] = set()
    todo = [(module_name, name)]
    while todo:
        modname, attr = todo.pop()
        if (modname, attr) in seen:
            continue
        seen.add((modname, attr))
        spec = importlib.util.find_spec(modname)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        body = ast.parse(pathlib.Path(spec.origin).read_text()).body
        # names a module resolves lazily are named for readers in an ``if TYPE_CHECKING:`` block
        body += [n for b in body if _is_type_checking(b) for n in b.body]
        for i, node in enumerate(body):
            targets: list[str] = []
            if isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            if attr in targets and i + 1 < len(body):
                nxt = body[i + 1]
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                    if isinstance(nxt.value.value, str) and nxt.value.value.strip():
                        return nxt.value.value
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("heddle")
            ):
                todo += [(node.module, a.name) for a in node.names if (a.asname or a.name) == attr]
    return None


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def members(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties a class defines itself, in definition order.

    Args:
      cls: the class.

    Returns:
      ``(name, function or property)`` pairs; static and class methods unwrapped to their function.

    Examples:
      >>> class C:
      ...     def f(self): ...
      ...     def _g(self): ...
      >>> [name for name, _ in members(C)]
      ['f']
    """
    out = []
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out.append((attr, value))
    return out


def write_page(page: pathlib.Path, new: str) -> int:
    """Writes ``new`` to ``page`` when it differs from the page; prints whether it changed.

    Args:
      page: the file (created if missing).
      new: its new text.

    Returns:
      0, the exit status of the generator scripts.
    """
    old = page.read_text() if page.exists() else ""
    if new != old:
        page.write_text(new)
    print(f"{page}: {'updated' if new != old else 'up to date'}")
    return 0
