"""The audit's walk: every equation of a jaxpr and of the jaxprs nested in it, and the
narrow-accumulation rule.

Narrow accumulation (POLICY.md 5): an equation that adds (or multiplies) up many terms whose
accumulator is narrower than ``acc_dtype`` of its inputs (``reduce_sum``, window sums, ``cumsum``,
scatter-add, ``psum``, and ``dot_general``/``conv_general_dilated`` through their
``preferred_element_type``), and the ``exp``-then-sum pattern of softmax/logsumexp with the ``exp`` in
a narrow float. The conversion rules are in ``_audit_convert``, the narrow-cotangent rule in
``_audit_cotangent``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from heddle.policy import _dtypes as D
from heddle.policy._rules import acc_dtype
from heddle.programs._audit_convert import ConversionRules
from heddle.programs._audit_cotangent import CotangentRules, body_cotangents
from heddle.programs._audit_ir import (
    ACCUMULATIONS,
    CONTRACTIONS,
    EXPS,
    GENERIC_REDUCTIONS,
    IMPLICIT_PROMOTION,
    NARROW_ACCUMULATION,
    PASS_VALUE,
    SUMMING,
    SUMS_OF_EXP,
    UNCLASSIFIED,
    UPSTREAM_LIMIT,
    Ctx,
    Level,
    RawFinding,
    holds,
    join,
    policy_dtype,
    shape_of,
    short,
)
from heddle.programs._audit_source import LIBRARY_BODY, Site, SiteCache, entry_name
from heddle.programs._interpret import subjaxprs
from heddle.programs._table import (
    HEDDLE_FUNCTIONS,
    Body,
    Fact,
    Rule,
    has,
    having,
    holding,
    kind,
    names,
    rule,
)


class Walker(ConversionRules, CotangentRules):
    """Applies the rules to a closed jaxpr; ``findings`` collects what they report."""

    def __init__(self, include_explicit: bool) -> None:
        self.include_explicit = include_explicit
        self.sites = SiteCache()
        self.findings: list[RawFinding] = []
        self._promotions_seen: set[int] = set()
        self._unclassified: set[str] = set()
        self._cotangent_groups = {}
        self._cotangent_sources = {}

    # -- traversal -----------------------------------------------------------------------------

    def walk(
        self,
        jaxpr: Any,
        ctx: Ctx | None = None,
        cotangents: set[Any] | None = None,
        parent: tuple[Level, Any] | None = None,
    ) -> None:
        """Walks ``jaxpr`` (a Jaxpr or ClosedJaxpr) and every jaxpr nested in its equations.

        ``cotangents`` are the inputs of ``jaxpr`` that hold cotangents (a body a backward equation
        calls), ``parent`` the level and equation that hold it; the walk of the outermost jaxpr (no
        ``ctx``) also finishes the findings."""
        top = ctx is None
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        ctx = ctx or Ctx(None, False, False, ())
        level = Level(jaxpr, parent)
        cts = set(cotangents or ())
        constants: set[Any] = set()
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            r = rule(name)
            if r is None and name not in self._unclassified:
                self._unclassified.add(name)
                self._report(
                    eqn,
                    ctx,
                    UNCLASSIFIED,
                    name,
                    tuple(short(d) for d in map(policy_dtype, _avals(eqn.invars)) if d),
                    ",".join(short(d) for d in map(policy_dtype, _avals(eqn.outvars)) if d),
                    tuple(shape_of(v) for v in eqn.invars if hasattr(v.aval, "shape")),
                    "a primitive heddle's table of rules does not list: heddle.autocast binds it "
                    "unchanged; classify it in heddle/programs/_table.py",
                )
            if r is Rule.CONVERT:
                self._convert(eqn, level, ctx)
            elif name in ACCUMULATIONS or name in CONTRACTIONS or name in GENERIC_REDUCTIONS:
                self._accumulation(eqn, ctx)
            if name in EXPS:
                self._exp_then_sum(eqn, level, ctx)
            if name in LOOPS:
                self._loop_carries(eqn, ctx)
            subs = list(subjaxprs(eqn.params))
            computes_cotangents = self._cotangent(eqn, ctx, cts, constants, bool(subs))
            if subs:
                site = self._site(eqn)
                called = eqn.params.get("name", _NO_NAME)  # a jit's function
                label = name + (f"[{called}]" if called is not _NO_NAME else "")
                inner = Ctx(
                    site.source or ctx.source,
                    self._backward(eqn, ctx),
                    site.explicit or (site.key is LIBRARY_BODY and ctx.explicit),
                    (*ctx.path, label),
                )
                for sub in subs:
                    body = getattr(sub, "jaxpr", sub)
                    cts_in = body_cotangents(eqn, body, cts, computes_cotangents)
                    self.walk(sub, inner, cts_in, (level, eqn))
        if top:
            self._finish_cotangents()

    def _site(self, eqn: Any) -> Site:
        return self.sites.site(eqn.source_info.traceback)

    @staticmethod
    def _backward(eqn: Any, ctx: Ctx) -> bool:
        return ctx.backward or "transpose(" in str(eqn.source_info.name_stack)

    def _report(
        self,
        eqn: Any,
        ctx: Ctx,
        kind: str,
        primitive: str,
        dtypes: tuple[str, ...],
        out_dtype: str,
        shapes: tuple[tuple[int, ...], ...],
        note: str,
        origin: str = "",
        expected: str = "",
    ) -> None:
        site = self._site(eqn)
        self.findings.append(
            RawFinding(
                kind=kind,
                primitive=primitive,
                dtypes=dtypes,
                out_dtype=out_dtype,
                shapes=shapes,
                source=site.source or ctx.source,
                backward=self._backward(eqn, ctx),
                origin=origin,
                note=note,
                path=" > ".join(ctx.path),
                expected=expected,
            )
        )

    # -- narrow accumulation ---------------------------------------------------------------------

    def _accumulation(self, eqn: Any, ctx: Ctx) -> None:
        name = eqn.primitive.name
        if name in GENERIC_REDUCTIONS and not _sums(eqn.params):
            return
        if name in CONTRACTIONS:
            a, b = (policy_dtype(x.aval) for x in eqn.invars[:2])
            out = policy_dtype(eqn.outvars[0].aval)
            pref = eqn.params.get("preferred_element_type")
            acc = D.dtype(np.dtype(pref)) if pref is not None else out
            if a is None or b is None or acc is None:
                return
            need = join(acc_dtype(a), acc_dtype(b))
            operands = eqn.invars[:2]
            dtypes: tuple[str, ...] = (short(a), short(b))
            if a != b and not self._backward(eqn, ctx):  # JAX's transposes mix on purpose
                self._mixed_contraction(eqn, ctx, a, b, out)
            fix = self._fix(eqn, ctx, name, f"preferred_element_type=jnp.{need.name}")
        else:
            x = eqn.invars[0]
            acc = policy_dtype(x.aval)
            if acc is None:
                return
            need = acc_dtype(acc)
            operands = [x]
            dtypes = (short(acc),)
            fix = self._fix(eqn, ctx, name, None)
            out = policy_dtype(eqn.outvars[0].aval) or acc
        if holds(acc, need) or _terms(eqn) <= 1:
            return
        self._report(
            eqn,
            ctx,
            NARROW_ACCUMULATION,
            name,
            dtypes,
            short(out) if out is not None else "?",
            tuple(shape_of(v) for v in operands),
            f"accumulates in {short(acc)}, narrower than acc_dtype {short(need)}; {fix}",
            expected=need.name,
        )

    def _fix(self, eqn: Any, ctx: Ctx, name: str, argument: str | None) -> str:
        """The remedy that applies at this call: autocast, the heddle function of the same name, and
        the JAX argument only where the user's own code made the JAX call that has it."""
        site = self._site(eqn)
        entry = (site.entry or "").rsplit(".", 1)[-1].lstrip("_")
        entry = {"operator_matmul": "matmul", "cumulative_sum": "cumsum"}.get(entry, entry)
        fix = "run it under heddle.autocast"
        if self._backward(eqn, ctx):  # a transpose: the forward call has no such argument
            return fix + ", or differentiate with heddle.autodiff.grad"
        heddle_fn = _heddle_function(entry) or HEDDLE_FUNCTIONS.get(name)
        if heddle_fn:
            fix += f", or call {heddle_fn}"
        if argument and site.direct and entry in _TAKES_PREFERRED:
            fix += f", or pass {argument}"
        return fix

    def _mixed_contraction(self, eqn: Any, ctx: Ctx, a: np.dtype, b: np.dtype, out: Any) -> None:
        """A contraction of two dtypes with no conversion in the jaxpr (``f32 @ bf16`` by lax)."""
        common = join(a, b)
        self._report(
            eqn,
            ctx,
            IMPLICIT_PROMOTION,
            eqn.primitive.name,
            (short(a), short(b)),
            short(out) if out is not None else "?",
            tuple(shape_of(v) for v in eqn.invars[:2]),
            f"operands of two dtypes contracted without a conversion; heddle's lattice gives "
            f"{common.name}; convert explicitly or {self._fix(eqn, ctx, eqn.primitive.name, None)}",
            "implicit",
            common.name if out is None or common != out else "",
        )

    def _exp_then_sum(self, eqn: Any, level: Level, ctx: Ctx) -> None:
        d = policy_dtype(eqn.outvars[0].aval)
        if d is None or not D.is_float(d) or holds(d, acc_dtype(d)):
            return
        seen: set[Any] = set()
        frontier = list(eqn.outvars)
        while frontier and len(seen) < UPSTREAM_LIMIT:
            v = frontier.pop(0)
            if v in seen:
                continue
            seen.add(v)
            for c in level.consumers(v):
                cname = c.primitive.name
                if cname in SUMS_OF_EXP:
                    self._report(
                        eqn,
                        ctx,
                        NARROW_ACCUMULATION,
                        f"{eqn.primitive.name}+{cname}",
                        (short(d),),
                        short(d),
                        (shape_of(eqn.outvars[0]),),
                        f"softmax/logsumexp: exp in {short(d)}, then summed; compute it in "
                        f"{short(acc_dtype(d))}: run it under heddle.autocast, or call "
                        "heddle.nn.softmax / heddle.nn.logsumexp",
                        expected=acc_dtype(d).name,
                    )
                    return
                if cname in PASS_VALUE:
                    frontier.extend(c.outvars)

    def _loop_carries(self, eqn: Any, ctx: Ctx) -> None:
        """A narrow float loop carry that each step adds to (or multiplies): ``scan``/``fori_loop``
        summing into a bfloat16 carry accumulates in bfloat16, whatever each step computes in."""
        body, first, count = _carries(eqn)
        body = getattr(body, "jaxpr", body)
        level = Level(body)
        steps = eqn.params.get("length")
        for i in range(count):
            carry, out = body.invars[first + i], body.outvars[i]
            if isinstance(out, jcore.Literal):  # a constant carry: nothing is summed into it
                continue
            d = policy_dtype(carry.aval)
            if d is None or not D.is_float(d) or holds(d, acc_dtype(d)) or steps in (0, 1):
                continue
            op = _updates(level, out, carry)
            if op is None:
                continue
            need = acc_dtype(d)
            over = f"over {steps} steps" if steps else "over the loop's steps"
            self._report(
                eqn,
                ctx,
                NARROW_ACCUMULATION,
                f"{eqn.primitive.name} carry ({op})",
                (short(d),),
                short(d),
                (shape_of(carry),),
                f"a {short(d)} loop carry updated by {op} {over} accumulates in {short(d)}, "
                f"narrower than acc_dtype {short(need)}; carry it in {short(need)} (start the loop "
                f"with init.astype(jnp.{need.name}) and round after it): heddle.autocast keeps every "
                "carry's dtype, so it cannot change this one",
                expected=need.name,
            )


