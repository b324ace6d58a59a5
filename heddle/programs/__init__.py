"""Reading and rewriting traced JAX programs: ``audit`` and ``autocast``.

Both read one table of primitive rules (``heddle/programs/_table.py``): ``audit`` reports where a
program departs from the policy, ``autocast`` rewrites the program to follow it.
"""

from heddle.programs._audit import KINDS as KINDS
from heddle.programs._audit import AuditReport as AuditReport
from heddle.programs._audit import Finding as Finding
from heddle.programs._audit import audit as audit
from heddle.programs._autocast import autocast as autocast
from heddle.programs._table import RULES as RULES
from heddle.programs._table import Rule as Rule

__all__ = ["KINDS", "RULES", "AuditReport", "Finding", "Rule", "audit", "autocast"]
