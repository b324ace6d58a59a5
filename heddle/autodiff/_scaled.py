"""heddle.autodiff's backward contractions: float32 (the default) or at the operands' narrow speed
(``"scaled"``), with float32 cotangents either way.

heddle.autodiff keeps every cotangent of a narrow value in float32 (POLICY.md 7), so by default the
two contractions that transpose a narrow ``dot_general`` (``dA = dC . B^T``, ``dB = A^T . dC``) read
float32 operands: float32 matmuls, where tensor cores run bfloat16 and float16 at many times the
rate. With ``contractions="scaled"`` each transposing contraction instead reads a narrow copy of the
float32 cotangent, made for that contraction alone and never stored as the cotangent:

- bfloat16 operands: the cotangent rounded to bfloat16. bfloat16 has float32's exponent range, so
  no value float32 holds as a normal number underflows; each element keeps 8 significant bits.
- float16 operands: the cotangent times ``2**k``, rounded to float16, where ``k`` puts the largest
  finite magnitude of the cotangent in ``[2**14, 2**15)`` (a power of two: the scaling is exact).
  The contraction's float32 result is multiplied by ``2**-k`` (exact again). So the cotangent is
  in float16's range whatever its magnitude (no underflow of a cotangent of 1e-10, no overflow of
  one of 1e6); elements about ``2**29`` below the largest lose bits as float16 subnormals, and
  those about ``2**39`` below it are zero.

Both contractions accumulate in float32 (``preferred_element_type``) and their results are the
float32 cotangents of the operands, summed with the operands' other cotangents in float32 as in the
default. What is given up against the default is the cotangent's precision inside the contraction
(8 or 11 significant bits instead of 24), never its range; against ``jax.grad``, which rounds the
same cotangent to the narrow dtype without a scale (and rounds the results too), nothing but the
last bit of a float16 cotangent whose largest element is within a factor 2 of 65504.

Contractions whose operands are not both bfloat16 or both float16 (float8, mixed dtypes) read the
cotangent as it is. Under explicit mesh axes each backward contraction names its result's sharding,
the operand's, as JAX's own transpose rule does. Inside the float32 version of a ``while`` body or a
``custom_jvp`` function (``_widen``), a contraction of two bfloat16 or two float16 operands uses the
rule too (``widened``); ``scan`` and ``cond`` bodies are evaluated with twins, where every
contraction takes it as at top level. Convolutions and ragged dots keep ``_widen``'s float32
derivative.

The default (``"float32"``), at the top level of a reverse-mode evaluation, is the same
``jax.custom_vjp`` rule with ``narrow=False``: the two contractions read the float32 cotangent as it
is and the operands widened exactly (a differentiated narrow operand as its twin, which the
backward pass keeps), so they compute the values JAX's transpose of the float32 contraction
computes, laid out differently. JAX's transpose rule contracts the cotangent with the other operand
and transposes the result into the operand's axis order; for the weight of ``x @ w`` it contracts
the cotangent over the cotangent's leading (batch) axes, which XLA:CPU compiles into a transposing
copy of the whole cotangent, fused into the elementwise work that produces it. ``_transposed``
writes each contraction as a batched matmul, ``(B, M, K) @ (B, K, N)``, the weight's cotangent as
``x^T @ dC``, so only the operand is transposed (a transformer block's gradient step on CPU:
1.15-1.38x ``jax.grad``'s time with JAX's transposes, 0.85x with these;
``benchmarks/bench_autodiff.py``).

The rule's forward value is ``_rules.contract``'s, a ``jax.custom_jvp`` through the twins, so that
forward mode over a gradient (``jax.jvp`` of it, a Hessian-vector product) differentiates the
result in float32, and its backward contractions read the kept twins, differentiable again in
float32. JAX's partial evaluation of a body (a ``scan``'s, a ``cond``'s, a checkpoint's) inlines a
``jax.custom_jvp`` and would leave that forward value differentiable only through the narrow
operands, so inside bodies the default keeps ``_rules.contract`` itself (the layout matters less
there: a scan over layers measured the same both ways). A ``jax.custom_vjp`` has no forward mode of
its own, so an evaluation that is differentiated forward (``jacfwd``, ``hessian``'s outer level:
``mode(FORWARD)``) keeps ``_rules.contract`` everywhere.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.sharding import AxisType

from heddle.autodiff._rules import contract, read_as
from heddle.ops.lowering import dot_needs_widening, runnable_precision
from heddle.programs._audit_cotangent import NARROW_COPY
from heddle.programs._on_twins import on_twins

_F32 = np.dtype("float32")
SCALED_DTYPES = frozenset(np.dtype(d) for d in (jnp.bfloat16, jnp.float16))
"""Operand dtypes whose backward contractions ``"scaled"`` runs narrow."""

MODES = ("float32", "scaled")
"""The values of heddle.autodiff's ``contractions`` argument."""

