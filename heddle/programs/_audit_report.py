"""The audit's report: ``Finding`` (one departure from the policy) and ``AuditReport`` (all of them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from heddle.policy._errors import PolicyError, message
from heddle.programs._audit_ir import (
    FLOAT64_UNAVAILABLE,
    IMPLICIT_PROMOTION,
    LOSSY_CONVERSION,
    NARROW_ACCUMULATION,
    NARROW_COTANGENT,
    UNCLASSIFIED,
    RawFinding,
)
from heddle.programs._audit_source import Location, source_line

KINDS: tuple[str, ...] = (
    NARROW_ACCUMULATION,
    IMPLICIT_PROMOTION,
    LOSSY_CONVERSION,
    FLOAT64_UNAVAILABLE,
    UNCLASSIFIED,
    NARROW_COTANGENT,
)
"""Every kind of finding, in the order reports list their counts."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One place where a program departs from heddle's dtype policy.

    Attributes:
      kind: one of ``KINDS``: ``"narrow_accumulation"``, ``"implicit_promotion"``,
        ``"lossy_conversion"``, ``"float64_unavailable"``, ``"unclassified_primitive"`` (a primitive the
        table of rules does not list: heddle.autocast binds it unchanged), ``"narrow_cotangent"`` (a
        backward pass that stores cotangents narrower than ``grad_dtype``, as ``jax.grad`` does for
        every bfloat16, float16 or float8 value; one finding per source line and dtype).
      primitive: the JAX primitive (``"reduce_sum"``, ``"dot_general"``, ``"exp+reduce_sum"`` for the
        softmax pattern, ``"convert_element_type"``, the promoted op such as ``"add"``); for a narrow
        cotangent, the backward primitives that store them, comma-separated.
      dtypes: the operands' dtypes (short names; ``float``/``int`` for Python scalars).
      out_dtype: the dtype the primitive produces or accumulates into (a narrow cotangent's dtype).
      shapes: the operands' shapes (a narrow cotangent's: the cotangents' shapes).
      file: the user's source file ("" when unknown).
      line: the line in it (0 when unknown).
      function: the function that line is in.
      code: the text of that line.
      backward: whether the equation belongs to the backward pass.
      origin: ``"implicit"`` or ``"explicit"`` for conversions and promotions, else ``""``.
      note: what is wrong and what the policy asks for.
      path: the nested bodies it sits in (``"jit[layer] > scan"``), "" at top level.
      expected: what the policy asks for instead: ``acc_dtype`` for a narrow accumulation,
        ``grad_dtype`` for a narrow cotangent, heddle's promotion for an implicit promotion where it
        differs from JAX's (``"error (PromotionError)"`` where heddle refuses the pair), else "".
      count: how many equations gave this same finding (a loop body traced once counts once).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle import policy
      >>> x = jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)
      >>> (f,) = policy.audit(lambda x: x @ x.T, x)
      >>> f.kind, f.primitive, f.dtypes, f.out_dtype, f.shapes, f.expected
      ('narrow_accumulation', 'dot_general', ('bf16', 'bf16'), 'bf16', ((16, 32), (32, 16)), 'float32')
    """

    kind: str
    primitive: str
    dtypes: tuple[str, ...]
    out_dtype: str
    shapes: tuple[tuple[int, ...], ...]
    file: str
    line: int
    function: str
    code: str
    backward: bool
    origin: str
    note: str
    path: str
    expected: str = ""
    count: int = 1

    @property
    def source(self) -> str:
        """``file:line (function)``, or ``"?"`` when the traceback had no user frame."""
        return str(Location(self.file, self.line, self.function)) if self.file else "?"

    @property
    def phase(self) -> str:
        """``"backward"`` or ``"forward"``."""
        return "backward" if self.backward else "forward"

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data (with ``source`` and ``phase``)."""
        d = dataclasses.asdict(self)
        d["dtypes"] = list(self.dtypes)
        d["shapes"] = [list(s) for s in self.shapes]
        d["source"] = self.source
        d["phase"] = self.phase
        return d


_COLUMNS = ("kind", "pass", "primitive", "dtypes", "shapes", "source", "note")


def _row(f: Finding) -> tuple[str, ...]:
    shapes = " ".join("[" + ",".join(map(str, s)) + "]" for s in f.shapes)
    note = f.note + (f" ({f.count} times)" if f.count > 1 else "")
    return (
        f.kind,
        f.phase,
        f.primitive,
        ",".join(f.dtypes) + " -> " + f.out_dtype,
        shapes,
        f.source,
        note,
    )


def _table(findings: Iterable[Finding]) -> str:
    rows = [_COLUMNS, *(_row(f) for f in findings)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
    lines = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        lines.append("  ".join([*cells, r[-1]]).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in [*widths, len(_COLUMNS[-1])]))
    return "\n".join(lines)


