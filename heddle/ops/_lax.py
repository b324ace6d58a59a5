"""Policy versions of the ``jax.lax`` entry points that accumulate: contractions, reductions, scans.

Contractions (``dot_general``, ``dot``, the convolutions, ``batch_matmul``, ``ragged_dot``) convert
their operands to their promotion and accumulate through ``preferred_element_type=acc_dtype``,
float32 ones at ``Precision.HIGHEST`` unless the active policy's ``float32_matmul_precision`` says
otherwise; the result is the promotion (integer and bool: the accumulation dtype) or
``preferred_element_type`` when given, rounded once. Sums, products and their scans convert to the
accumulation dtype first; ``reduce`` and ``reduce_window`` do so when their computation is an add or a
multiply, and run a max or min of a narrow float on its exact float32 copy (so max-pooling's backward
sums in float32). ``scatter_add``/``scatter_sub``/``scatter_mul`` combine their updates in the
accumulation dtype; ``conv_general_dilated_local`` and ``conv_general_dilated_patches``, which have no
accumulation dtype of their own, run on exactly widened operands. The other selections (reduce_max,
reduce_min, cummax, cummin) copy values and pass through. The collective sums (``psum``, ``pmean``,
``psum_scatter``) add each leaf across devices in its accumulation dtype and round once, as
``heddle.autocast`` does: a bfloat16 payload travels as float32 (twice the bytes; ``jax.lax.psum``
itself is the narrow all-reduce, which the audit reports).

The elementwise transcendental functions (``exp`` ... ``zeta``) compute a narrow float in float32 and
round once, as heddle.numpy's do (``jax.lax``'s own run in the narrow dtype: ``lax.asinh`` of the
bfloat16 0.0078125 is 0.00778, ``lax.expm1`` of the float16 2e-7 is 2.4e-7); ``exp2``, ``asin``,
``sinh``, ``cosh``, ``erf_inv``, ``lgamma`` and ``digamma`` use heddle.numpy's formulas
(heddle/ops/_formulas.py, ``LAX``).

``LAX`` classifies the names that have a policy version; every other name of ``jax.lax`` is
re-exported unchanged by ``heddle.lax``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax

from heddle.ops import _nanprop, lowering
from heddle.ops._core import compute_dtype
from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast, contraction_operand_dtype
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._errors import message
from heddle.policy._policy import Policy, active
from heddle.policy._rules import OpClass

_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH}


def contraction_dtypes(
    lhs: Any, rhs: Any, preferred: Any, p: Policy, widen: bool | None = None
) -> tuple[np.dtype, np.dtype, np.dtype]:
    """(result, operand dtype, accumulation dtype) of a contraction of ``lhs`` and ``rhs``; ``widen``
    (default: ``lowering.widens_narrow_contractions()``) says whether narrow floats go to float32."""
    common = _scalars.resolve((lhs, rhs), p)
    result, acc = _rules.reduction_dtypes(common, preferred, p)
    if widen is None:
        widen = lowering.widens_narrow_contractions()
    return result, contraction_operand_dtype(common, acc, widen), acc


def _widens(name: str, a: dict[str, Any]) -> bool:
    """Whether the contraction ``name`` with bound arguments ``a`` widens narrow operands."""
    if name == "dot_general":  # dot by dot, from its dimension numbers (vmapped ones included)
        return lowering.dot_needs_widening(a["lhs"], a["rhs"], a["dimension_numbers"])
    return lowering.widens_narrow_contractions(name)


def _contraction(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> jax.Array:
        p = active()
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        widen = _widens(name, a)
        result, to, acc = contraction_dtypes(
            a["lhs"], a["rhs"], a.get("preferred_element_type"), p, widen
        )
        for d in {result, to, acc}:
            D.require_available(d, f"heddle.lax.{name}")
        a["lhs"] = cast(materialise(a["lhs"], to), to)
        a["rhs"] = cast(materialise(a["rhs"], to), to)
        a["preferred_element_type"] = acc
        if a.get("precision") is None and D.real_dtype(to) == np.float32:
            a["precision"] = _PRECISION.get(p.float32_matmul_precision)
        out = fn(*bound.args, **bound.kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


def _batch_matmul_impl(
    lhs: Any, rhs: Any, precision: Any = None, preferred_element_type: Any = None
) -> jax.Array:
    lhs, rhs = jax.numpy.asarray(lhs), jax.numpy.asarray(rhs)
    if lhs.ndim < 2 or lhs.ndim != rhs.ndim or lhs.shape[:-2] != rhs.shape[:-2]:
        raise ValueError(
            message(
                f"heddle.lax.batch_matmul of shapes {lhs.shape} and {rhs.shape}",
                "both operands need the same rank >= 2 and the same leading (batch) dimensions",
                "Broadcast the batch dimensions first (jnp.broadcast_to), or use "
                "heddle.numpy.matmul, which broadcasts.",
            )
        )
    batch = tuple(range(lhs.ndim - 2))
    dims = (((lhs.ndim - 1,), (rhs.ndim - 2,)), (batch, batch))
    return lax.dot_general(
        lhs, rhs, dims, precision=precision, preferred_element_type=preferred_element_type
    )


_batch_contraction = _contraction(_batch_matmul_impl, "batch_matmul")


@functools.wraps(lax.batch_matmul)
def batch_matmul(lhs: Any, rhs: Any, precision: Any = None) -> jax.Array:
    return _batch_contraction(lhs, rhs, precision)


def _accumulating(fn: Callable[..., Any], name: str, op_class: OpClass) -> Callable[..., Any]:
    """Sums, products and scans: operand to acc_dtype, ``fn`` there, round once to the result."""

    @functools.wraps(fn)
    def op(operand: Any, *args: Any, **kwargs: Any) -> jax.Array:
        p = active()
        d = _scalars.resolve((operand,), p)
        if op_class is OpClass.REDUCTION:
            result, comp = _rules.reduction_dtypes(d, None, p)
        else:
            result = _rules.result_dtype(op_class, d, policy=p)
            comp = compute_dtype(result, p)
        for x in {result, comp}:
            D.require_available(x, f"heddle.lax.{name}")
        first = result if op_class is OpClass.FLOAT_ONLY else d  # int -> default float first
        x = cast(cast(materialise(operand, d), first), comp)
        out = fn(x, *args, **kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


def _collective(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """psum / pmean / psum_scatter: every leaf of the pytree summed across devices in its
    accumulation dtype (one collective for the whole tree), rounded once to its result dtype."""

    @functools.wraps(fn)
    def op(x: Any, *args: Any, **kwargs: Any) -> Any:
        p = active()
        leaves, tree = jax.tree.flatten(x)
        plans = []
        for leaf in leaves:
            d = _scalars.resolve((leaf,), p)
            result, acc = _rules.reduction_dtypes(d, None, p)
            for t in {result, acc}:
                D.require_available(t, f"heddle.lax.{name}")
            plans.append((d, result, acc))
        wide = [
            cast(cast(materialise(v, d), d), acc)
            for v, (d, _, acc) in zip(leaves, plans, strict=True)
        ]
        out = jax.tree.leaves(fn(jax.tree.unflatten(tree, wide), *args, **kwargs))
        if name != "psum_scatter":  # a scattered sum is batched along its scattered axis
            axes = _axis_names(args[0] if args else kwargs.get("axis_name"))
            out = [_batched_like(o, w, axes) for o, w in zip(out, wide, strict=True)]
        return jax.tree.unflatten(
            tree,
            [o if o.dtype == r else cast(o, r) for o, (_, r, _) in zip(out, plans, strict=True)],
        )

    return op


def _axis_names(axis_name: Any) -> frozenset[Any]:
    return frozenset(axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,))


def _varying(x: jax.Array) -> frozenset[Any]:
    """The ``shard_map`` mesh axes ``x`` varies over (empty outside a checked ``shard_map``)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset(vma or ())


