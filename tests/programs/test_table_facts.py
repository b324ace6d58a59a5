"""One row per primitive: what heddle knows about a JAX primitive is written in
``heddle/programs/_table.py`` and nowhere else.

The modules that read equations (``autocast``, the audit, ``heddle.autodiff``, and any other module of
heddle that looks at an equation's primitive or reads the table) derive their sets of primitives from
the table's rules, facts and kinds of bodies; a set of primitive names written out in one of them, or a
comparison with one name, is a second table that drifts from the first. The scan below finds them.
"""

from __future__ import annotations

import ast
import pathlib
import sys
from collections.abc import Iterator

import jax
import jax.experimental.multihost_utils
import jax.experimental.shard_map
import jax.nn
import jax.random
import jax.scipy
from jax._src import core

import heddle
from heddle.autodiff import _twins, _widen
from heddle.programs import _audit_cotangent, _higher, _table
from heddle.programs._table import Body, Fact, Rule

HEDDLE = pathlib.Path(heddle.__file__).resolve().parent
TABLE = HEDDLE / "programs" / "_table.py"

# The packages whose job is reading traced programs: every module in them is scanned.
READERS = ("programs", "autodiff")

# (module, name): strings that are a JAX primitive's name and also the name of something else, in a
# module the scan covers. Each is justified; nothing else may name a primitive outside the table.
ALLOWED: dict[tuple[str, str], str] = {
    # heddle.numpy's function names (jnp.max, jnp.min and their aliases amax, amin), the functions
    # whose NaN-propagating versions _nanprop defines: functions, not primitives
    ("ops/_nanprop.py", "max"): "jnp.max, a function",
    ("ops/_nanprop.py", "min"): "jnp.min, a function",
}
# Modules the scan covers that name JAX functions throughout: heddle.lax's classification of the
# jax.lax functions it replaces (``LAX``: lax.reduce_sum, lax.scatter_add, lax.cumlogsumexp are
# functions named as the primitives they bind) and the monoid a lax.reduce computation is.
ALLOWED_MODULES: dict[str, str] = {
    "ops/_lax.py": "names the jax.lax functions heddle.lax replaces",
}


def _installed_primitives() -> frozenset[str]:
    """The names of the primitives of the JAX modules loaded here, the table's rows and the names
    of other JAX versions (``test_table_versions.py`` enumerates every module of the installed
    JAX; the rows it checks are among these)."""
    names = set(_table.RULES) | set(_table.OTHER_VERSIONS)
    for m in list(sys.modules.values()):
        if m is None or not getattr(m, "__name__", "").startswith("jax"):
            continue
        for v in list(vars(m).values()):
            if isinstance(v, core.Primitive):
                names.add(v.name)
    return frozenset(names)


PRIMITIVES = _installed_primitives()


def _strings(node: ast.AST) -> Iterator[str]:
    """The string constants ``node`` holds as a collection of names: the elements of a set, tuple or
    list literal, the keys of a dict literal (a lookup compares them; its values are what it
    returns), the words of a string that is split, or a string compared with ``==``/``in``/``match``."""
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        items: list[ast.AST | None] = list(node.elts)
    elif isinstance(node, ast.Dict):
        items = list(node.keys)
    elif isinstance(node, ast.Compare):
        items = [node.left, *node.comparators]
    elif isinstance(node, ast.MatchValue):
        items = [node.value]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "split"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        yield from node.func.value.value.split()
        return
    else:
        return
    for item in items:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            yield item.value


def _reads_equations(tree: ast.AST) -> bool:
    """Whether a module looks at equations (``eqn.primitive``, ``jaxpr.eqns``) or reads the table."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("primitive", "eqns"):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "heddle.programs._table":
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "heddle.programs"
            and any(a.name == "_table" for a in node.names)
        ):
            return True
    return False


def primitive_names_in(path: pathlib.Path, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every string in ``tree`` that names a JAX primitive outside the allowlist."""
    rel = path.relative_to(HEDDLE).as_posix()
    found = []
    for node in ast.walk(tree):
        for s in _strings(node):
            if s in PRIMITIVES and (rel, s) not in ALLOWED:
                found.append((getattr(node, "lineno", 0), s))
    return found


def scanned_modules() -> Iterator[tuple[pathlib.Path, ast.AST]]:
    """Every module of heddle the scan covers: all of ``heddle.programs`` and ``heddle.autodiff``
    but the table, and every other module that reads equations or the table."""
    for path in sorted(HEDDLE.rglob("*.py")):
        if path == TABLE:
            continue
        rel = path.relative_to(HEDDLE).as_posix()
        if rel in ALLOWED_MODULES:
            continue
        tree = ast.parse(path.read_text(), str(path))
        if rel.split("/")[0] in READERS or _reads_equations(tree):
            yield path, tree


