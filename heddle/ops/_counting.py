"""Counting and index-grid functions of ``heddle.numpy``: exact counts, float32-accumulated weights.

``jax.numpy``'s histograms and ``bincount`` add their weights with a scatter-add in the weights' dtype
(a histogram of bfloat16 values even counts in bfloat16, so no bin exceeds 256), and its index grids
give int64 under ``jax_enable_x64``. Here:

- ``bincount`` counts in the index dtype (int32, exact); with ``weights`` it is a sum: the weights
  are converted to their accumulation dtype, added there and each bin is rounded once to the
  reduction dtype of the weights (a float keeps its dtype, integers and bool give int32).
- ``histogram``, ``histogram2d``, ``histogramdd`` give JAX's dtypes (a float, the promotion of the
  sample and the weights) with counts accumulated in float32 and rounded once. The bin edges are
  ``histogram_bin_edges``'s, and the sample is compared with them exactly (both are converted
  exactly to float32), so every value lands in the bin the returned edges say.
- ``histogram_bin_edges``: edge ``i`` of ``bins`` equal bins over ``[lo, hi]`` (the range, rounded
  once to the result dtype, or the sample's min and max) is the exact ``lo + i * (hi - lo) / bins``
  rounded once to the result dtype, computed on the host with rationals whenever ``lo`` and ``hi``
  are known values (eagerly, and under ``jax.jit`` with a given ``range``). With traced ends (under
  ``jax.jit`` without ``range``) it is computed in float32 and rounded once, as ``linspace``
  (JAX computes it in the result dtype: a float16 ``bins=10, range=(0, 1)`` misses 3 of 11 edges).
- Index grids (``indices``, ``tril_indices``, ``unique``'s indices, ...) give the policy's index
  dtype (POLICY.md 4: int32, not int64 under x64) unless a ``dtype`` is asked for.

- Selections whose backward pass sums (``unique``'s values, the set operations, ``choose``) select
  from the exact float32 copy of a narrow float and round back exactly.

``COUNTING`` maps each name to its function; ``REASONS`` says, per name, what it does.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from heddle.ops._core import compute_dtype
from heddle.ops._float_op import host_data
from heddle.ops._scalars import materialise, round_scalar
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._policy import active
from heddle.policy._rules import OpClass


def _index(x: Any) -> Any:
    """An integer array leaf in the policy's index dtype (other leaves unchanged)."""
    d = getattr(x, "dtype", None)
    if d is None or D.kind(np.dtype(d)) not in "iu":
        return x
    want = active().index_dtype
    return x if x.dtype == want else cast(x, want)


@functools.wraps(jnp.bincount)
def bincount(
    x: Any, weights: Any = None, minlength: int = 0, *, length: int | None = None, **kwargs: Any
) -> jax.Array:
    if weights is None:
        return _index(jnp.bincount(x, None, minlength, length=length, **kwargs))
    p = active()
    weights = host_data(weights)
    d = _scalars.resolve((weights,), p)
    result, acc = _rules.reduction_dtypes(d, None, p)
    for want in {result, acc}:
        D.require_available(want, "heddle.numpy.bincount")
    w = cast(materialise(weights, d), acc)
    out = jnp.bincount(x, w, minlength, length=length, **kwargs)
    return out if out.dtype == result else cast(out, result)


def _float_dtypes(operands: tuple[Any, ...]) -> tuple[np.dtype, np.dtype]:
    """(result dtype, accumulation dtype) of a histogram of ``operands`` (sample and weights)."""
    p = active()
    common = _scalars.resolve(operands, p)
    result = _rules.result_dtype(OpClass.FLOAT_ONLY, common, policy=p)
    acc = _rules.acc_dtype(result, p)
    for want in {result, acc}:
        D.require_available(want, "heddle.numpy.histogram")
    return result, acc


def _wide(x: Any, result: np.dtype, acc: np.dtype) -> Any:
    """``x`` converted to the result dtype, then exactly to the accumulation dtype."""
    return cast(cast(materialise(x, result), result), acc)


def _round_exact(v: Fraction, d: np.dtype) -> np.ndarray:
    """The rational ``v`` rounded once (to nearest, ties to even) to the float dtype ``d``."""
    if d.itemsize <= 2:
        return round_scalar(v, d)
    near = np.asarray(float(v), np.float64)  # Python's int / int division rounds once
    if d == np.float64:
        return near
    with np.errstate(over="ignore"):
        c = near.astype(d)  # within one ulp of the answer: check both neighbours exactly
        cands = [c, np.nextafter(c, d.type(-np.inf)), np.nextafter(c, d.type(np.inf))]
    cands = [x for x in cands if np.isfinite(x)] or [c]
    bits = np.dtype(f"u{d.itemsize}")
    return min(cands, key=lambda x: (abs(Fraction(float(x)) - v), int(x.view(bits)) & 1))


