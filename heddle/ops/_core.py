"""The one mechanism every op wrapper uses: resolve dtypes, convert explicitly, call JAX, round once.

An op is described by an ``OpSpec`` (data, in ``heddle/ops/_table.py``): the jax.numpy function, the
op class (which fixes the result dtype, POLICY.md 4) and the compute plan (how it accumulates,
POLICY.md 5). ``make_op`` turns a spec into a function with jax.numpy's signature:

1. resolve: the result dtype from the operands (arrays, dtypes, Python scalars) and the op class;
2. convert: every value operand explicitly, with heddle's correctly rounded cast, to the result dtype,
   then exactly to the compute dtype (float32 for narrow floats);
3. call the jax.numpy function, passing the accumulation dtype through ``dtype=`` or
   ``preferred_element_type=``;
4. round once to the result dtype.

Eagerly, steps 2-4 run as one jitted kernel per (op, dtypes, static arguments), so an op costs one
dispatch; under an outer ``jax.jit`` they are traced inline.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import lax

from heddle.policy import _dtypes as D
from heddle.policy import _lattice, _rules, _scalars
from heddle.policy._policy import Policy, active
from heddle.policy._rules import OpClass

try:  # the correctly rounded cast
    from heddle.policy._casts import astype as _astype
except ImportError:  # pragma: no cover - only while the cast module is being built
    _astype = None


class Plan(enum.Enum):
    """How an op computes (POLICY.md 5)."""

    # operands -> result dtype -> compute dtype (float32 for narrow floats); round once. For a
    # selection the rounding is exact: it copies from the float32 copy, so its transpose (the
    # scatter-add of a gather's cotangents, ...) sums in float32 under any jax.grad
    UPCAST = "upcast"
    NATIVE = (
        "native"  # operands -> result dtype; the op runs there (comparisons, copies, integer ops)
    )
    ACC_DTYPE = "acc_dtype"  # operand -> accumulation dtype; fn(..., dtype=acc); round once
    PREFERRED = (
        "preferred"  # operands -> result dtype; fn(..., preferred_element_type=acc); round once
    )
    PASS = "pass"  # no dtype decision: the jax.numpy function unchanged


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op of the namespace, as data.

    Attributes:
      fn: the JAX function called in step 3.
      op_class: fixes the result dtype (POLICY.md 4).
      plan: fixes the compute and accumulation dtype (POLICY.md 5).
      values: which positional arguments are value operands: a tuple of positions, ``"all"``, or
        ``"seq"`` (the first argument is a sequence of arrays, as in ``concatenate``).
      value_kwargs: parameters, by name, that are value operands too, whether passed by keyword or
        by position (``clip``'s ``min``/``max``, ``average``'s ``weights``). ``make_op`` adds the
        names of the parameters at ``values``' positions, so those work by keyword as well.
      sequence: the position of an argument that is a sequence of value operands (``select``'s
        ``choicelist``); ``values="seq"`` is the same at position 0.
      own_dtypes: the value operands do not meet: each is resolved, converted and rounded back on
        its own, and output ``i`` (of a list of outputs) has operand ``i``'s dtype
        (``broadcast_arrays``, ``meshgrid``: ``_table.OWN_DTYPES``). A Python scalar among them
        takes the policy's default for its kind, as it would alone.
    """

    fn: Callable[..., Any]
    op_class: OpClass
    plan: Plan
    values: tuple[int, ...] | str = "all"
    value_kwargs: tuple[str, ...] = ()
    sequence: int | None = None
    own_dtypes: bool = False


_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def with_value_names(spec: OpSpec) -> OpSpec:
    """``spec`` with its value operands known both by position and by name, from ``spec.fn``'s
    signature: the names of the value positions join ``value_kwargs``, and the positions of the
    ``value_kwargs`` join ``values`` (so ``clip(x, min=-5)`` and ``clip(x, -5)`` are the same call)."""
    try:
        params = list(inspect.signature(spec.fn).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return spec
    positional = [q for q in params if q.kind in (*_POSITIONAL, inspect.Parameter.VAR_POSITIONAL)]
    positional = positional[
        : next((i for i, q in enumerate(positional) if q.kind not in _POSITIONAL), None)
    ]
    seq = 0 if spec.values == "seq" else spec.sequence
    if spec.values == "all":
        at = range(len(positional))
    elif spec.values == "seq":
        at = ()
    else:
        at = spec.values
    names = [
        positional[i].name for i in at if i < len(positional) and positional[i].kind in _BY_NAME
    ]
    names += [n for n in spec.value_kwargs if n not in names]
    kinds = {q.name: q.kind for q in params}
    open_kw = any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params)  # pad(**kwargs)
    unknown = [n for n in names if kinds.get(n, None if open_kw else 0) not in (*_BY_NAME, None)]
    if unknown:  # a table entry that no longer matches JAX's signature: fail at import, loudly
        raise TypeError(f"{getattr(spec.fn, '__name__', spec.fn)}: no keyword parameter {unknown}")
    values = spec.values
    if isinstance(values, tuple):
        index = {q.name: i for i, q in enumerate(positional)}
        extra = sorted(index[n] for n in names if n in index and index[n] not in values)
        values = tuple(sorted({*values, *extra} - {seq}))
    return dataclasses.replace(spec, values=values, value_kwargs=tuple(names))


def cast(x: Any, d: np.dtype) -> jax.Array:
    """heddle's correctly rounded cast of an array to ``d`` (a no-op when it already is ``d``)."""
    if getattr(x, "dtype", None) == d and not isinstance(x, np.ndarray):
        return x
    if _astype is not None:
        return _astype(x, d)
    return lax.convert_element_type(x, d)


def compute_dtype(d: np.dtype, p: Policy) -> np.dtype:
    """The dtype an UPCAST op computes in: the accumulation dtype for floats, ``d`` otherwise."""
    return _rules.acc_dtype(d, p) if D.kind(d) == "f" else d


