"""The float32 version of one equation: where heddle.autodiff takes a narrow value's derivative.

``widen_bind(eqn, args)`` applies ``eqn``'s primitive to ``args`` in which every narrow float value
(bfloat16, float16, float8, float4) is replaced by a float32 array with the same values: every
narrow float dtype named in the parameters becomes float32, narrow literals are widened exactly, and
the bodies of higher-order primitives are widened the same way, recursively. At the values a narrow
program computes, the widened equation has the same derivative, computed and held in float32: a
rounding to a narrow dtype (``convert_element_type`` to bfloat16, say) widens to the identity, whose
derivative is 1, so a cotangent that float32 holds is never flushed by the narrow format's range.

Each kind of body the table of primitives gives a higher-order primitive (``_table.Body``) has its
float32 version in ``_BODIES``: a jit and a call are evaluated widened, a checkpoint is re-applied
around its widened body (so a checkpoint inside a ``scan`` body keeps rematerialising); a
``custom_jvp`` function keeps its rule: the widened call is a ``custom_jvp`` of the widened body
whose rule is the widened rule. A ``custom_vjp`` function (and its linearised rule), a bit cast,
the body of a ``shard_map`` (which runs under named axes) and bodies that do not retype raise
``NotWidened``; the caller then keeps JAX's own derivative, at the narrow dtype, for that equation.
With ``contractions="scaled"`` (``_scaled``), a contraction of two bfloat16 or two float16 operands
is widened to the scaled contraction of its narrow operands (read back exactly from the float32
ones), so a ``scan``/``while``/``cond`` body's backward contractions run narrow too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from heddle.autodiff import _scaled
from heddle.ops.lowering import runnable_precision
from heddle.programs._on_twins import on_twins
from heddle.programs._table import Body, Fact, has, kind

_F32 = np.dtype("float32")


class NotWidened(Exception):
    """The equation has no float32 version here; its derivative stays JAX's."""


def is_narrow(d: Any) -> bool:
    """Whether ``d`` is a real float dtype narrower than float32 (its gradients are float32)."""
    try:
        d = np.dtype(d)
    except TypeError:
        return False
    return bool(jnp.issubdtype(d, jnp.floating)) and d.itemsize < 4


def widen_value(x: Any) -> Any:
    """``x`` as float32 if it is a narrow float array, else ``x`` (exact either way)."""
    d = getattr(x, "dtype", None)
    return lax.convert_element_type(x, _F32) if d is not None and is_narrow(d) else x


def _widen_param(p: Any) -> Any:
    if isinstance(p, jex_core.ClosedJaxpr):
        return widen_closed(p)
    if isinstance(p, jex_core.Jaxpr):
        closed = widen_closed(jex_core.ClosedJaxpr(p, ()))
        if closed.consts:
            raise NotWidened("an open body whose widened form needs constants")
        return closed.jaxpr
    if isinstance(p, tuple):
        items = [_widen_param(e) for e in p]
        if hasattr(p, "_fields"):  # a NamedTuple of dimension numbers: keep its type
            return type(p)(*items)
        return tuple(items)
    if isinstance(p, np.dtype | type) and is_narrow(p):
        return _F32
    return p


def _widen_aval(a: Any) -> Any:
    d = getattr(a, "dtype", None)
    if d is None or not is_narrow(d):
        return a
    return a.update(dtype=_F32)  # its shape, weak type and sharding (explicit mesh axes) kept


def widen_closed(closed: Any) -> Any:
    """The float32 version of a closed jaxpr, traced at its widened input types.

    Raises:
      NotWidened: an equation inside has no float32 version, or the widened outputs do not have the
        widened types of the original outputs (the body does not widen consistently).
    """
    in_avals = [_widen_aval(a) for a in closed.in_avals]
    try:
        out = jax.make_jaxpr(lambda *xs: widen_eval(closed.jaxpr, closed.consts, xs))(*in_avals)
    except NotWidened:
        raise
    except Exception as e:  # a body that does not retype: JAX's own derivative is kept for it
        raise NotWidened(f"{type(e).__name__}: {e}") from e
    want = [(tuple(a.shape), _F32 if is_narrow(a.dtype) else a.dtype) for a in closed.out_avals]
    got = [(tuple(a.shape), a.dtype) for a in out.out_avals]
    if want != got:
        raise NotWidened("the widened body changes an output's type")
    return out