def _host_value(x: Any) -> float | None:
    """A known scalar as a Python float, or None for a traced one."""
    try:
        return float(np.asarray(x, np.float64))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _end(e: Any, d: np.dtype) -> Any:
    """An end of the range rounded once to ``d``: host data (Python and NumPy numbers) on the host,
    so that it stays a known value under ``jax.jit``; arrays with heddle's cast."""
    if isinstance(e, (int, float, np.ndarray, np.generic)) and np.ndim(e) == 0:
        v = e if isinstance(e, int) else float(np.asarray(e, np.float64))
        if isinstance(v, int) or np.isfinite(v):
            return _round_exact(Fraction(v), d)
        return np.asarray(v).astype(d)
    return cast(materialise(e, d), d)


@functools.wraps(jnp.histogram_bin_edges)
def histogram_bin_edges(
    a: Any, bins: Any = 10, range: Any = None, weights: Any = None
) -> jax.Array:
    a = host_data(a)
    result = _float_dtypes((a,))[0]
    return _bin_edges(cast(materialise(a, result), result), bins, range, result)


def _bin_edges(a: Any, bins: Any, range: Any, d: np.dtype) -> jax.Array:
    """The edges of ``bins`` (a count, or the edges themselves) over ``range`` in the float dtype
    ``d``, each the exact value rounded once (see the module docstring)."""
    from heddle.ops._creation import asarray

    if isinstance(bins, str) or np.ndim(bins) == 1:
        return jnp.histogram_bin_edges(a, bins if isinstance(bins, str) else asarray(bins, d))
    n = operator.index(bins)  # JAX's own error for a non-integer count
    ends = [a.min(), a.max()] if range is None else list(range)
    if len(ends) != 2:
        return jnp.histogram_bin_edges(a, n, range)  # JAX's own error
    lo, hi = (_end(e, d) for e in ends)
    known = [_host_value(lo), _host_value(hi)]
    if None in known:  # traced ends: float32 arithmetic, rounded once (as heddle's linspace)
        comp = compute_dtype(d, active())
        lo, hi = cast(lo, comp), cast(hi, comp)
        same = lo == hi
        lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
        return cast(jnp.linspace(lo, hi, n + 1, dtype=comp), d)
    flo, fhi = (Fraction(v) if np.isfinite(v) else v for v in known)
    if not all(isinstance(v, Fraction) for v in (flo, fhi)):  # inf or NaN ends: JAX's values
        return jnp.histogram_bin_edges(a, n, (lo, hi))
    if flo == fhi:  # numpy's and JAX's rule for an empty range
        flo, fhi = flo - Fraction(1, 2), fhi + Fraction(1, 2)
    edges = [_round_exact(flo + i * (fhi - flo) / n, d) for i in builtins.range(n + 1)]
    return jnp.asarray(np.array(edges, d).reshape(n + 1))


@functools.wraps(jnp.histogram)
def histogram(
    a: Any, bins: Any = 10, range: Any = None, weights: Any = None, density: Any = None
) -> tuple[jax.Array, jax.Array]:
    a, weights = host_data(a), host_data(weights)
    result, acc = _float_dtypes((a,) if weights is None else (a, weights))
    a = cast(materialise(a, result), result)
    w = None if weights is None else cast(materialise(weights, result), result)
    edges = _bin_edges(a, bins, range, result)
    counts, _ = jnp.histogram(
        cast(a, acc),
        cast(edges, acc),
        weights=None if w is None else cast(w, acc),
        density=density,
    )
    return cast(counts, result), cast(edges, result)


def _dd_edges(sample: Any, bins: Any, range: Any, weights: Any) -> list[jax.Array]:
    """The bin edges of each column of ``sample``, in its dtype (histogramdd's own rule: one
    ``bins`` for every dimension or one per dimension), without counting anything."""
    n_dims = sample.shape[1]
    try:
        per_dim = list(bins)
    except TypeError:
        per_dim = n_dims * [bins]
    if len(per_dim) != n_dims:
        return jnp.histogramdd(sample, bins, range, weights)[1]  # JAX's own error
    d = np.dtype(sample.dtype)
    return [
        _bin_edges(sample[:, i], per_dim[i], None if range is None else range[i], d)
        for i in builtins.range(n_dims)
    ]


@functools.wraps(jnp.histogramdd)
def histogramdd(
    sample: Any, bins: Any = 10, range: Any = None, weights: Any = None, density: Any = None
) -> tuple[jax.Array, list[jax.Array]]:
    sample, weights = host_data(sample), host_data(weights)
    result, acc = _float_dtypes((sample,) if weights is None else (sample, weights))
    sample = cast(materialise(sample, result), result)
    w = None if weights is None else cast(materialise(weights, result), result)
    edges = _dd_edges(jnp.asarray(sample), bins, range, w)
    counts, _ = jnp.histogramdd(
        cast(sample, acc),
        [cast(e, acc) for e in edges],
        weights=None if w is None else cast(w, acc),
        density=density,
    )
    return cast(counts, result), [cast(e, result) for e in edges]