_NO_NAME = object()


def _scan_carries(p: dict[str, Any]) -> tuple[Any, int, int]:
    return p["jaxpr"], p["num_consts"], p["num_carry"]


def _while_carries(p: dict[str, Any]) -> tuple[Any, int, int]:
    body = p["body_jaxpr"]
    return body, p["body_nconsts"], len(getattr(body, "jaxpr", body).outvars)


# The loops (by the kind of their bodies) -> (body jaxpr, index of the first carry among its inputs,
# number of carries) from the equation's parameters.
_CARRIES = {Body.SCAN: _scan_carries, Body.WHILE: _while_carries}
LOOPS = holding(*_CARRIES)
# Ops a carry's value passes through on its way to the update that accumulates into it.
_CARRY_PATH = having(Fact.KEEPS_ORDER) | names(Rule.CONVERT)
# The kinds of call whose body runs on the equation's own operands, one to one (a nested jit, a
# custom_jvp/custom_vjp function, jax.checkpoint, shard_map's per-shard body) -> the parameter that
# holds it.
_CALLED = {
    Body.JIT: "jaxpr",
    Body.CALL: "call_jaxpr",
    Body.CUSTOM_JVP: "call_jaxpr",
    Body.CUSTOM_VJP: "call_jaxpr",
    Body.REMAT: "jaxpr",
    Body.SHARD_MAP: "jaxpr",
}


