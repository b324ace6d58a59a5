"""Evaluates a traced function with a float32 twin beside every narrow float value.

This is the mechanism of heddle.autodiff (see the package docstring for why it is needed): a rule set
on the interpreter core autocast runs on (``heddle.programs._interpret``: its run loop, frame and
inline descent). The function is traced once to a jaxpr; the jaxpr is then evaluated equation by
equation, binding the same primitives with the same parameters, so every primal value is bit for
bit the one the plain call computes. Beside each narrow float variable ``v`` (bfloat16, float16, float8, float4) the evaluator
can produce its *twin*: one float32 array with exactly ``v``'s values, shared by every use. Four
rewrites use the twins; everything else is bound unchanged:

1. ``convert_element_type(v -> float32/float64)`` of a narrow ``v`` (how heddle's ops enter their
   float32 path) is bound as it is, differentiated as the same conversion of ``v``'s twin. All uses
   of ``v`` then differentiate through one float32 variable, so JAX sums their cotangent
   contributions in float32 (its ``add_any`` works at the variable's dtype). For a differentiated
   leaf the twin is the float32 variable heddle.autodiff differentiates with respect to: its
   gradient is never rounded at all.
2. ``dot_general`` with a narrow operand and a float32 result (heddle's contractions, with
   ``preferred_element_type=float32``) becomes ``_scaled.contraction`` (at the top level of a
   reverse-mode evaluation: a ``jax.custom_vjp`` whose backward contractions read the float32
   cotangent) or ``contract`` (forward mode, and inside bodies: a ``jax.custom_jvp``): same
   forward, derivative through the twins. A contraction with a narrow result takes
   ``_scaled.narrow_result`` the same way (``_custom_backward``).
3. Operations that only copy values (reshape, transpose, broadcast, slicing, gather, concatenate,
   pad, select, neg, abs, max, min, ...) give their result the same operation applied to the twins.
4. Every other equation with a narrow float result gives it the twin ``convert(result, float32)``
   whose derivative is the equation's own computed in float32 (``_widen``; a contraction's tangent
   reads the narrow operands): the cotangent of every narrow value is float32, so none is flushed
   by a narrow format's range. An equation that reads narrow values (operands, or values inside its
   bodies) into a float32 or wider result (a convolution or ragged dot with
   ``preferred_element_type=float32``, a ``scan`` with a float32 carry) keeps that result's value
   and gives it the same float32 derivative. Where an equation has no float32 version
   (``custom_vjp``, bit casts, ``shard_map`` bodies), its results keep JAX's own derivative.

Twins are created lazily: a twin nobody asks for is never computed. Calls to ``jax.jit``-compiled
functions without sharding annotations are evaluated inline so the rewrites reach inside them;
``jax.checkpoint`` that narrow values cross or live in is re-applied around an evaluation with
twins for the inputs that have one, so its rematerialisation is kept; ``scan`` and ``cond`` that
read narrow values become a new scan or switch over their bodies evaluated with twins (a narrow
carry carried as its twin). Other higher-order primitives (``while``, custom_jvp functions) are
bound unchanged; rule 4 widens them for the derivative.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend import core as jex_core

from heddle.autodiff import _scaled
from heddle.autodiff._rules import contract, like, read_as, widen_exactly
from heddle.autodiff._widen import is_narrow, widen_bind, widen_value
from heddle.ops.lowering import runnable_precision
from heddle.programs._frame import Frame, Once, dtype_of
from heddle.programs._interpret import bind, context, inline, plain_jit, run, subjaxprs
from heddle.programs._table import Body, Fact, Rule, has, having, kind, rule

_F32 = np.dtype("float32")
_IN_BODY: ContextVar[bool] = ContextVar("heddle_autodiff_in_body", default=False)
"""Whether the evaluation in progress is a body's (``_body``: a scan's, a branch's, a checkpoint's)."""

# Primitives whose single result copies values of its operands of the result's dtype.
_COPYING = having(Fact.COPIES)


def _is_float(d: np.dtype) -> bool:
    return bool(jnp.issubdtype(d, jnp.floating))


def _weak(atom: Any) -> bool:
    return bool(getattr(atom.aval, "weak_type", False))


def _frame() -> Frame:
    """A frame of the interpreter core whose twins are float32, pinned to the narrow values."""
    return Frame(lambda d: _F32, lambda x, d: widen_exactly(x))


def _run(frame: Frame, jaxpr: Any) -> None:
    eqns = jaxpr.eqns

    def step(i: int) -> int:
        with context(eqns[i]):
            _eqn(frame, eqns[i])
        return i + 1

    run(frame, jaxpr, step)


def _eqn(frame: Frame, eqn: Any) -> None:
    """One equation: a rewrite that uses the twins, or bound unchanged with twins for its results."""
    name = eqn.primitive.name
    body_kind = kind(name)
    if rule(name) is Rule.CONVERT and _convert(frame, eqn):
        return
    if has(name, Fact.DOT) and _dot(frame, eqn):
        return
    if body_kind is not None and _BODIES[body_kind](frame, eqn):
        return
    for v, x in zip(eqn.outvars, bind(eqn, [frame.read(a) for a in eqn.invars]), strict=True):
        frame.write(v, x)
    if name in _COPYING and not eqn.primitive.multiple_results:
        _copying_twin(frame, eqn)
    else:
        _derived_twin(frame, eqn)


def _convert(frame: Frame, eqn: Any) -> bool:
    (src,), (out,) = eqn.invars, eqn.outvars
    params = eqn.params
    if params.get("sharding") is not None or _weak(out):
        return False
    s, d = dtype_of(src), np.dtype(params["new_dtype"])
    if s is None or not (_is_float(d) or jnp.issubdtype(d, jnp.complexfloating)):
        return False
    if is_narrow(s) and d.itemsize >= 4:  # to float32, float64 or complex: read the twin
        frame.write(out, read_as(d)(frame.twin(src), frame.read(src)))
        return True
    return False


def _dot(frame: Frame, eqn: Any) -> bool:
    lhs, rhs = eqn.invars
    out_dtype = dtype_of(eqn.outvars[0])
    dl, dr = dtype_of(lhs), dtype_of(rhs)
    if out_dtype is None or dl is None or dr is None:
        return False
    if not (_is_float(out_dtype) and _is_float(dl) and _is_float(dr)):
        return False
    if out_dtype.itemsize < 4 or not (is_narrow(dl) or is_narrow(dr)):
        return False

    def twin(a: Any, d: np.dtype) -> Any:
        return frame.twin(a) if is_narrow(d) else frame.read(a)

    p = _dot_params(eqn)
    scaled = _scaled.active() and _scaled.applies(dl, dr)
    if out_dtype == _F32 and _custom_backward(scaled) and _scaled.exact_in_float32(dl, dr):
        keep = (_differentiated(frame, lhs), _differentiated(frame, rhs))
        narrow = frame.read(lhs), frame.read(rhs)
        lw, rw = twin(lhs, dl), twin(rhs, dr)
        named = _scaled.shardings(*narrow)
        f = _scaled.contraction(
            p["dimension_numbers"], p["precision"], p.get("out_sharding"), named, scaled, keep
        )
        frame.write(eqn.outvars[0], f(*narrow, lw, rw))
        return True
    lw, rw = twin(lhs, dl), twin(rhs, dr)
    frame.write(eqn.outvars[0], contract(frame.read(lhs), frame.read(rhs), lw, rw, **p))
    return True


def _differentiated(frame: Frame, atom: Any) -> bool:
    """Whether a contraction operand's derivative is its twin's in ``_scaled``'s rules
    (``keep_twins``): a differentiated narrow value (one with a twin) at the top level. Inside a
    body JAX's partial evaluation inlines the ``jax.custom_jvp`` rules that would carry it, so there
    the operands keep their own derivatives."""
    return _is_narrow_atom(atom) and frame.has_twin(atom) and not _IN_BODY.get()


def _custom_backward(scaled: bool) -> bool:
    """Whether a contraction takes ``_scaled``'s ``jax.custom_vjp`` rule: scaled, or the default at
    the top level of a reverse-mode evaluation. Inside a body (``scan``, ``cond``, checkpoint) the
    default keeps ``contract``: JAX's partial evaluation of a body inlines the ``jax.custom_jvp``
    that the rule's forward value is, which would leave that value differentiable only through its
    operands, which the rule reads stopped: forward mode over the gradient would lose the term.
    With ``contract`` it reads the narrow operands' own tangents there (rounded to their dtype), as
    every narrow operation in a body does under forward mode over a gradient."""
    return _scaled.reverse() and (scaled or not _IN_BODY.get())


def _dot_params(eqn: Any) -> dict[str, Any]:
    """A contraction's parameters, its precision one the backend runs (``runnable_precision``:
    float16 ``dot_product_attention``'s ``F16_F16_F32`` preset is refused by XLA:CPU)."""
    return dict(eqn.params, precision=runnable_precision(eqn.params["precision"]))


