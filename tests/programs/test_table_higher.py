"""The higher-order rows of the table: each has a handler in autocast and is descended by the audit,
and every primitive that holds a jaxpr has a kind of body in the table (a higher-order one, or a
reduction's or a scatter's scalar combiner), which autocast, the audit and heddle.autodiff each map
to a handler. Also: a scan's narrow per-step inputs enter it as float32 twins under autocast."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src import api_util
from jax._src import core as jax_core
from jax._src import linear_util as lu
from jax.extend import core as jcore
from jax.sharding import PartitionSpec as P

from heddle import autocast
from heddle.autodiff import _twins, _widen
from heddle.programs import _audit, _audit_cotangent, _higher, _table
from heddle.programs._table import Body, Rule

BF, F32 = jnp.bfloat16, jnp.float32
NA = "narrow_accumulation"
X = jnp.linspace(0.5, 2.0, 64, dtype=F32).astype(BF).reshape(4, 16)

HIGHER = _table.names(Rule.HIGHER_ORDER)
# Primitives whose jaxpr parameters are scalar combiners (``a + b``, ``max(a, b)``), not bodies run
# on arrays: their rule is the reduction they compute, and their bodies are not evaluated.
COMBINER_BODIES = {
    "reduce": Rule.MONOID,  # jaxpr: the combiner of lax.reduce
    "reduce_window": Rule.PASS,  # jaxpr: the combiner of a generic window reduction
    "select_and_scatter": Rule.PASS,  # select_jaxpr, scatter_jaxpr
    "scatter": Rule.EXACT,  # update_jaxpr: the combiner of each scatter
    "scatter-add": Rule.SCATTER,
    "scatter-sub": Rule.SCATTER,
    "scatter-mul": Rule.SCATTER,
    "scatter-min": Rule.EXACT,
    "scatter-max": Rule.EXACT,
}


def _cumsum(x: Any) -> Any:
    return jnp.cumsum(x, axis=1)  # a bfloat16 cumsum: a narrow accumulation of 16 terms


def _call(prim: Any, closed: bool) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        def body(x: Any) -> list[Any]:
            return [_cumsum(x)]

        if closed:
            cj = jax.make_jaxpr(body)(x)
            fun = lu.wrap_init(jax_core.jaxpr_as_fun(cj), debug_info=cj.jaxpr.debug_info)
            return prim.bind(x, call_jaxpr=cj, subfuns=(fun,))[0]
        dbg = api_util.debug_info("call", body, (x,), {})
        return prim.bind(x, subfuns=(lu.wrap_init(body, debug_info=dbg),))[0]

    return f


def _scan(x: Any) -> Any:
    return lax.scan(lambda c, xt: (c, _cumsum(xt)), F32(0), x[None])[1][0]


def _while(x: Any) -> Any:
    return lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, _cumsum(c[1])), (0, x))[1]


def _cond(x: Any) -> Any:
    return lax.cond(x[0, 0] > 0, _cumsum, lambda y: y, x)


@jax.custom_jvp
def _cj(x: Any) -> Any:
    return _cumsum(x)


_cj.defjvp(lambda p, t: (_cj(*p), _cumsum(*t)))


@jax.custom_vjp
def _cv(x: Any) -> Any:
    return _cumsum(x)


_cv.defvjp(lambda x: (_cumsum(x), None), lambda _, g: (jnp.flip(_cumsum(jnp.flip(g, 1)), 1),))


def _shard_map(x: Any) -> Any:
    mesh = jax.make_mesh((1,), ("d",))
    return jax.shard_map(_cumsum, mesh=mesh, in_specs=P(), out_specs=P())(x)


def _solve(x: Any) -> Any:
    def diff(v: Any) -> Any:  # the inverse of the cumsum along the rows
        return v - jnp.pad(v, ((0, 0), (1, 0)))[:, :-1]

    def diff_t(v: Any) -> Any:  # the inverse of its transpose (a reversed cumsum)
        return v - jnp.pad(v, ((0, 0), (0, 1)))[:, 1:]

    return lax.custom_linear_solve(
        _cumsum, x, solve=lambda _, v: diff(v), transpose_solve=lambda _, v: diff_t(v)
    )


# Higher-order primitive -> a program whose only accumulation is a bfloat16 cumsum in its body.
SAMPLES: dict[str, Callable[[Any], Any]] = {
    "jit": jax.jit(_cumsum),
    "closed_call": _call(jax_core.closed_call_p, closed=True),
    "call": _call(jax_core.call_p, closed=False),
    "scan": _scan,
    "while": _while,
    "cond": _cond,
    "custom_jvp_call": _cj,
    "custom_vjp_call": _cv,
    "remat2": jax.checkpoint(_cumsum),
    "shard_map": _shard_map,
    "custom_linear_solve": _solve,
}


def _jaxprs(value: Any) -> Iterator[Any]:
    if isinstance(value, (jcore.Jaxpr, jcore.ClosedJaxpr)):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _jaxprs(v)


def _holders(jaxpr: Any) -> Iterator[tuple[str, Any]]:
    """(primitive name, equation) of every equation, at any depth, with a jaxpr among its params."""
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        subs = [j for v in eqn.params.values() for j in _jaxprs(v)]
        if subs:
            yield eqn.primitive.name, eqn
        for sub in subs:
            yield from _holders(sub)


def _prims(jaxpr: Any) -> set[str]:
    return {name for name, _ in _holders(jaxpr)}


def test_every_higher_order_primitive_has_a_sample():
    current = HIGHER - set(_table.OTHER_VERSIONS)  # pjit: jit's name before jax 0.7
    assert sorted(current - set(SAMPLES)) == []
    for name, fn in SAMPLES.items():
        assert name in _prims(jax.make_jaxpr(fn)(X)), name


def test_every_higher_order_primitive_has_an_autocast_handler():
    kinds = {name: _table.kind(name) for name in HIGHER}
    assert sorted(n for n, k in kinds.items() if k not in _higher._HANDLERS) == []
    assert set(_higher._HANDLERS) == set(kinds.values())  # no handler for a kind no row has


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_audit_descends_into_the_body(name):
    fn = SAMPLES[name]
    findings = _audit.audit(fn, X).of_kind(NA)  # a solve's: its matvec and the transpose of it
    assert len(findings) == (2 if name == "custom_linear_solve" else 1)
    for finding in findings:
        assert finding.primitive == "cumsum"
        labels = [label.split("[")[0] for label in finding.path.split(" > ")]
        assert name in labels, finding.path


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_autocast_evaluates_the_body_by_the_rules(name):
    fn = SAMPLES[name]
    assert _audit.audit(autocast(fn), X).counts[NA] == 0
    # computed in float32 and rounded once (the solve's result is the inverse's, its body's sums)
    np.testing.assert_array_equal(autocast(fn)(X), fn(X.astype(F32)).astype(BF))


def _library_programs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    a = jnp.eye(4, dtype=F32) * 3 + 0.5
    idx = jnp.array([[0], [2], [0]], jnp.int32)
    dn = lax.ScatterDimensionNumbers((1,), (0,), (0,))
    upd = jnp.ones((3, 16), BF)
    return [
        ("solve", lambda b: jnp.linalg.solve(a, b), (X[:, :4].astype(F32),)),
        ("polyval", lambda x: jnp.polyval(jnp.arange(4.0, dtype=BF), x), (X,)),
        ("reduce", lambda x: lax.reduce(x, np.array(0, BF), lambda a, b: a + b, (1,)), (X,)),
        ("window", lambda x: lax.reduce_window(x, np.array(1, BF), lax.mul, (2, 2), (1, 1), "VALID"), (X,)),
        ("max pool", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID"), (X,)),
        ("scatters", lambda x: [f(x, idx, upd, dn) for f in _SCATTER_FNS], (X,)),
        ("fori", lambda x: lax.fori_loop(0, 3, lambda i, c: c * 2, x), (X,)),
        ("map", lambda x: lax.map(_cumsum, x[None]), (X,)),
        ("checkpoint scan", jax.checkpoint(_scan), (X,)),
    ]  # fmt: skip


_SCATTER_FNS = (lax.scatter, lax.scatter_add, lax.scatter_sub, lax.scatter_mul, lax.scatter_max)
_SCATTER_FNS += (lax.scatter_min,)


def _programs() -> Iterator[tuple[str, Any]]:
    cases = [(n, fn, (X,)) for n, fn in SAMPLES.items()] + _library_programs()
    for label, fn, args in cases:
        yield label, jax.make_jaxpr(fn)(*args)

        def loss(*a: Any, fn: Any = fn) -> Any:
            return sum(jnp.sum(jnp.asarray(o, F32)) for o in jax.tree.leaves(fn(*a)))

        def jvp(*a: Any, loss: Any = loss) -> Any:
            return jax.jvp(loss, a, tuple(jnp.ones_like(x) for x in a))

        yield f"jvp of {label}", jax.make_jaxpr(jvp)(*args)
        # no reverse mode for a while loop, a generic window reduction, nor for scatter_mul at
        # repeated indices
        if label not in ("while", "window", "scatters"):
            yield f"grad of {label}", jax.make_jaxpr(jax.grad(loss))(*args)
            yield f"vjp of {label}", jax.make_jaxpr(lambda *a, loss=loss: jax.vjp(loss, *a))(*args)


def test_every_primitive_that_holds_a_jaxpr_is_higher_order_with_a_handler():
    seen: dict[str, str] = {}
    for label, jaxpr in _programs():
        for name in _prims(jaxpr):
            seen.setdefault(name, label)
    assert set(SAMPLES) <= set(seen)
    no_kind = {name: label for name, label in seen.items() if _table.kind(name) is None}
    assert not no_kind, f"primitives with jaxpr parameters and no kind of body: {no_kind}"
    wrong = {
        name: f"{_table.rule(name)} (in {label})"
        for name, label in seen.items()
        if name not in COMBINER_BODIES
        and (
            _table.rule(name) is not Rule.HIGHER_ORDER or _table.kind(name) not in _higher._HANDLERS
        )
    }
    assert not wrong, f"primitives with jaxpr bodies that autocast does not descend into: {wrong}"
    for name, rule in COMBINER_BODIES.items():
        assert _table.rule(name) is rule, name
        assert _table.kind(name) in (Body.REDUCER, Body.COMBINER), name
    for handlers in (_audit_cotangent._OPERANDS, _twins._BODIES, _widen._BODIES):
        assert {_table.kind(name) for name in seen} <= set(handlers)


def _gather_then_scan(x: Any, idx: Any) -> Any:
    def step(c: Any, yt: Any) -> tuple[Any, None]:
        return c + jnp.sum(yt.astype(F32) * 0.1), None

    return lax.scan(step, F32(0), jnp.take_along_axis(x, idx, axis=1).T)[0]


def _reversed_rnn(x: Any, idx: Any) -> Any:  # flax's flip_sequences before a backward RNN
    def step(c: Any, xt: Any) -> tuple[Any, Any]:
        h = jnp.tanh(c + xt.astype(F32))
        return h, h.astype(BF)

    flipped = jnp.take_along_axis(x, idx, axis=1).T
    return lax.scan(step, jnp.zeros(x.shape[0], F32), flipped)


def test_a_narrow_xs_of_a_scan_gets_a_float32_cotangent():
    x, idx = jnp.ones((2, 8), BF), jnp.zeros((2, 4096), jnp.int32)  # 4096 reads of x[:, 0]
    exact = float(np.float32(4096 * np.float64(np.float32(0.1))))  # 409.6, one float32 rounding
    assert float(jax.grad(_gather_then_scan)(x, idx)[0, 0]) == 32.0  # JAX: a bfloat16 scatter-add
    got = jax.grad(autocast(_gather_then_scan))(x, idx)
    assert got.dtype == BF
    assert float(got[0, 0]) == float(jnp.asarray(exact, F32).astype(BF)) == 410.0
    assert float(got[0, 1]) == 0.0


def test_a_narrow_xs_of_a_scan_keeps_its_values():
    x = jnp.linspace(-3, 3, 2 * 8, dtype=F32).astype(BF).reshape(2, 8)
    idx = jnp.broadcast_to(jnp.arange(8)[::-1], (2, 8)).astype(jnp.int32)
    for a, b in zip(
        jax.tree.leaves(autocast(_reversed_rnn)(x, idx)),
        jax.tree.leaves(_reversed_rnn(x, idx)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        assert a.dtype == b.dtype
    jaxpr = jax.make_jaxpr(autocast(_reversed_rnn))(x, idx)
    (scan,) = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    first_x = scan.params["num_consts"] + scan.params["num_carry"]
    assert [str(v.aval.dtype) for v in scan.invars[first_x:]] == ["float32"]
    grads = jax.grad(lambda x: jnp.sum(autocast(_reversed_rnn)(x, idx)[0]))(x)
    assert grads.dtype == BF and bool(jnp.all(jnp.isfinite(grads.astype(F32))))
