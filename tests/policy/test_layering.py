"""The rules layer imports nothing above itself: ``heddle.policy`` is data and rules, and the op
namespaces, the program readers and the autodiff layer are built on it, never the other way round."""

from __future__ import annotations

import ast
import pathlib

import heddle
from heddle import policy

POLICY = pathlib.Path(heddle.__file__).parent / "policy"


def module_level_imports(path: pathlib.Path) -> list[str]:
    """The modules that ``path`` imports when it is imported: its top-level statements, those in
    ``if``/``try`` blocks included, but not function bodies or ``if TYPE_CHECKING:`` blocks."""
    names = []
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.If) and ast.unparse(node.test) != "TYPE_CHECKING":
            todo += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            todo += [*node.body, *(s for h in node.handlers for s in h.body), *node.finalbody]
    return names


def test_policy_modules_import_only_the_policy_layer_of_heddle():
    above = {
        (path.name, name)
        for path in sorted(POLICY.glob("*.py"))
        for name in module_level_imports(path)
        if name.startswith("heddle") and not name.startswith("heddle.policy")
    }
    assert not above, f"heddle.policy imports layers above it at import time: {sorted(above)}"


def test_the_layering_test_sees_an_import_from_above(tmp_path):
    # The checker itself must find such an import, or the test above could not fail.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from heddle.programs._audit import audit\nimport numpy\n"
        "if True:\n    import heddle.ops\n"
        "if TYPE_CHECKING:\n    import heddle.autodiff\n"
        "def f():\n    import heddle.scaling\n"
    )
    assert module_level_imports(bad) == ["heddle.programs._audit", "numpy", "heddle.ops"]


def test_policy_audit_names_are_the_audit_layers_own_objects():
    from heddle.programs import _audit

    assert policy.audit is heddle.audit is _audit.audit
    assert policy.AuditReport is _audit.AuditReport and policy.Finding is _audit.Finding
    assert policy.AUDIT_KINDS == _audit.KINDS


def test_an_unknown_policy_attribute_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = policy.nonexistent