def _inline_jit(frame: Frame, eqn: Any) -> bool:
    if not plain_jit(eqn):
        return False
    inline(frame, eqn, eqn.params["jaxpr"], _frame(), _run)
    return True


def _inline_call(frame: Frame, eqn: Any) -> bool:
    """``closed_call`` (a ClosedJaxpr) and ``call`` (an open Jaxpr): evaluated inline."""
    inline(frame, eqn, eqn.params["call_jaxpr"], _frame(), _run)
    return True


def _bound(frame: Frame, eqn: Any) -> bool:
    """Bound unchanged: rule 4 (``_derived_twin``) widens it for the derivative."""
    del frame, eqn
    return False


def _body(
    closed: Any, values: Sequence[Any], twins: dict[int, Any], narrow_out: Sequence[int]
) -> tuple[list[Any], list[Any]]:
    """A body (a ClosedJaxpr, or an open Jaxpr) evaluated with twins: ``twins`` maps input
    positions to their twins; returns its outputs and the twins of those at ``narrow_out``."""
    jaxpr = getattr(closed, "jaxpr", closed)
    inner = _frame()
    for v, c in zip(jaxpr.constvars, getattr(closed, "consts", ()), strict=True):
        inner.write(v, c)
    for v, x in zip(jaxpr.invars, values, strict=True):
        inner.write(v, x)
    for i, t in twins.items():
        inner.twins[jaxpr.invars[i]] = t
    token = _IN_BODY.set(True)
    try:
        _run(inner, jaxpr)
    finally:
        _IN_BODY.reset(token)
    outs = [inner.read(v) for v in jaxpr.outvars]
    return outs, [inner.twin(jaxpr.outvars[j]) for j in narrow_out]


