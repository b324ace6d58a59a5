"""heddle's own versions of the ``jax.scipy`` names whose arguments ``float_op`` cannot describe.

Each keeps JAX's name and arguments and is classified as ``Own`` in ``heddle/scipy/_table.py``:
solvers taking a ``(factor, lower)`` or ``(lu, piv)`` tuple, ``block_diag``'s blocks, creation
functions (the policy's defaults instead of JAX's 64-bit ones under ``jax_enable_x64``),
``map_coordinates`` (a sequence of coordinate arrays, a static fill value), ``mode`` and
``rankdata`` (counts and ranks), the Krylov solvers (an operator that is a matrix or a function),
and the classes ``gaussian_kde`` and ``RegularGridInterpolator``, whose state is held in the
accumulation dtype and whose methods round their outputs once. ``OWN`` maps each module path and
name to its object.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.scipy.interpolate as _jip
import jax.scipy.linalg as _jsl
import jax.scipy.ndimage as _jnd
import jax.scipy.sparse.linalg as _jsla
import jax.scipy.stats as _jst
import numpy as np
from jax import lax

from heddle.ops._core import compute_dtype
from heddle.ops._float_op import float_op, host_data, precision_scope, round_outputs
from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._policy import Policy, active
from heddle.policy._rules import OpClass


def _resolved(what: str, op_class: OpClass, *operands: Any) -> tuple[np.dtype, np.dtype, Policy]:
    """(result dtype, compute dtype, policy) of ``operands`` under ``op_class``; both available."""
    p = active()
    common = _scalars.resolve(tuple(host_data(o) for o in operands), p)
    result = _rules.result_dtype(op_class, common, policy=p)
    comp = compute_dtype(result, p)
    for d in {result, comp}:
        D.require_available(d, f"heddle.{what}")
    return result, comp, p


def _to(v: Any, result: np.dtype, comp: np.dtype) -> jax.Array:
    """A value operand converted with heddle's cast to the result dtype, then exactly to ``comp``."""
    return cast(cast(materialise(host_data(v), result), result), comp)


def _coordinate(v: Any, comp: np.dtype) -> jax.Array:
    """A coordinate (a position, not a value) converted with heddle's cast to the real part of the
    compute dtype (host float64 data rounded once)."""
    v = host_data(v)
    return cast(v if hasattr(v, "dtype") else np.asarray(v), D.real_dtype(comp))


def _is_numbers(x: Any) -> bool:
    """A nested list or tuple of Python numbers (host data), not a sequence of arrays."""
    return all(
        _is_numbers(v) if isinstance(v, (list, tuple)) else type(v) in (int, float) for v in x
    )


# --- linalg ----------------------------------------------------------------------------------------


def _cho_factor_c(
    a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True
) -> jax.Array:
    return _jsl.cho_factor(a, lower, overwrite_a, check_finite)[0]


def _cho_solve(
    c: Any, b: Any, lower: bool, overwrite_b: bool = False, check_finite: bool = True
) -> jax.Array:
    return _jsl.cho_solve((c, lower), b, overwrite_b, check_finite)


def _lu_solve(
    lu: Any,
    piv: Any,
    b: Any,
    trans: int = 0,
    overwrite_b: bool = False,
    check_finite: bool = True,
) -> jax.Array:
    return _jsl.lu_solve((lu, piv), b, trans, overwrite_b, check_finite)


_CHO_FACTOR = float_op(_cho_factor_c, "scipy.linalg.cho_factor", values=("a",), matmul=True)
_CHO_SOLVE = float_op(_cho_solve, "scipy.linalg.cho_solve", values=("c", "b"), matmul=True)
_LU_SOLVE = float_op(_lu_solve, "scipy.linalg.lu_solve", values=("lu", "b"), matmul=True)


def cho_factor(
    a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True
) -> tuple[jax.Array, bool]:
    return _CHO_FACTOR(a, lower, overwrite_a, check_finite), lower


def cho_solve(
    c_and_lower: tuple[Any, bool], b: Any, overwrite_b: bool = False, check_finite: bool = True
) -> jax.Array:
    c, lower = c_and_lower
    return _CHO_SOLVE(c, b, bool(lower), overwrite_b, check_finite)


def lu_solve(
    lu_and_piv: tuple[Any, Any],
    b: Any,
    trans: int = 0,
    overwrite_b: bool = False,
    check_finite: bool = True,
) -> jax.Array:
    lu, piv = lu_and_piv
    return _LU_SOLVE(lu, piv, b, trans, overwrite_b, check_finite)


