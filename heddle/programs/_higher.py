"""``autocast`` inside higher-order primitives: every body is evaluated under the same rules.

Each kind of body the table gives a higher-order primitive (``_table.Body``) has its handler:

- a ``jit`` without sharding or layout annotations, ``closed_call``, ``call``: evaluated
  inline (the outer jaxpr holds the rewritten equations; shadows and twins cross the boundary);
- ``jit`` with shardings, ``scan``, ``while``, ``cond``: the body is re-traced through the evaluator
  into a jaxpr with the same avals and the primitive re-bound with it (carries, branch outputs and
  shardings keep their types);
- ``custom_jvp_call``/``custom_vjp_call``: the function and its JVP rule (or forward pass) are
  evaluated by the rules; a custom VJP's backward rule is the library's own code;
- ``remat2`` (``jax.checkpoint``) and ``shard_map``: re-applied around the evaluated body, with
  their own parameters (policy, mesh, specs).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import core as _core
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe
from jax._src.lax.lax import _convert_element_type

from heddle.programs._frame import Frame, dtype_of, is_narrow
from heddle.programs._interpret import inline, plain_jit
from heddle.programs._table import Body, kind


def _conform(x: Any, aval: Any) -> Any:
    """``x`` with exactly ``aval``'s weak type (the dtype and shape already agree)."""
    weak = getattr(aval, "weak_type", False)
    if getattr(jax.typeof(x), "weak_type", False) != weak and hasattr(aval, "dtype"):
        return _convert_element_type(x, aval.dtype, weak_type=weak)
    return x


def evaluate_jaxpr(ev: Any, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Evaluates an open ``jaxpr`` with ``consts`` on ``args``: outputs of its own avals."""
    frame = ev.frame()
    for v, c in zip(jaxpr.constvars, consts, strict=True):
        frame.write(v, c)
    for v, x in zip(jaxpr.invars, args, strict=True):
        frame.write(v, x)
    ev.new_segment()
    ev.run(frame, jaxpr)
    ev.new_segment()
    return [_conform(frame.read(v), v.aval) for v in jaxpr.outvars]


def body(ev: Any, closed: Any) -> Callable[..., list[Any]]:
    """A ClosedJaxpr (or Jaxpr) as a function evaluated by the rules."""
    jaxpr = getattr(closed, "jaxpr", closed)
    consts = getattr(closed, "consts", ())
    return lambda *args: evaluate_jaxpr(ev, jaxpr, consts, args)


def retrace(ev: Any, closed: Any) -> Any:
    """A ClosedJaxpr evaluated by the rules, traced again into a ClosedJaxpr of the same avals."""
    fn = lu.wrap_init(body(ev, closed), debug_info=closed.jaxpr.debug_info)
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(fn, closed.in_avals)
    return _core.ClosedJaxpr(jaxpr, consts)


def _write_outs(frame: Frame, eqn: Any, outs: Sequence[Any]) -> None:
    for v, x in zip(eqn.outvars, outs, strict=True):
        frame.write(v, x)


def _write_wide(frame: Frame, eqn: Any, outs: Sequence[Any], wide: list[int], seg: int) -> None:
    """``eqn``'s results ``outs``: those at ``wide`` computed at float32 inside one library call,
    rounded once (their float32 values readable by the call's equations in ``seg``), the others
    as they are."""
    for j, (v, x) in enumerate(zip(eqn.outvars, outs, strict=True)):
        if j in wide:
            frame.write_rounded(v, x, seg)
        else:
            frame.write(v, x)


def _wide_operand(ev: Any, frame: Frame, atom: Any, seg: int) -> Any:
    """A narrow float operand at the library call's float32 value (its shadow, or exact twin)."""
    return _convert_element_type(frame.wide(atom, seg), ev.acc(dtype_of(atom)), weak_type=False)


def _inline(ev: Any, frame: Frame, eqn: Any, closed: Any) -> None:
    """``closed`` evaluated into ``frame``: the body's equations are the outer ones."""
    inline(frame, eqn, closed, ev.frame(), ev.run)


# Rewritten bodies of sharded jits, keyed weakly on the original body: an entry lives as long as JAX
# keeps that body (its own caches, a user's closure), never longer, so a fresh closure per step over
# new weights leaves nothing behind.
_RETRACED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, bool], Any]] = weakref.WeakKeyDictionary()


