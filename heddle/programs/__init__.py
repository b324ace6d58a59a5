"""Reading and rewriting traced JAX programs: ``audit`` and ``autocast``.

Both read one table of primitives (``heddle/programs/_table.py``): ``audit`` reports where a program
departs from the policy, ``autocast`` rewrites the program to follow it. The names below load on
first use, so the table (data only) can be read without loading the readers of programs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.programs._audit import KINDS as KINDS
    from heddle.programs._audit import AuditReport as AuditReport
    from heddle.programs._audit import Finding as Finding
    from heddle.programs._audit import audit as audit
    from heddle.programs._autocast import autocast as autocast
    from heddle.programs._table import RULES as RULES
    from heddle.programs._table import Rule as Rule

_HOMES = {
    "KINDS": "_audit",
    "AuditReport": "_audit",
    "Finding": "_audit",
    "audit": "_audit",
    "autocast": "_autocast",
    "RULES": "_table",
    "Rule": "_table",
}

__all__ = ["KINDS", "RULES", "AuditReport", "Finding", "Rule", "audit", "autocast"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'heddle.programs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"heddle.programs.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