def order_dtype(d: np.dtype) -> np.dtype:
    """The dtype an order op (max, min, argmax, ...) runs in: ``d``, or float32 for a float format
    with no negative values (``float8_e8m0fnu``), where JAX's -inf/+inf starting value is NaN.
    The widening is exact, so the values selected are ``d``'s."""
    values = _lattice.finite_values(d) if D.kind(d) == "f" else None
    return np.dtype(np.float32) if values is not None and values[0] > 0 else d


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


_REPRESENTATIVE = {bool: True, int: 0, float: 0.0, complex: 0j}


@functools.lru_cache(maxsize=4096)
def _python_scalar_as(x: Any, kind_type: type, d: np.dtype) -> np.ndarray:
    if D.kind(d) == "f" and _lattice.finite_values(d) is not None:
        return _round_scalar(complex(x).real if kind_type is complex else x, d)
    if D.kind(d) in "iu" and kind_type is int:
        lo, hi = D.int_range(d)
        if not lo <= x <= hi:  # only without range checks (policy.JAX): wrap, as JAX does
            x = (x - lo) % (hi - lo + 1) + lo
    if D.kind(d) in "fc" and kind_type is int:  # NumPy rounds int -> float64 -> float32: twice
        return np.asarray(_int_as_float(x, D.real_dtype(d))).astype(d)
    return np.asarray(x, d)  # NumPy rounds float64 -> float32 once, and ints convert exactly


def _int_as_float(x: int, d: np.dtype) -> np.ndarray:
    """A Python int rounded once (to nearest, ties to even) to float32 or float64."""
    big = _scalars._overflow_threshold(d)
    if abs(x) >= big:  # only without range checks (policy.JAX): overflow to inf
        return np.asarray(math.copysign(math.inf, x), d)
    near = np.asarray(float(x), np.float64).astype(d)  # Python's int -> float rounds once
    if d == np.float64 or abs(x) <= 2**53:  # float(x) exact: one rounding
        return near
    inf = d.type(math.inf)
    cands = [near, np.nextafter(near, -inf), np.nextafter(near, inf)]
    cands = [c for c in cands if math.isfinite(c)]
    bits = np.dtype(f"u{d.itemsize}")
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(c.view(bits)) & 1))


def _round_scalar(x: float | int, d: np.dtype) -> np.ndarray:
    """A Python number rounded once (to nearest, ties to even) to a <= 16-bit float format, on the host."""
    if isinstance(x, float) and not math.isfinite(x):
        return np.asarray(x).astype(d)  # inf and NaN: no rounding (a format without inf gives NaN)
    values = _lattice.finite_values(d)
    exact = Fraction(x)
    if values[0] > 0 and exact < Fraction(float(values[0])):  # no zero (float8_e8m0fnu), as astype:
        return np.asarray(values[0] if exact > 0 else math.nan).astype(d)  # the smallest, or NaN
    i = int(np.searchsorted(values, float(x)))
    lo, hi = values[max(i - 1, 0)], values[min(i, len(values) - 1)]
    if Fraction(float(hi)) < exact or exact < Fraction(float(lo)):  # past the ends: overflow rule
        top = Fraction(float(values[-1]))
        half = (top - Fraction(float(values[-2]))) / 2
        if abs(exact) >= top + half:
            return np.asarray(math.copysign(math.inf, x)).astype(d)
        return np.asarray(math.copysign(float(top), x)).astype(d)
    dlo, dhi = exact - Fraction(float(lo)), Fraction(float(hi)) - exact
    if dlo != dhi:
        pick = lo if dlo < dhi else hi
    else:
        bits = np.asarray(lo).astype(d).view(np.uint8 if d.itemsize == 1 else np.uint16)
        pick = lo if int(bits) % 2 == 0 else hi
    return np.asarray(math.copysign(float(pick), x) if pick == 0 else pick).astype(d)


def materialise(x: Any, d: np.dtype) -> Any:
    """A Python scalar (or a nested list/tuple of them: fill values) as a NumPy value of dtype ``d``,
    each rounded once; arrays unchanged."""
    t = type(x)
    if t in _REPRESENTATIVE:
        if not x:  # 0.0 == -0.0 (and 0j == -0j): a cache would give one sign for both
            return _python_scalar_as.__wrapped__(x, t, d)
        return _python_scalar_as(x, t, d)
    leaves = _fill_values(x)
    if leaves is not None:
        return np.asarray([materialise(v, d) for v in leaves], d).reshape(np.shape(x))
    return x


_KINDS = (bool, int, float, complex)


def _fill_values(x: Any) -> list[Any] | None:
    """The Python scalars of a nested list/tuple made only of them, or None."""
    if not isinstance(x, list | tuple):
        return None
    leaves: list[Any] = []

    def walk(v: Any) -> bool:
        if type(v) in _REPRESENTATIVE:
            leaves.append(v)
            return True
        return isinstance(v, list | tuple) and all(map(walk, v))

    return leaves if walk(x) and leaves else None


def _fill_signature(x: Any) -> type | None:
    """Fill values written by a copy (``pad(x, 1, constant_values=(0, 255))``) have no dtype, like
    the Python scalars they are made of: the widest of their kinds, or None for other host data."""
    leaves = _fill_values(x)
    return None if leaves is None else max(map(type, leaves), key=_KINDS.index)


def _signature(x: Any) -> Any:
    """What the dtype plan depends on: a Python scalar's type, or an array's (dtype, weak)."""
    t = type(x)
    if t in _REPRESENTATIVE:
        return t
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    weak = getattr(x, "weak_type", None)
    if weak is None:
        weak = getattr(getattr(x, "aval", None), "weak_type", False)
    return (dt, bool(weak))