def test_no_module_names_primitives_outside_the_table():
    found = {
        path.relative_to(HEDDLE).as_posix(): hits
        for path, tree in scanned_modules()
        if (hits := primitive_names_in(path, tree))
    }
    assert not found, (
        "sets of primitive names (or comparisons with one) outside heddle/programs/_table.py; "
        f"derive them from the table's rules, facts and kinds of bodies: {found}"
    )


def test_the_scan_covers_the_readers_and_the_other_modules_that_read_equations():
    rel = {p.relative_to(HEDDLE).as_posix() for p, _ in scanned_modules()}
    for expected in (
        "programs/_evaluate.py",
        "programs/_higher.py",
        "programs/_known.py",
        "programs/_audit_ir.py",
        "programs/_audit_walk.py",
        "programs/_audit_convert.py",
        "programs/_audit_source.py",
        "programs/_audit_cotangent.py",
        "autodiff/_twins.py",
        "autodiff/_widen.py",
        "ops/_nanprop.py",
        "ops/lowering.py",
        "quant/_emulate.py",
    ):
        assert expected in rel, expected
    assert "programs/_table.py" not in rel
    for (module, name), why in ALLOWED.items():
        assert module in rel and name in PRIMITIVES and why, (module, name)


def test_the_scan_finds_a_set_of_names_and_a_comparison(tmp_path):
    # The checker itself must find these, or the test above could not fail.
    source = (
        "A = frozenset({'dot_general', 'other'})\n"
        "B = frozenset('cumsum cumprod not_one'.split())\n"
        "C = {'scatter-add': 1, 'x': 'reduce_sum'}\n"
        "def f(eqn):\n"
        "    if eqn.primitive.name == 'jit' or eqn.primitive.name in ('pjit', 'remat2'):\n"
        "        return 'convert_element_type'\n"
        "    match eqn.primitive.name:\n"
        "        case 'while':\n"
        "            return 1\n"
    )
    path = HEDDLE / "programs" / "_probe.py"  # only its relative name is read
    tree = ast.parse(source)
    names = sorted(s for _, s in primitive_names_in(path, tree))
    assert names == [
        "cumprod",
        "cumsum",
        "dot_general",
        "jit",
        "pjit",
        "remat2",
        "scatter-add",
        "while",
    ]
    assert _reads_equations(tree)
    assert not _reads_equations(ast.parse("x = 'max'\n"))


# -- facts ------------------------------------------------------------------------------------------


def test_every_fact_and_kind_names_rows_of_the_table():
    named = {
        "facts": set().union(*_table.FACTS.values()),
        "kinds of bodies": set(_table.BODIES),
        "monoids": set(_table.MONOIDS),
        "index operands": set(_table.INDEX_OPERANDS),
        "heddle functions": set(_table.HEDDLE_FUNCTIONS),
    }
    for what, names in named.items():
        assert sorted(names - set(_table.RULES)) == [], what
    assert {m.value for m in _table.Monoid} <= set(_table.RULES)


def test_every_fact_has_rows_and_a_meaning():
    assert set(_table.FACTS) == set(Fact) == set(_table.FACT_MEANINGS)
    assert set(_table.BODY_MEANINGS) == set(Body)
    for fact in Fact:
        assert _table.having(fact), fact
        assert _table.FACT_MEANINGS[fact].strip(), fact
    for kind in Body:
        assert _table.holding(kind), kind


def test_the_queries():
    assert _table.has("broadcast_in_dim", Fact.COPIES)
    assert not _table.has("no_such_primitive", Fact.COPIES)
    assert _table.facts("reduce_max") >= {Fact.COPIES, Fact.COUNTS_TIES}
    assert _table.kind("jit") is _table.kind("pjit") is Body.JIT  # pjit: jit's name before 0.7
    assert _table.kind("add") is None
    assert _table.holding(Body.SCAN, Body.WHILE) == {"scan", "while"}
    assert _table.monoid("add_any") is _table.Monoid.SUM and _table.monoid("sub") is None
    assert _table.combining(_table.Monoid.MAX) == {"max"}
    assert _table.is_index("dynamic_update_slice", 2) and not _table.is_index("gather", 0)
    assert _table.is_index("dynamic_slice", 5) and not _table.is_index("add", 1)


