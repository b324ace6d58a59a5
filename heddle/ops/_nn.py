"""Policy versions of ``jax.nn``: activations, softmax family, attention, one_hot, initializers.

Every float-only function runs the whole of JAX's own implementation in the accumulation dtype
(float32 for narrow floats) and rounds once at the end, so every intermediate (the softmax
denominator, the sum inside logsumexp, the mean inside standardize, attention's logits and
probabilities) stays in float32 (POLICY.md 5). The mechanism, ``float_op``, is in
``heddle/ops/_float_op.py`` (imported from here by ``heddle/ops/_linalg.py`` too).

``NN`` is the classification of every public name of ``jax.nn``, as data.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.ops import _formulas
from heddle.ops._core import compute_dtype, order_dtype, remember
from heddle.ops._float_op import float_op, host_data, precision_scope, round_outputs
from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._policy import Policy, active
from heddle.policy._rules import OpClass

# --- integrality-preserving activations: exact in the input dtype ----------------------------------


def _clipper(fn: Callable[..., Any], lo: int, hi: int | None, qualname: str) -> Callable[..., Any]:
    """relu-style activations: the input dtype; integers and bool are clipped natively."""

    @functools.wraps(fn)
    def op(x: Any) -> Any:
        x = host_data(x)
        d = _scalars.resolve((x,))
        x = jnp.asarray(materialise(x, d))
        if D.kind(d) == "b":
            return x  # 0 and 1 are already inside every clip range used here
        if D.kind(d) in "iu":
            low = lax.full_like(x, max(lo, D.int_range(d)[0]))
            return lax.max(x, low) if hi is None else lax.clamp(low, x, lax.full_like(x, hi))
        return fn(x)

    op.__qualname__ = qualname
    return op


def one_hot(x: Any, num_classes: int, *, dtype: Any = None, axis: int | Any = -1) -> jax.Array:
    """One-hot encoding, in the policy's default float unless ``dtype`` says otherwise.

    Dtypes: result ``dtype``, default the active policy's ``default_float`` (float32; JAX gives
    float64 under ``jax_enable_x64``); the values 0 and 1 are exact in every dtype.

    Args:
      x: integer class indices.
      num_classes: the number of classes.
      dtype: the result dtype; the policy's default float when None.
      axis: where the new class axis goes.

    Returns:
      ``x.shape`` with a ``num_classes`` axis inserted at ``axis``.

    Raises:
      PrecisionError: a 64-bit ``dtype`` while ``jax_enable_x64`` is off.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.nn
      >>> heddle.nn.one_hot(jnp.array([0, 2]), 3)
      Array([[1., 0., 0.],
             [0., 0., 1.]], dtype=float32)
    """
    d = active().default_float if dtype is None else D.dtype(dtype)
    D.require_available(d, "heddle.nn.one_hot")
    return jax.nn.one_hot(x, num_classes, dtype=d, axis=axis)


def dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    bias: Any = None,
    mask: Any = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: Any = None,
    key_value_seq_lengths: Any = None,
    local_window_size: int | tuple[int, int] | None = None,
    implementation: str | None = None,
    return_residual: bool = False,
) -> Any:
    """Scaled dot-product attention with float32 logits, probabilities and accumulation.

    Dtypes: the result is the promotion of ``query``, ``key``, ``value`` and ``bias`` (an integer
    promotion gives the default float). With ``implementation`` None or ``"xla"`` every operand is
    converted exactly to the accumulation dtype (float32 for narrow floats) and the whole of
    ``jax.nn.dot_product_attention`` runs there, contractions at full float32 precision, so the
    probabilities are never rounded to the narrow dtype before they meet ``value`` (JAX rounds them);
    the output (and the residual) is rounded once. ``implementation="cudnn"`` runs cuDNN's fused
    kernel on the operands converted to the result dtype (cuDNN accumulates in float32 itself).

    Args:
      query: ``[B, T, N, H]`` (or without the batch axis).
      key: ``[B, S, K, H]``.
      value: ``[B, S, K, H]``.
      bias: optional additive bias broadcastable to ``[B, N, T, S]``.
      mask: optional boolean mask broadcastable to ``[B, N, T, S]``.
      scale: the logit scale; ``1/sqrt(H)`` when None.
      is_causal: apply a causal mask.
      query_seq_lengths: optional int32 ``[B]`` valid query lengths.
      key_value_seq_lengths: optional int32 ``[B]`` valid key/value lengths.
      local_window_size: optional sliding window.
      implementation: None, ``"xla"`` or ``"cudnn"``, as in JAX.
      return_residual: also return the logsumexp residual.

    Returns:
      The attention output in the result dtype (and the residual, if asked).

    Raises:
      PromotionError: the operands have no promotion under the policy.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle.nn
      >>> q = jnp.ones((1, 4, 2, 8), jnp.bfloat16)
      >>> heddle.nn.dot_product_attention(q, q, q).dtype
      dtype(bfloat16)
    """
    kwargs = dict(
        scale=scale,
        is_causal=is_causal,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
        local_window_size=local_window_size,
        implementation=implementation,
        return_residual=return_residual,
    )
    if implementation != "cudnn":
        return _attention(query, key, value, bias, mask, **kwargs)
    p = active()
    operands = tuple(v for v in (query, key, value, bias) if v is not None)
    result = _rules.result_dtype(OpClass.FLOAT_ONLY, _scalars.resolve(operands, p), policy=p)
    D.require_available(result, "heddle.nn.dot_product_attention")

    def conv(v: Any) -> Any:
        return None if v is None else cast(materialise(v, result), result)

    out = jax.nn.dot_product_attention(
        conv(query), conv(key), conv(value), conv(bias), mask, **kwargs
    )
    return round_outputs(out, result, p)


_attention = float_op(
    jax.nn.dot_product_attention,
    "nn.dot_product_attention",
    values=("query", "key", "value", "bias"),
    matmul=True,
)


# --- logsumexp: the max on the narrow input ---------------------------------------------------------


def logsumexp(
    a: Any,
    axis: Any = None,
    b: Any = None,
    keepdims: bool = False,
    return_sign: bool = False,
    where: Any = None,
) -> Any:
    """``jax.nn.logsumexp`` with every intermediate in the compute dtype, ``a`` read narrow.

    float_op hands ``a`` and ``b`` over rounded to the result dtype (``widen=False``). For a narrow
    real float ``a`` this is JAX's computation on ``a`` widened to float32 (the same values and
    gradients), except that the maximum is taken on ``a`` itself, which is exact, and ``a`` is
    widened only inside the ``exp(a - max)`` sum: widened once for both reductions, XLA kept a
    float32 copy of the whole input (two users), 1.9-2.4x jax.nn.logsumexp's time.
    """
    comp = compute_dtype(np.dtype(a.dtype), active())
    if comp == a.dtype or not jnp.issubdtype(a.dtype, jnp.floating):
        return jax.nn.logsumexp(a, axis, b, keepdims, return_sign, where)
    b = None if b is None else cast(b, comp)
    if where is not None:
        a = jnp.where(where, a, jnp.zeros((), a.dtype))
    if b is not None:
        a = jnp.where(b != 0, a, jnp.full((), -np.inf, a.dtype))
    ordered = order_dtype(a.dtype)  # a format with no -inf (float8_e8m0fnu): exactly widened first
    m = a if ordered == a.dtype else cast(a, ordered)
    # the max is a constant of the derivative (as in JAX's): stopped before the reduction, so that
    # no derivative of reduce_max (its tie count, a sum in a's dtype) is ever built
    m = lax.stop_gradient(m)
    amax = cast(jnp.max(m, axis=axis, keepdims=True, where=where, initial=-np.inf), comp)
    amax = lax.select(jnp.isfinite(amax), amax, lax.full_like(amax, 0))
    exp_a = lax.exp(lax.sub(cast(a, comp), amax))
    if b is not None:
        exp_a = lax.mul(exp_a, b)
    sumexp = exp_a.sum(axis=axis, keepdims=keepdims, where=where)
    sign = lax.sign(sumexp)
    out = lax.add(lax.log(abs(sumexp)), amax.reshape(sumexp.shape))
    if return_sign:
        return (out, sign)
    if b is not None:
        with jax.debug_nans(False):
            out = jnp.where(sign < 0, jnp.array(np.nan, dtype=out.dtype), out)
    return out


# float_op functions that read their value operands at the result dtype and widen them themselves
_NARROW_IN: dict[str, Callable[..., Any]] = {"logsumexp": logsumexp}


# --- the table ------------------------------------------------------------------------------------

F = OpClass.FLOAT_ONLY

# name -> (op class, value operands, hyper-parameters); every one computes in acc_dtype, rounds once.
FLOAT_OPS: dict[str, tuple[OpClass, tuple[str, ...], tuple[str, ...]]] = {
    **dict.fromkeys(
        "sigmoid silu swish gelu glu hard_sigmoid hard_silu hard_swish log_sigmoid log1mexp mish "
        "selu soft_sign softplus sparse_plus sparse_sigmoid tanh softmax log_softmax "
        "logmeanexp".split(),
        (F, ("x",), ()),
    ),
    "celu": (F, ("x",), ("alpha",)),
    "elu": (F, ("x",), ("alpha",)),
    "leaky_relu": (F, ("x",), ("negative_slope",)),
    "squareplus": (F, ("x",), ("b",)),
    "logsumexp": (F, ("a", "b"), ()),
    "standardize": (F, ("x", "mean", "variance"), ("epsilon",)),
}

# integrality-preserving: (lower bound, upper bound or None); exact in the input dtype.
CLIP_OPS: dict[str, tuple[int, int | None]] = {
    "relu": (0, None),
    "relu6": (0, 6),
    "hard_tanh": (-1, 1),
}

SPECIAL = {
    "one_hot": "creation: dtype argument, default the policy's default float",
    "dot_product_attention": "float32 logits, probabilities and accumulation; rounded once",
    "initializers": "initializers computing in float32 for narrow dtypes, default dtype the "
    "policy's default float (heddle/ops/_initializers in heddle.nn)",
}

# Names with no dtype decision, each with the reason it passes through unchanged.
PASS: dict[str, str] = {
    "identity": "returns its input unchanged",
    "scaled_matmul": "block-scaled (MX) matmul: its operands are the quantisation formats and it "
    "already accumulates in preferred_element_type (float32 by default)",
    "scaled_dot_general": "block-scaled (MX) dot_general: quantises its operands itself and already "
    "accumulates in preferred_element_type (float32 by default)",
    "get_scaled_dot_general_config": "returns a configuration object, not an array",
}


def _doc(name: str, op_class: OpClass, jfn: Callable[..., Any]) -> str:
    what = (
        "a float input keeps its dtype; an integer or bool input gives the policy's default float"
        if op_class is F
        else "the input dtype, computed exactly (integers and bool clipped natively)"
    )
    compute = (
        "JAX's implementation runs in the accumulation dtype (float32 for narrow floats) and the "
        "output is rounded once, so every intermediate stays in float32"
        if op_class is F
        else "no rounding at all"
    )
    return (
        f"heddle's policy version of ``jax.nn.{name}``.\n\n"
        f"Dtypes: {what}; {compute} (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.nn.{name}.\n  **kwargs: as for jax.nn.{name}.\n\n"
        f"Returns:\n  The result of jax.nn.{name} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.nn\n  >>> heddle.nn.{name}  # doctest: +ELLIPSIS\n"
        f"  <function ...>\n\n"
        f"Original documentation follows.\n\n{jfn.__doc__ or ''}"
    )


def build() -> dict[str, Any]:
    """The policy functions of heddle.nn, by name (pass-throughs and initializers excluded)."""
    names: dict[str, Any] = {}
    for name, (op_class, values, params) in FLOAT_OPS.items():
        jfn = getattr(jax.nn, name)
        fn = _NARROW_IN.get(name) or _formulas.NN.get(name, jfn)
        op = float_op(
            fn,
            f"nn.{name}",
            op_class=op_class,
            values=values,
            params=params,
            widen=name not in _NARROW_IN,
        )
        op.__doc__ = _doc(name, op_class, jfn)
        names[name] = op
    for name, (lo, hi) in CLIP_OPS.items():
        jfn = getattr(jax.nn, name)
        op = _clipper(jfn, lo, hi, name)
        op.__doc__ = _doc(name, OpClass.INTEGRAL, jfn)
        names[name] = op
    names["one_hot"] = one_hot
    names["dot_product_attention"] = dot_product_attention
    return names


# --- initializers -----------------------------------------------------------------------------------


def _policy_init(inner: Callable[..., Any], default: Any, qualname: str) -> Callable[..., Any]:
    """An initializer that samples in the accumulation dtype and rounds once to ``dtype``."""
    kernels: dict[tuple, Callable[..., Any]] = {}

    def sample(key: Any, shape: Any, d: np.dtype, p: Policy, kwargs: dict[str, Any]) -> Any:
        comp = compute_dtype(d, p)
        with precision_scope(comp, p):
            out = inner(key, shape, comp, **kwargs)
        return out if out.dtype == d else cast(out, d)

    @functools.wraps(inner)
    def init(key: Any, shape: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> jax.Array:
        p = active()
        chosen = dtype if dtype is not None else default
        d = p.default_float if chosen is None else D.dtype(chosen)
        for x in {d, compute_dtype(d, p)}:
            D.require_available(x, f"heddle.nn.initializers.{qualname}")
        if args:  # out_sharding given positionally
            kwargs["out_sharding"] = args[0]
        if isinstance(key, jax.core.Tracer):
            return sample(key, shape, d, p, kwargs)
        try:
            k = (tuple(shape), d, p, D.x64_enabled(), tuple(sorted(kwargs.items())))
            kernel = kernels.get(k)
        except TypeError:  # an unhashable argument: sample op by op
            return sample(key, shape, d, p, kwargs)
        if kernel is None:
            kernel = remember(
                kernels,
                k,
                jax.jit(functools.partial(sample, shape=tuple(shape), d=d, p=p, kwargs=kwargs)),
            )
        return kernel(key)

    return init


def _factory(jfactory: Callable[..., Any], name: str) -> Callable[..., Any]:
    sig = inspect.signature(jfactory)

    @functools.wraps(jfactory)
    def factory(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        bound = sig.bind(*args, **kwargs)
        default = bound.arguments.get("dtype")
        return _policy_init(jfactory(*args, **kwargs), default, name)

    return factory


def _init_doc(name: str, jfn: Callable[..., Any], factory: bool) -> str:
    what = "Returns an initializer that" if factory else "An initializer that"
    return (
        f"heddle's policy version of ``jax.nn.initializers.{name}``.\n\n"
        f"Dtypes: {what[0].lower() + what[1:]} samples in the accumulation dtype (float32 for "
        "narrow floats) and rounds once to ``dtype``; ``dtype`` defaults to the active policy's "
        "default float (JAX: float64 under ``jax_enable_x64``).\n\n"
        f"Args:\n  *args: as for jax.nn.initializers.{name}.\n"
        f"  **kwargs: as for jax.nn.initializers.{name}.\n\n"
        f"Returns:\n  As jax.nn.initializers.{name}.\n\n"
        f"Examples:\n  >>> import heddle.nn\n  >>> heddle.nn.initializers.{name}  "
        "# doctest: +ELLIPSIS\n  <function ...>\n\n"
        f"Original documentation follows.\n\n{jfn.__doc__ or ''}"
    )


INIT_DIRECT = ("zeros", "ones")  # initializers themselves: (key, shape, dtype, out_sharding)
INIT_FACTORIES = tuple(
    "constant delta_orthogonal glorot_normal glorot_uniform he_normal he_uniform kaiming_normal "
    "kaiming_uniform lecun_normal lecun_uniform normal orthogonal truncated_normal uniform "
    "variance_scaling xavier_normal xavier_uniform".split()
)  # factories: (..., dtype=None) -> initializer
INIT_PASS = {"Initializer": "the protocol class of initializers"}


def build_initializers() -> dict[str, Any]:
    """Every public name of ``jax.nn.initializers``, policy versions where a dtype is chosen."""
    src = jax.nn.initializers
    names: dict[str, Any] = {}
    for name in (*INIT_DIRECT, *INIT_FACTORIES, *INIT_PASS):
        jfn = getattr(src, name, None)
        if jfn is None:
            continue
        if name in INIT_PASS:
            names[name] = jfn
            continue
        direct = name in INIT_DIRECT
        op = _policy_init(jfn, None, name) if direct else _factory(jfn, name)
        op.__doc__ = _init_doc(name, jfn, factory=not direct)
        names[name] = op
    return names