def _representative(sig: Any) -> Any:
    if isinstance(sig, type):
        return _REPRESENTATIVE[sig]
    dt, weak = sig
    if weak:
        return _REPRESENTATIVE[
            {"b": bool, "i": int, "u": int, "f": float, "c": complex}[D.kind(np.dtype(dt))]
        ]
    return np.dtype(dt)


@functools.lru_cache(maxsize=8192)
def _plan(spec: OpSpec, p: Policy, sigs: tuple, dtype_arg: Any, x64: bool, widen: bool) -> tuple:
    if spec.own_dtypes:  # one plan per operand; each field of the plan becomes a tuple of them
        alone = dataclasses.replace(spec, own_dtypes=False)
        per = [_plan(alone, p, (s,), dtype_arg, x64, widen) for s in sigs]
        return tuple(zip(*per, strict=True)) if per else (None,) * 7
    operands = tuple(_representative(s) for s in sigs)
    common = _scalars.resolve(operands, p, check=False)  # the representatives are not the values
    typed_dtypes = [o for o in operands if isinstance(o, np.dtype)]
    typed = _scalars.resolve(tuple(typed_dtypes), p) if typed_dtypes else None
    dtypes = _result_and_compute(spec, common, dtype_arg, p, widen)
    for d in set(dtypes) - {None}:
        D.require_available(d, f"heddle.numpy.{getattr(spec.fn, '__name__', 'op')}")
    precision = (
        _PRECISION[p.float32_matmul_precision]
        if spec.plan is Plan.PREFERRED and dtypes[2] == np.float32
        else None
    )
    return (common, *dtypes, precision, typed)


# Contractions whose dot_general always contracts the lhs on its trailing dimensions (a layout
# XLA:CPU's library path takes with narrow operands and a float32 result); measured on CPU by
# ``python benchmarks/bench_contractions.py`` (benchmarks/RESULTS.md). ``einsum`` and
# ``heddle.lax.dot_general`` and tensordot decide dot by dot (``narrow_dot_needs_widening``); the
# convolutions widen on CPU.
NARROW_ON_CPU = frozenset(
    "matmul dot vdot inner vecdot einsum batch_matmul linalg.matmul linalg.vecdot tensordot".split()
)


@functools.cache
def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def widens_narrow_contractions(name: str | None = None) -> bool:
    """Whether the contraction ``name`` widens narrow float operands to float32 before its dot.

    Never on GPU and TPU: their matrix units take bfloat16/float16/float8 operands with a float32
    result directly. On CPU a narrow dot with a float32 result is as fast as (and its backward pass
    faster than) the widened float32 dot wherever XLA:CPU's library path takes it, so the ops of
    ``NARROW_ON_CPU`` keep their narrow operands; the others widen here and narrow again dot by dot
    (``narrow_dot_needs_widening``) through ``contraction_dot_general``. Widening is exact, so either
    way the dot is the same float32-accumulated contraction, rounded once.

    Args:
      name: the contraction (``"matmul"``, ``"einsum"``, ...); None asks about a generic one.

    Returns:
      True where the operands are widened in the op's plan.

    Examples:
      >>> from heddle.ops import _core
      >>> _core.widens_narrow_contractions("matmul")
      False
    """
    return _on_cpu() and name not in NARROW_ON_CPU


def narrow_dot_needs_widening(lhs_ndim: int, rhs_ndim: int, dimension_numbers: Any) -> bool:
    """Whether XLA:CPU needs a narrow dot with a float32 result widened to float32 operands.

    XLA:CPU's generic dot (outside its library path) has no narrow x narrow -> float32 kernel: it
    fails on a dot whose lhs does not contract on its trailing dimensions while the rhs keeps more
    than one free dimension (``tensordot(a, b, axes=([0], [2]))``) or has its batch dimensions
    anywhere but in front (``einsum("bcm,cbn->bmn")``); measured over every placement of batch,
    contracting and free dimensions in operands of rank up to 4. Such dots are widened first
    (exact); every other one keeps its narrow operands. Other backends never widen.

    Args:
      lhs_ndim: rank of the lhs.
      rhs_ndim: rank of the rhs.
      dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))`` as for
        ``lax.dot_general``.

    Returns:
      True when the operands must reach the dot as float32.

    Examples:
      >>> from heddle.ops import _core
      >>> _core.narrow_dot_needs_widening(2, 3, (((0,), (2,)), ((), ()))) == _core._on_cpu()
      True
    """
    if not _on_cpu():
        return False
    (lc, rc), (lb, rb) = dimension_numbers
    rhs_free = rhs_ndim - len(rc) - len(rb)
    in_order = list(lb) == sorted(lb) and _leading(rb)
    return not _contracts_trailing(lhs_ndim, lc) and (rhs_free > 1 or not in_order)


def _leading(dims: Any) -> bool:
    """The dimensions are the first ones, in order."""
    return [int(d) for d in dims] == list(range(len(dims)))


def _contracts_trailing(lhs_ndim: int, lhs_contract: Any) -> bool:
    lc = sorted(int(d) % max(lhs_ndim, 1) for d in lhs_contract)
    return lc == list(range(lhs_ndim - len(lc), lhs_ndim))


