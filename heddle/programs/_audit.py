"""``audit``: find narrow accumulations, implicit promotions and lossy conversions before anything runs.

The policy is enforced inside heddle's ops; models also call flax or equinox layers, optax and raw
jax.numpy. ``audit`` traces any JAX function with ``jax.make_jaxpr`` (arguments may be
``jax.ShapeDtypeStruct``; nothing executes) and checks every equation, and the equations of every
nested ``jit``, ``custom_jvp``/``custom_vjp``, ``while``, ``cond``, ``scan`` and ``shard_map`` body,
against POLICY.md. The rules are in ``_audit_walk`` and ``_audit_convert``, the report in
``_audit_report``; this module holds the entry point.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy._errors import PolicyError
from heddle.programs._audit_ir import FLOAT64_UNAVAILABLE, RawFinding, short
from heddle.programs._audit_report import KINDS as KINDS
from heddle.programs._audit_report import AuditReport as AuditReport
from heddle.programs._audit_report import Finding as Finding
from heddle.programs._audit_report import merge
from heddle.programs._audit_source import Location, is_user
from heddle.programs._audit_walk import Walker
from heddle.programs._autocast import linen_apply


def _is_array_leaf(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _inexact(x: Any) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


def _zero(x: Any) -> Any:
    """The cotangent of an integer or boolean output."""
    return np.zeros(x.shape, jax.dtypes.float0)


def _name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None and hasattr(fn, "func"):  # functools.partial
        return _name(fn.func)
    return name or type(fn).__name__


def _frame_of_caller() -> Location | None:
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if is_user(f.f_code.co_filename):
            return Location(f.f_code.co_filename, f.f_lineno, f.f_code.co_qualname)
        f = f.f_back
    return None


def audit(
    fn: Callable[..., Any],
    *args: Any,
    include_backward: bool = False,
    include_explicit: bool = False,
    **kwargs: Any,
) -> AuditReport:
    """Checks a JAX function against heddle's dtype policy without running it.

    ``fn(*args, **kwargs)`` is traced with ``jax.make_jaxpr``: array leaves of ``args``/``kwargs``
    (JAX or NumPy arrays, ``jax.ShapeDtypeStruct``) are traced, every other leaf (Python scalars,
    functions, static module fields) is passed as is. Every equation, including those in nested
    ``jit``, ``custom_jvp``, ``custom_vjp``, ``while``, ``cond``, ``scan`` and ``shard_map`` bodies, is
    checked for:

    - ``narrow_accumulation``: ``reduce_sum``/``reduce_prod``/window sums, ``cumsum``/``cumprod``/
      ``cumlogsumexp``, scatter-add, ``psum``, and ``dot_general``/``conv_general_dilated`` whose
      ``preferred_element_type`` (or output dtype) is narrower than ``acc_dtype`` of the inputs; and
      softmax/logsumexp computed with ``exp`` in a narrow float. ``argmax``, ``cummax`` and the
      max/min reductions add nothing up and are fine.
    - ``implicit_promotion``: an op whose operands JAX converted because their dtypes differed, with
      the dtype heddle's lattice gives when it is not JAX's.
    - ``lossy_conversion``: a conversion that can change values (``int32 -> float32``, any
      narrowing). Implicit ones always; explicit ones (``astype``, heddle's own rounding) only with
      ``include_explicit=True``, since an explicit cast is the program saying where to round.
    - ``float64_unavailable``: float64 asked for (a 64-bit argument, ``astype(float64)``) while
      ``jax_enable_x64`` is off, so JAX silently uses 32 bits.
    - ``unclassified_primitive``: a primitive heddle's table of rules does not list.
    - ``narrow_cotangent``: in a backward pass (``include_backward=True``, or a function such as
      ``jax.grad(f)`` that holds one), cotangents stored narrower than ``grad_dtype`` of their
      value, as ``jax.grad``/``jax.vjp`` store every bfloat16, float16 or float8 value's (float16
      flushes a cotangent below 6e-8 to zero, bfloat16 keeps 8 significant bits); one finding per
      source line and dtype. ``heddle.autodiff.grad``/``value_and_grad`` keep them in float32, also
      for ``heddle.autocast(f)``, whose narrow results get narrow cotangents under ``jax.grad``.

    JAX's promotion mode is the caller's: under ``jax.numpy_dtype_promotion('strict')`` (or
    ``heddle.policy.enforce()``) a mixed-dtype op fails to trace instead of being reported.

    Args:
      fn: any JAX-traceable function (also ``jax.grad(f)``, a jitted function, an equinox module;
        a flax linen Module that is not bound is audited as its ``apply``:
        ``audit(module, variables, x)``). Its outputs may hold Python numbers, ``None``, strings
        and integer arrays beside the floats; the backward pass starts from a cotangent of each
        float output's dtype and shape, given as an input of the audited program.
      *args: its positional arguments; arrays may be ``jax.ShapeDtypeStruct``.
      include_backward: also audit the backward pass (``fn``'s VJP), its
        narrow cotangents included.
      include_explicit: also report lossy conversions the code asked for explicitly.
      **kwargs: its keyword arguments.

    Returns:
      An ``AuditReport``.

    Raises:
      Exception: whatever ``fn`` raises while being traced.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle import policy
      >>> x = jax.ShapeDtypeStruct((1024,), jnp.bfloat16)
      >>> report = policy.audit(lambda x: jnp.cumsum(x), x)
      >>> report.counts["narrow_accumulation"], report[0].primitive
      (1, 'cumsum')
      >>> policy.audit(lambda x: jnp.cumsum(x.astype(jnp.float32)), x).counts["narrow_accumulation"]
      0
    """
    name = _name(fn)
    apply = linen_apply(fn)
    fn = fn if apply is None else apply
    leaves, treedef = jax.tree.flatten((args, kwargs))
    dynamic = [i for i, leaf in enumerate(leaves) if _is_array_leaf(leaf)]
    raw: list[RawFinding] = []
    raw.extend(_x64_arguments(leaves, dynamic))

    def flat(*values: Any) -> list[Any]:
        full = list(leaves)
        for i, v in zip(dynamic, values, strict=True):
            full[i] = v
        a, k = jax.tree.unflatten(treedef, full)
        # only JAX values are traced outputs: a Python number, None or a string the function
        # returns beside them computes nothing, and has no cotangent in the backward pass
        return [
            o for o in jax.tree.leaves(fn(*a, **k)) if isinstance(o, jax.Array | jax.core.Tracer)
        ]

    # the backward pass's seeds are inputs of the traced program, so the walk knows them as
    # cotangents (a seed built inside is a constant: the transpose of a lone tanh, which multiplies
    # it by a residual, would not count as computing a cotangent)
    arrays = [leaves[i] for i in dynamic]
    seeds = [o for o in jax.eval_shape(flat, *arrays) if _inexact(o)] if include_backward else []

    def forward_and_backward(cts: list[Any], *values: Any) -> Any:
        out, pullback = jax.vjp(flat, *values)
        given = iter(cts)
        return out, pullback([next(given) if _inexact(o) else _zero(o) for o in out])

    caught: list[tuple[warnings.WarningMessage, Location | None]] = []

    def hook(msg, category, filename, lineno, file=None, line=None):
        wm = warnings.WarningMessage(msg, category, filename, lineno, file, line)
        caught.append((wm, _frame_of_caller()))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        if include_backward:
            closed = jax.make_jaxpr(forward_and_backward)(seeds, *arrays)
        else:
            closed = jax.make_jaxpr(flat)(*arrays)
    walker = Walker(include_explicit=include_explicit)
    walker.walk(closed, cotangents=set(closed.jaxpr.invars[: len(seeds)]))
    raw.extend(walker.findings)
    for wm, frame in caught:
        f = _x64_warning(wm, frame)
        if f is None:
            warnings.warn_explicit(wm.message, wm.category, wm.filename, wm.lineno)
        else:
            raw.append(f)
    return AuditReport(name, merge(raw), include_backward)


def _x64_arguments(leaves: list[Any], dynamic: list[int]) -> list[RawFinding]:
    if D.x64_enabled():
        return []
    out = []
    for n, i in enumerate(dynamic):
        if jax.dtypes.issubdtype(leaves[i].dtype, jax.dtypes.extended):
            continue  # PRNG keys (nnx.Rngs, jax.random.key): no NumPy dtype, never float64
        d = np.dtype(leaves[i].dtype)
        if d.itemsize == 8 or d == np.complex128:
            narrow = {"f": "float32", "c": "complex64", "i": "int32", "u": "uint32"}[d.kind]
            out.append(
                RawFinding(
                    FLOAT64_UNAVAILABLE,
                    "argument",
                    (short(d),),
                    _short_name(narrow),
                    (tuple(leaves[i].shape),),
                    None,
                    False,
                    "",
                    f"array argument {n} is {d.name} but jax_enable_x64 is off, so JAX traces it as "
                    f"{narrow}; enable x64 or pass {narrow} explicitly",
                    "",
                )
            )
    return out


def _x64_warning(wm: warnings.WarningMessage, frame: Location | None) -> RawFinding | None:
    text = str(wm.message)
    if "is not available" not in text or "jax_enable_x64" not in text:
        return None
    words = text.split()
    asked = words[words.index("dtype") + 1] if "dtype" in words else "float64"
    into = text.split("truncated to dtype ")[-1].split(".")[0] if "truncated" in text else "?"
    where = text.split(" requested in ")[-1].split()[0] if " requested in " in text else "?"
    return RawFinding(
        FLOAT64_UNAVAILABLE,
        where,
        (_short_name(asked),),
        _short_name(into),
        (),
        frame,
        False,
        "",
        f"{asked} asked for in {where} while jax_enable_x64 is off: JAX uses {into}; enable x64 "
        f"(jax.config.update('jax_enable_x64', True)) or ask for {into} explicitly",
        "",
    )


def _short_name(name: str) -> str:
    try:
        return short(D.dtype(name))
    except PolicyError:
        return name