def block_diag(*arrs: Any) -> jax.Array:
    if not arrs:
        return _jsl.block_diag()  # JAX's own answer for no blocks
    arrs = tuple(host_data(a) for a in arrs)
    result, _, _ = _resolved("scipy.linalg.block_diag", OpClass.ARITHMETIC, *arrs)
    return _jsl.block_diag(*(cast(materialise(a, result), result) for a in arrs))


def _default_float_of(jfn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A creation function whose result is the policy's default float: JAX's values (computed in
    JAX's own default float) rounded once to it."""

    @functools.wraps(jfn)
    def op(*args: Any, **kwargs: Any) -> jax.Array:
        d = active().default_float
        D.require_available(d, f"heddle.scipy.linalg.{name}")
        return cast(jfn(*args, **kwargs), d)

    return op


def dft(n: int, scale: str | None = None, *, dtype: Any = None) -> jax.Array:
    p = active()
    want = p.default_complex if dtype is None else D.dtype(dtype)
    D.require_available(want, "heddle.scipy.linalg.dft")
    return _jsl.dft(n, scale, dtype=want)


def hadamard(n: int, dtype: Any = None) -> jax.Array:
    p = active()
    want = p.default_int if dtype is None else D.dtype(dtype)
    comp = compute_dtype(want, p)
    for d in {want, comp}:
        D.require_available(d, "heddle.scipy.linalg.hadamard")
    return cast(_jsl.hadamard(n, dtype=comp), want)


# --- ndimage ---------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _map_kernel(
    x: Any, result: np.dtype, work: np.dtype, fill: Any, order: int, mode: str, *coordinates: Any
) -> jax.Array:
    out = _jnd.map_coordinates(cast(cast(x, result), work), list(coordinates), order, mode, fill)
    if D.kind(result) in "iu":  # JAX's rounding of an integer input's interpolated values
        out = lax.round(out, lax.RoundingMethod.AWAY_FROM_ZERO)
    return cast(out, result)


def _static_fill(cval: Any, result: np.dtype) -> Any:
    """The fill value as a Python number of ``result``, computed on the host (JAX takes it as a
    static argument): rounded once to a float ``result``, truncated to an integer one (as JAX)."""
    v = np.asarray(cval).item()
    if D.is_inexact(result):
        return np.asarray(materialise(v, result)).item()
    return np.asarray(v).astype(result).item()


def map_coordinates(
    input: Any, coordinates: Any, order: int, mode: str = "constant", cval: Any = 0.0
) -> jax.Array:
    x = host_data(input)
    p = active()
    result = _rules.result_dtype(OpClass.ARITHMETIC, _scalars.resolve((x,), p), policy=p)
    work = compute_dtype(result if D.is_inexact(result) else p.int_float_dtype, p)
    for d in {result, work}:
        D.require_available(d, "heddle.scipy.ndimage.map_coordinates")
    fill = _static_fill(cval, result)
    coords = [_coordinate(c, work) for c in coordinates]
    return _map_kernel(x, result, work, fill, order, mode, *coords)


# --- stats -----------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _mode(a: Any, axis: int | None, nan_policy: str, keepdims: bool, index: np.dtype) -> Any:
    out = _jst.mode(a, axis, nan_policy, keepdims)
    return type(out)(out.mode, cast(out.count, index))


def mode(
    a: Any, axis: int | None = 0, nan_policy: str = "propagate", keepdims: bool = False
) -> Any:
    return _mode(host_data(a), axis, nan_policy, keepdims, active().index_dtype)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _rankdata(a: Any, method: str, axis: int | None, nan_policy: str, d: np.dtype) -> jax.Array:
    return cast(_jst.rankdata(a, method, axis=axis, nan_policy=nan_policy), d)


def rankdata(
    a: Any, method: str = "average", *, axis: int | None = None, nan_policy: str = "propagate"
) -> jax.Array:
    d = active().int_float_dtype
    D.require_available(d, "heddle.scipy.stats.rankdata")
    return _rankdata(host_data(a), method, axis, nan_policy, d)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _kde_build(data: Any, weights: Any, bw_method: Any, comp: np.dtype, p: Policy) -> Any:
    with precision_scope(comp, p):
        return _jst.gaussian_kde(data, bw_method, weights)


_KDE_BUILD = jax.jit(_kde_build, static_argnums=(2, 3, 4))


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7))
def _kde_method(
    kde: Any,
    values: tuple[Any, ...],
    extra: tuple[Any, ...],
    method: str,
    kwargs: tuple[tuple[str, Any], ...],
    result: np.dtype,
    comp: np.dtype,
    p: Policy,
) -> Any:
    """``gaussian_kde.<method>`` of JAX on the state and the value operands in ``comp``, its
    outputs rounded once to ``result``."""
    kdes = jax.tree.map(lambda v: cast(v, comp), kde)
    ops = [cast(v, comp) for v in values]
    with precision_scope(comp, p):
        out = getattr(_jst.gaussian_kde, method)(*kdes, *ops, *extra, **dict(kwargs))
    return round_outputs(out, result, p)