def _carries(eqn: Any) -> tuple[Any, int, int]:
    """(body jaxpr, index of the first carry among its inputs, number of carries) of a loop."""
    body_kind = kind(eqn.primitive.name)
    assert body_kind is not None, "only loops have carries"
    return _CARRIES[body_kind](eqn.params)


def _updates(level: Level, out: Any, carry: Any) -> str | None:
    """The summing op that makes a body's carry output from its carry input and terms that do not
    depend on it (a running sum of the steps' values: ``c + x``, ``c * x``, ``c.at[i].add(x)``,
    also behind a ``where``), through conversions; ``None`` for any other output. An update whose
    term depends on the carry (a residual stream ``h + f(h)``, an average ``c + a * (x - c)``) is a
    recurrence, as the same program unrolled is, not a sum."""

    def source(v: Any) -> Any:
        for _ in range(UPSTREAM_LIMIT):
            if isinstance(v, jcore.Literal):
                return v
            e = level.producer.get(v)
            if e is None or e.primitive.name not in _CARRY_PATH:
                return v
            v = e.invars[0]
        return v

    tainted = _dependents(level, carry)
    v = source(out)
    e = None if isinstance(v, jcore.Literal) else level.producer.get(v)
    body = _call_body(e)
    if body is not None and e is not None:  # a jitted or custom-derivative call: follow the carry
        inner = [b for x, b in zip(e.invars, body.invars, strict=True) if source(x) is carry]
        others = [x for x in e.invars if source(x) is not carry]
        if len(inner) != 1 or any(_reads(x, tainted) for x in others):
            return None
        return _updates(Level(body), body.outvars[e.outvars.index(v)], inner[0])
    if e is not None and has(e.primitive.name, Fact.CHOOSES):  # where(p, c + x, c): the update
        branches = [source(b) for b in e.invars[1:] if not isinstance(b, jcore.Literal)]
        updates = [b for b in branches if b is not carry]
        if len(updates) != 1:
            return None
        e = level.producer.get(updates[0])
    if e is None or e.primitive.name not in _CARRY_UPDATES:
        return None
    operands = e.invars[:1] if e.primitive.name in _SCATTERS else e.invars
    terms = [x for x in e.invars if source(x) is not carry]  # literals too: c + 1.0 counts
    if not terms or carry not in [source(x) for x in operands]:
        return None  # c + c doubles: nothing is summed
    return None if any(_reads(x, tainted) for x in terms) else e.primitive.name


