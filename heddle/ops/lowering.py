"""How heddle lowers its ops to JAX on each backend: the explicit conversion, and narrow contractions.

Every op converts its operands with ``cast``, heddle's correctly rounded cast. A contraction
(``matmul``, ``einsum``, ``dot``, ``tensordot``, ``heddle.lax.dot_general``, the convolutions) of
narrow floats (bfloat16, float16, float8) feeds the dot its operands' promotion and accumulates in
float32 through ``preferred_element_type``; how the dot is laid out depends on the backend:

- GPU and TPU: the narrow operands go to the dot as they are (their matrix units take them with a
  float32 result directly).
- CPU: the same, wherever XLA:CPU's library path takes the dot (``NARROW_ON_CPU``); the dots it has
  no narrow kernel for are widened exactly to float32 first (``narrow_dot_needs_widening``,
  ``contraction_dot_general``), and a matmul whose weight is being differentiated takes the weight
  transposed (``matmul_on_cpu``). The convolutions widen.

Widening is exact, so every arrangement is the same float32-accumulated contraction, rounded once;
only its speed differs, measured by ``python benchmarks/bench_contractions.py`` (recorded in
benchmarks/RESULTS.md). ``heddle.autocast`` and the audit (heddle.programs) lower the dots of a
traced program with the same functions.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from heddle.policy import _dtypes as D
from heddle.policy._casts import astype as _astype
from heddle.policy._policy import active
from heddle.programs._table import Fact, has


def cast(x: Any, d: np.dtype) -> jax.Array:
    """heddle's correctly rounded cast of an array to ``d`` (a no-op when it already is ``d``).

    Args:
      x: an array, a tracer or a NumPy value.
      d: the target dtype.

    Returns:
      ``x`` itself when it is already a JAX value of dtype ``d``; otherwise ``x`` rounded once to ``d``.

    Examples:
      >>> import jax.numpy as jnp, numpy as np
      >>> from heddle.ops import lowering
      >>> lowering.cast(jnp.asarray([1.0, 2.5]), np.dtype(jnp.bfloat16)).dtype
      dtype(bfloat16)
    """
    if getattr(x, "dtype", None) == d and not isinstance(x, np.ndarray):
        return x
    return _astype(x, d)


# The algorithm presets JAX lowers on XLA:CPU (``jax._src.lax.lax._handle_dot_precision`` raises for
# any other, eagerly as under jit). Plain JAX's ``dot_product_attention`` of float16 asks for
# ``F16_F16_F32`` (narrow operands, float32 accumulation) and only falls back to the default when the
# eager call fails, so its traced program cannot run on CPU.
_CPU_ALGORITHMS = frozenset(
    "DEFAULT F16_F16_F16 F32_F32_F32 F64_F64_F64 BF16_BF16_F32 BF16_BF16_F32_X3 BF16_BF16_F32_X6".split()
)


def runnable_precision(precision: Any) -> Any:
    """A contraction's ``precision``, or None where it is an algorithm preset XLA:CPU cannot run.

    Such a preset names the operand and accumulation dtypes, and heddle's contraction rules already
    give the dot its operands (narrow, or widened exactly) and a float32 accumulator; so the preset
    is dropped and the dot bound at the default precision, the same contraction the preset asks for.

    Args:
      precision: a ``dot_general`` precision: None, a ``lax.Precision`` pair or a
        ``lax.DotAlgorithmPreset``.

    Returns:
      ``precision``, or None for a preset the CPU backend refuses (on CPU).

    Examples:
      >>> from jax import lax
      >>> from heddle.ops import lowering
      >>> preset = lax.DotAlgorithmPreset.F16_F16_F32
      >>> lowering.runnable_precision(preset) is (None if lowering.on_cpu() else preset)
      True
    """
    if not isinstance(precision, lax.DotAlgorithmPreset) or not on_cpu():
        return precision
    return None if precision.name not in _CPU_ALGORITHMS else precision


PRECISION: dict[str, Any] = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "default": None,
}
"""The ``precision=`` of a float32 dot, by the policy's ``float32_matmul_precision``."""

# Contractions whose dot_general always contracts the lhs on its trailing dimensions (a layout
# XLA:CPU's library path takes with narrow operands and a float32 result); measured on CPU by
# ``python benchmarks/bench_contractions.py`` (benchmarks/RESULTS.md). ``einsum`` and
# ``heddle.lax.dot_general`` and tensordot decide dot by dot (``narrow_dot_needs_widening``); the
# convolutions widen on CPU.
NARROW_ON_CPU = frozenset(
    "matmul dot vdot inner vecdot einsum batch_matmul linalg.matmul linalg.vecdot tensordot".split()
)
"""The contractions whose narrow float operands reach XLA:CPU's dot unwidened."""