def dot_needs_widening(lhs: Any, rhs: Any, dimension_numbers: Any) -> bool:
    """``narrow_dot_needs_widening`` for the dot these operands will bind: under ``jax.vmap``, the
    batched dot (a vmapped operand gains a dimension the unbatched shapes do not show); where that
    cannot be told (nested or ragged vmaps, operands of two vmaps), True on CPU: widening is exact.

    Args:
      lhs: the lhs value (an array or a tracer).
      rhs: the rhs value.
      dimension_numbers: as for ``lax.dot_general``, on the unbatched shapes.

    Returns:
      True when the operands must reach the dot as float32.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle.ops import _core
      >>> a, b = jnp.ones((16, 4), jnp.bfloat16), jnp.ones((2, 16, 3), jnp.bfloat16)
      >>> _core.dot_needs_widening(a, b[0], (((0,), (0,)), ((), ())))
      False
      >>> jax.vmap(lambda y: _core.dot_needs_widening(a, y, (((0,), (0,)), ((), ()))))(b) or True
      True
    """
    if not _on_cpu():
        return False
    bl, br = _vmapped(lhs), _vmapped(rhs)
    if not (bl or br):
        return narrow_dot_needs_widening(np.ndim(lhs), np.ndim(rhs), dimension_numbers)
    if bl and br and lhs._trace is not rhs._trace:
        return True
    lv, rv = (lhs.val if bl else lhs), (rhs.val if br else rhs)
    lbd, rbd = (lhs.batch_dim if bl else None), (rhs.batch_dim if br else None)
    if _vmapped(lv) or _vmapped(rv) or not all(d is None or isinstance(d, int) for d in (lbd, rbd)):
        return True
    if lbd is None and rbd is None:
        return narrow_dot_needs_widening(np.ndim(lv), np.ndim(rv), dimension_numbers)
    try:
        dn, _ = _batch_dim_nums((np.ndim(lv), np.ndim(rv)), (lbd, rbd), dimension_numbers)
    except Exception:  # pragma: no cover - a JAX whose batching rule differs: widen (exact)
        return True
    return narrow_dot_needs_widening(np.ndim(lv), np.ndim(rv), dn)


try:
    from jax._src.lax.lax import _dot_general_batch_dim_nums as _batch_dim_nums
except ImportError:  # pragma: no cover - a JAX without it: vmapped narrow dots widen on CPU

    def _batch_dim_nums(*_: Any) -> Any:
        raise NotImplementedError


def contraction_dot_general(
    precision: Any = None, vmapped: str | None = None
) -> Callable[..., Any]:
    """A ``lax.dot_general`` for contractions built on it (``jnp.einsum``'s ``_dot_general``): narrow
    operands go to the dot as they are, or widened exactly to float32 (at ``precision``) where
    ``dot_needs_widening`` says XLA:CPU needs it. ``vmapped``: the contraction's operands are being
    batched by ``jax.vmap`` where this dot cannot see it (inside ``jnp.einsum``'s own jit, which vmap
    batches as a whole): ``"leading"`` when every vmapped dimension is the operand's first (vmap's
    default), so it becomes a leading batch dimension or a free one; ``"other"`` otherwise, where
    every narrow dot is widened (exact)."""

    def needs(lhs: Any, rhs: Any, dn: Any) -> bool:
        if vmapped is None or not _on_cpu():
            return dot_needs_widening(lhs, rhs, dn)
        if vmapped != "leading":
            return True
        (lc, rc), (lb, rb) = dn  # the worst placement: the vmapped dimension a new free one of rhs
        rhs_free = np.ndim(rhs) - len(rc) - len(rb) + 1
        in_order = list(lb) == sorted(lb) and _leading(rb)
        return not _contracts_trailing(np.ndim(lhs), lc) and (rhs_free > 1 or not in_order)

    def dot_general(lhs: Any, rhs: Any, dimension_numbers: Any, *args: Any, **kwargs: Any) -> Any:
        narrow = {D.kind(np.dtype(lhs.dtype)), D.kind(np.dtype(rhs.dtype))} == {"f"} and min(
            np.dtype(lhs.dtype).itemsize, np.dtype(rhs.dtype).itemsize
        ) < 4
        if narrow and needs(lhs, rhs, dimension_numbers):
            f32 = np.dtype(np.float32)
            lhs, rhs = (
                cast(lhs, max(np.dtype(lhs.dtype), f32, key=lambda d: d.itemsize)),
                cast(rhs, max(np.dtype(rhs.dtype), f32, key=lambda d: d.itemsize)),
            )
            if precision is not None and kwargs.get("precision") is None and not args:
                kwargs["precision"] = precision
        return lax.dot_general(lhs, rhs, dimension_numbers, *args, **kwargs)

    return dot_general


def _vmapped(x: Any) -> bool:
    """Whether ``x`` is being batched by ``jax.vmap`` (the dot then gains a dimension heddle's trace
    does not see)."""
    return _BatchTracer is not None and isinstance(x, _BatchTracer)


try:
    from jax._src.interpreters.batching import BatchTracer as _BatchTracer
except ImportError:  # pragma: no cover - a JAX without it: no vmap-specific lowering
    _BatchTracer = None
try:
    from jax._src.interpreters.ad import JVPTracer, LinearizeTracer

    _AD_TRACERS: tuple[type, ...] = (JVPTracer, LinearizeTracer)
except ImportError:  # pragma: no cover - a JAX without them: no gradient-specific lowering
    _AD_TRACERS = ()


def _differentiated(x: Any) -> bool:
    """Whether ``x`` is being differentiated (``jax.grad``, ``jax.vjp``, ``jax.jvp`` traced it)."""
    return bool(_AD_TRACERS) and isinstance(x, _AD_TRACERS)