def _narrow_positions(atoms: Sequence[Any]) -> list[int]:
    return [i for i, a in enumerate(atoms) if _is_narrow_atom(a)]


def _write_with_twins(frame: Frame, eqn: Any, outs: Sequence[Any], twins: Sequence[Any]) -> None:
    for v, x in zip(eqn.outvars, outs, strict=True):
        frame.write(v, x)
    for j, t in zip(_narrow_positions(eqn.outvars), twins, strict=True):
        if not isinstance(eqn.outvars[j], jex_core.DropVar):
            frame.twins[eqn.outvars[j]] = t


def _remat(frame: Frame, eqn: Any) -> bool:
    """``jax.checkpoint``: re-wrapped around an evaluation with twins, for the inputs that have one
    (computed or pending), returning the twins of its narrow results too, so cotangents cross the
    checkpoint both ways in float32 and stay float32 inside it. A checkpoint with no narrow value
    in or out is bound as it is."""
    p = eqn.params
    jaxpr = p["jaxpr"]
    if jaxpr.constvars:
        return False
    with_twin = [i for i, a in enumerate(eqn.invars) if frame.has_twin(a)]  # never a literal
    if not with_twin and not _holds_narrow(jaxpr):
        return False
    narrow_out = _narrow_positions(jaxpr.outvars)

    def body(values: list[Any], twins: list[Any]) -> tuple[list[Any], list[Any]]:
        return _body(jaxpr, values, dict(zip(with_twin, twins, strict=True)), narrow_out)

    wrapped = jax.checkpoint(body, prevent_cse=p["prevent_cse"], policy=p["policy"])
    outs, out_twins = wrapped(
        [frame.read(a) for a in eqn.invars], [frame.twin(eqn.invars[i]) for i in with_twin]
    )
    _write_with_twins(frame, eqn, outs, out_twins)
    return True