FORWARD = "forward"
"""The mode of a forward-mode evaluation (``jacfwd``): every rule must have a JVP, so contractions
keep the ``jax.custom_jvp`` rule of ``_rules.contract`` and no ``jax.custom_vjp`` rule is used."""

_MODE: ContextVar[str] = ContextVar("heddle_autodiff_contractions", default="float32")


@contextlib.contextmanager
def mode(contractions: str) -> Iterator[None]:
    """Evaluates with ``contractions`` (one of ``MODES``) as the backward contractions' rule."""
    token = _MODE.set(contractions)
    try:
        yield
    finally:
        _MODE.reset(token)


def active() -> bool:
    """Whether the evaluation in progress runs its backward contractions scaled."""
    return _MODE.get() == "scaled"


def reverse() -> bool:
    """Whether the evaluation in progress is differentiated in reverse mode only, so a contraction
    may take the ``jax.custom_vjp`` rule here (``contraction``), scaled or not."""
    return _MODE.get() != FORWARD


def applies(lhs_dtype: Any, rhs_dtype: Any) -> bool:
    """Whether a contraction of these operand dtypes runs its backward pass narrow when scaled."""
    d = np.dtype(lhs_dtype)
    return d == np.dtype(rhs_dtype) and d in SCALED_DTYPES


def exact_in_float32(*dtypes: Any) -> bool:
    """Whether every operand dtype is a real float that float32 holds exactly (narrow or float32),
    so the ``jax.custom_vjp`` rule's backward contractions can read them widened."""
    return all(jnp.issubdtype(d, jnp.floating) and np.dtype(d).itemsize <= 4 for d in dtypes)


def shardings(lhs: Any, rhs: Any) -> tuple[Any, Any] | None:
    """The operands' shardings where the mesh has explicit axes (the backward contractions must
    name their results' shardings there, the operands'), else None. The mesh is the context's
    (``jax.set_mesh``) or, outside one, the operands' own (arrays placed on an explicit mesh and
    passed to ``jax.jit``)."""
    avals = jax.typeof(lhs), jax.typeof(rhs)
    meshes = [jax.sharding.get_abstract_mesh(), *(getattr(a.sharding, "mesh", None) for a in avals)]
    explicit = [
        m for m in meshes if m is not None and not m.empty and AxisType.Explicit in m.axis_types
    ]
    if not explicit:
        return None

    def on_mesh(s: Any) -> Any:  # an operand on no mesh (a plain array) is replicated on it
        return s.update(mesh=explicit[0]) if s.mesh.empty else s

    return on_mesh(avals[0].sharding), on_mesh(avals[1].sharding)


def _pow2(k: jax.Array) -> jax.Array:
    """``2.0**k`` as float32, exactly, for integer ``k`` in [-126, 127] (its bit pattern)."""
    return lax.bitcast_convert_type((k + 127) << 23, jnp.float32)