def matmul_on_cpu(a: Any, b: Any, **kwargs: Any) -> jax.Array:
    """``jnp.matmul`` of narrow float operands with a float32 result, laid out for XLA:CPU.

    The same float32-accumulated dot; only the layout of a weight being differentiated changes, so
    that XLA:CPU's library path takes the dots of the backward pass and the weight gradient's dot
    has the orientation XLA:CPU runs faster (``python benchmarks/bench_contractions.py``). An
    unbatched weight ``b`` (rank 2) under ``jax.grad``/``jax.vjp`` enters the dot transposed (its
    gradient is then computed as ``[n, k]`` and transposed after its rounding) when the lhs has
    rank > 2 or is batched by ``jax.vmap`` (XLA:CPU would otherwise fold the gradient's transpose
    into a dot with both operands transposed, a slow loop), or when ``b`` has more rows than
    columns. Otherwise, and always in a forward pass alone (where the transposed weight would cost
    XLA:CPU float32 copies of both operands), it is ``jnp.matmul`` unchanged. A function traced
    before it is differentiated (``jax.grad`` of a ``jax.jit``-compiled function, heddle.autodiff)
    sees no gradient here and keeps ``jnp.matmul``'s layout.

    Args:
      a: the lhs.
      b: the rhs.
      **kwargs: ``preferred_element_type`` and ``precision``, as for ``jnp.matmul``.

    Returns:
      ``jnp.matmul(a, b, **kwargs)``'s value and dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.ops import _core
      >>> a, b = jnp.ones((2, 3, 4), jnp.bfloat16), jnp.ones((4, 5), jnp.bfloat16)
      >>> _core.matmul_on_cpu(a, b, preferred_element_type=jnp.float32).shape
      (2, 3, 5)
    """
    if transposes_weight_on_cpu(a, b) and not set(kwargs) - {"preferred_element_type", "precision"}:
        return lax.dot_general(a, b.T, (((a.ndim - 1,), (1,)), ((), ())), **kwargs)
    return jax.numpy.matmul(a, b, **kwargs)


def transposes_weight_on_cpu(a: Any, b: Any) -> bool:
    """Whether ``a @ b`` (narrow operands, float32 result) feeds the weight ``b`` to XLA:CPU's dot
    transposed, as ``matmul_on_cpu`` says; heddle.autocast asks the same of every such dot."""
    return (
        np.ndim(b) == 2
        and np.ndim(a) >= 2
        and _differentiated(b)
        and not _vmapped(b)
        and (np.ndim(a) > 2 or _vmapped(a) or b.shape[0] > b.shape[1])
    )


def tensordot_on_cpu(a: Any, b: Any, axes: Any = 2, **kwargs: Any) -> jax.Array:
    """``jnp.tensordot`` of narrow float operands with a float32 result, decided dot by dot on
    XLA:CPU: the operands stay narrow unless ``narrow_dot_needs_widening`` says the dot has no narrow
    kernel (``axes=([0], [2])``), where they are widened exactly. The same value either way.

    Args:
      a: the lhs.
      b: the rhs.
      axes: as for ``jnp.tensordot``.
      **kwargs: ``preferred_element_type`` and ``precision``.

    Returns:
      ``jnp.tensordot(a, b, axes, **kwargs)``'s value and dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.ops import _core
      >>> a, b = jnp.ones((4, 3), jnp.bfloat16), jnp.ones((2, 5, 4), jnp.bfloat16)
      >>> _core.tensordot_on_cpu(a, b, ([0], [2]), preferred_element_type=jnp.float32).shape
      (3, 2, 5)
    """
    # jnp.tensordot's own checks and axes normalisation (its errors are the user's): the program
    # is one dot_general of the two operands, whose dimension numbers are the ones to bind
    program = jax.make_jaxpr(lambda x, y: jax.numpy.tensordot(x, y, axes, **kwargs))(a, b).jaxpr
    (dot, *others) = [e for e in program.eqns if e.primitive.name == "dot_general"] or [None]
    if dot is None or others or dot.invars[:2] != program.invars or dot.outvars != program.outvars:
        return jax.numpy.tensordot(a, b, axes, **kwargs)  # pragma: no cover - another JAX's form
    dn = dot.params["dimension_numbers"]
    return contraction_dot_general(kwargs.get("precision"))(a, b, dn, **kwargs)


CPU_LOWERINGS: dict[Callable[..., Any], Callable[..., Any]] = {
    jax.numpy.matmul: matmul_on_cpu,
    jax.numpy.linalg.matmul: matmul_on_cpu,
    jax.numpy.tensordot: tensordot_on_cpu,
}
"""JAX functions heddle's narrow contractions call through a CPU-specific arrangement instead."""


def contraction_operand_dtype(common: np.dtype, acc: np.dtype, widen: bool) -> np.dtype:
    """The dtype a contraction's operands (of promotion ``common``, accumulating in ``acc``) are fed
    to the dot in: ``common``, or ``acc`` for sub-byte integers and floats (XLA cannot widen them
    inside a dot) and, where ``widen`` (``widens_narrow_contractions(name)``), for narrow floats."""
    k = D.kind(common)
    if k in "iu" and int(D.iinfo(common).bits) < 8:
        return acc
    if k == "f" and int(D.finfo(common).bits) < 8:
        return acc
    if k == "f" and common.itemsize < 4 and widen:
        return acc
    return common


def available_int_acc(d: np.dtype, result: np.dtype, acc: np.dtype, p: Policy) -> np.dtype:
    """The accumulation dtype of a reduction of ``d`` into an explicit ``result``, one JAX can hold.

    POLICY.md 4 accumulates in the promotion ``acc`` of the input's and the result's accumulation
    dtypes. For two integers that promotion can be int64 (int32 with uint32, as in
    ``sum(int8, dtype=uint8)``), which JAX lacks while ``jax_enable_x64`` is off. Then the op
    accumulates in the input's own accumulation dtype: it holds every input value exactly, and
    sums, products and scans in 32-bit two's complement are exact modulo 2**32, so a result of at
    most 32 bits (which wraps to its width anyway) gets the same value from either 32-bit
    accumulator, and a mean (divided after the sum) is that of the exact input values.

    Args:
      d: the input's dtype (the promotion of the operands).
      result: the result dtype.
      acc: the accumulation dtype POLICY.md 4 gives.
      p: the policy.

    Returns:
      ``acc``, or the input's accumulation dtype where ``acc`` is an unavailable 64-bit integer.

    Examples:
      >>> import numpy as np
      >>> from heddle.ops import _core
      >>> from heddle.policy._policy import active
      >>> i8, u8, i32, i64 = map(np.dtype, ("int8", "uint8", "int32", "int64"))
      >>> _core.available_int_acc(i8, u8, i64, active())  # without jax_enable_x64
      dtype('int32')
    """
    if D.x64_enabled() or D.kind(acc) not in "iu" or not D.is_64bit(acc):
        return acc
    own = _rules.acc_dtype(d, p)
    if D.kind(own) in "biu" and not D.is_64bit(own) and not D.is_64bit(result):
        return own
    return acc