def _retraced_jit_body(ev: Any, closed: Any) -> Any:
    """The rewritten body of a jitted function, one per (body, policy): an eager call of the same
    library function reuses it, so it is compiled once, as the original is."""
    per_body = _RETRACED.setdefault(closed, {})
    key = (ev.p, ev.widen)
    if key not in per_body:
        per_body[key] = retrace(ev, closed)
    return per_body[key]


def _jit(ev: Any, frame: Frame, eqn: Any) -> None:
    p = eqn.params
    if plain_jit(
        eqn
    ):  # inline, so the rewrite sees across the call (one rounding per library call),
        # eagerly as under an outer jit: a nested jit is not a rounding boundary
        _inline(ev, frame, eqn, p["jaxpr"])
        return
    params = dict(p, jaxpr=_retraced_jit_body(ev, p["jaxpr"]))
    _write_outs(frame, eqn, eqn.primitive.bind(*map(frame.read, eqn.invars), **params))


def _rebind(ev: Any, frame: Frame, eqn: Any, **jaxprs: Any) -> None:
    params = dict(eqn.params, **jaxprs)
    params = eqn.primitive.get_bind_params(params)
    _write_outs(frame, eqn, eqn.primitive.bind(*map(frame.read, eqn.invars), **params))


def _scan(ev: Any, frame: Frame, eqn: Any) -> None:
    """A scan, its body under the rules. Its narrow float constants (a weight every step reads) and
    per-step inputs ``xs`` enter as their exact float32 twins, narrowed inside the body (the same
    values): JAX's transpose then sums a constant's cotangents over the steps in float32, as every
    other sum, and returns float32 cotangents for ``xs``, so what produced them sums its own in
    float32 too (a gather's scatter-add, flax's ``flip_sequences`` before a reversed RNN).

    A scan that is part of one library call (``jnp.polyval``'s, ``jnp.searchsorted``'s, see
    ``in_library_call``) is one op with the rest of that call: its narrow float constants, carries
    and per-step inputs enter at the call's float32 values (read as their shadows by the body's
    equations of that call; a carry is each step's unrounded result), and its narrow results
    (final carries, stacked outputs) are rounded once, where the scan's results are. A scan the
    program writes keeps its narrow carries (the audit reports the narrow ``scan carry``)."""
    closed, n = eqn.params["jaxpr"], eqn.params["num_consts"]
    seg = ev.segment  # the scan equation's own
    first_x = n + eqn.params["num_carry"]
    wide = [
        i for i, v in enumerate(eqn.invars) if (i < n or i >= first_x) and is_narrow(dtype_of(v))
    ]
    carried: list[int] = []
    out_carried: list[int] = []
    if ev.in_library_call(eqn):  # every narrow operand and result at the call's float32 value
        carried, wide = [i for i, v in enumerate(eqn.invars) if is_narrow(dtype_of(v))], []
        out_carried = [j for j, v in enumerate(eqn.outvars) if is_narrow(dtype_of(v))]
    if not wide and not carried:
        _rebind(ev, frame, eqn, jaxpr=retrace(ev, closed))
        return
    avals = list(closed.in_avals)
    narrow = {i: avals[i].dtype for i in wide}
    for i in wide:
        acc = ev.acc(np.dtype(avals[i].dtype))
        avals[i] = avals[i].update(dtype=acc, weak_type=False)
    for i in carried:
        avals[i] = avals[i].update(dtype=ev.acc(np.dtype(avals[i].dtype)), weak_type=False)
    evaluate = body(ev, closed)

    def step(*args: Any) -> list[Any]:
        vals = list(args)
        for i, d in narrow.items():  # exact: the value is the narrow constant itself
            vals[i] = _convert_element_type(vals[i], d)
        if not carried:
            return evaluate(*vals)
        return _carrying_body(ev, eqn, closed, vals, carried, out_carried)

    fn = lu.wrap_init(step, debug_info=closed.jaxpr.debug_info)
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(fn, avals)
    operands = list(map(frame.read, eqn.invars))
    for i in wide:  # the exact twin: cotangents reach it (and what it was copied from) unrounded
        operands[i] = _convert_element_type(frame.twin(eqn.invars[i]), avals[i].dtype)
    for i in carried:  # the call's float32 value (its shadow) or the exact twin
        operands[i] = _convert_element_type(frame.wide(eqn.invars[i], seg), avals[i].dtype)
    params = dict(eqn.params, jaxpr=_core.ClosedJaxpr(jaxpr, consts))
    params = eqn.primitive.get_bind_params(params)
    outs = eqn.primitive.bind(*operands, **params)
    if not carried:
        _write_outs(frame, eqn, outs)
        return
    after = ev.resume(seg, eqn)  # the call's next equations read the unrounded carries
    _write_wide(frame, eqn, outs, out_carried, after)


