"""The table of primitive rules covers every primitive the installed JAX defines (that the audit
reports each accumulating row is ``test_table_audit.py``; that each row is a primitive of the
installed JAX or of a dated other version is ``test_table_versions.py``)."""

from __future__ import annotations

import sys

import jax
import jax.experimental.multihost_utils
import jax.experimental.shard_map
import jax.nn
import jax.random
import jax.scipy
from jax._src import core

from heddle.programs import _table


def _jax_primitives() -> set[str]:
    names = set()
    for m in list(sys.modules.values()):
        if m is None or not getattr(m, "__name__", "").startswith("jax"):
            continue
        for v in list(vars(m).values()):
            if isinstance(v, core.Primitive):
                names.add(v.name)
    return names


def test_every_jax_primitive_has_a_rule():
    missing = sorted(_jax_primitives() - set(_table.RULES))
    assert not missing, f"classify these primitives in heddle/programs/_table.py: {missing}"


def test_every_pass_through_has_its_reason():
    for name in _table.RULES:
        assert _table.REASONS[name], name
    assert "callback" in _table.REASONS["pure_callback"]


def test_each_primitive_is_listed_once():
    seen: list[str] = []
    for groups in _table._GROUPS.values():
        for text in groups.values():
            seen += text.split()
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    assert not dupes


def test_an_unknown_primitive_is_none():
    assert _table.rule("no_such_primitive") is None
    assert jax  # imported for its side effects