def _result_and_compute(spec: OpSpec, common: np.dtype, dtype_arg: Any, p: Policy, widen: bool):
    """(result dtype, dtype the operands are converted to, compute dtype, accumulation dtype)."""
    if spec.plan is Plan.ACC_DTYPE:
        if spec.op_class is OpClass.REDUCTION:
            result, acc = _rules.reduction_dtypes(common, dtype_arg, p)
        else:  # float-only ops that accumulate: mean, var, std, ...
            result = (
                _rules.result_dtype(spec.op_class, common, policy=p)
                if dtype_arg is None
                else D.dtype(dtype_arg)
            )
            acc = _rules.reduction_dtypes(common, result, p)[1]
        acc = available_int_acc(common, result, acc, p)
        return result, acc, acc, acc
    if spec.plan is Plan.PREFERRED:  # accumulates in the wider of the input's and result's acc
        result, acc = _rules.reduction_dtypes(common, dtype_arg, p)
        acc = available_int_acc(common, result, acc, p)
        return result, common, contraction_operand_dtype(common, acc, widen), acc
    if dtype_arg is not None:  # dtype= sets the result: operands convert to it directly, once
        result = dtype_arg
    else:
        result = _rules.result_dtype(spec.op_class, common, policy=p)
    if spec.op_class is OpClass.INDEX or (
        spec.op_class is OpClass.SELECTION and spec.plan is not Plan.UPCAST
    ):  # orders (argmax, sort) and copies: an exact widening only where JAX's order needs one
        return result, common, order_dtype(common), None
    if spec.op_class is OpClass.COMPARISON:
        return result, common, common, None
    comp = compute_dtype(result, p) if spec.plan is Plan.UPCAST else result
    return result, result, comp, None


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_EAGER = object()  # marks an op that cannot run as one jitted kernel
_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "default": None}


def _is_value(x: Any) -> bool:
    """Whether an argument at a value operand's place is a value (not None, not a mode string such
    as ``interp``'s ``left="extrapolate"``)."""
    return x is not None and not isinstance(x, str)


def _split(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]):
    """(value operands, template): the template holds every other argument and where values go."""
    if spec.values == "all" and not kwargs and not any(a is None for a in args):
        return args, ((tuple(range(len(args))), (), None), (None,) * len(args), ())
    seq = 0 if spec.values == "seq" else spec.sequence
    if spec.values == "all":
        pos = range(len(args))
    else:
        pos = [i for i in (() if spec.values == "seq" else spec.values) if i < len(args)]
    pos = tuple(i for i in pos if _is_value(args[i]) and i != seq)
    kws = tuple(k for k in spec.value_kwargs if _is_value(kwargs.get(k)))
    operands = tuple(args[i] for i in pos) + tuple(kwargs[k] for k in kws)
    if seq is not None and seq < len(args):
        items = tuple(args[seq])
        operands, seqs = operands + items, (seq, len(items))
    else:
        seqs = None
    skeleton = tuple(None if i in pos or (seqs and i == seq) else a for i, a in enumerate(args))
    rest = tuple((k, v) for k, v in kwargs.items() if k not in kws)
    return operands, ((pos, kws, seqs), skeleton, rest)