def _batched_like(out: jax.Array, wide: jax.Array, axes: frozenset[Any]) -> jax.Array:
    """``out`` exactly (``out - 0``, bit for bit, -0.0 and NaN included), made to depend on ``wide``.

    Under ``jax.vmap`` with the collective's ``axis_name``, JAX's batching rule returns the sum
    unbatched, and ``vmap`` broadcasts it over the batch only where it is used batched: after the
    rounding to the result dtype, so the transpose of that broadcast (the backward sum of every
    example's cotangent) would add in the narrow dtype. Subtracting a zero read from ``wide`` makes
    the accumulation-dtype sum batched before it is rounded: the broadcast, and so its transposed
    sum, is in the accumulation dtype. Elsewhere it is an exact no-op that XLA removes. Over the axes
    of a checked ``shard_map`` that ``wide`` varies over, the sum is invariant and must stay so (its
    backward is JAX's ``pvary``, which adds nothing): there ``out`` is returned as it is.
    """
    if wide.size == 0 or out.shape != wide.shape or axes & _varying(wide):
        return out
    first = lax.reshape(lax.slice(wide, (0,) * wide.ndim, (1,) * wide.ndim), ())
    zero = lax.convert_element_type(lax.bitwise_and(lax.ne(first, first), False), out.dtype)
    return lax.sub(out, lax.broadcast(lax.stop_gradient(zero), out.shape))


