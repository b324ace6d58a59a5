"""The audit's conversion rules: implicit promotion and lossy conversion.

A ``convert_element_type`` is ``explicit`` when the code asked for it (``astype``,
``asarray(x, dtype)``, ``lax.convert_element_type``, ``jnp.float32(x)``, heddle's own ops) and
``implicit`` when JAX inserted it inside another operation. An implicit conversion of an operand the
caller passed in, feeding an op together with operands of another dtype, is an implicit promotion
(POLICY.md 2 says what heddle gives instead). A conversion that can change values
(``can_lossless_cast`` is false) is lossy; an implicit narrowing that only rounds the operation's own
wider result (``jnp.sum`` of bfloat16 sums in float32 and stores bfloat16) is the "round once on
store" of POLICY.md 5 and is not reported, while one that narrows a value the caller passed in
(``bf16.at[i].set(f32)``) is. A Python scalar taking an array's dtype (POLICY.md 3) is neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from jax.extend import core as jcore

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import PolicyError
from heddle.policy._scalars import result_type
from heddle.programs._audit_ir import (
    DATA_MOVEMENT,
    IMPLICIT_PROMOTION,
    LOOK_THROUGH,
    LOSSY_CONVERSION,
    SHAPE_OPS,
    UPSTREAM_LIMIT,
    Ctx,
    Level,
    holds,
    policy_dtype,
    shape_of,
    short,
)
from heddle.programs._audit_source import LIBRARY_BODY, Site, SiteCache
from heddle.programs._interpret import subjaxprs
from heddle.programs._table import ACCUMULATING, Body, Fact, Rule, having, is_index, kind, rule


class ConversionRules:
    """The conversion rules, mixed into ``Walker`` (which provides ``_site``, ``_backward``,
    ``_report``, ``sites``, ``include_explicit`` and ``_promotions_seen``)."""

    sites: SiteCache
    include_explicit: bool
    _promotions_seen: set[int]

    def _site(self, eqn: Any) -> Site:
        raise NotImplementedError

    def _backward(self, eqn: Any, ctx: Ctx) -> bool:
        raise NotImplementedError

    def _report(self, eqn: Any, ctx: Ctx, kind: str, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def _convert(self, eqn: Any, level: Level, ctx: Ctx) -> None:
        x = eqn.invars[0]
        src = policy_dtype(x.aval)
        dst = policy_dtype(eqn.outvars[0].aval)
        if src is None or dst is None or src == dst or x.aval.weak_type:
            return  # a Python scalar taking the array's dtype is POLICY.md 3, not a finding
        if _unread(eqn.outvars[0], level):
            return  # XLA drops it (a narrow copy that autocast made and nothing reads)
        site = self._site(eqn)
        explicit = site.explicit or (site.key is LIBRARY_BODY and ctx.explicit)
        lossy = not _lattice.lossless(src, dst) and not _exact_literal(x, dst)
        lossy = lossy and not _round_trip(x, level, dst)
        if explicit:
            if lossy and self.include_explicit:
                self._lossy(eqn, ctx, src, dst, "explicit")
            return
        external = _external(x, level, site.key, self.sites)
        if external and not self._backward(eqn, ctx):  # backward converts transpose forward ones
            self._promotion(eqn, level, ctx, site)
        backward = self._backward(eqn, ctx)
        narrows_input = lossy and (external or self._narrows_an_input(x, level, site.key, dst))
        if lossy and not backward and _received(x, level, dst):
            # data the function was given, rounded (``full_like(x_bf16, w_f32)``), however it is
            # read afterwards (autocast reads it through its float32 copy, as its own roundings)
            self._lossy(eqn, ctx, src, dst, "implicit")
            return
        if lossy and _rounded_for_a_wider_use(eqn, level, src, self.sites):
            return  # a value rounded once to its own narrow dtype and read through its wide copy
        if lossy and backward and _read_by_loops(eqn, level):
            return  # a cotangent rounded once for a loop with narrow carries: the loop's finding
        if narrows_input:
            self._lossy(eqn, ctx, src, dst, "implicit")
        elif lossy and _integer_accumulator_store(x, level, src, dst):
            self._lossy(eqn, ctx, src, dst, "implicit")  # JAX's dtype kept: the sum wraps

    def _lossy(self, eqn: Any, ctx: Ctx, src: np.dtype, dst: np.dtype, origin: str) -> None:
        if dst.itemsize < src.itemsize or _lattice.lossless(dst, src):
            what = "narrowing"
        elif dst.itemsize > src.itemsize:
            what = "lossy widening"
        else:
            what = "lossy conversion"
        self._report(
            eqn,
            ctx,
            LOSSY_CONVERSION,
            eqn.primitive.name,
            (short(src),),
            short(dst),
            (shape_of(eqn.invars[0]),),
            f"{origin} {what}: not every {src.name} is a {dst.name}",
            origin,
        )

    def _narrows_an_input(self, x: Any, level: Level, key: Any, dst: np.dtype) -> bool:
        """Whether ``x`` is a value the call received (moved, not computed on) wider than ``dst``.

        A narrowing of something the call computed (a sum, a product, a normalised value) is the
        call rounding its own result once on store; one of a value it only moved is not.
        """
        seen: set[Any] = set()
        frontier = [x]
        while frontier and len(seen) < UPSTREAM_LIMIT:
            v = frontier.pop()
            if isinstance(v, jcore.Literal) or v in seen:
                continue
            seen.add(v)
            producer = level.producer.get(v)
            if producer is None or self._site(producer).key != key:
                d = policy_dtype(v.aval)
                wider = d is not None and D.is_inexact(d) and not holds(dst, d)
                if wider and not _round_trip(v, level, dst):  # a float32 twin holds no more
                    return True
                continue
            if producer.primitive.name in DATA_MOVEMENT:
                frontier.extend(producer.invars)
        return False

    def _promotion(self, eqn: Any, level: Level, ctx: Ctx, site: Site) -> None:
        for target in self._forward_targets(eqn, level, site.key):
            if id(target) in self._promotions_seen or self._backward(target, ctx):
                continue
            name = target.primitive.name
            operands = [v for i, v in enumerate(target.invars) if not is_index(name, i)]
            if len(operands) < 2:
                continue
            found = [self._original(v, level, site.key) for v in operands]
            if any(o is None for o in found):
                continue  # an operand the call computed itself: the library's own upcast
            originals = [_as_operand(o) for o in found]
            if len({_describe(o) for o in originals}) < 2:
                continue
            self._promotions_seen.add(id(target))
            common = policy_dtype(eqn.outvars[0].aval)
            if common is None:
                return
            try:
                theirs = result_type(*originals)
                heddle = theirs.name
            except PolicyError as e:
                theirs, heddle = None, f"error ({type(e).__name__})"
            # None first: comparing a dtype with None compares it with float64.
            differs = theirs is None or theirs != common
            note = f"JAX converts the operands to {common.name}"
            if differs:
                note += f"; heddle's lattice gives {heddle}"
            note += "; convert explicitly"
            self._report(
                target,
                ctx,
                IMPLICIT_PROMOTION,
                target.primitive.name,
                tuple(_describe(o) for o in originals),
                short(common),
                tuple(shape_of(v) for v in operands),
                note,
                "implicit",
                heddle if differs else "",
            )

    def _forward_targets(self, eqn: Any, level: Level, key: Any) -> Iterator[Any]:
        frontier = list(eqn.outvars)
        seen: set[Any] = set()
        while frontier:
            v = frontier.pop()
            if v in seen:
                continue
            seen.add(v)
            for c in level.consumers(v):
                if self._site(c).key != key:
                    continue
                if c.primitive.name in SHAPE_OPS:
                    frontier.extend(c.outvars)
                elif not any(True for _ in subjaxprs(c.params)):  # cond's index is not a value
                    yield c

    def _original(self, v: Any, level: Level, key: Any) -> Any:
        """The operand as the caller passed it (through the call's converts and shape ops).

        None when the call computed the operand itself.
        """
        while not isinstance(v, jcore.Literal):
            producer = level.producer.get(v)
            if producer is None or self._site(producer).key != key:
                break
            if producer.primitive.name not in LOOK_THROUGH:
                return None
            v = producer.invars[0]
        return v


# Ops whose result holds only values of their first operand (moved, not computed on), and ops
# that return their operands as they are (optimization_barrier).
_MOVES_ONE = having(Fact.FROM_FIRST)
_IDENTITIES = having(Fact.IDENTITY)
_ROUNDS = having(Fact.ROUNDS)
_CHOOSES = having(Fact.CHOOSES)


def _round_trip(x: Any, level: Level, dst: np.dtype) -> bool:
    """Whether ``x`` is, through ops that only move values, an exact widening of a value whose dtype
    ``dst`` holds: narrowing it back to ``dst`` gives back the same values (autocast's narrow dot
    reads its operands' float32 twins, ``cast(twin, bfloat16)``; ``x.astype(f32).astype(bf16)``).
    The walk enters a custom_jvp function's body (heddle.autodiff's float32 twin of a narrow value,
    ``reduce_precision(convert(x))``, is one) and leaves it by its operands, leaves the body being
    walked by the operand of the equation that holds it (a loop's constant), and follows every case
    of a ``select_n``."""
    return _trip(x, [(level, None)], dst, [UPSTREAM_LIMIT])


def _trip(v: Any, levels: list[tuple[Level, Any]], dst: np.dtype, budget: list[int]) -> bool:
    """``_round_trip`` from ``v`` in the innermost of ``levels`` (each with the equation that holds
    it, None for the body being walked); ``budget`` bounds the steps of all branches together."""
    while budget[0] > 0:
        budget[0] -= 1
        if isinstance(v, jcore.Literal):
            return False
        lvl, holder = levels[-1]
        producer = lvl.producer.get(v)
        if producer is None:
            if holder is not None and v in lvl.jaxpr.invars:
                v = holder.invars[lvl.jaxpr.invars.index(v)]
                levels = levels[:-1]
                continue
            if holder is None and lvl.parent is not None:  # out of the body being walked
                outer, eqn = lvl.parent
                v = _outer_operand(eqn, lvl.jaxpr, v)
                if v is None:
                    return False
                levels = [*levels[:-1], (outer, None)]
                continue
            return False
        name = producer.primitive.name
        if rule(name) is Rule.CONVERT:
            origin, wide = policy_dtype(producer.invars[0].aval), policy_dtype(v.aval)
            return (
                origin is not None
                and wide is not None
                and holds(wide, origin)
                and holds(dst, origin)
            )
        if name in _CHOOSES:
            return all(_trip(case, levels, dst, budget) for case in producer.invars[1:])
        if name in _IDENTITIES:
            v = producer.invars[producer.outvars.index(v)]
        elif (name in _MOVES_ONE or name in _ROUNDS) and producer.invars:
            v = producer.invars[0]  # a rounding to fewer bits: follow the value it rounds
        elif kind(name) is Body.CUSTOM_JVP:
            body = producer.params["call_jaxpr"]
            body = getattr(body, "jaxpr", body)
            v = body.outvars[producer.outvars.index(v)]
            levels = [*levels, (Level(body), producer)]
        else:
            return False
    return False


def _received(x: Any, level: Level, dst: np.dtype) -> bool:
    """Whether ``x`` holds, through ops that only move values (every value operand of a ``pad``,
    ``select_n``, ``concatenate``, ...), float data the function was given that ``dst`` does not
    hold: an input or constant of the outermost jaxpr (out of a body by the operand its equation
    passes in), or an inexact literal. A value computed anywhere, or converted, is not."""
    frontier, seen = [(x, level)], set()
    while frontier:
        v, lvl = frontier.pop()
        if isinstance(v, jcore.Literal):
            d = policy_dtype(v.aval)
            if d is not None and D.is_inexact(d) and not _exact_literal(v, dst):
                return True
            continue
        d = policy_dtype(v.aval)
        if v in seen or d is None or not D.is_inexact(d) or holds(dst, d):
            continue  # an index, a predicate, or a value ``dst`` holds: nothing of it is lost
        seen.add(v)
        if len(seen) > UPSTREAM_LIMIT:
            return False
        producer = lvl.producer.get(v)
        if producer is None:
            if lvl.parent is None:
                if v in lvl.jaxpr.invars or v in lvl.jaxpr.constvars:
                    return True
                continue
            outer, eqn = lvl.parent
            u = _outer_operand(eqn, lvl.jaxpr, v)
            if u is not None:
                frontier.append((u, outer))
        elif producer.primitive.name in DATA_MOVEMENT:
            frontier.extend((a, lvl) for a in producer.invars)
    return False


def _unread(v: Any, level: Level) -> bool:
    """Whether no equation of ``level`` reads ``v`` and it is not an output."""
    return isinstance(v, jcore.DropVar) or (
        not level.consumers(v) and all(v is not o for o in level.jaxpr.outvars)
    )


def _outer_operand(eqn: Any, body: Any, v: Any) -> Any | None:
    """The operand of ``eqn`` that ``body``'s input ``v`` holds at every step (a loop's constant or
    per-step input, a call's or branch's argument); None for a loop's carry, which later steps set."""
    if v not in body.invars:
        return None
    i = body.invars.index(v)
    p = eqn.params
    k = kind(eqn.primitive.name)
    if k is Body.SCAN:
        carry = p["num_consts"] <= i < p["num_consts"] + p["num_carry"]
        return None if carry else eqn.invars[i]
    if k is Body.WHILE:
        cond = getattr(p["cond_jaxpr"], "jaxpr", p["cond_jaxpr"]) is body
        first, count = (0, p["cond_nconsts"]) if cond else (p["cond_nconsts"], p["body_nconsts"])
        return eqn.invars[first + i] if i < count else None
    if k is Body.COND:
        return eqn.invars[1 + i]
    if k in _POSITIONAL and len(body.invars) == len(eqn.invars):
        return eqn.invars[i]
    return None


_POSITIONAL = (Body.JIT, Body.CALL, Body.CUSTOM_JVP, Body.CUSTOM_VJP, Body.REMAT, Body.SHARD_MAP)


def _rounded_for_a_wider_use(eqn: Any, level: Level, src: np.dtype, sites: SiteCache) -> bool:
    """Whether a narrowing's result is read only by exact widenings back to ``src`` (directly or
    through selections and copies): a value computed at ``src`` rounded once to the narrow dtype the
    program gives it, whose consumers compute on its exact wide copy. heddle.autocast rounds each
    narrow result once and computes with its float32 twin; in its backward pass the transposes of
    those two conversions round each cotangent once to its primal's narrow dtype, the dtype JAX's
    own cotangent has there (a relu's ``select_n`` between them is exact). The walk enters the
    bodies of calls that take the value as an operand (``jax.checkpoint``'s ``remat``, a ``jit``).
    A narrowing that a narrow operation reads, a store into a narrow buffer (``bf16.at[i].set(f32)``,
    also when the buffer is widened afterwards) and a narrow output (a bfloat16 gradient) are not
    this."""
    (out,) = eqn.outvars
    dst = policy_dtype(out.aval)
    stored = level.producer.get(eqn.invars[0])
    if stored is not None and stored.primitive.name in _STORES:
        return False  # bf16.at[i].set(f32): the buffer promoted, stored into, narrowed back
    frontier: list[tuple[Level, Any]] = [(level, out)]
    seen: set[Any] = set()
    while frontier:
        lvl, v = frontier.pop()
        if v in seen:
            continue
        seen.add(v)
        if len(seen) > UPSTREAM_LIMIT or isinstance(v, jcore.DropVar) or v in lvl.jaxpr.outvars:
            return False
        readers = lvl.consumers(v)
        if not readers:
            return False
        for r in readers:
            name = r.primitive.name
            if rule(name) is Rule.CONVERT:
                if policy_dtype(r.outvars[0].aval) != src or _site_of(r, sites).explicit:
                    return False
            elif name in _SELECTS_AND_COPIES and all(
                policy_dtype(o.aval) == dst for o in r.outvars
            ):
                frontier.extend((lvl, o) for o in r.outvars)
            elif kind(name) in _POSITIONAL:
                inner = _inner_inputs(r, v)
                if not inner:
                    return False
                frontier.extend(inner)
            else:
                return False
    return True


def _inner_inputs(eqn: Any, v: Any) -> list[tuple[Level, Any]]:
    """The inputs of ``eqn``'s bodies that hold its operand ``v`` (a call's bodies take its operands
    in order); empty where a body does not."""
    out: list[tuple[Level, Any]] = []
    for sub in subjaxprs(eqn.params):
        body = getattr(sub, "jaxpr", sub)
        if len(body.invars) != len(eqn.invars):
            return []
        out.extend((Level(body), body.invars[i]) for i, a in enumerate(eqn.invars) if a is v)
    return out


_LOOPS = (Body.SCAN, Body.WHILE)


def _read_by_loops(eqn: Any, level: Level) -> bool:
    """Whether only loops read a narrowing's result, or only the loop whose body ``level`` is, as a
    carry or per-step result of that body (in the backward pass: a cotangent computed in float32 by
    heddle.autocast, rounded once to the narrow dtype of the transposed loop's carry or per-step
    input, where ``jax.grad`` of the plain program computes it narrow; the audit reports the
    loop's narrow cotangents and carries)."""
    (out,) = eqn.outvars
    readers = level.consumers(out)
    if readers:
        return all(kind(r.primitive.name) in _LOOPS for r in readers)
    holder = level.parent[1] if level.parent is not None else None
    return (
        holder is not None
        and kind(holder.primitive.name) in _LOOPS
        and any(out is o for o in level.jaxpr.outvars)
    )


def _site_of(eqn: Any, sites: SiteCache) -> Site:
    return sites.site(eqn.source_info.traceback)


_STORES = having(Fact.OVERWRITES)
# Exact ops a rounded value may pass through on its way to its widening (not stores into a buffer).
_SELECTS_AND_COPIES = SHAPE_OPS | having(Fact.SELECTS)


def _integer_accumulator_store(x: Any, level: Level, src: np.dtype, dst: np.dtype) -> bool:
    """An integer sum or contraction accumulated at ``src`` stored in a narrower integer ``dst``
    (heddle.autocast keeps JAX's ``int8 @ int8 -> int8``; heddle.numpy returns the int32 sum)."""
    if D.kind(src) not in "iu" or D.kind(dst) not in "iu" or isinstance(x, jcore.Literal):
        return False
    producer = level.producer.get(x)
    return producer is not None and rule(producer.primitive.name) in ACCUMULATING


def _as_operand(v: Any) -> Any:
    """A policy dtype for a typed value; a Python scalar for a weakly typed one."""
    d = policy_dtype(v.aval)
    if d is None:
        return None
    if not getattr(v.aval, "weak_type", False):
        return d
    if isinstance(v, jcore.Literal):
        val = np.asarray(v.val).item()
        return {"b": bool, "i": int, "u": int, "f": float, "c": complex}[D.kind(d)](val)
    return {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}[D.kind(d)]


def _describe(o: Any) -> str:
    if isinstance(o, np.dtype):
        return short(o)
    return type(o).__name__ if o is not None else "?"


def _external(x: Any, level: Level, key: Any, sites: SiteCache) -> bool:
    if isinstance(x, jcore.Literal):
        return True
    producer = level.producer.get(x)
    return producer is None or sites.site(producer.source_info.traceback).key != key


def _exact_literal(x: Any, dst: np.dtype) -> bool:
    if not isinstance(x, jcore.Literal):
        return False
    try:
        val = np.asarray(x.val)
        with np.errstate(all="ignore"):
            back = val.astype(dst).astype(val.dtype)
            same = (back == val) | (np.isnan(back) & np.isnan(val))
    except (TypeError, ValueError, OverflowError):
        return False
    return bool(np.all(same))