def _scan(frame: Frame, eqn: Any) -> bool:
    """``scan`` that reads narrow values: a scan of the body evaluated with twins. A narrow carry
    is carried as its twin alone (its value is the twin converted back, exactly), so the loop's
    cotangent of it is float32 and what the backward pass saves of it is one float32 array; narrow
    inputs and results have their twins sliced and stacked beside them. JAX transposes that body
    as a whole: every cotangent in it is a twin's, float32, and the forward values are the plain
    scan's."""
    if not _reads_narrow(eqn):
        return False
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    ins = list(eqn.invars)
    values = [frame.read(a) for a in ins]
    carries = range(nc, nc + nk)
    # a narrow carry is carried as its twin; a narrow constant or input has its own twin passed
    # in only where it has one (a differentiated value): else the body widens its values itself,
    # step by step (no float32 copy of a whole stack of data)
    twins = {
        i: frame.twin(ins[i])
        for i in _narrow_positions(ins)
        if i in carries or frame.has_twin(ins[i])
    }
    narrow_out = _narrow_positions(eqn.outvars)
    xs = range(nc + nk, len(ins))
    consts, const_twins = values[:nc], {i: t for i, t in twins.items() if i < nc}
    init = [twins.get(i, values[i]) for i in range(nc, nc + nk)]  # a narrow carry: its twin
    dtypes = [dtype_of(a) for a in ins[nc : nc + nk]]

    def body(carry: list[Any], x: Any) -> tuple[Any, Any]:
        xv, xt = x
        cv = [_narrowed(c, d) for c, d in zip(carry, dtypes, strict=True)]
        tw = dict(const_twins)
        tw.update((nc + k, c) for k, c in enumerate(carry) if _is_narrow_atom(ins[nc + k]))
        tw.update(zip([i for i in xs if i in twins], xt, strict=True))
        outs, out_twins = _body(p["jaxpr"], [*consts, *cv, *xv], tw, narrow_out)
        at = dict(zip(narrow_out, out_twins, strict=True))
        new = [at.get(k, outs[k]) for k in range(nk)]
        return new, (outs[nk:], [at[j] for j in narrow_out if j >= nk])

    stacked = [values[i] for i in xs], [twins[i] for i in xs if i in twins]
    carry, (ys, yt) = lax.scan(
        body, init, stacked, length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
    )
    cv = [_narrowed(c, d) for c, d in zip(carry, dtypes, strict=True)]
    carry_twins = [c for c, a in zip(carry, ins[nc : nc + nk], strict=True) if _is_narrow_atom(a)]
    _write_with_twins(frame, eqn, [*cv, *ys], [*carry_twins, *yt])
    return True


def _narrowed(x: Any, d: np.dtype | None) -> Any:
    """A narrow carry's value from its twin (exact: the twin holds the narrow value)."""
    return lax.convert_element_type(x, d) if d is not None and is_narrow(d) else x


def _cond(frame: Frame, eqn: Any) -> bool:
    """``cond``/``switch`` that reads narrow values: the branches evaluated with twins, the narrow
    operands' twins passed in and the narrow results' returned."""
    if not _reads_narrow(eqn):
        return False
    index, *ops = eqn.invars
    narrow_in = [i for i in _narrow_positions(ops) if frame.has_twin(ops[i])]  # as in ``_scan``
    narrow_out = _narrow_positions(eqn.outvars)

    def branch(closed: Any) -> Callable[..., tuple[list[Any], list[Any]]]:
        def run(values: list[Any], twins: list[Any]) -> tuple[list[Any], list[Any]]:
            return _body(closed, values, dict(zip(narrow_in, twins, strict=True)), narrow_out)

        return run

    outs, out_twins = lax.switch(
        frame.read(index),
        [branch(b) for b in eqn.params["branches"]],
        [frame.read(a) for a in ops],
        [frame.twin(ops[i]) for i in narrow_in],
    )
    _write_with_twins(frame, eqn, outs, out_twins)
    return True