_MONOIDS = {"add": lax.add, "mul": lax.mul, "max": lax.max, "min": lax.min}


@functools.lru_cache(maxsize=256)
def _monoid_of(computation: Callable[..., Any], d: np.dtype) -> str | None:
    """The name of ``_MONOIDS`` that ``computation`` on two scalars of ``d`` exactly is, if any."""
    s = jax.ShapeDtypeStruct((), d)
    try:
        closed = jax.make_jaxpr(computation)(s, s)
    except Exception:  # not a binary scalar function we can read: treat as unknown
        return None
    jaxpr = closed.jaxpr
    if len(jaxpr.eqns) != 1 or len(jaxpr.outvars) != 1:
        return None
    eqn = jaxpr.eqns[0]
    if eqn.primitive.name not in _MONOIDS or set(eqn.invars) != set(jaxpr.invars):
        return None
    if eqn.outvars[0] is not jaxpr.outvars[0] or len(set(jaxpr.invars)) != 2:
        return None
    return eqn.primitive.name


def monoid(computation: Callable[..., Any], d: np.dtype) -> str | None:
    """The monoid (``"add"``, ``"mul"``, ``"max"``, ``"min"``) ``computation`` computes on ``d``."""
    try:
        return _monoid_of(computation, d)
    except TypeError:  # an unhashable callable
        return _monoid_of.__wrapped__(computation, d)


def _is_array(x: Any) -> bool:
    return hasattr(x, "dtype") or _scalars.scalar_kind(x) is not None


