"""docs/primitives.md is the table of primitive rules as ``docs/gen_primitives.py`` renders it now."""

from __future__ import annotations

import pathlib
import re
import runpy

import pytest

from heddle.programs import _table
from heddle.programs._table import Rule

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def rendered() -> str:
    return str(runpy.run_path(str(DOCS / "gen_primitives.py"))["render"]())


def test_the_primitives_page_is_up_to_date(rendered):
    page = DOCS / "primitives.md"
    assert page.exists(), "docs/primitives.md is missing: run python docs/gen_primitives.py"
    assert page.read_text() == rendered, (
        "docs/primitives.md is stale: run python docs/gen_primitives.py"
    )


def test_the_page_lists_every_primitive_once_under_its_rule(rendered):
    sections = re.split(r"^## ", rendered, flags=re.M)[1:]
    by_rule = {s.split("\n", 1)[0]: s for s in sections}
    for rule in Rule:
        assert rule.value in by_rule, rule
        assert _table.MEANINGS[rule].capitalize() in by_rule[rule.value]
    for name, rule in _table.RULES.items():
        cells = [
            line
            for line in by_rule[rule.value].splitlines()
            if re.search(rf"`{re.escape(name)}`", line)
        ]
        assert len(cells) == 1, name
        assert cells[0].rstrip(" |").endswith(_table.REASONS[name]), name
    for name, note in _table.OTHER_VERSIONS.items():
        assert f"| `{name}` | `{_table.RULES[name].value}` | {note} |" in rendered


def test_the_page_lists_each_fact_and_kind_of_body_with_its_primitives(rendered):
    lines = rendered.splitlines()
    for fact in _table.Fact:
        (row,) = [line for line in lines if line.startswith(f"| `{fact.value}` |")]
        cells = set(re.findall(r"`([^`]+)`", row.split(" | ")[1]))
        assert cells == set(_table.FACTS[fact]), fact
        assert row.endswith(f"| {_table.FACT_MEANINGS[fact]} |"), fact
    for kind in _table.Body:
        (row,) = [line for line in lines if line.startswith(f"| `{kind.value}` |")]
        assert set(re.findall(r"`([^`]+)`", row.split(" | ")[1])) == _table.holding(kind), kind
    for name, fn in _table.HEDDLE_FUNCTIONS.items():
        assert f"| `{name}` | `{fn}` |" in rendered