def _carrying_body(
    ev: Any, eqn: Any, closed: Any, vals: list[Any], carried: list[int], out_carried: list[int]
) -> list[Any]:
    """One step of a library call's scan: the float32 carries ``vals[i]`` (``i`` in ``carried``)
    are the shadows of the body's narrow carry variables in the segment of the scan's call, and the
    float32 values of the carried outputs (their shadows, or exact twins) are returned for them."""
    jaxpr = closed.jaxpr
    inner = ev.frame()
    for v, c in zip(jaxpr.constvars, closed.consts, strict=True):
        inner.write(v, c)
    seg = ev.continue_call(eqn)
    for i, (v, x) in enumerate(zip(jaxpr.invars, vals, strict=True)):
        if i in carried:
            inner.write_rounded(v, x, seg)
        else:
            inner.write(v, x)
    ev.run(inner, jaxpr)
    end = ev.segment_of(eqn)
    outs = []
    for j, v in enumerate(jaxpr.outvars):
        if j not in out_carried:
            outs.append(_conform(inner.read(v), v.aval))
            continue
        s = inner.shadow(v, end) if end is not None else None
        x = s if s is not None else inner.twin(v)
        outs.append(_convert_element_type(x, np.dtype(x.dtype), weak_type=False))
    ev.new_segment()
    return outs


def _wide_jaxpr(ev: Any, eqn: Any, closed: Any, ins: list[int], outs: list[int]) -> Any:
    """``closed`` (a body of ``eqn``, one library call) evaluated by the rules with its narrow
    float inputs ``ins`` and outputs ``outs`` at their accumulation dtype (``_carrying_body``)."""
    avals = list(closed.in_avals)
    for i in ins:
        avals[i] = avals[i].update(dtype=ev.acc(np.dtype(avals[i].dtype)), weak_type=False)

    def fn(*vals: Any) -> list[Any]:
        return _carrying_body(ev, eqn, closed, list(vals), ins, outs)

    wrapped = lu.wrap_init(fn, debug_info=closed.jaxpr.debug_info)
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(wrapped, avals)
    return _core.ClosedJaxpr(jaxpr, consts)