def widen_eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Evaluates ``jaxpr`` with every narrow float value held as float32."""
    env: dict[Any, Any] = {}

    def read(a: Any) -> Any:
        return widen_value(a.val) if isinstance(a, jex_core.Literal) else env[a]

    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = widen_value(c)
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = widen_value(x)
    for eqn in jaxpr.eqns:
        outs = widen_bind(eqn, [read(a) for a in eqn.invars])
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _inline(closed: Any, args: Sequence[Any]) -> list[Any]:
    """A ClosedJaxpr, or an open Jaxpr, evaluated widened on ``args``."""
    return widen_eval(getattr(closed, "jaxpr", closed), getattr(closed, "consts", ()), args)


def _rebind(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """``eqn`` itself on ``args`` rounded back to its input dtypes, its outputs widened."""
    ins = [
        lax.convert_element_type(x, a.aval.dtype) if is_narrow(a.aval.dtype) else x
        for x, a in zip(args, eqn.invars, strict=True)
    ]
    out = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
    return [widen_value(o) for o in (out if eqn.primitive.multiple_results else [out])]


def _custom_jvp(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """A ``custom_jvp`` function keeps its rule: the rule's jaxpr is widened and applied.

    Its value is the widened body where the body retypes, else the function itself on the inputs
    rounded back to their dtypes (a body of bit manipulations, say): only the rule's derivative is
    ever used, and the rule is widened either way.
    """
    p = eqn.params
    call, n_consts = p["call_jaxpr"], p["num_consts"]
    n_in = len(eqn.invars) - n_consts
    jvp_jaxpr, jvp_consts, out_zeros = p["jvp_jaxpr_fun"].call_wrapped(*([False] * n_in))
    n_out = len(out_zeros)
    try:
        body = widen_closed(call)
        value = lambda xs: widen_eval(body.jaxpr, body.consts, xs)
    except NotWidened:
        value = lambda xs: _rebind(eqn, xs)

    @jax.custom_jvp
    def call_fn(*xs: Any) -> list[Any]:
        return value(xs)

    def rule(primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        ins = [*primals[n_consts:], *tangents[n_consts:]]
        out = widen_eval(jvp_jaxpr, jvp_consts, ins)
        prim_out, nz_tan = out[:n_out], iter(out[n_out:])
        tan = [
            jnp.zeros_like(o) if z else next(nz_tan)
            for o, z in zip(prim_out, out_zeros, strict=True)
        ]
        return call_fn(*primals), tan

    call_fn.defjvp(rule)
    return list(call_fn(*args))


def _jit(eqn: Any, args: Sequence[Any]) -> list[Any]:
    return _inline(eqn.params["jaxpr"], args)


def _call(eqn: Any, args: Sequence[Any]) -> list[Any]:
    return _inline(eqn.params["call_jaxpr"], args)


def _remat(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """A checkpoint stays one: its body evaluated widened, under ``jax.checkpoint`` with the same
    policy, so what it saves for the backward pass is what the plain checkpoint saves."""
    p = eqn.params

    def body(*xs: Any) -> list[Any]:
        return widen_eval(p["jaxpr"], (), xs)

    return list(jax.checkpoint(body, prevent_cse=p["prevent_cse"], policy=p["policy"])(*args))


def _own_rule(eqn: Any, args: Sequence[Any]) -> NoReturn:
    raise NotWidened(f"{eqn.primitive.name} has only a rule for its own dtypes")


def _named_axes(eqn: Any, args: Sequence[Any]) -> NoReturn:
    raise NotWidened(f"{eqn.primitive.name}'s body runs under its own named axes")


def _widened_params(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """``eqn``'s primitive bound on ``args`` with its narrow dtypes and bodies widened."""
    params = {k: _widen_param(v) for k, v in eqn.params.items()}
    if "precision" in params:  # a contraction's: an algorithm preset XLA:CPU refuses is dropped
        params["precision"] = runnable_precision(params["precision"])
    bind_params = eqn.primitive.get_bind_params(params)
    out = eqn.primitive.bind(*args, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


# The kind of an equation's bodies -> its float32 version.
_BODIES: dict[Body, Callable[[Any, Sequence[Any]], list[Any]]] = {
    Body.JIT: _jit,
    Body.CALL: _call,
    Body.REMAT: _remat,
    Body.CUSTOM_JVP: _custom_jvp,
    Body.CUSTOM_VJP: _own_rule,
    Body.SHARD_MAP: _named_axes,
    Body.SCAN: _widened_params,
    Body.WHILE: _widened_params,
    Body.COND: _widened_params,
    Body.LINEAR_SOLVE: _widened_params,
    Body.REDUCER: _widened_params,
    Body.COMBINER: _widened_params,
}


def widen_bind(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """Applies the float32 version of ``eqn`` to ``args`` (narrow values given as float32).

    Args:
      eqn: an equation of a jaxpr.
      args: one value per input of ``eqn``; narrow float inputs as float32 arrays of their values.

    Returns:
      The outputs, narrow float outputs as float32.

    Raises:
      NotWidened: the equation has no float32 version (a ``custom_vjp`` function, or a body that
        does not retype).
    """
    name = eqn.primitive.name
    body_kind = kind(name)
    if body_kind is not None:
        return _BODIES[body_kind](eqn, args)
    if has(name, Fact.DOT) and _scaled.active():
        scaled = _scaled.widened(eqn, args)
        if scaled is not None:
            return scaled
    if has(name, Fact.ROUNDS):  # a rounding has derivative 1, as a narrowing conversion widened
        return [on_twins(lambda x: _widened_params(eqn, [x])[0], lambda x: x, args)]
    if has(name, Fact.USER_RULE):
        _own_rule(eqn, args)
    atoms = (*eqn.invars, *eqn.outvars)  # a bit cast of no narrow dtype (jax.random's) widens
    if has(name, Fact.BITS) and any(is_narrow(getattr(a.aval, "dtype", None)) for a in atoms):
        raise NotWidened("a bit cast depends on the narrow dtype's width")
    return _widened_params(eqn, args)