def test_every_scatter_has_its_indices_as_an_index_operand():
    scatters = {n for n in _table.RULES if n.startswith("scatter")}
    assert scatters == {f"scatter{s}" for s in ("", "-add", "-sub", "-mul", "-min", "-max")}
    for name in scatters:  # operand, indices, updates
        assert [_table.is_index(name, i) for i in range(3)] == [False, True, False], name


def test_an_integer_operand_of_every_primitive_is_an_index_where_jax_says_so():
    """Every integer operand of the primitives below is an index, found by binding each on
    abstract values: ragged_dot_general's group sizes, a dynamic slice's starts, a gather's and
    every scatter's indices."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    f32, i32 = jnp.float32, jnp.int32
    calls = {
        "ragged_dot_general": lambda: lax.ragged_dot(
            jnp.ones((6, 4), f32), jnp.ones((2, 4, 3), f32), jnp.array([2, 4], i32)
        ),
        "dynamic_slice": lambda: lax.dynamic_slice(jnp.ones((4, 4), f32), (i32(1), i32(0)), (2, 2)),
        "dynamic_update_slice": lambda: lax.dynamic_update_slice(
            jnp.ones((4, 4), f32), jnp.ones((2, 2), f32), (i32(1), i32(0))
        ),
        "gather": lambda: jnp.ones((4, 3), f32)[jnp.array([0, 2], i32)],
        "scatter-add": lambda: jnp.ones((4, 3), f32).at[jnp.array([0, 2], i32)].add(1.0),
    }
    for name, call in calls.items():
        (eqn,) = [e for e in jax.make_jaxpr(call)().eqns if e.primitive.name == name]
        ints = [i for i, v in enumerate(eqn.invars) if jnp.issubdtype(v.aval.dtype, jnp.integer)]
        assert ints, name
        assert all(_table.is_index(name, i) for i in ints), (name, ints)


def test_the_copies_are_exact_rows_with_one_result():
    for name in _table.having(Fact.COPIES):
        assert _table.rule(name) is Rule.EXACT, name


def test_the_rows_bound_on_the_values_are_exact_or_bit_casts():
    for name in _table.having(Fact.ON_VALUES):
        assert _table.rule(name) in (Rule.EXACT, Rule.PASS), name


def test_each_heddle_function_exists_and_computes_an_accumulating_row():
    import importlib

    for name, path in _table.HEDDLE_FUNCTIONS.items():
        assert _table.rule(name) in _table.ACCUMULATING, name
        module, attr = path.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), attr)), path


# -- kinds of bodies and the consumers' handlers -------------------------------------------------------


def test_the_kinds_of_bodies_are_the_higher_order_rows_and_the_combiners():
    higher = _table.names(Rule.HIGHER_ORDER)
    assert sorted(higher - set(_table.BODIES)) == []  # every higher-order row holds bodies
    for name, kind in _table.BODIES.items():
        combiner = kind in (Body.REDUCER, Body.COMBINER)
        assert (_table.rule(name) is Rule.HIGHER_ORDER) is not combiner, name


def test_autocast_has_a_handler_for_the_kind_of_every_higher_order_row():
    kinds = {_table.kind(n) for n in _table.names(Rule.HIGHER_ORDER)}
    assert set(_higher._HANDLERS) == kinds  # a combiner follows its rule, not a handler
    assert kinds == set(Body) - {Body.REDUCER, Body.COMBINER}


def test_the_audit_and_autodiff_have_a_handler_for_every_kind():
    for consumer in (_audit_cotangent._OPERANDS, _twins._BODIES, _widen._BODIES):
        assert sorted(set(Body) - set(consumer), key=str) == [], consumer
    assert jax  # imported for its primitives


# -- what the readers do with the facts ----------------------------------------------------------------


def test_a_narrow_carry_updated_by_any_accumulating_scatter_is_reported():
    import jax.numpy as jnp
    from jax import lax

    from heddle.programs import _audit

    dn = lax.ScatterDimensionNumbers((1,), (0,), (0,))
    idx = jnp.zeros((3, 1), jnp.int32)
    carry, xs = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((5, 3, 8), jnp.bfloat16)
    for name in sorted(_table.names(Rule.SCATTER)):  # scatter-add, scatter-sub, scatter-mul
        scatter = getattr(lax, name.replace("-", "_"))

        def loop(c, xs, scatter=scatter):
            return lax.scan(lambda c, u: (scatter(c, idx, u, dn), None), c, xs)[0]

        found = [f.primitive for f in _audit.audit(loop, carry, xs).of_kind("narrow_accumulation")]
        assert f"scan carry ({name})" in found, (name, found)