def _check_kinds(kinds: Iterable[str] | None, asked: str) -> tuple[str, ...]:
    if kinds is None:
        return KINDS
    if isinstance(kinds, str):
        kinds = (kinds,)
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(
            message(
                f"{asked}(kinds={kinds!r})",
                f"{', '.join(map(repr, bad))} is not a kind of finding",
                f"Use any of {', '.join(KINDS)}, e.g. {asked}(kinds=['{KINDS[0]}']).",
            )
        )
    return kinds


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What ``audit`` found: an iterable of ``Finding``s that prints as an aligned table.

    Attributes:
      function: the name of the audited function.
      findings: the findings, in program order.
      include_backward: whether the backward pass was audited too.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle import policy
      >>> x = jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)
      >>> report = policy.audit(lambda x: (jnp.cumsum(x), jnp.sum(x)), x)
      >>> len(report), report.counts["narrow_accumulation"], [f.primitive for f in report]
      (1, 1, ['cumsum'])
      >>> print(str(report).splitlines()[0])
      audit of <lambda> (forward): 1 finding(s): narrow_accumulation 1, implicit_promotion 0, lossy_conversion 0, float64_unavailable 0, unclassified_primitive 0, narrow_cotangent 0
    """

    function: str
    findings: tuple[Finding, ...]
    include_backward: bool = False

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def __getitem__(self, i: int) -> Finding:
        return self.findings[i]

    @property
    def counts(self) -> dict[str, int]:
        """The number of findings of each kind (every kind present, zeros included)."""
        out = dict.fromkeys(KINDS, 0)
        for f in self.findings:
            out[f.kind] += 1
        return out

    def of_kind(self, *kinds: str) -> tuple[Finding, ...]:
        """The findings of the given kinds.

        Raises:
          ValueError: a name that is not one of ``KINDS``.
        """
        ks = _check_kinds(kinds, "AuditReport.of_kind")
        return tuple(f for f in self.findings if f.kind in ks)

    def __str__(self) -> str:
        scope = "forward and backward" if self.include_backward else "forward"
        counts = ", ".join(f"{k} {n}" for k, n in self.counts.items())
        head = f"audit of {self.function} ({scope}): {len(self)} finding(s): {counts}"
        if not self.findings:
            return head
        return head + "\n" + _table(self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: function, include_backward, counts, findings."""
        return {
            "function": self.function,
            "include_backward": self.include_backward,
            "counts": self.counts,
            "findings": [f.to_dict() for f in self.findings],
        }

    def raise_if_any(self, kinds: Iterable[str] | None = None) -> None:
        """Raises ``PolicyError`` listing the findings of ``kinds`` (all kinds by default), if any.

        Args:
          kinds: kind names from ``KINDS``; None for all.

        Raises:
          PolicyError: there are findings of those kinds; the message holds their table.
          ValueError: a name in ``kinds`` is not a kind of finding.

        Examples:
          >>> import jax, jax.numpy as jnp
          >>> from heddle import policy
          >>> x = jax.ShapeDtypeStruct((8,), jnp.float32)
          >>> policy.audit(jnp.sum, x).raise_if_any()  # float32 sums are fine
        """
        ks = _check_kinds(kinds, "raise_if_any")
        hits = [f for f in self.findings if f.kind in ks]
        if not hits:
            return
        found = {f.kind for f in hits}
        fixes = []
        if found - {NARROW_COTANGENT}:
            fixes.append(
                "Run the function under heddle.autocast (heddle.autocast(fn)), which accumulates "
                "every sum in float32 and rounds once, or call heddle.numpy/heddle.nn/heddle.lax "
                "functions; convert explicitly where dtypes mix"
            )
        if NARROW_COTANGENT in found:
            fixes.append(
                f"{'For the narrow cotangents, d' if fixes else 'D'}ifferentiate with "
                "heddle.autodiff.grad or value_and_grad (also of heddle.autocast(fn)), which keep "
                "every cotangent in float32"
            )
        raise PolicyError(
            message(
                f"audit of {self.function}",
                f"{len(hits)} finding(s) of kind {', '.join(sorted(found))}",
                "; ".join(fixes),
            )
            + "\n"
            + _table(hits)
        )


def merge(raw: list[RawFinding]) -> tuple[Finding, ...]:
    """``Finding``s from raw ones: identical findings merged, with their count."""
    counts: dict[RawFinding, int] = {}
    for r in raw:
        counts[r] = counts.get(r, 0) + 1
    out = []
    for r, n in counts.items():
        src = r.source
        out.append(
            Finding(
                kind=r.kind,
                primitive=r.primitive,
                dtypes=r.dtypes,
                out_dtype=r.out_dtype,
                shapes=r.shapes,
                file=src.file if src else "",
                line=src.line if src else 0,
                function=src.function if src else "",
                code=source_line(src),
                backward=r.backward,
                origin=r.origin,
                note=r.note,
                path=r.path,
                expected=r.expected,
                count=n,
            )
        )
    return tuple(out)
