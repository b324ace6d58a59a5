"""The rules layer imports nothing above itself: ``heddle.policy`` is data and rules, and the op
namespaces, the program readers and the autodiff layer are built on it, never the other way round.
The program readers and the autodiff layer reach the ops layer through its public names only (the
lowering of contractions is ``heddle.ops.lowering``), never through the ops' private helpers."""

from __future__ import annotations

import ast
import pathlib

import heddle
from heddle import policy

HEDDLE = pathlib.Path(heddle.__file__).parent
POLICY = HEDDLE / "policy"


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


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(root: pathlib.Path, dotted: str) -> bool:
    """Whether ``dotted`` (``heddle.ops._nanprop``) is a module or package under ``root``'s parent."""
    where = root.parent.joinpath(*dotted.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def private_ops_names(path: pathlib.Path, root: pathlib.Path = HEDDLE) -> list[str]:
    """The private names of ``heddle.ops``'s modules that ``path`` uses, anywhere in it (function
    bodies included): ``from heddle.ops.X import _name``, and ``m._name`` where ``m`` is a module of
    heddle.ops the file imported (``from heddle.ops import _core``, ``import heddle.ops._core as m``,
    or the dotted ``heddle.ops._core._name``). Importing a module whose name is private is not a
    private name (``from heddle.ops import _nanprop``): what it then reads of it is checked.
    ``root`` is the ``heddle`` package directory (relative imports are resolved against it)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    modules: set[str] = set()  # names bound to heddle.ops modules, and dotted paths of them
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            if not (base == "heddle.ops" or base.startswith("heddle.ops.")):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if _is_module(root, full):
                    modules.add(alias.asname or alias.name)
                elif _private(alias.name):
                    found.append(full)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "heddle.ops" or alias.name.startswith("heddle.ops."):
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = ast.unparse(node.value)
            if owner not in modules and not (
                owner.startswith("heddle.ops") and _is_module(root, owner)
            ):
                continue
            if not _is_module(root, f"{owner}.{node.attr}"):  # heddle.ops._core: a module
                found.append(f"{owner}.{node.attr}")
    return found


def _ops_users(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for layer in ("programs", "autodiff") for p in (root / layer).rglob("*.py"))


def test_programs_and_autodiff_use_no_private_name_of_the_ops_layer():
    found = {
        path.relative_to(HEDDLE).as_posix(): names
        for path in _ops_users(HEDDLE)
        if (names := private_ops_names(path))
    }
    assert not found, (
        "heddle.programs and heddle.autodiff use private names of heddle.ops (give them a public "
        f"name in a public module, as heddle.ops.lowering): {found}"
    )


def test_the_private_name_scan_sees_each_form(tmp_path):
    # The checker itself must find each form, or the test above could not fail.
    root = tmp_path / "heddle"
    (root / "ops").mkdir(parents=True)
    (root / "programs").mkdir()
    for name in ("__init__.py", "ops/__init__.py", "ops/_core.py", "ops/lowering.py"):
        (root / name).write_text("")
    probe = root / "programs" / "probe.py"
    probe.write_text(
        "import heddle.ops._core\n"
        "import heddle.ops.lowering as low\n"
        "from heddle.ops import _core, lowering\n"
        "from heddle.ops._core import _PRECISION, cast\n"
        "from ..ops.lowering import _vmapped, on_cpu\n"
        "def f(x):\n"
        "    from heddle.ops import _core as c\n"
        "    return (_core._on_cpu(), c._split, low._leading, lowering.cast, low.__name__,\n"
        "            heddle.ops._core._run, x._private)\n"
    )
    assert sorted(private_ops_names(probe, root)) == sorted(
        [
            "heddle.ops._core._PRECISION",
            "heddle.ops.lowering._vmapped",
            "_core._on_cpu",
            "c._split",
            "low._leading",
            "heddle.ops._core._run",
        ]
    )
    assert not private_ops_names(root / "ops" / "_core.py", root)


def test_policy_audit_names_are_the_audit_layers_own_objects():
    from heddle.programs import _audit

    assert policy.audit is heddle.audit is _audit.audit
    assert policy.AuditReport is _audit.AuditReport and policy.Finding is _audit.Finding
    assert policy.AUDIT_KINDS == _audit.KINDS


def test_an_unknown_policy_attribute_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = policy.nonexistent