def _linear_solve(ev: Any, frame: Frame, eqn: Any) -> None:
    """``custom_linear_solve`` (``jnp.linalg.solve``, ``inv``): its matvec and solve bodies under the
    rules. Inside one library call its narrow float operands (the LU factors, the right-hand side)
    enter at their float32 values (the call's shadows) and the solution is rounded once, where the
    equation's results are; a solve the program writes has its bodies evaluated as loop bodies are."""
    p = eqn.params
    jaxprs, lengths = p["jaxprs"], list(p["const_lengths"])
    seg = ev.segment
    starts = list(np.cumsum([0, *lengths]))
    nb = len(eqn.invars) - starts[-1]
    narrow = [is_narrow(dtype_of(v)) for v in eqn.invars]
    b_narrow = [t for t in range(nb) if narrow[starts[-1] + t]]

    def consistent(closed: Any) -> bool:
        outs = [t for t, v in enumerate(closed.jaxpr.outvars) if is_narrow(dtype_of(v))]
        return outs == b_narrow

    bodies = [j for j in jaxprs if j is not None]
    if not (any(narrow) and ev.in_library_call(eqn) and all(map(consistent, bodies))):
        new = type(jaxprs)(*(None if j is None else retrace(ev, j) for j in jaxprs))
        _rebind(ev, frame, eqn, jaxprs=new)
        return
    wide_jaxprs: list[Any] = []
    for j, start, n in zip(jaxprs, starts, lengths, strict=False):
        if j is None:
            wide_jaxprs.append(None)
            continue
        ins = [i for i in range(n) if narrow[start + i]] + [n + t for t in b_narrow]
        wide_jaxprs.append(_wide_jaxpr(ev, eqn, j, ins, b_narrow))
    operands = list(map(frame.read, eqn.invars))
    for k, is_n in enumerate(narrow):
        if is_n:
            operands[k] = _wide_operand(ev, frame, eqn.invars[k], seg)
    params = eqn.primitive.get_bind_params(dict(p, jaxprs=type(jaxprs)(*wide_jaxprs)))
    outs = eqn.primitive.bind(*operands, **params)
    after = ev.resume(seg, eqn)
    for v, x in zip(eqn.outvars, outs, strict=True):
        frame.write_rounded(v, x, after)


def _while(ev: Any, frame: Frame, eqn: Any) -> None:
    p = eqn.params
    _rebind(
        ev,
        frame,
        eqn,
        cond_jaxpr=retrace(ev, p["cond_jaxpr"]),
        body_jaxpr=retrace(ev, p["body_jaxpr"]),
    )


def _cond(ev: Any, frame: Frame, eqn: Any) -> None:
    """A cond, its branches under the rules. Inside one library call (``jnp.diagonal``'s choice of
    lowering per platform, see ``in_library_call``) its narrow float operands enter at the call's
    float32 values and its narrow results are rounded once, where the cond's results are; a cond
    the program writes (``lax.cond``, ``lax.switch``) rounds what crosses its branches' boundary."""
    branches = eqn.params["branches"]
    ops = eqn.invars[1:]  # the index first
    ins = [i for i, v in enumerate(ops) if is_narrow(dtype_of(v))]
    outs = [j for j, v in enumerate(eqn.outvars) if is_narrow(dtype_of(v))]
    if not (ins or outs) or not ev.in_library_call(eqn):
        _rebind(ev, frame, eqn, branches=tuple(retrace(ev, b) for b in branches))
        return
    seg = ev.segment
    wide = tuple(_wide_jaxpr(ev, eqn, b, ins, outs) for b in branches)
    operands = list(map(frame.read, eqn.invars))
    for i in ins:
        operands[1 + i] = _wide_operand(ev, frame, ops[i], seg)
    params = eqn.primitive.get_bind_params(dict(eqn.params, branches=wide))
    results = eqn.primitive.bind(*operands, **params)
    _write_wide(frame, eqn, results, outs, ev.resume(seg, eqn))


