"""The promotion table as a value, and promotion over it: n-ary, with messages that name the fix.

``PromotionTable`` is the immutable, hashable pairwise table a ``Policy`` holds; ``promote_all`` is the
n-ary promotion every op uses; ``promotion_message`` explains a refused pair in terms of the policy's
own table.
"""

from __future__ import annotations

import csv
import importlib
import io
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import PromotionError, message

if TYPE_CHECKING:
    from heddle.policy._policy import Policy

Pair = tuple[np.dtype, np.dtype]


class PromotionTable(Mapping[Pair, "np.dtype | None"]):
    """An immutable, hashable pairwise promotion table; ``None`` marks a ``PromotionError`` cell.

    Args:
      cells: every ordered pair of dtypes it covers, mapped to the result dtype or None.
      name: a label for messages.
    """

    def __init__(self, cells: Mapping[Pair, np.dtype | None], name: str = "custom") -> None:
        self._cells = dict(cells)
        self._name = name
        self._hash = self._cells_hash()

    def _cells_hash(self) -> int:
        return hash(
            tuple(
                sorted(
                    (a.name, b.name, getattr(r, "name", None)) for (a, b), r in self._cells.items()
                )
            )
        )

    def __getstate__(self) -> dict[str, Any]:
        # string hashes differ from process to process: a pickled table recomputes its own
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._hash = self._cells_hash()

    def __getitem__(self, key: Pair) -> np.dtype | None:
        return self._cells[key]

    def __iter__(self) -> Iterator[Pair]:
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, PromotionTable)
            and self._hash == other._hash
            and self._cells == other._cells
        )

    def __repr__(self) -> str:
        return f"PromotionTable({self._name!r}, {len(self._cells)} cells)"

    @property
    def dtypes(self) -> tuple[np.dtype, ...]:
        """The dtypes the table covers, in ``DTYPES`` order."""
        present = {a for a, _ in self._cells}
        return tuple(d for d in D.DTYPES if d in present)


def _table_from_csv(text: str) -> dict[Pair, np.dtype | None]:
    rows = list(csv.reader(io.StringIO(text.strip())))
    header = [D.dtype(n) for n in rows[0][1:]]
    cells: dict[Pair, np.dtype | None] = {}
    for row in rows[1:]:
        a = D.dtype(row[0])
        for b, v in zip(header, row[1:], strict=True):
            cells[a, b] = None if v.strip() == "error" else D.dtype(v)
    return cells


# JAX's refusal of an implicit promotion; public as jax.dtypes.TypePromotionError from JAX 0.10.1.
_TypePromotionError: type[Exception] = (
    getattr(jax.dtypes, "TypePromotionError", None)
    or importlib.import_module("jax._src.dtypes").TypePromotionError
)


def _jax_cells() -> dict[Pair, np.dtype | None]:
    """JAX's default ('standard') promotion table, whatever the promotion mode is at import."""
    cells: dict[Pair, np.dtype | None] = {}
    with jax.numpy_dtype_promotion("standard"):
        for a in D.DTYPES:
            for b in D.DTYPES:
                try:
                    cells[a, b] = np.dtype(jax.numpy.promote_types(a, b))
                except (TypeError, _TypePromotionError):
                    cells[a, b] = None
    return cells


def promotion_message(p: Policy, a: np.dtype, b: np.dtype) -> str:
    """The ``PromotionError`` message for the pair: what was asked, why, and a fix that works in ``p``."""
    asked = f"promoting {a.name} with {b.name} (policy {p.name!r})"
    lattice = _lattice_reason(a, b) if (a, b) in p.table else None
    if lattice is not None:
        why, fix, other, targets = lattice
        if all(p.table.get((t, other)) is not None for t in targets):
            return message(asked, why, fix)  # refused by heddle's lattice: the formats' reason
    why = (
        "the policy's table marks this pair as an error"
        if (a, b) in p.table
        else "the policy's table does not cover this pair"
    )
    return message(asked, why, _convert_fix(p, a, b))


def _lattice_reason(a: np.dtype, b: np.dtype) -> tuple[str, str, np.dtype, list[np.dtype]] | None:
    """Where heddle's lattice refuses the pair: (why, fix, the operand the fix keeps, the dtypes the
    fix converts the other one to)."""
    if _lattice.derive_promotion(a, b) is not None:
        return None
    if {D.kind(a), D.kind(b)} <= {"i", "u"}:
        signed = a if D.kind(a) == "i" else b
        return (
            "no integer dtype holds every value of both (uint64 and a signed integer)",
            "Convert the uint64 operand explicitly: heddle.astype(x, 'int64') if its values "
            "fit, or heddle.astype(x, 'float64').",
            signed,
            [D.dtype("int64"), D.dtype("float64")],
        )
    holders = [c for c in _lattice.REAL_FLOATS if _lattice.holds(c, a) and _lattice.holds(c, b)]
    return (
        "no unique narrowest format holds every value of both "
        f"(candidates: {', '.join(c.name for c in holders[:2])})",
        f"Convert the {a.name} operand explicitly to the one you mean, e.g. "
        f"heddle.astype(x, '{holders[0].name}').",
        b,
        holders[:1],
    )


def _convert_fix(p: Policy, a: np.dtype, b: np.dtype) -> str:
    """Names a dtype the ``a`` operand can be converted to so that this policy promotes it with ``b``.

    Preferably one that holds every value of ``a``; else ``b``'s own dtype; else any the table pairs
    with ``b``.
    """
    usable = [c for c in p.table.dtypes if p.table.get((c, b)) is not None]
    if not usable:
        covered = ", ".join(d.name for d in p.table.dtypes)
        return f"Convert both operands to dtypes the table covers ({covered})."
    lossless = [c for c in usable if _lattice.lossless(a, c)]
    c = lossless[0] if lossless else b if b in usable else usable[0]
    return f"Convert the {a.name} operand explicitly, e.g. heddle.astype(x, '{c.name}')."


def promote_all(p: Policy, dtypes: Sequence[np.dtype]) -> np.dtype:
    """The n-ary promotion of ``dtypes`` under ``p``, the same in any order (POLICY.md 2).

    A left fold where every step is defined; where a step is not (``float8_e4m3fn`` with
    ``float8_e5m2``) but a later operand settles it (``float32``), the least upper bound of all the
    operands in the table's order: the unique minimal ``u`` with ``promote(d, u) == u`` for every ``d``.
    So ``(e4m3fn, e5m2, float32)`` is ``float32`` in every order, as ``(float32, e4m3fn, e5m2)`` is.

    Raises:
      PromotionError: no unique least upper bound (the first refused pair is named).
    """
    out = dtypes[0]
    for d in dtypes[1:]:
        try:
            out = p.promote(out, d)
        except PromotionError:
            joined = _least_upper_bound(p, dtypes) if len(dtypes) > 2 else None
            if joined is None:
                raise
            return joined
    return out


def _least_upper_bound(p: Policy, dtypes: Sequence[np.dtype]) -> np.dtype | None:
    def below(a: np.dtype, b: np.dtype) -> bool:
        return a == b or p.table.get((a, b)) == b

    want = set(dtypes)
    upper = [u for u in p.table.dtypes if all(below(d, u) for d in want)]
    minimal = [u for u in upper if not any(v != u and below(v, u) for v in upper)]
    return minimal[0] if len(minimal) == 1 else None
