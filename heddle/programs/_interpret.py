"""The interpreter core that autocast and heddle.autodiff share: one run loop over a jaxpr's
equations, one frame of values and float32 twins (``_frame.Frame``), one descent into inlined calls.

Each consumer brings its rule set, a ``step`` that evaluates the equations starting at one index
(autocast's evaluates a known library call's equations at once, so a step may cover several); the
loop frees every variable after its last use, as ``jax.core.eval_jaxpr`` does, so an eager call
holds no intermediate (or twin, or shadow) longer than plain JAX would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jax._src import source_info_util
from jax.extend import core as jcore

from heddle.programs._frame import Frame
from heddle.programs._table import Body, kind


@contextlib.contextmanager
def context(eqn: Any) -> Iterator[None]:
    """What an equation is bound under: its source information and its context (``eqn.ctx``)."""
    with (
        source_info_util.user_context(
            eqn.source_info.traceback,
            name_stack=source_info_util.current_name_stack() + eqn.source_info.name_stack,
        ),
        eqn.ctx.manager,
    ):
        yield


def dead_after(jaxpr: Any) -> list[list[Any]]:
    """For each equation, the variables no later equation reads and the jaxpr does not return (as
    ``jax.core.eval_jaxpr``'s ``last_used``): freed once the equation has run."""
    last: dict[Any, int] = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for v in eqn.outvars:
            last[v] = k  # a result nobody reads is dead at once
        for a in eqn.invars:
            if not isinstance(a, jcore.Literal):
                last[a] = k
    for a in jaxpr.outvars:
        if not isinstance(a, jcore.Literal):  # a returned literal is no variable
            last.pop(a, None)
    dead: list[list[Any]] = [[] for _ in jaxpr.eqns]
    for v, k in last.items():
        dead[k].append(v)
    return dead


def run(frame: Frame, jaxpr: Any, step: Callable[[int], int]) -> None:
    """Evaluates ``jaxpr``'s equations into ``frame``: ``step(i)`` evaluates those from ``i`` on
    and returns the index after the last one it evaluated; each variable is freed after its last
    use."""
    dead = dead_after(jaxpr)
    i, n = 0, len(jaxpr.eqns)
    while i < n:
        end = step(i)
        for k in range(i, end):
            for v in dead[k]:
                frame.free(v)
        i = end


def bind(eqn: Any, args: Sequence[Any], params: dict[str, Any] | None = None) -> list[Any]:
    """``eqn``'s primitive bound on ``args`` (with ``params`` for its own): its results, a list."""
    params = eqn.primitive.get_bind_params(eqn.params if params is None else params)
    ans = eqn.primitive.bind(*args, **params)
    return list(ans) if eqn.primitive.multiple_results else [ans]


def _unspecified(shardings: Sequence[Any]) -> bool:
    return all(type(s).__name__ == "UnspecifiedValue" for s in shardings)


def plain_jit(eqn: Any) -> bool:
    """Whether ``eqn`` is a ``jit`` without sharding or layout annotations: its body can be
    evaluated inline, as part of the outer program, with the same results."""
    p = eqn.params
    if kind(eqn.primitive.name) is not Body.JIT:
        return False
    plain = _unspecified(p["in_shardings"]) and _unspecified(p["out_shardings"])
    return plain and all(lay is None for lay in (*p["in_layouts"], *p["out_layouts"]))


def inline(
    frame: Frame, eqn: Any, closed: Any, inner: Frame, run_body: Callable[[Frame, Any], None]
) -> None:
    """``closed`` (the body of ``eqn``: a ClosedJaxpr, or an open Jaxpr without constants)
    evaluated by ``run_body`` into the fresh frame ``inner``, as part of ``frame``'s program:
    values, twins and shadows cross the call both ways."""
    jaxpr = getattr(closed, "jaxpr", closed)
    for v, c in zip(jaxpr.constvars, getattr(closed, "consts", ()), strict=True):
        inner.write(v, c)
    for v, a in zip(jaxpr.invars, eqn.invars, strict=True):
        inner.inherit(v, frame, a)
    run_body(inner, jaxpr)
    for v, a in zip(eqn.outvars, jaxpr.outvars, strict=True):
        if not isinstance(v, jcore.DropVar):
            frame.inherit(v, inner, a)


def subjaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs among an equation's parameters (bodies, branches, called functions)."""
    for v in params.values():
        if isinstance(v, jcore.Jaxpr | jcore.ClosedJaxpr):
            yield v
        elif isinstance(v, tuple | list):
            for w in v:
                if isinstance(w, jcore.Jaxpr | jcore.ClosedJaxpr):
                    yield w