def _custom_call(ev: Any, eqn: Any) -> tuple[dict[str, Any], int, Any]:
    """A custom_jvp/custom_vjp call's bind parameters, its number of constants, and its primal
    function evaluated under the rules (the derivative rule is each caller's own)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    call = eqn.params["call_jaxpr"]
    fun = lu.wrap_init(body(ev, call), debug_info=call.jaxpr.debug_info)
    return params, eqn.params["num_consts"], fun


def _custom_jvp(ev: Any, frame: Frame, eqn: Any) -> None:
    from jax._src.custom_derivatives import SymbolicZero

    ins = [i for i, v in enumerate(eqn.invars) if is_narrow(dtype_of(v))]
    outs = [j for j, v in enumerate(eqn.outvars) if is_narrow(dtype_of(v))]
    if (ins or outs) and ev.in_library_call(eqn):
        _library_custom_jvp(ev, frame, eqn, ins, outs)
        return
    params, num_consts, fun = _custom_call(ev, eqn)
    jvp_jaxpr_fun = eqn.params["jvp_jaxpr_fun"]

    def jvp(*xs: Any) -> list[Any]:
        n = len(xs) // 2
        primals, tangents = xs[num_consts:n], xs[n + num_consts :]
        zeros = [type(t) is SymbolicZero for t in tangents]
        jvp_jaxpr, jvp_consts, out_zeros = jvp_jaxpr_fun.call_wrapped(*zeros)
        nonzero = [t for t in tangents if type(t) is not SymbolicZero]
        jaxpr = getattr(jvp_jaxpr, "jaxpr", jvp_jaxpr)
        out = evaluate_jaxpr(ev, jaxpr, jvp_consts, [*primals, *nonzero])
        out_primals, nz_tangents = out[: len(out_zeros)], iter(out[len(out_zeros) :])
        out_tangents = [
            SymbolicZero(_core.typeof(p).to_tangent_aval()) if z else next(nz_tangents)
            for p, z in zip(out_primals, out_zeros, strict=True)
        ]
        return [*out_primals, *out_tangents]

    params["subfuns"] = (fun, lu.wrap_init(jvp, debug_info=jvp_jaxpr_fun.debug_info))
    _write_outs(frame, eqn, eqn.primitive.bind(*map(frame.read, eqn.invars), **params))


def _library_custom_jvp(ev: Any, frame: Frame, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """A custom_jvp function inside one library call (``xlogy`` inside ``rel_entr``, a
    distribution's log density; ``jax.nn.relu``): one op with the rest of that call, as a library
    ``cond`` is. Its narrow float operands enter at the call's float32 values and its narrow results
    keep theirs (rounded once, where the call's results are); its derivative rule is evaluated the
    same way, its narrow tangents at float32. Before, each such function rounded its results to
    the narrow dtype before the call's next operation read them."""
    from jax._src.custom_derivatives import SymbolicZero

    here = ev.position()
    seg = here[0]
    call, num_consts = eqn.params["call_jaxpr"], eqn.params["num_consts"]
    jvp_jaxpr_fun = eqn.params["jvp_jaxpr_fun"]
    params = eqn.primitive.get_bind_params(eqn.params)
    n_out = len(eqn.outvars)

    def fun(*vals: Any) -> list[Any]:
        return _carrying_body(ev, eqn, call, list(vals), ins, outs)

    def jvp(*xs: Any) -> list[Any]:
        n = len(xs) // 2
        primals, tangents = xs[num_consts:n], xs[n + num_consts :]
        zeros = [type(t) is SymbolicZero for t in tangents]
        jvp_jaxpr, jvp_consts, out_zeros = jvp_jaxpr_fun.call_wrapped(*zeros)
        given = [k for k, z in enumerate(zeros) if not z]
        wide = [k for k in range(len(primals)) if k + num_consts in ins]
        wide += [len(primals) + m for m, k in enumerate(given) if k + num_consts in ins]
        moving = [j for j, z in enumerate(out_zeros) if not z]
        wide_out = [*outs, *(n_out + m for m, j in enumerate(moving) if j in outs)]
        jaxpr = getattr(jvp_jaxpr, "jaxpr", jvp_jaxpr)
        closed = _core.ClosedJaxpr(jaxpr, jvp_consts)
        out = _carrying_body(
            ev, eqn, closed, [*primals, *(tangents[k] for k in given)], wide, wide_out
        )
        out_primals, nz_tangents = out[:n_out], iter(out[n_out:])
        out_tangents = [
            SymbolicZero(_core.typeof(p).to_tangent_aval()) if z else next(nz_tangents)
            for p, z in zip(out_primals, out_zeros, strict=True)
        ]
        return [*out_primals, *out_tangents]

    params["subfuns"] = (
        lu.wrap_init(fun, debug_info=call.jaxpr.debug_info),
        lu.wrap_init(jvp, debug_info=jvp_jaxpr_fun.debug_info),
    )
    operands = list(map(frame.read, eqn.invars))
    for i in ins:
        operands[i] = _wide_operand(ev, frame, eqn.invars[i], seg)
    results = eqn.primitive.bind(*operands, **params)
    _write_wide(frame, eqn, results, outs, ev.restore(here))


def _custom_vjp(ev: Any, frame: Frame, eqn: Any) -> None:
    from jax._src.interpreters import ad

    params, num_consts, fun = _custom_call(ev, eqn)
    fwd_thunk = eqn.params["fwd_jaxpr_thunk"]

    def fwd(*args: Any) -> list[Any]:
        vals, nonzeros = args[::2], args[1::2]
        primals = vals[num_consts:]
        if any(nonzeros[:num_consts]):
            raise ad.CustomVJPException()
        fwd_jaxpr, fwd_consts = fwd_thunk.call_wrapped(*nonzeros[num_consts:])
        jaxpr = getattr(fwd_jaxpr, "jaxpr", fwd_jaxpr)
        return evaluate_jaxpr(ev, jaxpr, fwd_consts, primals)

    _, _, bwd = params["subfuns"]
    params["subfuns"] = (fun, lu.wrap_init(fwd, debug_info=fwd_thunk.debug_info), bwd)
    _write_outs(frame, eqn, eqn.primitive.bind(*map(frame.read, eqn.invars), **params))


def _remat(ev: Any, frame: Frame, eqn: Any) -> None:
    p = eqn.params
    fn = jax.checkpoint(body(ev, p["jaxpr"]), prevent_cse=p["prevent_cse"], policy=p["policy"])
    _write_outs(frame, eqn, fn(*map(frame.read, eqn.invars)))


def _shard_map(ev: Any, frame: Frame, eqn: Any) -> None:
    p = eqn.params
    inner = body(ev, p["jaxpr"])
    fn = jax.shard_map(
        lambda *xs: tuple(inner(*xs)),
        mesh=p["mesh"],
        in_specs=tuple(p["in_specs"]),
        out_specs=tuple(p["out_specs"]),
        axis_names=set(p["newly_manual_axes"]),
        check_vma=p["check_vma"],
    )
    _write_outs(frame, eqn, fn(*map(frame.read, eqn.invars)))


def _closed_call(ev: Any, frame: Frame, eqn: Any) -> None:
    """``closed_call`` (a ClosedJaxpr: JAX's partial evaluation of a scan under ``jax.checkpoint``
    stages one) and ``call`` (an open Jaxpr, as ``core.call_p`` stages it): evaluated inline, as a
    plain ``jit``."""
    _inline(ev, frame, eqn, eqn.params["call_jaxpr"])


# The kind of a higher-order row's bodies -> its handler (a reduction's or a scatter's combiner
# follows the primitive's own rule, never reaching here).
_HANDLERS: dict[Body, Callable[[Any, Frame, Any], None]] = {
    Body.JIT: _jit,
    Body.CALL: _closed_call,
    Body.SCAN: _scan,
    Body.LINEAR_SOLVE: _linear_solve,
    Body.WHILE: _while,
    Body.COND: _cond,
    Body.CUSTOM_JVP: _custom_jvp,
    Body.CUSTOM_VJP: _custom_vjp,
    Body.REMAT: _remat,
    Body.SHARD_MAP: _shard_map,
}


def evaluate(ev: Any, frame: Frame, eqn: Any) -> None:
    """A higher-order equation: its bodies evaluated by the rules (unknown ones bound unchanged)."""
    body_kind = kind(eqn.primitive.name)
    handler = None if body_kind is None else _HANDLERS.get(body_kind)
    if handler is None:
        ev.bind_plain(frame, eqn)
    else:
        handler(ev, frame, eqn)
