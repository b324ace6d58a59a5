"""Reading and rewriting traced JAX programs: ``audit`` and ``autocast``.

Both read one table of primitives (``heddle/programs/_table.py``): ``audit`` reports where a program
departs from the policy, ``autocast`` rewrites the program to follow it. The names below load on
first use, so the table (data only) can be read without loading the readers of programs.

Layout:

- ``_table``: one row per primitive, the facts every consumer reads (autocast, the audit,
  heddle.autodiff).
- ``_interpret`` and ``_frame``: the interpreter core that evaluates a jaxpr equation by equation
  (run loop with source information, freeing each variable after its last use, descent into
  inlined calls, one frame of values, float32 twins and shadows). autocast (``_evaluate``,
  ``_higher``, ``_known``, ``_eager``) and heddle.autodiff (``heddle/autodiff/_twins.py``) are
  rule sets on it.
- ``_audit*``: the audit. It evaluates nothing (it reads a jaxpr's dtypes, producers, consumers
  and sources, forward and backward, and never binds a primitive), so it walks jaxprs itself
  (``_audit_walk``) rather than through the interpreter; it shares the table and the call-site
  keys (``_audit_source``) with autocast, so both tell one library call from another alike.
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