def _call_body(eqn: Any) -> Any:
    """The jaxpr a call-like equation runs on its own operands (nested jit, custom_jvp/vjp, remat),
    or None (an inner loop's carries are its own finding)."""
    body_kind = None if eqn is None else kind(eqn.primitive.name)
    key = None if body_kind is None else _CALLED.get(body_kind)
    if key is None:
        return None
    body = getattr(eqn.params.get(key), "jaxpr", eqn.params.get(key))
    if isinstance(body, jcore.Jaxpr) and len(body.invars) == len(eqn.invars):
        return body if len(body.outvars) == len(eqn.outvars) else None
    return None


def _reads(x: Any, tainted: set[Any]) -> bool:
    return not isinstance(x, jcore.Literal) and x in tainted


def _dependents(level: Level, v: Any) -> set[Any]:
    """Every variable of the level computed from ``v``."""
    seen = {v}
    for eqn in level.jaxpr.eqns:
        if any(not isinstance(x, jcore.Literal) and x in seen for x in eqn.invars):
            seen.update(eqn.outvars)
    return seen


# Scatters accumulate into their first operand (the buffer): the carry must be it.
_SCATTERS = names(Rule.SCATTER)
_CARRY_UPDATES = having(Fact.UPDATES)

# The JAX functions that take ``preferred_element_type`` (a fix may suggest it where the user's code
# called one of them).
_TAKES_PREFERRED = frozenset(
    entry_name(f)
    for f in (
        jnp.matmul,
        jnp.dot,
        jnp.vdot,
        jnp.inner,
        jnp.tensordot,
        jnp.einsum,
        lax.dot_general,
        lax.conv_general_dilated,
        lax.conv,
        lax.conv_with_general_padding,
        lax.ragged_dot,
        lax.ragged_dot_general,
    )
)


def _heddle_function(entry: str) -> str | None:
    """``heddle.numpy.NAME`` / ``heddle.lax.NAME`` / ``heddle.nn.NAME`` where heddle has ``entry``."""
    if not entry:
        return None
    import heddle

    for ns in ("numpy", "nn", "lax"):
        if hasattr(getattr(heddle, ns), entry):
            return f"heddle.{ns}.{entry}"
    return None


def _avals(atoms: Any) -> list[Any]:
    return [a.aval for a in atoms]


def _terms(eqn: Any) -> int:
    """How many terms each output element adds up (2, i.e. "some", when it cannot be told)."""
    name, params = eqn.primitive.name, eqn.params
    r = rule(name)
    shape = tuple(eqn.invars[0].aval.shape)

    def size(axes: Any) -> int:
        n = 1
        for a in axes:
            d = shape[a]
            n *= d if isinstance(d, (int, np.integer)) else 2
        return n

    if has(name, Fact.DOT):
        return size(params["dimension_numbers"][0][0])
    if r is Rule.REDUCTION and "axes" in params:
        return size(params["axes"])
    if r is Rule.SCAN and "axis" in params:
        return size((params["axis"],))
    if r is Rule.WINDOW and "window_dimensions" in params:
        return int(np.prod(params["window_dimensions"]))
    return 2


def _sums(params: dict[str, Any]) -> bool:
    return any(
        e.primitive.name in SUMMING for j in subjaxprs(params) for e in getattr(j, "jaxpr", j).eqns
    )
