"""The audit's walk: every equation of a jaxpr and of the jaxprs nested in it, and the
narrow-accumulation rule.

Narrow accumulation (POLICY.md 5): an equation that adds (or multiplies) up many terms whose
accumulator is narrower than ``acc_dtype`` of its inputs (``reduce_sum``, window sums, ``cumsum``,
scatter-add, ``psum``, and ``dot_general``/``conv_general_dilated`` through their
``preferred_element_type``), and the ``exp``-then-sum pattern of softmax/logsumexp with the ``exp`` in
a narrow float. The conversion rules are in ``_audit_convert``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy._rules import acc_dtype
from heddle.programs._audit_convert import ConversionRules
from heddle.programs._audit_ir import (
    ACCUMULATIONS,
    CONTRACTIONS,
    EXPS,
    GENERIC_REDUCTIONS,
    NARROW_ACCUMULATION,
    PASS_VALUE,
    SUMMING,
    SUMS_OF_EXP,
    UPSTREAM_LIMIT,
    Ctx,
    Level,
    RawFinding,
    holds,
    join,
    policy_dtype,
    shape_of,
    short,
    subjaxprs,
)
from heddle.programs._audit_source import LIBRARY_BODY, Site, SiteCache


class Walker(ConversionRules):
    """Applies the rules to a closed jaxpr; ``findings`` collects what they report."""

    def __init__(self, include_explicit: bool) -> None:
        self.include_explicit = include_explicit
        self.sites = SiteCache()
        self.findings: list[RawFinding] = []
        self._promotions_seen: set[int] = set()

    # -- traversal -----------------------------------------------------------------------------

    def walk(self, jaxpr: Any, ctx: Ctx | None = None) -> None:
        """Walks ``jaxpr`` (a Jaxpr or ClosedJaxpr) and every jaxpr nested in its equations."""
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        ctx = ctx or Ctx(None, False, False, ())
        level = Level(jaxpr)
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "convert_element_type":
                self._convert(eqn, level, ctx)
            elif name in ACCUMULATIONS or name in CONTRACTIONS or name in GENERIC_REDUCTIONS:
                self._accumulation(eqn, ctx)
            if name in EXPS:
                self._exp_then_sum(eqn, level, ctx)
            subs = list(subjaxprs(eqn.params))
            if subs:
                site = self._site(eqn)
                label = name + (f"[{eqn.params['name']}]" if "name" in eqn.params else "")
                inner = Ctx(
                    site.source or ctx.source,
                    self._backward(eqn, ctx),
                    site.explicit or (site.key is LIBRARY_BODY and ctx.explicit),
                    (*ctx.path, label),
                )
                for sub in subs:
                    self.walk(sub, inner)

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
            dtypes = (short(a), short(b))
            fix = f"pass preferred_element_type=jnp.{need.name}"
        else:
            x = eqn.invars[0]
            acc = policy_dtype(x.aval)
            if acc is None:
                return
            need = acc_dtype(acc)
            operands = [x]
            dtypes = (short(acc),)
            fix = f"convert first: x.astype(jnp.{need.name})"
            out = policy_dtype(eqn.outvars[0].aval) or acc
        if holds(acc, need) or _terms(eqn) <= 1:
            return
        self._report(
            eqn,
            ctx,
            NARROW_ACCUMULATION,
            name,
            dtypes,
            short(out),
            tuple(shape_of(v) for v in operands),
            f"accumulates in {short(acc)}, narrower than acc_dtype {short(need)}; {fix}",
            expected=need.name,
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
                        f"{short(acc_dtype(d))}, e.g. jax.nn.softmax(x.astype(jnp.float32))",
                        expected=acc_dtype(d).name,
                    )
                    return
                if cname in PASS_VALUE:
                    frontier.extend(c.outvars)


def _terms(eqn: Any) -> int:
    """How many terms each output element adds up (2, i.e. "some", when it cannot be told)."""
    name, params = eqn.primitive.name, eqn.params
    shape = tuple(eqn.invars[0].aval.shape)

    def size(axes: Any) -> int:
        n = 1
        for a in axes:
            d = shape[a]
            n *= d if isinstance(d, (int, np.integer)) else 2
        return n

    if name == "dot_general":
        return size(params["dimension_numbers"][0][0])
    if name in ("reduce_sum", "reduce_prod") and "axes" in params:
        return size(params["axes"])
    if name in ("cumsum", "cumprod", "cumlogsumexp") and "axis" in params:
        return size((params["axis"],))
    if name == "reduce_window_sum" and "window_dimensions" in params:
        return int(np.prod(params["window_dimensions"]))
    return 2


def _sums(params: dict[str, Any]) -> bool:
    return any(
        e.primitive.name in SUMMING for j in subjaxprs(params) for e in getattr(j, "jaxpr", j).eqns
    )