# The kind of an equation's bodies -> how it is evaluated: True where the handler evaluated it (its
# body inline with the twins, or a checkpoint re-applied around that), False to bind it unchanged.
_BODIES: dict[Body, Callable[[Frame, Any], bool]] = {
    Body.JIT: _inline_jit,
    Body.CALL: _inline_call,
    Body.REMAT: _remat,
    Body.SCAN: _scan,
    Body.WHILE: _bound,
    Body.COND: _cond,
    Body.CUSTOM_JVP: _bound,
    Body.CUSTOM_VJP: _bound,
    Body.SHARD_MAP: _bound,
    Body.LINEAR_SOLVE: _bound,
    Body.REDUCER: _bound,
    Body.COMBINER: _bound,
}


def _copying_twin(frame: Frame, eqn: Any) -> None:
    (out,) = eqn.outvars
    d = dtype_of(out)
    if d is None or not is_narrow(d) or isinstance(out, jex_core.DropVar):
        return
    if not any(frame.has_twin(a) for a in eqn.invars):
        return  # nothing upstream carries a twin: the default conversion is as good
    refs = [frame.twin_ref(a) if dtype_of(a) == d else frame.value_ref(a) for a in eqn.invars]
    frame.defer_twin(out, lambda: bind(eqn, [ref() for ref in refs])[0], refs)


def _derived_twin(frame: Frame, eqn: Any) -> None:
    """Twins for the narrow float outputs of any other equation with a float input, and float32
    derivatives for its wide float outputs where it reads a narrow value.

    Each twin is ``convert(output, float32)`` (its value, exactly) whose derivative is the float32
    version of the equation's (``_widen``), so the cotangent of a narrow value is float32 and the
    backward pass of the equation runs at full width. A wide float output (float32 or wider) of an
    equation with a narrow operand or a body holding narrow values (a convolution with
    ``preferred_element_type=float32``, a loop with a float32 carry) keeps its value and takes the
    same float32 derivative, so the cotangents of the narrow values inside are float32 too. Where
    the equation has no float32 version, its outputs keep JAX's own derivative (narrow).
    """
    live = [(k, v) for k, v in enumerate(eqn.outvars) if not isinstance(v, jex_core.DropVar)]
    narrow_outs = [(k, v) for k, v in live if _is_narrow_atom(v)]
    wide_outs = [(k, v) for k, v in live if _is_wide_float_atom(v)] if _reads_narrow(eqn) else []
    outs = narrow_outs + wide_outs
    if not outs or not any(_is_float_atom(a) for a in eqn.invars):
        return
    keep = tuple(_differentiated(frame, a) for a in eqn.invars)
    wide = [frame.twin_ref(a) if _is_narrow_atom(a) else frame.value_ref(a) for a in eqn.invars]
    ins = [frame.value_ref(a) for a in eqn.invars]
    values = [frame.value_ref(v) for _, v in outs]

    # read now: a lazy twin may be made after the evaluation
    scaled, custom = _scaled.active(), _custom_backward(False)

    def made() -> dict[Any, Any]:
        return _wide_twins(
            eqn,
            outs,
            [w() for w in wide],
            [x() for x in ins],
            [n() for n in values],
            scaled,
            custom,
            keep,
        )

    twins = Once(made, wide)  # one evaluation for all the outputs' twins
    for _, v in narrow_outs:
        frame.defer_twin(v, lambda v=v: twins()[v], (twins,))
    if wide_outs:  # a value is needed now: the evaluation is not deferred
        result = twins()
        for _, v in wide_outs:
            frame.write(v, result[v])


def _reads_narrow(eqn: Any) -> bool:
    """Whether an equation reads a narrow float value: an operand, or one inside its bodies."""
    return any(_is_narrow_atom(a) for a in eqn.invars) or any(
        _holds_narrow(sub) for sub in subjaxprs(eqn.params)
    )


def _holds_narrow(closed: Any) -> bool:
    jaxpr = getattr(closed, "jaxpr", closed)
    return any(_is_narrow_atom(v) for e in jaxpr.eqns for v in (*e.invars, *e.outvars)) or any(
        _holds_narrow(sub) for e in jaxpr.eqns for sub in subjaxprs(e.params)
    )


def _is_float_atom(a: Any) -> bool:
    d = dtype_of(a)
    return d is not None and _is_float(d)