def _rebuild(template: tuple, values: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    (pos, kws, seqs), skeleton, rest = template
    args = list(skeleton)
    n = len(pos) + len(kws)
    for i, v in zip(pos, values[: len(pos)], strict=True):
        args[i] = v
    kwargs = dict(rest)
    kwargs.update(zip(kws, values[len(pos) : n], strict=True))
    if seqs is not None:
        args[seqs[0]] = list(values[n:])
    return tuple(args), kwargs


def _vmap_placement(values: Sequence[Any]) -> str | None:
    """None when no value is being vmapped; ``"leading"`` when each vmapped one is vmapped along its
    first axis (nested vmaps too); ``"other"`` otherwise."""
    dims = []
    for v in values:
        while _vmapped(v):
            dims.append(v.batch_dim)
            v = v.val
    if not dims:
        return None
    return "leading" if all(d == 0 for d in dims) else "other"


def _field(plan: tuple, k: int, i: int) -> Any:
    """Field ``k`` of ``plan`` for value operand ``i``: an op with ``own_dtypes`` has one per operand."""
    f = plan[k]
    return f[i] if isinstance(f, tuple) else f


def _run(spec: OpSpec, plan: tuple, template: tuple, values: Sequence[Any]) -> Any:
    """Steps 2-4: convert explicitly, call JAX with the accumulation dtype, round once."""
    _, result, to, comp, acc, precision, _ = plan
    if spec.own_dtypes:  # each operand to its own compute dtype; output i back to operand i's dtype
        vals = [cast(cast(v, to[i]), comp[i]) for i, v in enumerate(values)]
        args, kwargs = _rebuild(template, vals)
        out = spec.fn(*args, **kwargs)
        return type(out)(_round_output(o, r) for o, r in zip(out, result, strict=True))
    vals = [cast(cast(v, to), comp) for v in values]
    args, kwargs = _rebuild(template, vals)
    if spec.plan is Plan.ACC_DTYPE:
        kwargs["dtype"] = acc
    elif spec.plan is Plan.PREFERRED:
        kwargs["preferred_element_type"] = acc
        if precision is not None and kwargs.get("precision") is None:
            kwargs["precision"] = precision
        if comp.itemsize < 4 and _takes_dot_general(spec.fn):  # einsum: decide dot by dot
            prec = _PRECISION[active().float32_matmul_precision]
            kwargs["_dot_general"] = contraction_dot_general(prec, _vmap_placement(vals))
        if D.kind(comp) == "f" and comp.itemsize < 4 and spec.fn in CPU_LOWERINGS and _on_cpu():
            return _round_output(CPU_LOWERINGS[spec.fn](*args, **kwargs), result)
    out = spec.fn(*args, **kwargs)
    return jax.tree.map(lambda o: _round_output(o, result), out)


@functools.cache
def _takes_dot_general(fn: Callable[..., Any]) -> bool:
    try:
        return "_dot_general" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _output_dtype(out: np.dtype, result: np.dtype) -> np.dtype:
    """The dtype one output of an op is rounded to: the result dtype, adapted to the output's kind.

    An op with several outputs, or one whose output kind differs from its inputs', keeps the kind JAX
    gives: a real output of a complex op (``angle``) takes the real part of the result dtype, a
    complex output of a real op (``sort_complex``) its complex counterpart, and an integer output of
    a float op (``frexp``'s exponent) the policy's index dtype.
    """
    k, kr = D.kind(out), D.kind(result)
    if k == kr or k == "b":
        return result if k == kr else out
    if k == "f" and kr == "c":
        return D.real_dtype(result)
    if k == "c" and kr == "f":
        return _scalars._complex_of(result)
    if k in "iu" and kr in "fc":
        return active().index_dtype
    return result


def _round_output(o: Any, result: np.dtype) -> Any:
    d = _output_dtype(np.dtype(o.dtype), result)
    return o if o.dtype == d else cast(o, d)


def _kernel(spec: OpSpec, plan: tuple, template: tuple) -> Callable[..., Any]:
    return jax.jit(lambda *values: _run(spec, plan, template, values))


@functools.lru_cache(maxsize=16384)
def _range_checked(value: Any, d: np.dtype, p: Policy, typed: np.dtype | None) -> bool:
    _scalars._check_range(value, d, p, typed)
    return True


def _check_scalars(operands: Sequence[Any], sigs: tuple, plan: tuple, p: Policy) -> None:
    """Range checks of POLICY.md 3 for the Python scalars (and concrete weak values) in a call."""
    for i, (x, sig) in enumerate(zip(operands, sigs, strict=True)):
        common, typed = _field(plan, 0, i), _field(plan, -1, i)
        if isinstance(sig, type):
            for value in _fill_values(x) or (x,):
                _range_checked(value, common, p, typed)
        elif sig is not None and sig[1]:  # a weakly typed array: its known values, if any
            for value in _scalars._concrete(x):
                _range_checked(value, common, p, typed)


def _fast_key(x: Any) -> Any:
    """What a repeated eager call's plan and kernel depend on, cheaply: a Python scalar's type, or an
    array's (type, dtype, weak type); AttributeError for anything else (host data)."""
    t = type(x)
    return t if t in _REPRESENTATIVE else (t, x.dtype, x.weak_type)


class _Fast(NamedTuple):
    """A call shape seen before: everything ``op`` needs to skip straight to the kernel."""

    policy: Policy
    plan: tuple
    kernel: Callable[..., Any]
    values: tuple[int, ...] | None  # positions of the value operands in ``args`` (None: all)
    scalars: tuple[int, ...]  # which values are Python scalars (range-checked and materialised)
    memo: dict[tuple, Any]  # (type, value) of a nonzero Python scalar -> its checked NumPy value

    def scalar(self, p: Policy, v: Any, i: int) -> Any:
        """The Python scalar value operand ``i`` range-checked and materialised (memoised but for
        zeros, whose sign ``==`` does not see)."""
        key = (i, type(v), v) if v else None
        out = self.memo.get(key)
        if out is None:
            if p.check_scalar_range:
                _range_checked(v, _field(self.plan, 0, i), p, _field(self.plan, -1, i))
            out = materialise(v, _field(self.plan, 2, i))
            if key is not None and len(self.memo) < 64:
                self.memo[key] = out
        return out


CACHE_LIMIT = 4096
"""How many entries one op's call cache holds before it starts again (a bound on memory)."""


def remember(cache: dict, key: Any, value: Any) -> Any:
    """Stores ``value`` under ``key`` in one of an op's call caches, emptying it first when full."""
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def make_op(name: str, spec: OpSpec) -> Callable[..., Any]:
    """Builds the public function for ``spec`` with the signature of ``spec.fn``."""
    if spec.plan is Plan.PASS:
        return spec.fn
    from heddle.ops._table import OWN_DTYPES  # here: _table reads Plan from this module

    if name in OWN_DTYPES and not spec.own_dtypes:
        spec = dataclasses.replace(spec, own_dtypes=True)
    spec = with_value_names(spec)

    dtype_kw = {Plan.ACC_DTYPE: "dtype", Plan.PREFERRED: "preferred_element_type"}.get(spec.plan)
    if dtype_kw is None and spec.op_class not in (OpClass.INDEX, OpClass.COMPARISON):
        dtype_kw = "dtype" if "dtype" in _parameters(spec.fn) else None  # dtype= sets the result
    # (id(policy), signatures, dtype=, x64) -> (policy, dtype plan, {template: jitted steps 2-4});
    # policies are interned (heddle.policy.use), so equal policies share one id
    plans: dict[tuple, tuple] = {}
    # eager calls seen before (no value operand None, weak-typed or host data; no value keyword):
    # (id(policy), x64, argument keys) -> _Fast, so a repeat costs one lookup and one dispatch
    fast: dict[tuple, _Fast] = {}
    positions = frozenset(spec.values) if isinstance(spec.values, tuple) else None
    # how many leading positional arguments are all value operands
    lead = (
        math.inf
        if spec.values == "all"
        else next((i for i in range(len(spec.values) + 1) if i not in (positions or ())), 0)
    )

    def general_key(p: Policy, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
        if spec.values == "seq" or spec.sequence is not None:
            return None
        if any(k in kwargs for k in spec.value_kwargs):
            return None
        parts = [
            _fast_key(a) if positions is None or i in positions else (type(a), a)
            for i, a in enumerate(args)
        ]
        parts += [(k, type(v), v) for k, v in kwargs.items()]
        return (id(p), D.x64_enabled(), *parts)

    @functools.wraps(spec.fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        p = active()
        try:
            if not kwargs and len(args) <= lead:
                key = (id(p), D.x64_enabled(), *map(_fast_key, args))
            else:
                key = general_key(p, args, kwargs)
            hit = fast.get(key)
        except (AttributeError, TypeError):  # host data; an unhashable static argument
            key = hit = None
        if hit is None or hit.policy is not p:
            return slow(p, key, args, kwargs)
        values = args if hit.values is None else [args[i] for i in hit.values]
        if hit.scalars:
            values = list(values)
            for i in hit.scalars:
                values[i] = hit.scalar(p, values[i], i)
        return hit.kernel(*values)

    def slow(p: Policy, key_: tuple | None, args: tuple, kwargs: dict[str, Any]) -> Any:
        dtype_arg = kwargs.pop(dtype_kw, None) if dtype_kw and kwargs else None
        operands, template = _split(spec, args, kwargs)
        sigs = tuple(map(_signature, operands))
        if None in sigs and spec.op_class is OpClass.SELECTION:  # copies writing fill values
            sigs = tuple(
                _fill_signature(x) if s is None else s for x, s in zip(operands, sigs, strict=True)
            )
        if None in sigs:  # nested lists and other host data: make them arrays first
            from heddle.ops._creation import asarray

            operands = tuple(
                x if s is not None else asarray(x) for x, s in zip(operands, sigs, strict=True)
            )
            sigs = tuple(map(_signature, operands))
        key = (id(p), sigs, dtype_arg, D.x64_enabled(), widens_narrow_contractions(name))
        hit = plans.get(key)
        if hit is None or hit[0] is not p:
            d_arg = None if dtype_arg is None else D.dtype(dtype_arg)
            hit = remember(plans, key, (p, _plan(spec, p, sigs, d_arg, *key[3:]), {}))
        _, plan, kernels = hit
        if p.check_scalar_range and any(type(s) is not tuple or s[1] for s in sigs):
            _check_scalars(operands, sigs, plan, p)
        values = [materialise(v, _field(plan, 2, i)) for i, v in enumerate(operands)]
        if any(isinstance(v, jax.core.Tracer) for v in values):
            return _run(spec, plan, template, values)
        try:
            kernel = kernels.get(template)
            if kernel is None:
                kernel = kernels[template] = _kernel(spec, plan, template)
        except TypeError:  # an unhashable static argument (an array passed as axis=, ...)
            return _run(spec, plan, template, values)
        if kernel is _EAGER:
            return _run(spec, plan, template, values)
        try:
            out = kernel(*values)
        except jax.errors.ConcretizationTypeError:  # a data-dependent shape (nonzero, ...)
            kernels[template] = _EAGER
            return _run(spec, plan, template, values)
        if key_ is not None and all(type(s) is not tuple or not s[1] for s in sigs):
            pos = template[0][0]
            pos = None if tuple(pos) == tuple(range(len(args))) and not kwargs else pos
            scalars = tuple(i for i, s in enumerate(sigs) if type(s) is not tuple)
            remember(fast, key_, _Fast(p, plan, kernel, pos, scalars, {}))  # (weak: range checks)
        return out

    op.__doc__ = _doc(name, spec, spec.fn)
    return op


def _parameters(fn: Callable[..., Any]) -> Any:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return {}


def _doc(name: str, spec: OpSpec, fn: Callable[..., Any]) -> str:
    dtypes = {
        OpClass.ARITHMETIC: "result: promotion of the operands",
        OpClass.COMPARISON: "result: bool",
        OpClass.INDEX: "result: int32",
        OpClass.FLOAT_ONLY: "result: a float input's dtype; integer/bool input gives the default float",
        OpClass.INTEGRAL: "result: the input dtype",
        OpClass.SELECTION: "result: the input dtype, values copied bit-exactly",
        OpClass.REDUCTION: "result: a float input's dtype, integer/bool input its accumulation dtype",
    }.get(spec.op_class, "")
    acc = {
        Plan.UPCAST: "computed in float32 for narrow floats, rounded once",
        Plan.ACC_DTYPE: "accumulates in acc_dtype, rounded once",
        Plan.PREFERRED: "accumulates in acc_dtype via preferred_element_type, rounded once",
        Plan.NATIVE: "no arithmetic beyond the explicit conversion",
    }.get(spec.plan, "")
    return (
        f"heddle's policy version of ``jax.numpy.{name}``.\n\n"
        f"Dtypes: {dtypes}; {acc} (POLICY.md 4-5). Arguments are those of jax.numpy.{name}.\n\n"
        f"Args:\n  *args: as for jax.numpy.{name}.\n  **kwargs: as for jax.numpy.{name}.\n\n"
        f"Returns:\n  The result of jax.numpy.{name} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.numpy as hnp\n  >>> hnp.{name}  # doctest: +ELLIPSIS\n  <function ...>\n\n"
        f"Original documentation follows.\n\n{fn.__doc__ or ''}"
    )