@jax.tree_util.register_pytree_node_class
class gaussian_kde(_jst.gaussian_kde):
    __slots__ = ("result_dtype",)
    result_dtype: np.dtype

    def __init__(self, dataset: Any, bw_method: Any = None, weights: Any = None) -> None:
        operands = (dataset,) if weights is None else (dataset, weights)
        result, comp, p = _resolved("scipy.stats.gaussian_kde", OpClass.FLOAT_ONLY, *operands)
        data = _to(dataset, result, comp)
        w = None if weights is None else _to(weights, result, comp)
        build = _KDE_BUILD if _hashable(bw_method) else _kde_build
        kde = build(data, w, bw_method, comp, p)
        for field in ("neff", "dataset", "weights", "covariance", "inv_cov"):
            object.__setattr__(self, field, getattr(kde, field))
        object.__setattr__(self, "result_dtype", result)

    def tree_flatten(self) -> tuple[tuple[Any, ...], np.dtype]:
        """The arrays of the state (as JAX's) and, as static data, the result dtype."""
        children, _ = super().tree_flatten()
        return children, self.result_dtype

    @classmethod
    def tree_unflatten(cls, aux_data: np.dtype, children: Any) -> gaussian_kde:
        """Rebuilds an estimator from ``tree_flatten``'s output."""
        kde = super().tree_unflatten(None, children)
        object.__setattr__(kde, "result_dtype", aux_data)
        return kde

    def _run(
        self,
        method: str,
        values: tuple[Any, ...] = (),
        extra: tuple[Any, ...] = (),
        kwargs: tuple[tuple[str, Any], ...] = (),
        others: tuple[Any, ...] = (),
    ) -> Any:
        dtypes = [getattr(k, "result_dtype", k.dataset.dtype) for k in (self, *others)]
        result, comp, p = _resolved(
            f"scipy.stats.gaussian_kde.{method}", OpClass.FLOAT_ONLY, *dtypes, *values
        )
        values = tuple(materialise(host_data(v), result) for v in values)
        return _kde_method((self, *others), values, extra, method, kwargs, result, comp, p)

    def evaluate(self, points: Any) -> jax.Array:
        """The estimated density at ``points``, computed in the accumulation dtype, rounded once."""
        return self._run("evaluate", (points,))

    def __call__(self, points: Any) -> jax.Array:
        return self.evaluate(points)

    def pdf(self, x: Any) -> jax.Array:
        """The estimated density at ``x`` (``evaluate``)."""
        return self._run("evaluate", (x,))

    def logpdf(self, x: Any) -> jax.Array:
        """The log of the estimated density at ``x``, computed in the accumulation dtype (its
        log-sum-exp over the dataset included), rounded once."""
        return self._run("logpdf", (x,))

    def integrate_gaussian(self, mean: Any, cov: Any) -> jax.Array:
        """The density integrated against a Gaussian of ``mean`` and ``cov``, rounded once."""
        return self._run("integrate_gaussian", (mean, cov))

    def integrate_box_1d(self, low: Any, high: Any) -> jax.Array:  # type: ignore[override]
        """The density of a one-dimensional estimator integrated from ``low`` to ``high``."""
        return self._run("integrate_box_1d", (low, high))

    def integrate_kde(self, other: Any) -> jax.Array:
        """The product of this density and ``other``'s integrated, in the accumulation dtype of
        both estimators' result dtypes, rounded once."""
        return self._run("integrate_kde", others=(other,))

    def resample(self, key: Any, shape: tuple[int, ...] = ()) -> jax.Array:  # type: ignore[override]
        """Samples of the estimated density, drawn in the accumulation dtype, rounded once to the
        result dtype."""
        return self._run("resample", extra=(key,), kwargs=(("shape", tuple(shape)),))

    def integrate_box(self, low_bounds: Any, high_bounds: Any, maxpts: Any = None) -> Any:
        """Not implemented in JAX (use ``integrate_box_1d``): JAX's error."""
        return _jst.gaussian_kde.integrate_box(self, low_bounds, high_bounds, maxpts)

    def set_bandwidth(self, bw_method: Any = None) -> Any:
        """Not implemented in JAX: JAX's error."""
        return _jst.gaussian_kde.set_bandwidth(self, bw_method)