def narrowed(ct: jax.Array, d: np.dtype) -> tuple[jax.Array, jax.Array | None]:
    """``ct`` (float32) as the narrow dtype ``d`` for one contraction, and the power of two its
    result is multiplied by (None: no scale). The scale is set by the largest finite magnitude, so
    an inf or NaN element changes no other element's rounding."""
    if jnp.finfo(d).maxexp >= jnp.finfo(_F32).maxexp:  # bfloat16: float32's range
        return ct.astype(d), None
    amax = jnp.max(jnp.where(jnp.isfinite(ct), jnp.abs(ct), 0.0), initial=0.0)
    _, e = jnp.frexp(amax)  # amax = m * 2**e, m in [0.5, 1)
    top = jnp.finfo(d).maxexp - 1  # float16: 2**15 <= its largest finite value
    k = jnp.clip(top - e, -126, 126).astype(jnp.int32)
    return (ct * _pow2(k)).astype(d), _pow2(-k)


def _kept(ndim: int, contract: Any, batch: Any) -> list[int]:
    return [i for i in range(ndim) if i not in contract and i not in batch]


def _size(shape: Any, axes: Any) -> int:
    return int(np.prod([shape[i] for i in axes], dtype=np.int64))


def _matmul(a: jax.Array, b: jax.Array, precision: Any) -> jax.Array:
    """``a @ b`` of ``(B, M, K)`` and ``(B, K, N)`` arrays, accumulated in float32 (the layout every
    backend's narrow kernels take; XLA folds the operands' transposes into the dot)."""
    if a.shape[0] == 1:
        dims: Any = (((1,), (0,)), ((), ()))
        return lax.dot_general(a[0], b[0], dims, precision, preferred_element_type=_F32)[None]
    dims = (((2,), (1,)), ((0,), (0,)))
    return lax.dot_general(a, b, dims, precision, preferred_element_type=_F32)


def _transposed(
    ct: jax.Array, other: jax.Array, dims: Any, side: int, precision: Any, sharding: Any
) -> jax.Array:
    """The float32 cotangent of operand ``side`` (0: lhs, 1: rhs) of a ``dot_general`` with
    dimension numbers ``dims`` for ``ct`` (axes: batch, lhs free, rhs free), ``other`` the other
    operand: ``ct`` contracted with ``other`` over its free axes, accumulated in float32, put
    back in the operand's shape and axis order (JAX's transpose rule). ``sharding`` (explicit
    mesh axes): the operand's, which the contraction names as its result's; None: the
    contraction is a batched matmul, the layout every backend's narrow kernels take."""
    (lc, rc), (lb, rb) = dims if side == 0 else ((dims[0][1], dims[0][0]), (dims[1][1], dims[1][0]))
    # from here on "l" is the operand whose cotangent this is, "r" the other
    r_kept = _kept(other.ndim, rc, rb)
    nb = len(lb)
    n_kept = ct.ndim - nb - len(r_kept)
    ndim = nb + n_kept + len(lc)
    l_kept = _kept(ndim, lc, lb)
    if sharding is not None:
        return _named(ct, other, (lc, rc, lb, rb), (l_kept, r_kept), side, precision, sharding)
    shape = [0] * ndim
    for j, i in enumerate(lb):
        shape[i] = ct.shape[j]
    for j, i in enumerate(l_kept):
        shape[i] = ct.shape[(nb + j) if side == 0 else (nb + len(r_kept) + j)]
    for j, i in enumerate(lc):
        shape[i] = other.shape[rc[j]]
    b, m = _size(shape, lb), _size(shape, l_kept)
    n, k = _size(other.shape, r_kept), _size(shape, lc)
    if side == 0:  # ct (B, M, N) @ rhs^T (B, N, K)
        theirs = lax.transpose(other, (*rb, *r_kept, *rc)).reshape(b, n, k)
        out, order = _matmul(ct.reshape(b, m, n), theirs, precision), [*lb, *l_kept, *lc]
    else:  # lhs^T (B, K, N) @ ct (B, N, M): ct's axes are batch, lhs free (N), rhs free (M)
        theirs = lax.transpose(other, (*rb, *rc, *r_kept)).reshape(b, k, n)
        out, order = _matmul(theirs, ct.reshape(b, n, m), precision), [*lb, *lc, *l_kept]
    out = out.reshape([shape[i] for i in order])
    return lax.transpose(out, tuple(int(i) for i in np.argsort(order)))


