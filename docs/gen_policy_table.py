"""Writes heddle's promotion table into docs/policy.md, between the markers, from ``policy.table()``.

Run ``python docs/gen_policy_table.py`` after changing the lattice; a test fails while the page is stale.
"""

from __future__ import annotations

import pathlib
import runpy
import sys
import types

BEGIN = "<!-- BEGIN GENERATED: heddle.policy.table(fmt='markdown') -->"
END = "<!-- END GENERATED -->"
PAGE = pathlib.Path(__file__).with_name("policy.md")
_docgen = types.SimpleNamespace(**runpy.run_path(str(PAGE.with_name("_docgen.py"))))


def render(text: str) -> str:
    """``text`` with the part between ``BEGIN`` and ``END`` replaced by the current table.

    Args:
      text: the page, holding each marker once.

    Returns:
      The page with a fresh table.

    Raises:
      ValueError: a marker is missing.
    """
    from heddle import policy

    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"the page needs each marker once: {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    table = policy.table(fmt="markdown", policy=policy.HEDDLE)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> int:
    """Rewrites docs/policy.md in place; prints whether it changed."""
    return _docgen.write_page(PAGE, render(PAGE.read_text()))


if __name__ == "__main__":
    sys.path.insert(0, str(PAGE.parents[1]))
    sys.exit(main())
