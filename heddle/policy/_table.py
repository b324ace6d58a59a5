"""``table()``: the pairwise promotion table rendered from the active policy's lattice."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from heddle.policy import _dtypes as D
from heddle.policy._policy import Policy, active


def table(
    dtypes: Iterable[Any] | None = None, fmt: str = "markdown", policy: Policy | None = None
) -> str:
    """The pairwise promotion table, generated from the lattice (never pasted).

    Args:
      dtypes: the rows and columns (dtype-likes); every dtype of the policy by default.
      fmt: ``"markdown"``, ``"html"`` or ``"csv"`` (the layout of ``promotion.csv``).
      policy: the policy to render; the active one by default.

    Returns:
      The table as text; ``error`` marks a ``PromotionError``.

    Raises:
      ValueError: an unknown ``fmt``.

    Examples:
      >>> from heddle import policy
      >>> print(policy.table(["int8", "uint8"], fmt="csv"))
      ,int8,uint8
      int8,int8,int16
      uint8,int16,uint8
    """
    p = policy or active()
    ds = p.table.dtypes if dtypes is None else tuple(D.dtype(d) for d in dtypes)
    names = [d.name for d in ds]

    def cell(a, b) -> str:
        r = p.table.get((a, b))
        return "error" if r is None else r.name

    rows = [[cell(a, b) for b in ds] for a in ds]
    if fmt == "csv":
        return "\n".join(
            [",".join(["", *names])] + [",".join([n, *r]) for n, r in zip(names, rows, strict=True)]
        )
    if fmt == "markdown":
        head = "| | " + " | ".join(names) + " |"
        rule = "|---" * (len(names) + 1) + "|"
        body = [
            "| **" + n + "** | " + " | ".join(r) + " |" for n, r in zip(names, rows, strict=True)
        ]
        return "\n".join([head, rule, *body])
    if fmt == "html":
        th = "".join(f"<th>{html.escape(n)}</th>" for n in names)
        trs = "".join(
            f"<tr><th>{html.escape(n)}</th>"
            + "".join(f'<td class="{c}">{c}</td>' for c in r)
            + "</tr>"
            for n, r in zip(names, rows, strict=True)
        )
        return f"<table><thead><tr><th></th>{th}</tr></thead><tbody>{trs}</tbody></table>"
    raise ValueError(f"table(fmt={fmt!r}): unknown format. Use 'markdown', 'html' or 'csv'.")