@functools.cache
def on_cpu() -> bool:
    """Whether JAX's default backend is the CPU (where the layout of a narrow dot matters).

    Returns:
      True on CPU, False on GPU and TPU.

    Examples:
      >>> import jax
      >>> from heddle.ops import lowering
      >>> lowering.on_cpu() == (jax.default_backend() == "cpu")
      True
    """
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
      >>> from heddle.ops import lowering
      >>> lowering.widens_narrow_contractions("matmul")
      False
    """
    return on_cpu() and name not in NARROW_ON_CPU


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
      >>> from heddle.ops import lowering
      >>> dn = (((0,), (2,)), ((), ()))
      >>> lowering.narrow_dot_needs_widening(2, 3, dn) == lowering.on_cpu()
      True
    """
    if not on_cpu():
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
      >>> from heddle.ops import lowering
      >>> a, b = jnp.ones((16, 4), jnp.bfloat16), jnp.ones((2, 16, 3), jnp.bfloat16)
      >>> dn = (((0,), (0,)), ((), ()))
      >>> lowering.dot_needs_widening(a, b[0], dn)
      False
      >>> seen = []  # vmapped, the rhs gains a free dimension: no narrow kernel on XLA:CPU
      >>> _ = jax.vmap(lambda y: seen.append(lowering.dot_needs_widening(a, y, dn)) or y)(b)
      >>> seen == [lowering.on_cpu()]
      True
    """
    if not on_cpu():
        return False
    bl, br = is_vmapped(lhs), is_vmapped(rhs)
    if not (bl or br):
        return narrow_dot_needs_widening(np.ndim(lhs), np.ndim(rhs), dimension_numbers)
    if bl and br and lhs._trace is not rhs._trace:
        return True
    lv, rv = (lhs.val if bl else lhs), (rhs.val if br else rhs)
    lbd, rbd = (lhs.batch_dim if bl else None), (rhs.batch_dim if br else None)
    if (
        is_vmapped(lv)
        or is_vmapped(rv)
        or not all(d is None or isinstance(d, int) for d in (lbd, rbd))
    ):
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
    """A ``lax.dot_general`` for contractions built on it (``jnp.einsum``'s ``_dot_general``).

    Narrow operands go to the dot as they are, or widened exactly to float32 (at ``precision``)
    where ``dot_needs_widening`` says XLA:CPU needs it.

    Args:
      precision: the ``precision=`` of a widened dot that sets none itself.
      vmapped: the contraction's operands are being batched by ``jax.vmap`` where this dot cannot
        see it (inside ``jnp.einsum``'s own jit, which vmap batches as a whole): ``"leading"`` when
        every vmapped dimension is the operand's first (vmap's default), so it becomes a leading
        batch dimension or a free one; ``"other"`` otherwise, where every narrow dot is widened
        (exact); None when nothing is vmapped (``vmap_placement``).

    Returns:
      A function with ``lax.dot_general``'s signature.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.ops import lowering
      >>> a = jnp.ones((4, 3), jnp.bfloat16)
      >>> dot = lowering.contraction_dot_general()
      >>> dot(a, a, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32).dtype
      dtype('float32')
    """

    def needs(lhs: Any, rhs: Any, dn: Any) -> bool:
        if vmapped is None or not on_cpu():
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


def vmap_placement(values: Sequence[Any]) -> str | None:
    """Where ``jax.vmap`` batches a contraction's operands, for ``contraction_dot_general``.

    Args:
      values: the operands (arrays or tracers).

    Returns:
      None when no value is being vmapped; ``"leading"`` when each vmapped one is vmapped along its
      first axis (nested vmaps too); ``"other"`` otherwise.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle.ops import lowering
      >>> x = jnp.ones((2, 3))
      >>> lowering.vmap_placement([x]) is None
      True
      >>> jax.vmap(lambda r: jnp.float32(lowering.vmap_placement([r]) == "leading"))(x)[0]
      Array(1., dtype=float32)
    """
    dims = []
    for v in values:
        while is_vmapped(v):
            dims.append(v.batch_dim)
            v = v.val
    if not dims:
        return None
    return "leading" if all(d == 0 for d in dims) else "other"


def is_vmapped(x: Any) -> bool:
    """Whether ``x`` is being batched by ``jax.vmap`` (a dot of it then gains a dimension that
    heddle's trace does not see).

    Args:
      x: a value (an array or a tracer).

    Returns:
      True for a tracer of ``jax.vmap``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle.ops import lowering
      >>> lowering.is_vmapped(jnp.ones(2))
      False
      >>> bool(jax.vmap(lambda r: jnp.float32(lowering.is_vmapped(r)))(jnp.ones(2))[0])
      True
    """
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


def is_differentiated(x: Any) -> bool:
    """Whether ``x`` is being differentiated (``jax.grad``, ``jax.vjp``, ``jax.jvp`` traced it).

    Args:
      x: a value (an array or a tracer).

    Returns:
      True for a tracer of JAX's forward-mode or linearising differentiation.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from heddle.ops import lowering
      >>> seen = []
      >>> _ = jax.grad(lambda w: seen.append(lowering.is_differentiated(w)) or w)(1.0)
      >>> seen, lowering.is_differentiated(jnp.ones(2))
      ([True], False)
    """
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
      >>> from heddle.ops import lowering
      >>> a, b = jnp.ones((2, 3, 4), jnp.bfloat16), jnp.ones((4, 5), jnp.bfloat16)
      >>> lowering.matmul_on_cpu(a, b, preferred_element_type=jnp.float32).shape
      (2, 3, 5)
    """
    if transposes_weight_on_cpu(a, b) and not set(kwargs) - {"preferred_element_type", "precision"}:
        return lax.dot_general(a, b.T, (((a.ndim - 1,), (1,)), ((), ())), **kwargs)
    return jax.numpy.matmul(a, b, **kwargs)


def transposes_weight_on_cpu(a: Any, b: Any) -> bool:
    """Whether ``a @ b`` (narrow operands, float32 result) feeds the weight ``b`` to XLA:CPU's dot
    transposed, as ``matmul_on_cpu`` says; heddle.autocast asks the same of every such dot.

    Args:
      a: the lhs.
      b: the rhs (the weight).

    Returns:
      True when ``b`` is an unbatched rank-2 weight being differentiated and the layout above
      applies.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.ops import lowering
      >>> lowering.transposes_weight_on_cpu(jnp.ones((2, 3, 4)), jnp.ones((4, 5)))  # no gradient
      False
    """
    return (
        np.ndim(b) == 2
        and np.ndim(a) >= 2
        and is_differentiated(b)
        and not is_vmapped(b)
        and (np.ndim(a) > 2 or is_vmapped(a) or b.shape[0] > b.shape[1])
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
      >>> from heddle.ops import lowering
      >>> a, b = jnp.ones((4, 3), jnp.bfloat16), jnp.ones((2, 5, 4), jnp.bfloat16)
      >>> lowering.tensordot_on_cpu(a, b, ([0], [2]), preferred_element_type=jnp.float32).shape
      (3, 2, 5)
    """
    # jnp.tensordot's own checks and axes normalisation (its errors are the user's): the program
    # is one dot_general of the two operands, whose dimension numbers are the ones to bind
    program = jax.make_jaxpr(lambda x, y: jax.numpy.tensordot(x, y, axes, **kwargs))(a, b).jaxpr
    (dot, *others) = [e for e in program.eqns if has(e.primitive.name, Fact.DOT)] or [None]
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


def contraction(fn: Callable[..., Any], operand_dtype: np.dtype, operands: Sequence[Any]) -> Any:
    """The function a contraction ``fn`` (called with ``preferred_element_type=``) is computed by,
    given the dtype its operands reach it in.

    ``jnp.einsum`` of operands narrower than 32 bits decides dot by dot (``contraction_dot_general``,
    at the policy's float32 matmul precision); ``jnp.matmul`` and ``jnp.tensordot`` of narrow floats
    go through ``CPU_LOWERINGS`` on CPU; everything else is ``fn`` itself.

    Args:
      fn: the JAX contraction.
      operand_dtype: the dtype the operands are converted to (``contraction_operand_dtype``).
      operands: the converted operands (tracers under ``jax.vmap`` tell where it batches them).

    Returns:
      A function with ``fn``'s signature and value.

    Examples:
      >>> import jax.numpy as jnp, numpy as np
      >>> from heddle.ops import lowering
      >>> lowering.contraction(jnp.add, np.dtype(jnp.bfloat16), []) is jnp.add
      True
    """
    if operand_dtype.itemsize < 4 and _takes_dot_general(fn):  # einsum: decide dot by dot
        prec = PRECISION[active().float32_matmul_precision]
        dot = contraction_dot_general(prec, vmap_placement(operands))

        def with_dot_general(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **{**kwargs, "_dot_general": dot})

        return with_dot_general
    narrow_float = D.kind(operand_dtype) == "f" and operand_dtype.itemsize < 4
    if narrow_float and fn in CPU_LOWERINGS and on_cpu():
        return CPU_LOWERINGS[fn]
    return fn


@functools.cache
def _takes_dot_general(fn: Callable[..., Any]) -> bool:
    try:
        return "_dot_general" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def contraction_operand_dtype(common: np.dtype, acc: np.dtype, widen: bool) -> np.dtype:
    """The dtype a contraction's operands are fed to the dot in.

    Args:
      common: the promotion of the operands.
      acc: the accumulation dtype.
      widen: ``widens_narrow_contractions(name)`` for the contraction.

    Returns:
      ``common``, or ``acc`` for sub-byte integers and floats (XLA cannot widen them inside a dot)
      and, where ``widen``, for narrow floats.

    Examples:
      >>> import numpy as np, ml_dtypes
      >>> from heddle.ops import lowering
      >>> bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
      >>> lowering.contraction_operand_dtype(bf16, f32, widen=False)
      dtype(bfloat16)
      >>> lowering.contraction_operand_dtype(np.dtype(ml_dtypes.int4), np.dtype(np.int32), False)
      dtype('int32')
    """
    k = D.kind(common)
    if k in "iu" and int(D.iinfo(common).bits) < 8:
        return acc
    if k == "f" and int(D.finfo(common).bits) < 8:
        return acc
    if k == "f" and common.itemsize < 4 and widen:
        return acc
    return common
