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

Two modules hold what the mechanism calls on: ``heddle/ops/_scalars.py`` reads the operands'
signatures and rounds Python scalars on the host, and ``heddle/ops/lowering.py`` is the conversion
(``cast``) and how a narrow contraction reaches each backend's dot.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from heddle.ops import lowering
from heddle.ops._scalars import (
    REPRESENTATIVE,
    fill_signature,
    fill_values,
    materialise,
    range_checked,
    representative,
    signature,
)
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _lattice, _rules, _scalars
from heddle.policy._policy import Policy, active
from heddle.policy._rules import OpClass


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
      params: hyper-parameters, each as (name, position or None) (``quantile``'s ``q``,
        ``_table.HYPER_PARAMS``): they do not take part in promotion; a narrow float array is
        widened exactly to the compute dtype, anything else (a Python scalar) passed on unrounded.
        ``with_value_names`` fills the positions from ``spec.fn``'s signature.
    """

    fn: Callable[..., Any]
    op_class: OpClass
    plan: Plan
    values: tuple[int, ...] | str = "all"
    value_kwargs: tuple[str, ...] = ()
    sequence: int | None = None
    own_dtypes: bool = False
    params: tuple[tuple[str, int | None], ...] = ()


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
    where = {q.name: i for i, q in enumerate(positional)}
    hyper = tuple((n, where.get(n)) for n, _ in spec.params)
    return dataclasses.replace(spec, values=values, value_kwargs=tuple(names), params=hyper)


def compute_dtype(d: np.dtype, p: Policy) -> np.dtype:
    """The dtype an UPCAST op computes in: the accumulation dtype for floats, ``d`` otherwise."""
    return _rules.acc_dtype(d, p) if D.kind(d) == "f" else d


def order_dtype(d: np.dtype) -> np.dtype:
    """The dtype an order op (max, min, argmax, ...) runs in: ``d``, or float32 for a float format
    with no negative values (``float8_e8m0fnu``), where JAX's -inf/+inf starting value is NaN.
    The widening is exact, so the values selected are ``d``'s."""
    values = _lattice.finite_values(d) if D.kind(d) == "f" else None
    return np.dtype(np.float32) if values is not None and values[0] > 0 else d


@functools.lru_cache(maxsize=8192)
def _plan(spec: OpSpec, p: Policy, sigs: tuple, dtype_arg: Any, x64: bool, widen: bool) -> tuple:
    if spec.own_dtypes:  # one plan per operand; each field of the plan becomes a tuple of them
        alone = dataclasses.replace(spec, own_dtypes=False)
        per = [_plan(alone, p, (s,), dtype_arg, x64, widen) for s in sigs]
        return tuple(zip(*per, strict=True)) if per else (None,) * 7
    operands = tuple(representative(s) for s in sigs)
    common = _scalars.resolve(operands, p, check=False)  # the representatives are not the values
    typed_dtypes = [o for o in operands if isinstance(o, np.dtype)]
    typed = _scalars.resolve(tuple(typed_dtypes), p) if typed_dtypes else None
    dtypes = _result_and_compute(spec, common, dtype_arg, p, widen)
    for d in set(dtypes) - {None}:
        D.require_available(d, f"heddle.numpy.{getattr(spec.fn, '__name__', 'op')}")
    precision = (
        lowering.PRECISION[p.float32_matmul_precision]
        if spec.plan is Plan.PREFERRED and dtypes[2] == np.float32
        else None
    )
    return (common, *dtypes, precision, typed)


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
        return result, common, lowering.contraction_operand_dtype(common, acc, widen), acc
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
    if spec.params:
        args, kwargs = _widen_params(spec, args, kwargs, comp)
    fn = spec.fn
    if spec.plan is Plan.ACC_DTYPE:
        kwargs["dtype"] = acc
    elif spec.plan is Plan.PREFERRED:
        kwargs["preferred_element_type"] = acc
        if precision is not None and kwargs.get("precision") is None:
            kwargs["precision"] = precision
        fn = lowering.contraction(spec.fn, comp, vals)  # the backend's arrangement of the dot
    out = fn(*args, **kwargs)
    return jax.tree.map(lambda o: _round_output(o, result), out)