def _is_narrow_atom(a: Any) -> bool:
    d = dtype_of(a)
    return d is not None and is_narrow(d)


def _is_wide_float_atom(a: Any) -> bool:
    d = dtype_of(a)
    return d is not None and _is_float(d) and not is_narrow(d)


def _wide_twins(
    eqn: Any,
    outs: list[tuple[int, Any]],
    wide: list[Any],
    ins: list[Any],
    narrow: list[Any],
    scaled: bool = False,
    custom: bool = False,
    keep: tuple[bool, ...] = (),
) -> dict[Any, Any]:
    """The twins of ``eqn``'s narrow results ``outs`` (values ``narrow``), computed from its
    operands' twins (``wide``; ``ins`` the operands themselves); ``scaled``: a contraction's
    backward contractions read its cotangent narrowed (``_scaled``); ``custom``: a contraction
    takes ``_scaled``'s default rule (``_custom_backward``), keeping the twins of the operands
    ``keep`` marks (``_differentiated``)."""
    floats = [i for i, a in enumerate(eqn.invars) if _is_float_atom(a)]
    picks = [k for k, _ in outs]
    bilinear = rule(eqn.primitive.name) is Rule.CONTRACTION and len(floats) == 2
    narrow_only = all(_is_narrow_atom(v) for _, v in outs)
    dot = bilinear and has(eqn.primitive.name, Fact.DOT) and narrow_only
    dtypes = [dtype_of(a) for a in eqn.invars]
    narrowed = dot and scaled and _scaled.applies(*dtypes)
    if dot and (narrowed or custom) and _scaled.exact_in_float32(*dtypes):
        p = _dot_params(eqn)
        named = _scaled.shardings(*ins)
        f = _scaled.narrow_result(
            p["dimension_numbers"], p["precision"], widen_exactly, named, narrowed, keep
        )
        ((_, v),) = outs
        return {v: f(narrow[0], *wide, *ins)}

    def widened(base: list[Any], *xs: Any) -> list[Any]:
        """The equation at float32 on ``xs``, its other operands (indices, predicates) from
        ``base``: passed in, never closed over, so a rule traced later (a higher derivative)
        reads them from its own trace."""
        args = list(base)
        for i, x in zip(floats, xs, strict=True):
            args[i] = x
        res = widen_bind(eqn, args)
        return [widen_value(res[k]) for k in picks]

    if bilinear:
        tangent = _bilinear_tangent(eqn, floats)
    else:

        def tangent(ins: Any, xs: Any, ts: Any) -> list[Any]:
            ts = [_instantiate(t, x) for t, x in zip(ts, xs, strict=True)]
            at = functools.partial(widened, list(ins))
            with _scaled.mode("scaled" if scaled else "float32"):  # contractions in its bodies
                return list(jax.jvp(at, tuple(xs), tuple(ts))[1])

        try:
            jax.eval_shape(functools.partial(widened, wide), *(wide[i] for i in floats))
        except Exception:  # no float32 version of this equation: JAX's own derivative is kept
            return {v: widen_value(x) for (_, v), x in zip(outs, narrow, strict=True)}
    result = _straight_through(tangent)(narrow, [wide[i] for i in floats], ins)
    return {v: t for (_, v), t in zip(outs, result, strict=True)}


def _bilinear_tangent(eqn: Any, floats: list[int]) -> Callable[..., list[Any]]:
    """A contraction's float32 tangent (``dot_general``, ``conv_general_dilated``,
    ``ragged_dot_general``: linear in each of its two float operands ``floats``): one float32
    contraction per differentiated operand, reading the other operand's value as the program holds
    it (narrow, widened exactly), so the backward contractions read the narrow residuals, not
    float32 copies."""

    def term(i: int, t: Any, *ins: Any) -> Any:
        args = list(ins)
        for j in floats:
            args[j] = t if j == i else like(ins[j], t)
        with _scaled.mode("float32"):
            return widen_bind(eqn, args)[0]

    def tangent(ins: Any, xs: Any, ts: Any) -> list[Any]:
        del xs
        terms = []  # an operand that is not differentiated has no term (no contraction of zeros)
        for i, t in zip(floats, ts, strict=True):
            if not isinstance(t, SymbolicZero):
                # under a checkpoint, the backward pass saves the narrow operand and widens it
                # where it reads it (a scan would otherwise stack a float32 copy of each step's)
                terms.append(jax.checkpoint(functools.partial(term, i))(t, *ins))
        if not terms:
            return [None]
        return [terms[0] if len(terms) == 1 else terms[0] + terms[1]]

    return tangent