def _named(
    ct: jax.Array, other: jax.Array, axes: Any, kept: Any, side: int, precision: Any, sharding: Any
) -> jax.Array:
    """``_transposed`` as one ``dot_general`` naming its result's sharding: the operand's, its
    axes in the order the contraction produces them (batch, free, contracted). Where XLA:CPU has
    no narrow kernel for the dot, its operands are widened exactly first (the same value)."""
    lc, rc, lb, rb = axes
    l_kept, r_kept = kept
    nb = len(lb)
    ct_r = range(nb, nb + len(r_kept)) if side == 1 else range(ct.ndim - len(r_kept), ct.ndim)
    order = [*lb, *l_kept, *np.take(lc, np.argsort(rc)).tolist()]
    spec = tuple(sharding.spec) + (None,) * (len(order) - len(sharding.spec))
    named = sharding.update(spec=sharding.spec.update(partitions=tuple(spec[i] for i in order)))
    dims = ((tuple(ct_r), tuple(r_kept)), (tuple(range(nb)), tuple(rb)))
    if dot_needs_widening(ct, other, dims):  # XLA:CPU has no narrow kernel for it: exact
        ct, other = ct.astype(_F32), other.astype(_F32)
    out = lax.dot_general(
        ct, other, dims, precision, preferred_element_type=_F32, out_sharding=named
    )
    return lax.transpose(out, tuple(int(i) for i in np.argsort(order)))


def transposes(
    ct: jax.Array,
    lhs: jax.Array | None,
    rhs: jax.Array | None,
    dims: Any,
    precision: Any,
    shardings: tuple[Any, Any] | None = None,
    narrow: bool = True,
) -> tuple[jax.Array | None, jax.Array | None]:
    """The float32 cotangents of the two operands for the float32 cotangent ``ct`` of
    ``dot_general(lhs, rhs, dims, preferred_element_type=float32)``, each contraction reading
    ``ct`` narrowed (``narrowed``; ``narrow``, for operands of one scaled dtype) or as it is, the
    operands widened exactly (``narrow=False``). An operand given as None is not needed: the
    other's cotangent is not computed (None). ``shardings``: the operands' (``shardings``), named
    as their cotangents'. Differentiated again (forward over reverse: a Hessian-vector product),
    they are the same contractions in float32."""
    arrays = [a for a in (lhs, rhs) if a is not None]
    if not arrays:
        return None, None
    f = _transposes(dims, precision, lhs is not None, rhs is not None, shardings, narrow)
    outs = iter(f(ct, *arrays))
    return (next(outs) if rhs is not None else None), (next(outs) if lhs is not None else None)