def _generic_reduce(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """lax.reduce / lax.reduce_window: accumulate in acc_dtype when the computation adds or multiplies.

    One operand with one init value whose computation is ``add`` or ``mul`` (read from its jaxpr) is
    converted to the accumulation dtype with its init value; the result has the reduction's dtype
    (a float keeps its dtype, integers and bool their accumulation dtype), rounded once. A ``max`` or
    ``min`` copies values: a narrow float runs on its exact float32 copy and the result is rounded
    back (exactly), so the backward pass (``select_and_scatter_add`` of max-pooling, the tie counts
    of ``reduce_max``) sums its cotangents in float32; integers keep their dtype. A concrete init
    value stays a constant, so JAX differentiates the reduction (a traced init makes
    ``reduce_window`` a primitive without a derivative). Anything else (variadic reductions, other
    computations) is JAX's own call, unchanged.
    """

    sig = inspect.signature(fn)
    operand_name, init_name, comp_name = list(sig.parameters)[:3]

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        operands, init_values = a[operand_name], a[init_name]
        if not (_is_array(operands) and _is_array(init_values)):
            return fn(*args, **kwargs)  # variadic (tuples of operands): JAX's own call
        p = active()
        d = _scalars.resolve((operands,), p)
        kind = monoid(a[comp_name], d)
        if kind is None:
            return fn(*args, **kwargs)
        if kind in ("add", "mul"):
            result, acc = _rules.reduction_dtypes(d, None, p)
        else:  # a selection: the input dtype, computed on the exact wide copy of a narrow float
            result, acc = d, compute_dtype(d, p)
        for x in {result, acc}:
            D.require_available(x, f"heddle.lax.{name}")
        a[operand_name] = cast(materialise(operands, d), acc)
        a[init_name] = _init_as(init_values, d, acc)
        a[comp_name] = _MONOIDS[kind]
        out = fn(*bound.args, **bound.kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


def _init_as(value: Any, d: np.dtype, acc: np.dtype) -> Any:
    """An init value of dtype ``d`` in ``acc``: a NumPy constant when it is concrete (so JAX sees the
    monoid's identity and uses its differentiable reduction), else a converted array."""
    v = materialise(value, d)
    if isinstance(v, jax.core.Tracer):
        return cast(v, acc)
    try:
        host = np.asarray(v)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return cast(v, acc)
    return host.astype(acc)  # exact: acc holds every value of d


def _axes(args: tuple, kwargs: dict[str, Any]) -> tuple[int, ...]:
    return tuple(args[0] if args else kwargs["axes"])


def _selection(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """reduce_max / reduce_min: the input dtype, computed on the exact wide copy of a narrow float
    (the rounding back is exact), so JAX's backward pass (tie counts, cotangent sums) is float32;
    NaN wherever the reduced slice holds one, on any sharding (``_nanprop``)."""

    @functools.wraps(fn)
    def op(operand: Any, *args: Any, **kwargs: Any) -> jax.Array:
        p = active()
        d = _scalars.resolve((operand,), p)
        comp = compute_dtype(d, p)
        D.require_available(comp, f"heddle.lax.{name}")
        x = cast(materialise(operand, d), comp)
        out = _nanprop.reduce(name, x, _axes(args, kwargs), lambda y: fn(y, *args, **kwargs))
        return out if out.dtype == d else cast(out, d)

    return op


def _collective_selection(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """pmax / pmin: JAX's own on every leaf, NaN wherever a device's value is NaN (``_nanprop``)."""

    @functools.wraps(fn)
    def op(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
        out = fn(x, axis_name, axis_index_groups=axis_index_groups)
        return jax.tree.map(
            lambda a, o: _nanprop.across_devices(a, o, axis_name, axis_index_groups), x, out
        )

    return op


def _scatter(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """scatter_add / scatter_sub / scatter_mul: operand and updates in acc_dtype, rounded once.

    The result has the reduction dtype of the promotion of ``operand`` and ``updates`` (a float keeps
    its dtype, integers and bool their accumulation dtype), as for a sum: every update to one slot is
    combined in the accumulation dtype and the slot is rounded once.
    """

    @functools.wraps(fn)
    def op(operand: Any, scatter_indices: Any, updates: Any, *args: Any, **kwargs: Any) -> Any:
        p = active()
        common = _scalars.resolve((operand, updates), p)
        result, acc = _rules.reduction_dtypes(common, None, p)
        for x in {result, acc}:
            D.require_available(x, f"heddle.lax.{name}")
        operand = cast(cast(materialise(operand, common), common), acc)
        updates = cast(cast(materialise(updates, common), common), acc)
        out = fn(operand, scatter_indices, updates, *args, **kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


def _widened(fn: Callable[..., Any], name: str, copies: bool) -> Callable[..., Any]:
    """Entry points without an accumulation dtype of their own: the operands run in acc_dtype.

    ``conv_general_dilated_local`` (a dot of extracted patches, with no ``preferred_element_type``):
    both operands are converted to the promotion and then exactly to the accumulation dtype, float32
    ones at the policy's float32 precision, the result rounded once. ``copies``:
    ``conv_general_dilated_patches``, whose forward copies values: the input runs on its exact wide
    copy and is rounded back exactly (to ``preferred_element_type`` if given), so its backward
    convolution sums overlapping patches in float32.
    """
    sig = inspect.signature(fn)
    names = ["lhs"] if copies else ["lhs", "rhs"]

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> jax.Array:
        p = active()
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        common = _scalars.resolve(tuple(a[n] for n in names), p)
        if copies:
            want = a.get("preferred_element_type")
            result = common if want is None else D.dtype(want)
            acc = compute_dtype(common, p)
            a["preferred_element_type"] = None if want is None else acc
        else:
            result, acc = _rules.reduction_dtypes(common, None, p)
        for x in {result, acc}:
            D.require_available(x, f"heddle.lax.{name}")
        for n in names:
            a[n] = cast(cast(materialise(a[n], common), common), acc)
        if a.get("precision") is None and D.real_dtype(acc) == np.float32:
            a["precision"] = _PRECISION.get(p.float32_matmul_precision)
        out = fn(*bound.args, **bound.kwargs)
        return out if out.dtype == result else cast(out, result)

    return op


# The classification of the names heddle.lax replaces, as data: name -> (kind, reason).
LAX: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        "dot_general dot conv_general_dilated conv conv_with_general_padding conv_transpose "
        "batch_matmul ragged_dot ragged_dot_general".split(),
        ("contraction", "preferred_element_type=acc_dtype, rounded once"),
    ),
    **dict.fromkeys(
        "reduce_sum reduce_prod cumsum cumprod".split(),
        ("reduction", "accumulates in acc_dtype, rounded once; integers return acc_dtype"),
    ),
    "cumlogsumexp": ("float_only", "computed in float32 for narrow floats, rounded once"),
    # JAX's own evaluates these in the narrow dtype: lax.asinh(bfloat16 0.0078125) is 0.00778,
    # lax.expm1(float16 2e-7) is 2.4e-7, lax.asin of the smallest normals is 0.
    **dict.fromkeys(
        "exp expm1 log log1p sqrt rsqrt cbrt sin cos tan acos atan atan2 tanh asinh acosh atanh "
        "logistic erf erfc bessel_i0e bessel_i1e igamma igammac polygamma zeta".split(),
        ("elementwise", "computed in float32 for narrow floats, rounded once"),
    ),
    **dict.fromkeys(
        "exp2 asin sinh cosh erf_inv lgamma digamma".split(),
        (
            "elementwise",
            "computed in float32 for narrow floats by heddle's formula (heddle/ops/_formulas.py, "
            "as heddle.numpy's: exact powers of two, no flushed tails, accurate near the zeros), "
            "rounded once",
        ),
    ),
    **dict.fromkeys(
        "reduce_max reduce_min".split(),
        (
            "selection",
            "values copied bit-exactly from the exact float32 copy of a narrow float, so the "
            "backward pass counts ties and sums cotangents in float32",
        ),
    ),
    **dict.fromkeys(
        "pmax pmin".split(),
        (
            "collective selection",
            "JAX's own values, NaN on every device where any device's value is NaN (XLA:CPU's "
            "cross-device combiner drops it)",
        ),
    ),
    **dict.fromkeys(
        "reduce reduce_window".split(),
        (
            "generic reduction",
            "acc_dtype when the computation is add or mul; max and min on the exact float32 copy "
            "of a narrow float (float32 cotangent sums); else unchanged",
        ),
    ),
    **dict.fromkeys(
        "scatter_add scatter_sub scatter_mul".split(),
        ("scatter", "operand and updates in acc_dtype, each slot rounded once; integers acc_dtype"),
    ),
    **dict.fromkeys(
        "psum pmean psum_scatter".split(),
        (
            "collective",
            "each leaf summed across devices in acc_dtype (a narrow float travels as float32), "
            "rounded once; integers return acc_dtype",
        ),
    ),
    "conv_general_dilated_local": (
        "widened contraction",
        "operands exactly in acc_dtype (no preferred_element_type), rounded once",
    ),
    "conv_general_dilated_patches": (
        "widened copy",
        "runs on the exact float32 copy of a narrow float and rounds back exactly, so the backward "
        "convolution sums overlapping patches in float32",
    ),
}


# Names of jax.lax that take a preferred_element_type or reduce, deliberately left as JAX's own.
LAX_PASS: dict[str, str] = {
    "cummax": "selection: values copied bit-exactly",
    "cummin": "selection: values copied bit-exactly",
    "reduce_and": "bitwise/logical: exact in the input dtype",
    "reduce_or": "bitwise/logical: exact in the input dtype",
    "reduce_xor": "bitwise/logical: exact in the input dtype",
    "reduce_precision": "an explicit rounding the user asks for",
    "argmax": "index_dtype is a required argument: the user chooses it",
    "argmin": "index_dtype is a required argument: the user chooses it",
    "scaled_dot": "block-scaled (MX) contraction over quantised operands with its own scales; "
    "already accumulates in preferred_element_type",
    "DotAlgorithm": "a class describing dot algorithms",
    "scatter": "overwrites: values copied bit-exactly",
    "scatter_max": "selection: values copied bit-exactly",
    "scatter_min": "selection: values copied bit-exactly",
    "scatter_apply": "applies the user's own function; the ops inside it carry the policy",
}


def _operands(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The value operands of an elementwise ``jax.lax`` function: its parameters without a default
    (``x``; ``x`` and ``y`` of ``atan2``; ``a`` and ``x`` of ``igamma``)."""
    ps = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in ps if p.default is inspect.Parameter.empty)


def _doc(name: str, kind: str, how: str, jfn: Callable[..., Any]) -> str:
    return (
        f"heddle's policy version of ``jax.lax.{name}`` ({kind}).\n\n"
        f"Dtypes: {how} (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.lax.{name}.\n  **kwargs: as for jax.lax.{name}.\n\n"
        f"Returns:\n  The result of jax.lax.{name} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.lax\n  >>> heddle.lax.{name}  # doctest: +ELLIPSIS\n"
        f"  <function ...>\n\n"
        f"Original documentation follows.\n\n{jfn.__doc__ or ''}"
    )


def build() -> dict[str, Any]:
    """The policy functions of heddle.lax, by name."""
    names: dict[str, Any] = {}
    for name, (kind, how) in LAX.items():
        jfn = getattr(lax, name, None)
        if jfn is None:
            continue
        if name == "batch_matmul":
            op = batch_matmul
        elif kind == "contraction":
            op = _contraction(jfn, name)
        elif kind == "reduction":
            op = _accumulating(jfn, name, OpClass.REDUCTION)
        elif kind == "elementwise":
            from heddle.ops import _formulas
            from heddle.ops._float_op import float_op

            op = float_op(_formulas.LAX.get(name, jfn), f"lax.{name}", values=_operands(jfn))
        elif kind == "float_only":
            op = _accumulating(jfn, name, OpClass.FLOAT_ONLY)
        elif kind == "selection":
            op = _selection(jfn, name)
        elif kind == "scatter":
            op = _scatter(jfn, name)
        elif kind == "collective":
            op = _collective(jfn, name)
        elif kind == "collective selection":
            op = _collective_selection(jfn, name)
        elif kind.startswith("widened"):
            op = _widened(jfn, name, copies=kind == "widened copy")
        else:
            op = _generic_reduce(jfn, name)
        op.__doc__ = _doc(name, kind, how, jfn)
        names[name] = op
    return names