def _straight_through(tangent: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``f(narrow_outputs, wide_inputs, inputs)``: the outputs as float32 (exactly), whose tangent is
    ``tangent(inputs, wide_inputs, their_tangents)``."""

    @jax.custom_jvp
    def f(narrow: list[Any], wide: list[Any], ins: list[Any]) -> list[Any]:
        del wide, ins
        return [widen_exactly(x) if is_narrow(x.dtype) else x for x in narrow]

    def rule(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
        narrow, wide, ins = primals
        out = f(narrow, wide, ins)
        ts = tangent(ins, wide, tangents[1])
        return out, [jnp.zeros_like(o) if t is None else t for o, t in zip(out, ts, strict=True)]

    f.defjvp(rule, symbolic_zeros=True)
    return f


def _instantiate(t: Any, x: Any) -> Any:
    """A tangent as an array: zeros of ``x``'s type for a symbolic zero."""
    return jnp.zeros_like(x) if isinstance(t, SymbolicZero) else t


_ARRAYS = (jax.Array, jax.core.Tracer)  # a NumPy value is returned as it is, as jax.grad does


def evaluate(
    fun: Callable[..., Any], args: Sequence[Any], arg_twins: Sequence[Any | None]
) -> tuple[Any, Callable[[int], Any], Any]:
    """Calls ``fun(*args)`` through the twin-carrying evaluator.

    Args:
      fun: a function of positional array arguments returning a pytree of arrays; leaves that are
        not arrays (strings, Python numbers: constants of the trace) are returned as they are, as
        ``jax.grad`` returns them in its ``aux``.
      args: the arguments.
      arg_twins: for each argument, a float32 array with its exact values (its twin) or None.

    Returns:
      ``(flat_outputs, twin_of_output, out_tree)``: ``twin_of_output(i)`` is the float32 twin of the
      i-th flat output (meaningful for narrow float outputs).
    """
    out_tree = []
    kept: dict[int, Any] = {}  # position -> a leaf that is not an array, returned as it is
    arrays: list[int] = []  # the positions of the traced outputs

    def flat(*xs):
        leaves, tree = jax.tree.flatten(fun(*xs))
        out_tree.append(tree)
        kept.clear()
        kept.update((i, x) for i, x in enumerate(leaves) if not isinstance(x, _ARRAYS))
        arrays[:] = [i for i in range(len(leaves)) if i not in kept]
        return [leaves[i] for i in arrays]

    try:
        closed = jax.make_jaxpr(flat)(*args)
    except jax.errors.ConcretizationTypeError:
        # Python control flow on values: differentiate the call itself (correct dtypes; a narrow
        # leaf's cotangent is then rounded to its dtype once before widening).
        leaves, tree = jax.tree.flatten(fun(*args))
        return leaves, lambda i: lax.convert_element_type(leaves[i], _F32), tree
    frame = _frame()
    jaxpr = closed.jaxpr
    for v, c in zip(jaxpr.constvars, closed.consts, strict=True):
        frame.write(v, c)
    for v, x, t in zip(jaxpr.invars, args, arg_twins, strict=True):
        frame.write(v, x)
        if t is not None:
            frame.twins[v] = t
    _run(frame, jaxpr)
    outs: list[Any] = [None] * (len(arrays) + len(kept))
    for i, v in zip(arrays, jaxpr.outvars, strict=True):
        outs[i] = frame.read(v)
    for i, x in kept.items():
        outs[i] = x
    at = {i: v for i, v in zip(arrays, jaxpr.outvars, strict=True)}

    def twin_of(i: int) -> Any:  # a constant output (a NumPy array) is its own twin, widened
        return frame.twin(at[i]) if i in at else lax.convert_element_type(outs[i], _F32)

    return outs, twin_of, out_tree[-1]