@functools.cache
def _transposes(
    dims: Any,
    precision: Any,
    has_lhs: bool,
    has_rhs: bool,
    shardings: tuple[Any, Any] | None,
    narrow: bool,
) -> Any:
    """``f(ct, *operands)``: the list of cotangents ``transposes`` gives, with a float32 derivative."""

    def split(operands: Any) -> tuple[Any, Any]:
        it = iter(operands)
        return (next(it) if has_lhs else None), (next(it) if has_rhs else None)

    def compute(ct: Any, operands: Any, wide: bool) -> list[Any]:
        lhs, rhs = split(operands)
        d = np.dtype((lhs if lhs is not None else rhs).dtype)
        if wide:
            narrow, unscale = ct, None
            lhs, rhs = (None if a is None else a.astype(_F32) for a in (lhs, rhs))
        else:
            narrow, unscale = narrowed(ct, d)
        named = shardings or (None, None)
        out = []
        if rhs is not None:
            out.append(_transposed(narrow, rhs, dims, 0, precision, named[0]))
        if lhs is not None:
            out.append(_transposed(narrow, lhs, dims, 1, precision, named[1]))
        return out if unscale is None else [o * unscale for o in out]

    def exact(ct: Any, *operands: Any) -> list[Any]:
        return compute(ct, operands, wide=True)

    if not narrow:
        return exact

    def scaled(ct: Any, operands: Any) -> list[Any]:
        # the narrow copy of the cotangent is an operand, not the cotangent: the audit skips it
        with jax.named_scope(NARROW_COPY):
            return compute(ct, operands, wide=False)

    @jax.custom_jvp
    def f(ct: Any, *operands: Any) -> list[Any]:
        return scaled(ct, operands)

    @f.defjvp
    def _(primals: Any, tangents: Any) -> tuple[Any, Any]:
        return f(*primals), jax.jvp(exact, primals, tangents)[1]

    return f


@functools.cache
def contraction(
    dims: Any,
    precision: Any,
    out_sharding: Any,
    named: Any = None,
    narrow: bool = True,
    keep_twins: tuple[bool, bool] = (False, False),
) -> Any:
    """``f(lhs, rhs, lhs32, rhs32)``: ``dot_general(lhs, rhs)`` with a float32 result, whose
    cotangent reaches the float32 twins ``lhs32``/``rhs32`` through ``transposes`` (``narrow``:
    reading it narrowed); ``named``: the operands' ``shardings``. The operands ``keep_twins`` marks
    (differentiated narrow values) are read for their values alone: their derivative is their
    twins', through the result's value (``contract``'s) and through what the backward pass keeps
    of them (``_saved``), so forward mode over the gradient (``jax.jvp`` of it) differentiates
    both through the twins."""
    kw = dict(
        dimension_numbers=dims,
        precision=precision,
        preferred_element_type=_F32,
        out_sharding=out_sharding,
    )

    def value(lhs: Any, rhs: Any, lhs32: Any, rhs32: Any) -> Any:
        return contract(lhs, rhs, lhs32, rhs32, **kw)

    @jax.custom_vjp
    def f(lhs: Any, rhs: Any, lhs32: Any, rhs32: Any) -> Any:
        return value(lhs, rhs, lhs32, rhs32)

    def fwd(lhs: Any, rhs: Any, lhs32: Any, rhs32: Any) -> tuple[Any, Any]:
        out = value(lhs.value, rhs.value, lhs32.value, rhs32.value)
        saved = _saved((lhs.value, rhs.value), (lhs32.value, rhs32.value), keep_twins, narrow)
        return out, _residuals(*saved, lhs32.perturbed, rhs32.perturbed)

    def bwd(res: Any, ct: Any) -> tuple[Any, ...]:
        return None, None, *_pullback(res, ct, dims, precision, named, narrow)

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return lambda lhs, rhs, *twins: f(*_stopped((lhs, rhs), keep_twins), *twins)


def _stopped(xs: Any, keep_twins: tuple[bool, ...]) -> list[Any]:
    """The operands whose twins carry their derivative, stopped: the rules here give them no
    cotangent, and JAX 0.10's scan transpose gives a zero one of the wrong shape to a stacked scan
    output that one of them reads (``ValueError: Expected cotangent type``)."""
    return [lax.stop_gradient(x) if keep else x for x, keep in zip(xs, keep_twins, strict=True)]


def _saved(xs: Any, twins: Any, keep_twins: tuple[bool, ...], narrow: bool) -> list[Any]:
    """What the backward pass keeps of each operand, differentiable again through its twin where
    the operand is stopped: the twin (float32), or for a narrow backward contraction the operand
    itself with its twin's derivative rounded to its dtype (``read_as``); any other as it is."""
    saved = []
    for x, t, keep in zip(xs, twins, keep_twins, strict=True):
        if keep:
            x = read_as(np.dtype(x.dtype))(t, x) if narrow else t
        saved.append(x)
    return saved