@functools.wraps(jnp.histogram2d)
def histogram2d(
    x: Any, y: Any, bins: Any = 10, range: Any = None, weights: Any = None, density: Any = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    try:  # jax.numpy.histogram2d's own reading of ``bins``
        n = len(bins)
    except TypeError:
        n = 1
    if n not in (1, 2):
        bins = [jnp.asarray(bins)] * 2
    x, y = host_data(x), host_data(y)
    result = _float_dtypes((x, y))[0]
    sample = jnp.stack([cast(materialise(v, result), result) for v in (x, y)], axis=1)
    counts, (ex, ey) = histogramdd(sample, bins, range, weights, density)
    return counts, ex, ey


def _index_outputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its integer outputs in the index dtype; a ``dtype`` the caller gives is kept."""
    has_dtype = "dtype" in inspect.signature(fn).parameters

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        if has_dtype and kwargs.get("dtype") is not None:
            return fn(*args, **kwargs)
        return jax.tree.map(_index, fn(*args, **kwargs))

    return op


def _wide_selection(
    fn: Callable[..., Any], positions: tuple[int, ...], seq: int | None = None
) -> Callable[..., Any]:
    """Selections whose backward pass sums (unique's ``size=`` padding, the set operations, choose).

    The value operands (positional arguments at ``positions``, or the sequence at ``seq``) are
    converted to their promotion and then exactly to its compute dtype (float32 for narrow floats);
    JAX's function selects from those copies, and the values are rounded back exactly to the
    promotion, so the scatter-add of the backward pass sums in float32. Of several outputs the first
    holds the values; the rest (indices, inverse, counts) are in the index dtype.
    """

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        p = active()
        args = list(args)
        where = [i for i in positions if i < len(args)] if seq is None else []
        values = [host_data(args[i]) for i in where] if seq is None else list(args[seq])
        if not values:
            return fn(*args, **kwargs)
        d = _scalars.resolve(tuple(values), p)
        comp = compute_dtype(d, p)
        D.require_available(comp, f"heddle.numpy.{fn.__name__}")
        wide = [cast(cast(materialise(v, d), d), comp) for v in values]
        if seq is None:
            for i, v in zip(where, wide, strict=True):
                args[i] = v
        else:
            args[seq] = wide
        out = fn(*args, **kwargs)
        if not isinstance(out, tuple):
            return cast(out, d)
        first, *rest = out
        fixed = [cast(first, d), *(jax.tree.map(_index, r) for r in rest)]
        return type(out)(*fixed) if hasattr(out, "_fields") else tuple(fixed)

    return op


_INDEX_GRIDS = (
    "indices tril_indices triu_indices tril_indices_from triu_indices_from diag_indices "
    "diag_indices_from mask_indices unravel_index ravel_multi_index".split()
)
_UNIQUE = "unique unique_all unique_counts unique_inverse unique_values".split()
_SET_OPS = "union1d intersect1d setdiff1d setxor1d".split()

COUNTING: dict[str, Callable[..., Any]] = {
    "bincount": bincount,
    "histogram_bin_edges": histogram_bin_edges,
    "histogram": histogram,
    "histogram2d": histogram2d,
    "histogramdd": histogramdd,
    **{n: _index_outputs(getattr(jnp, n)) for n in _INDEX_GRIDS},
    **{n: _wide_selection(getattr(jnp, n), (0,)) for n in _UNIQUE},
    **{n: _wide_selection(getattr(jnp, n), (0, 1)) for n in _SET_OPS},
    "choose": _wide_selection(jnp.choose, (), seq=1),
}

REASONS: dict[str, str] = {
    "bincount": "counts in the index dtype; weights summed in acc_dtype, each bin rounded once",
    **dict.fromkeys(
        "histogram histogram2d histogramdd".split(),
        "each edge the exact lo + i (hi - lo) / bins rounded once to the result dtype; counts "
        "accumulated in float32, rounded once",
    ),
    "histogram_bin_edges": "the float dtype of the sample; each edge the exact "
    "lo + i (hi - lo) / bins rounded once",
    **dict.fromkeys(_INDEX_GRIDS, "integer outputs in the index dtype (int32)"),
    **dict.fromkeys(
        _UNIQUE,
        "values keep their dtype (selected from the exact float32 copy of a narrow float); "
        "indices, inverse and counts int32",
    ),
    **dict.fromkeys(
        _SET_OPS,
        "the promotion of both arrays, selected from its exact float32 copy (float32 cotangent "
        "sums); return_indices int32",
    ),
    "choose": "the promotion of the choices, selected from their exact float32 copies",
}


def _doc(name: str) -> str:
    return (
        f"heddle's policy version of ``jax.numpy.{name}``.\n\n"
        f"Dtypes: {REASONS[name]} (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.numpy.{name}.\n  **kwargs: as for jax.numpy.{name}.\n\n"
        f"Returns:\n  The result of jax.numpy.{name} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.numpy as hnp\n  >>> hnp.{name}  # doctest: +ELLIPSIS\n"
        f"  <function ...>\n\n"
        f"Original documentation follows.\n\n{getattr(jnp, name).__doc__ or ''}"
    )


for _name, _fn in COUNTING.items():
    _fn.__doc__ = _doc(_name)
    _fn.__module__ = __name__
