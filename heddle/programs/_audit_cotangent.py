"""The audit's cotangent rule: a backward pass that stores cotangents narrower than ``grad_dtype``.

JAX gives every cotangent the dtype of its primal value, so ``jax.grad``/``jax.vjp`` of a function
with bfloat16, float16 or float8 values holds their cotangents in that dtype, where POLICY.md 7 asks
for ``grad_dtype`` (float32). The rule reads the backward pass JAX traced (the transposed equations,
``transpose(...)`` in their name stack, and every equation of a body they call): a variable there is
a cotangent when its equation reads a cotangent, or reads only constants (a unit seed, a zero buffer
a transpose adds into). Residuals (forward values a transpose multiplies by, a custom_vjp rule's
``cos(x)``, what ``jax.checkpoint`` recomputes) are not cotangents. Each narrow float cotangent is
attributed to the user's line whose forward computation it transposes, and findings are grouped by
that line and dtype, one per group.

Reading the backward pass rather than the forward one's narrow values is what makes the rule exact:
a value off the differentiated path, behind ``stop_gradient``, with a zero derivative (``floor``,
``sign``), or inside a custom_vjp function whose rule keeps float32, gets no narrow cotangent there,
and ``heddle.autodiff.grad(f)``, whose backward pass keeps float32, audits clean.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import ml_dtypes
import numpy as np
from jax.extend import core as jcore

from heddle.policy import _dtypes as D
from heddle.policy._rules import grad_dtype
from heddle.programs._audit_ir import (
    NARROW_COTANGENT,
    SHAPE_OPS,
    Ctx,
    RawFinding,
    holds,
    policy_dtype,
    shape_of,
    short,
)
from heddle.programs._audit_source import _HEDDLE_DIR, Location, Site
from heddle.programs._table import Body, kind

_F32 = np.dtype(np.float32)

NARROW_COPY = "heddle_narrow_copy_of_cotangent"
"""The name scope of a narrow copy of a float32 cotangent made for one backward contraction
(heddle.autodiff's ``contractions="scaled"``): an operand of that contraction, never stored as the
cotangent, so the rule does not report it (the cotangents it is computed from and those the
contraction gives stay float32)."""


@dataclasses.dataclass
class _Group:
    """The narrow cotangents of one source line and dtype, collected in program order."""

    index: int  # where the finding goes in ``findings``: the group's first equation
    source: Location | None
    out: np.dtype
    primitives: list[str] = dataclasses.field(default_factory=list)
    dtypes: list[str] = dataclasses.field(default_factory=list)
    shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    copies: list[tuple[int, ...]] = dataclasses.field(default_factory=list)  # of SHAPE_OPS
    paths: list[tuple[str, ...]] = dataclasses.field(default_factory=list)


class CotangentRules:
    """The cotangent rule, mixed into ``Walker`` (which provides ``_site``, ``_backward`` and
    ``findings``)."""

    findings: list[RawFinding]
    _cotangent_groups: dict[tuple[Any, ...], _Group]
    # the user's line each cotangent was computed at, for one that autocast's own conversion
    # stores (the cotangent of an argument, rounded to its dtype where the backward pass ends)
    _cotangent_sources: dict[Any, Location]

    def _site(self, eqn: Any) -> Site:
        raise NotImplementedError

    def _backward(self, eqn: Any, ctx: Ctx) -> bool:
        raise NotImplementedError

    def _cotangent(
        self, eqn: Any, ctx: Ctx, cotangents: set[Any], constants: set[Any], has_body: bool
    ) -> bool:
        """Whether ``eqn`` computes cotangents; records its narrow float ones. Updates the level's
        sets of cotangent and constant variables."""
        operands = [x for x in eqn.invars if not isinstance(x, jcore.Literal)]
        reads_cotangent = any(x in cotangents for x in operands)
        constant = all(x in constants for x in operands)
        if not (reads_cotangent or constant) or not self._backward(eqn, ctx):
            if constant:
                constants.update(eqn.outvars)  # a seed built in the forward pass (jnp.ones)
            return False
        if not reads_cotangent and "rematted_computation" in str(eqn.source_info.name_stack):
            constants.update(eqn.outvars)  # a constant jax.checkpoint recomputes: not a cotangent
            return False
        cotangents.update(v for v in eqn.outvars if _inexact(v))
        source = self._cotangent_source(eqn)
        if source is not None:
            self._cotangent_sources.update((v, source) for v in eqn.outvars)
        if not has_body and NARROW_COPY not in str(eqn.source_info.name_stack):
            self._record_cotangents(eqn, ctx)  # a called body's own are recorded where they are
        return True

    def _record_cotangents(self, eqn: Any, ctx: Ctx) -> None:
        narrow = []
        for v in eqn.outvars:
            d = policy_dtype(v.aval)
            if d is not None and D.is_float(d) and not holds(d, grad_dtype(d)):
                narrow.append((v, d))
        if not narrow:
            return
        source = self._cotangent_source(eqn) or ctx.source
        floats = (policy_dtype(x.aval) for x in eqn.invars)
        ins = [short(d) for d in floats if d is not None and D.is_float(d)]
        for v, d in narrow:
            key = (source, d) if source is not None else (None, d, ctx.path)
            group = self._cotangent_groups.get(key)
            if group is None:
                group = _Group(len(self.findings), source, d)
                self._cotangent_groups[key] = group
                self.findings.append(_PLACEHOLDER)
            _add(group.primitives, eqn.primitive.name)
            for s in ins:
                _add(group.dtypes, s)
            # a reshaped or transposed copy holds no new value: its shape is shown only when the
            # group has nothing else
            _add(group.copies if eqn.primitive.name in SHAPE_OPS else group.shapes, shape_of(v))
            group.paths.append(ctx.path)

    def _cotangent_source(self, eqn: Any) -> Location | None:
        """The user's line of a backward equation: its own, or for one of autocast's conversions
        (in heddle's files), the line its cotangent operand was computed at."""
        source = self._site(eqn).source
        if source is not None and not source.file.startswith(_HEDDLE_DIR):
            return source
        return next(
            (
                self._cotangent_sources[x]
                for x in eqn.invars
                if isinstance(x, jcore.Var) and x in self._cotangent_sources
            ),
            None,
        )

    def _finish_cotangents(self) -> None:
        """Puts each group's finding where its first equation was."""
        for group in self._cotangent_groups.values():
            computing = [p for p in group.primitives if p not in SHAPE_OPS] or group.primitives
            self.findings[group.index] = RawFinding(
                kind=NARROW_COTANGENT,
                primitive=",".join(computing),
                dtypes=tuple(group.dtypes) or (short(group.out),),
                out_dtype=short(group.out),
                shapes=tuple(group.shapes or group.copies),
                source=group.source,
                backward=True,
                origin="",
                note=cotangent_note(group.out),
                path=" > ".join(_common_prefix(group.paths)),
                expected=grad_dtype(group.out).name,
            )
        self._cotangent_groups = {}
        self._cotangent_sources = {}


def body_cotangents(
    eqn: Any, body: Any, cotangents: set[Any], computes_cotangents: bool
) -> set[Any]:
    """The input variables of ``body`` (a jaxpr ``eqn`` calls) that hold cotangents.

    They map one to one onto the equation's operands for calls (``jit``, ``checkpoint``,
    custom_jvp/custom_vjp) and ``scan``; ``while`` drops the other body's constants and ``cond`` the
    branch index (``_OPERANDS``, by the kind of the equation's bodies). The float carries of a loop
    that computes cotangents are cotangents (the transpose of a scan carries the cotangent sums);
    every input of any other body of such an equation is.
    """
    if not computes_cotangents:
        return set()
    invars = list(body.invars)
    body_kind = kind(eqn.primitive.name)
    operands = _same_operands if body_kind is None else _OPERANDS[body_kind]
    outer, carries = operands(eqn, body)
    if len(outer) != len(invars):
        return {v for v in invars if _inexact(v)}
    out = {b for x, b in zip(outer, invars, strict=True) if _reads(x, cotangents)}
    out.update(v for v in (invars[i] for i in carries) if _inexact(v))
    return out


def _same_operands(eqn: Any, body: Any) -> tuple[list[Any], range]:
    """A body that runs on the equation's operands (a call; or not one to one, told by the count)."""
    return list(eqn.invars), range(0)


def _while_operands(eqn: Any, body: Any) -> tuple[list[Any], range]:
    p, outer = eqn.params, list(eqn.invars)
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    if body is getattr(p["cond_jaxpr"], "jaxpr", p["cond_jaxpr"]):
        outer, first = outer[:cn] + outer[cn + bn :], cn
    else:
        outer, first = outer[cn:], bn
    return outer, range(first, len(body.invars))


def _scan_operands(eqn: Any, body: Any) -> tuple[list[Any], range]:
    p = eqn.params
    return list(eqn.invars), range(p["num_consts"], p["num_consts"] + p["num_carry"])


def _cond_operands(eqn: Any, body: Any) -> tuple[list[Any], range]:
    return list(eqn.invars)[1:], range(0)


# The kind of an equation's bodies -> (the operands its body's inputs map onto, the body's carries).
_OPERANDS: dict[Body, Callable[[Any, Any], tuple[list[Any], range]]] = {
    Body.JIT: _same_operands,
    Body.CALL: _same_operands,
    Body.SCAN: _scan_operands,
    Body.WHILE: _while_operands,
    Body.COND: _cond_operands,
    Body.CUSTOM_JVP: _same_operands,
    Body.CUSTOM_VJP: _same_operands,
    Body.REMAT: _same_operands,
    Body.SHARD_MAP: _same_operands,
    Body.LINEAR_SOLVE: _same_operands,  # bodies of their own constants: every float input
    Body.REDUCER: _same_operands,
    Body.COMBINER: _same_operands,
}


def cotangent_note(d: np.dtype) -> str:
    """What a cotangent of dtype ``d`` risks, and the fix."""
    s, need = short(d), short(grad_dtype(d))
    info = ml_dtypes.finfo(d)
    narrow_range = info.minexp > ml_dtypes.finfo(_F32).minexp
    if narrow_range:
        tiny = f"{float(info.smallest_subnormal):.0e}".replace("e-0", "e-")
        risk = f"{s} flushes a cotangent below {tiny} to zero"
    else:
        risk = f"{s} keeps {info.nmant + 1} significant bits of each, {need} 24"
    note = (
        f"jax.grad/jax.vjp store these cotangents in {s}, narrower than grad_dtype {need} ({risk}); "
        f"differentiate with heddle.autodiff.grad/value_and_grad, which keep them in {need} (for "
        "jax.grad(heddle.autocast(f)) too: use heddle.autodiff.grad(heddle.autocast(f)))"
    )
    if narrow_range:
        note += "; heddle.scaling's loss scaling is then needed only against forward overflow"
    return note


_PLACEHOLDER = RawFinding(NARROW_COTANGENT, "", (), "", (), None, True, "", "", "")


def _add(items: list[Any], item: Any) -> None:
    if item not in items:
        items.append(item)


def _reads(x: Any, cotangents: set[Any]) -> bool:
    return not isinstance(x, jcore.Literal) and x in cotangents


def _inexact(v: Any) -> bool:
    d = policy_dtype(v.aval)
    return d is not None and D.is_inexact(d)


def _common_prefix(paths: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    paths = list(paths)
    if not paths:
        return ()
    first = paths[0]
    n = len(first)
    for p in paths[1:]:
        n = min(n, len(p))
        for i in range(n):
            if p[i] != first[i]:
                n = i
                break
    return first[:n]
