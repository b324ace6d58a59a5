"""``emulate(fn, dtype)``: run a JAX function as if every intermediate value were stored in ``dtype``.

The function is traced to a jaxpr and interpreted primitive by primitive. Every float value the
program stores (inputs, constants, literals and each primitive's outputs) is rounded to ``dtype``
with heddle's correctly rounded cast and kept in its own dtype, so the program's types, shapes and
pytree structure do not change: only the values do, exactly as if each had been stored in ``dtype``
and read back. Primitives still compute at their own dtype (a float32 ``dot_general`` accumulates in
float32), which is what heddle's narrow ops do (POLICY.md 5): compute wide, round once on store.

Primitives that hold jaxprs (``jit``, ``cond``, ``while``, ``scan``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat``) get emulated copies of those jaxprs, so rounding reaches inside loops
and branches too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
import numpy as np
from jax import lax

import heddle.numpy as hnp
from heddle.policy import _dtypes as D
from heddle.policy._errors import message
from heddle.policy._rules import can_lossless_cast

try:  # restores a weak type after rounding, so emulated loop bodies keep their exact signature
    from jax._src.lax.lax import _convert_element_type as _weak_convert
except ImportError:  # pragma: no cover - depends on JAX internals
    _weak_convert = None


def _rounder(d: np.dtype) -> Callable[[Any, Any], Any]:
    def rnd(x: Any, aval: Any) -> Any:
        xd = np.dtype(aval.dtype)
        if xd == d or D.kind(xd) not in "fc":
            return x
        if D.kind(xd) == "c":
            part = D.real_dtype(xd)
            if not can_lossless_cast(d, part):
                return x
            re = hnp.astype(hnp.astype(lax.real(x), d), part)
            im = hnp.astype(hnp.astype(lax.imag(x), d), part)
            y = lax.complex(re, im)
        elif can_lossless_cast(d, xd):
            y = hnp.astype(hnp.astype(x, d), xd)
        else:  # the value is stored narrower than (or beside) d already: left as it is
            return x
        if getattr(aval, "weak_type", False) and _weak_convert is not None:
            y = _weak_convert(y, xd, weak_type=True)
        return y

    return rnd


def _eval(jaxpr: Any, consts: list[Any], args: list[Any], d: np.dtype) -> list[Any]:
    rnd = _rounder(d)
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        if isinstance(v, jex.Literal):
            return rnd(v.val, v.aval)
        return env[v]

    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = rnd(c, v.aval)
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = rnd(a, v.aval)
    for eqn in jaxpr.eqns:
        params = {k: _emulate_param(p, d) for k, p in eqn.params.items()}
        bind_params = eqn.primitive.get_bind_params(params)
        with eqn.ctx.manager:
            outs = eqn.primitive.bind(*map(read, eqn.invars), **bind_params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, o in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jex.DropVar):
                env[v] = rnd(o, v.aval)
    return [read(v) for v in jaxpr.outvars]


def _emulate_closed(cj: jex.ClosedJaxpr, d: np.dtype) -> jex.ClosedJaxpr:
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in cj.in_avals]
    return jax.make_jaxpr(lambda *xs: _eval(cj.jaxpr, cj.consts, list(xs), d))(*avals)


def _emulate_param(p: Any, d: np.dtype) -> Any:
    if isinstance(p, jex.ClosedJaxpr):
        return _emulate_closed(p, d)
    if isinstance(p, jex.Jaxpr):
        new = _emulate_closed(jex.ClosedJaxpr(p, ()), d)
        if new.consts:  # pragma: no cover - the rounding itself introduces no constants
            raise NotImplementedError(
                message(
                    "emulate(fn, dtype)",
                    "an inner jaxpr gained constants while being emulated",
                    "Wrap the inner function in jax.jit so that it is held as a closed jaxpr.",
                )
            )
        return new.jaxpr
    if isinstance(p, tuple) and p and all(isinstance(e, jex.ClosedJaxpr) for e in p):
        return tuple(_emulate_closed(e, d) for e in p)
    return p


def emulate(fn: Callable[..., Any], dtype: jax.typing.DTypeLike) -> Callable[..., Any]:
    """Returns ``fn`` running as if every intermediate value were stored in ``dtype``.

    Each float value the traced program stores (inputs, constants, literals, every primitive's
    outputs, inside jit/cond/while/scan/custom-derivative calls too) is rounded to ``dtype`` with
    heddle's correctly rounded cast, then kept in its own dtype: outputs have ``fn``'s dtypes and
    shapes, with values that ``dtype`` holds exactly. Each primitive still computes at its own
    dtype, as heddle's narrow ops do (compute in float32, round once on store), so ``emulate(fn,
    "bfloat16")`` on a float32 ``fn`` gives, bit for bit, what ``fn`` written with bfloat16
    heddle.numpy ops gives, primitive by primitive. Use it to measure what a narrower format would do
    to a computation before committing to it.

    Values whose dtype cannot hold every value of ``dtype`` (a float16 value under bfloat16
    emulation) and integer or bool values are left unchanged. Complex values have each part rounded.
    Wrap the result in ``jax.jit`` for speed; it is traced again at every eager call.

    Args:
      fn: a JAX-traceable function of arrays (pytrees of arrays allowed).
      dtype: a float dtype of the policy (``bfloat16``, ``float16``, ``float8_e4m3fn``, ...).

    Returns:
      A function with ``fn``'s signature.

    Raises:
      TypeError: ``dtype`` is not a float dtype.
      UnknownDTypeError: ``dtype`` is not a dtype of the policy.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> f = lambda x: x * 3.0 + 1.0
      >>> # 1.01 is stored as 1.0078125; times 3 is 3.0234375, stored as 3.03125 (a tie, to even)
      >>> float(hq.emulate(f, "bfloat16")(jnp.float32(1.01)))
      4.03125
      >>> float(f(jnp.float32(1.01)))
      4.029999732971191
    """
    d = D.dtype(dtype)
    if D.kind(d) != "f":
        raise TypeError(
            message(
                f"emulate(fn, {d.name!r})",
                "emulation rounds float values; it needs a float dtype to round them to",
                "Pass a float dtype, e.g. heddle.quant.emulate(fn, 'bfloat16').",
            )
        )

    @functools.wraps(fn)
    def emulated(*args: Any, **kwargs: Any) -> Any:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
        flat = jax.tree_util.tree_leaves((args, kwargs))
        outs = _eval(closed.jaxpr, closed.consts, flat, d)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return emulated