def _widen_params(
    spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], comp: np.dtype
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The hyper-parameters given as narrow float arrays, widened exactly to ``comp``."""
    listed = list(args)
    wide = D.real_dtype(comp) if D.kind(comp) == "c" else comp

    def widen(v: Any) -> Any:
        d = getattr(v, "dtype", None)
        if d is None or D.kind(np.dtype(d)) != "f" or np.dtype(d).itemsize >= wide.itemsize:
            return v
        return jax.lax.convert_element_type(v, wide)

    for name, i in spec.params:
        if name in kwargs:
            kwargs[name] = widen(kwargs[name])
        elif i is not None and i < len(listed):
            listed[i] = widen(listed[i])
    return tuple(listed), kwargs


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


def _check_scalars(operands: Sequence[Any], sigs: tuple, plan: tuple, p: Policy) -> None:
    """Range checks of POLICY.md 3 for the Python scalars (and concrete weak values) in a call."""
    for i, (x, sig) in enumerate(zip(operands, sigs, strict=True)):
        common, typed = _field(plan, 0, i), _field(plan, -1, i)
        if isinstance(sig, type):
            for value in fill_values(x) or (x,):
                range_checked(value, common, p, typed)
        elif sig is not None and sig[1]:  # a weakly typed array: its known values, if any
            for value in _scalars._concrete(x):
                range_checked(value, common, p, typed)


def _fast_key(x: Any) -> Any:
    """What a repeated eager call's plan and kernel depend on, cheaply: a Python scalar's type, or an
    array's (type, dtype, weak type); AttributeError for anything else (host data)."""
    t = type(x)
    return t if t in REPRESENTATIVE else (t, x.dtype, x.weak_type)


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
                range_checked(v, _field(self.plan, 0, i), p, _field(self.plan, -1, i))
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
    """Builds the public function for ``spec`` with the signature of ``spec.fn``.

    A call is the module's recipe, one step per function: split the arguments into value operands
    and the rest (``_split``); read what the dtypes depend on (``_signatures``); resolve the dtypes,
    once per signature (``_resolve``); range-check the Python scalars and round each once on the host
    (``_scalar_values``); then convert explicitly, call JAX with the accumulation dtype and round
    once (``_run``), as one jitted kernel per template (``_execute``). A call shape seen before goes
    straight to its kernel (``_Fast``, stored by ``_shortcut``).

    Args:
      name: the op's name in its namespace (``"sum"``, ``"linalg.matmul"``).
      spec: what the op is (``OpSpec``).

    Returns:
      The op, or ``spec.fn`` itself for a pass-through (``Plan.PASS``).
    """
    if spec.plan is Plan.PASS:
        return spec.fn
    spec = _complete(name, spec)
    dtype_kw = _dtype_keyword(spec)
    positions, lead = _value_positions(spec)
    # (id(policy), signatures, dtype=, x64, widen) -> (policy, dtype plan, {template: jitted steps
    # 2-4}); policies are interned (heddle.policy.use), so equal policies share one id
    plans: dict[tuple, tuple] = {}
    # eager calls seen before (no value operand None, weak-typed or host data; no value keyword):
    # (id(policy), x64, argument keys) -> _Fast, so a repeat costs one lookup and one dispatch
    fast: dict[tuple, _Fast] = {}

    @functools.wraps(spec.fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        p = active()
        try:
            if not kwargs and len(args) <= lead:
                key = (id(p), D.x64_enabled(), *map(_fast_key, args))
            else:
                key = _general_key(spec, positions, p, args, kwargs)
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

    def slow(p: Policy, key: tuple | None, args: tuple, kwargs: dict[str, Any]) -> Any:
        dtype_arg = kwargs.pop(dtype_kw, None) if dtype_kw and kwargs else None
        operands, template = _split(spec, args, kwargs)
        operands, sigs = _signatures(spec, operands)
        plan, kernels = _resolve(plans, name, spec, p, sigs, dtype_arg)
        values = _scalar_values(p, plan, operands, sigs)
        out, kernel = _execute(spec, plan, template, values, kernels)
        if kernel is not None and key is not None:
            _shortcut(fast, key, p, plan, kernel, sigs, template, len(args), bool(kwargs))
        return out

    op.__doc__ = _doc(name, spec, spec.fn)
    return op


def _complete(name: str, spec: OpSpec) -> OpSpec:
    """``spec`` as its op runs it: each operand on its own dtype where the table says so
    (``_table.OWN_DTYPES``), and the value operands known by name and by position."""
    from heddle.ops._table import OWN_DTYPES  # here: _table reads Plan from this module

    if name in OWN_DTYPES and not spec.own_dtypes:
        spec = dataclasses.replace(spec, own_dtypes=True)
    return with_value_names(spec)


def _dtype_keyword(spec: OpSpec) -> str | None:
    """The keyword a caller's dtype comes by, taken out of the call before the split: the
    accumulating ops' ``dtype=``/``preferred_element_type=``, or a ``dtype=`` that sets the result;
    None for index and comparison ops."""
    kw = {Plan.ACC_DTYPE: "dtype", Plan.PREFERRED: "preferred_element_type"}.get(spec.plan)
    if kw is None and spec.op_class not in (OpClass.INDEX, OpClass.COMPARISON):
        kw = "dtype" if "dtype" in _parameters(spec.fn) else None  # dtype= sets the result
    return kw


def _value_positions(spec: OpSpec) -> tuple[frozenset[int] | None, float]:
    """(the positions of the value operands, None for all; how many leading positional arguments
    are all value operands: a call with no more than that and no keyword takes the quickest key)."""
    positions = frozenset(spec.values) if isinstance(spec.values, tuple) else None
    lead = (
        math.inf
        if spec.values == "all"
        else next((i for i in range(len(spec.values) + 1) if i not in (positions or ())), 0)
    )
    return positions, lead


def _general_key(
    spec: OpSpec, positions: frozenset[int] | None, p: Policy, args: tuple, kwargs: dict[str, Any]
) -> tuple | None:
    """The call-cache key of a call with keywords or static arguments: the value operands'
    ``_fast_key``, the static arguments and keywords by type and value; None for calls that always
    take the slow path (sequences of operands, value operands by keyword)."""
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


def _signatures(spec: OpSpec, operands: tuple) -> tuple[tuple, tuple]:
    """(operands, their signatures): what the dtypes depend on. A copy's fill values take their
    scalars' kind; other host data (nested lists) becomes an array first."""
    sigs = tuple(map(signature, operands))
    if None in sigs and spec.op_class is OpClass.SELECTION:  # copies writing fill values
        sigs = tuple(
            fill_signature(x) if s is None else s for x, s in zip(operands, sigs, strict=True)
        )
    if None in sigs:  # nested lists and other host data: make them arrays first
        from heddle.ops._creation import asarray

        operands = tuple(
            x if s is not None else asarray(x) for x, s in zip(operands, sigs, strict=True)
        )
        sigs = tuple(map(signature, operands))
    return operands, sigs


def _resolve(
    plans: dict, name: str, spec: OpSpec, p: Policy, sigs: tuple, dtype_arg: Any
) -> tuple[tuple, dict]:
    """Step 1: (the dtype plan of a call, the op's kernels for it), from the op's cache of plans or
    resolved by ``_plan``."""
    key = (id(p), sigs, dtype_arg, D.x64_enabled(), lowering.widens_narrow_contractions(name))
    hit = plans.get(key)
    if hit is None or hit[0] is not p:
        d_arg = None if dtype_arg is None else D.dtype(dtype_arg)
        hit = remember(plans, key, (p, _plan(spec, p, sigs, d_arg, *key[3:]), {}))
    return hit[1], hit[2]


def _scalar_values(p: Policy, plan: tuple, operands: tuple, sigs: tuple) -> list[Any]:
    """The value operands with the Python scalars range-checked (POLICY.md 3) and each rounded once,
    on the host, to the dtype its operand is converted to."""
    if p.check_scalar_range and any(type(s) is not tuple or s[1] for s in sigs):
        _check_scalars(operands, sigs, plan, p)
    return [materialise(v, _field(plan, 2, i)) for i, v in enumerate(operands)]


def _execute(
    spec: OpSpec, plan: tuple, template: tuple, values: Sequence[Any], kernels: dict
) -> tuple[Any, Callable[..., Any] | None]:
    """Steps 2-4 (``_run``) on the values: (the output, the kernel that computed it or None).

    Eagerly they run as the op's jitted kernel for this template, built on first use; under a trace
    they run inline, and so do calls with an unhashable static argument (an array passed as
    ``axis=``) and ops whose output shape depends on their data (``nonzero``)."""
    if any(isinstance(v, jax.core.Tracer) for v in values):
        return _run(spec, plan, template, values), None
    try:
        kernel = kernels.get(template)
        if kernel is None:
            kernel = kernels[template] = _kernel(spec, plan, template)
    except TypeError:  # an unhashable static argument (an array passed as axis=, ...)
        return _run(spec, plan, template, values), None
    if kernel is _EAGER:
        return _run(spec, plan, template, values), None
    try:
        return kernel(*values), kernel
    except jax.errors.ConcretizationTypeError:  # a data-dependent shape (nonzero, ...)
        kernels[template] = _EAGER
        return _run(spec, plan, template, values), None


def _shortcut(
    fast: dict,
    key: tuple,
    p: Policy,
    plan: tuple,
    kernel: Callable[..., Any],
    sigs: tuple,
    template: tuple,
    n_args: int,
    keywords: bool,
) -> None:
    """Stores the ``_Fast`` entry that sends repeats of a call straight to ``kernel``; none for a
    call with a weakly typed array, whose values each call range-checks."""
    if any(type(s) is tuple and s[1] for s in sigs):
        return
    pos = template[0][0]
    pos = None if tuple(pos) == tuple(range(n_args)) and not keywords else pos
    scalars = tuple(i for i, s in enumerate(sigs) if type(s) is not tuple)
    remember(fast, key, _Fast(p, plan, kernel, pos, scalars, {}))


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