# --- interpolate -----------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _rgi_call(obj: Any, xi: Any, method: str | None, result: np.dtype, p: Policy) -> jax.Array:
    return round_outputs(_jip.RegularGridInterpolator.__call__(obj, xi, method), result, p)


class RegularGridInterpolator(_jip.RegularGridInterpolator):
    def __init__(
        self,
        points: Any,
        values: Any,
        method: str = "linear",
        bounds_error: bool = False,
        fill_value: Any = np.nan,
    ) -> None:
        operands = (values,) if fill_value is None else (values, fill_value)
        result, comp, _ = _resolved(
            "scipy.interpolate.RegularGridInterpolator", OpClass.FLOAT_ONLY, *operands
        )
        grid = tuple(_coordinate(g, comp) for g in points)
        fill = None if fill_value is None else _to(fill_value, result, comp)
        super().__init__(grid, _to(values, result, comp), method, bounds_error, fill)
        self.result_dtype = result

    def __call__(self, xi: Any, method: str | None = None) -> jax.Array:
        comp = np.dtype(self.values.dtype)
        if isinstance(xi, (tuple, list)) and not _is_numbers(xi):
            xi = type(xi)(_coordinate(x, comp) for x in xi)
        else:
            xi = _coordinate(xi, comp)
        return _rgi_call(self, xi, method, self.result_dtype, active())


def _rgi_flatten(obj: RegularGridInterpolator) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    return (obj.grid, obj.values, obj.fill_value), (obj.method, obj.bounds_error, obj.result_dtype)


def _rgi_unflatten(aux: tuple[Any, ...], children: tuple[Any, ...]) -> RegularGridInterpolator:
    obj = RegularGridInterpolator.__new__(RegularGridInterpolator)
    obj.grid, obj.values, obj.fill_value = children
    obj.method, obj.bounds_error, obj.result_dtype = aux
    return obj


jax.tree_util.register_pytree_node(RegularGridInterpolator, _rgi_flatten, _rgi_unflatten)


# --- sparse.linalg ---------------------------------------------------------------------------------


def _krylov(jfn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A Krylov solver whose operator ``A`` and preconditioner ``M`` are value operands where they
    are arrays and the user's functions where they are callables; its signature is JAX's."""
    ops: dict[tuple[bool, bool], Callable[..., Any]] = {}

    def solve(A: Any, b: Any, x0: Any = None, **kwargs: Any) -> Any:
        M = kwargs.get("M")
        key = (not callable(A), M is not None and not callable(M))
        op = ops.get(key)
        if op is None:
            values = ("b", "x0") + ("A",) * key[0] + ("M",) * key[1]
            op = ops[key] = float_op(
                jfn,
                f"scipy.sparse.linalg.{name}",
                values=values,
                params=("tol", "atol"),
                matmul=True,
            )
        return op(A, b, x0, **kwargs)

    solve.__name__ = solve.__qualname__ = name
    # the keywords JAX's solver takes (tol, atol, maxiter, M, ...), for inspect and help()
    solve.__signature__ = inspect.signature(jfn)  # type: ignore[attr-defined]
    return solve


cg = _krylov(_jsla.cg, "cg")
bicgstab = _krylov(_jsla.bicgstab, "bicgstab")
gmres = _krylov(_jsla.gmres, "gmres")


OWN: dict[str, Any] = {
    "linalg.cho_factor": cho_factor,
    "linalg.cho_solve": cho_solve,
    "linalg.lu_solve": lu_solve,
    "linalg.block_diag": block_diag,
    **{
        f"linalg.{n}": _default_float_of(getattr(_jsl, n), n)
        for n in "helmert hilbert invhilbert invpascal pascal".split()
        if hasattr(_jsl, n)
    },
    "linalg.dft": dft,
    "linalg.hadamard": hadamard,
    "ndimage.map_coordinates": map_coordinates,
    "stats.mode": mode,
    "stats.rankdata": rankdata,
    "stats.gaussian_kde": gaussian_kde,
    "interpolate.RegularGridInterpolator": RegularGridInterpolator,
    "sparse.linalg.cg": cg,
    "sparse.linalg.bicgstab": bicgstab,
    "sparse.linalg.gmres": gmres,
}
"""The ``Own`` names of ``heddle/scipy/_table.py``, by module path and name."""