def _residuals(lhs: Any, rhs: Any, want_lhs: bool, want_rhs: bool) -> tuple[Any, Any]:
    """What the backward pass keeps: each operand only where the other's cotangent is wanted."""
    return (lhs if want_rhs else None), (rhs if want_lhs else None)


def _pullback(
    res: Any, ct: Any, dims: Any, precision: Any, named: Any, narrow: bool
) -> tuple[Any, Any]:
    """The float32 cotangents of the twins (None where not wanted, or where ``ct`` is zero)."""
    lhs, rhs = res
    if isinstance(ct, SymbolicZero):
        return None, None
    return transposes(ct, lhs, rhs, dims, precision, named, narrow)


def widened(eqn: Any, args: Any) -> list[Any] | None:
    """The float32 version of a contraction equation (``_widen``) whose operands were both of one
    scaled dtype: the scaled contraction of the narrow operands, read back exactly from their
    float32 ``args``, a float32 result. None for any other contraction."""
    lhs, rhs = eqn.invars
    if len(args) != 2 or not applies(lhs.aval.dtype, rhs.aval.dtype):
        return None
    d = np.dtype(lhs.aval.dtype)
    p = eqn.params
    precision = runnable_precision(p["precision"])
    narrow = [a.astype(d) for a in args]
    f = contraction(p["dimension_numbers"], precision, p.get("out_sharding"), shardings(*narrow))
    return [f(*narrow, *args)]


@functools.cache
def narrow_result(
    dims: Any,
    precision: Any,
    exactly: Callable[[Any], Any],
    named: Any = None,
    narrow: bool = True,
    keep_twins: tuple[bool, bool] = (False, False),
) -> Any:
    """``f(out, lhs32, rhs32, lhs, rhs)``: ``exactly(out)``, the float32 twin of ``out``, the narrow
    result of ``dot_general(lhs, rhs, dims)``; its cotangent reaches the float32 twins
    ``lhs32``/``rhs32`` through ``transposes``; ``named``: the operands' ``shardings``;
    ``keep_twins`` as ``contraction``'s. Under forward mode the twin differentiates as the float32
    contraction of the twins (``on_twins``)."""

    def derivative(lhs32: Any, rhs32: Any) -> Any:
        return lax.dot_general(lhs32, rhs32, dims, precision, preferred_element_type=_F32)

    def value(out: Any, lhs32: Any, rhs32: Any) -> Any:
        return on_twins(lambda _l, _r, out: exactly(out), derivative, [lhs32, rhs32], [out])

    @jax.custom_vjp
    def f(out: Any, lhs32: Any, rhs32: Any, lhs: Any, rhs: Any) -> Any:
        del lhs, rhs
        return value(out, lhs32, rhs32)

    def fwd(out: Any, lhs32: Any, rhs32: Any, lhs: Any, rhs: Any) -> tuple[Any, Any]:
        saved = _saved((lhs.value, rhs.value), (lhs32.value, rhs32.value), keep_twins, narrow)
        res = _residuals(*saved, lhs32.perturbed, rhs32.perturbed)
        return value(out.value, lhs32.value, rhs32.value), res

    def bwd(res: Any, ct: Any) -> tuple[Any, ...]:
        return None, *_pullback(res, ct, dims, precision, named, narrow), None, None

    f.defvjp(fwd, bwd, symbolic_zeros=True)

    def call(out: Any, lhs32: Any, rhs32: Any, lhs: Any, rhs: Any) -> Any:
        # ``out`` is read for its value alone, its derivative the twins' (``on_twins``)
        return f(lax.stop_gradient(out), lhs32, rhs32, *_stopped((lhs, rhs), keep_twins))

    return call
