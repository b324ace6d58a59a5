"""Policy versions of ``jax.nn``: activations, softmax family, attention, one_hot, initializers.

Every float-only function runs the whole of JAX's own implementation in the accumulation dtype
(float32 for narrow floats) and rounds once at the end, so every intermediate (the softmax
denominator, the sum inside logsumexp, the mean inside standardize, attention's logits and
probabilities) stays in float32 (POLICY.md 5). ``float_op`` is that mechanism for any JAX function
whose value operands are named parameters; ``heddle/ops/_linalg.py`` uses it too.

``NN`` is the classification of every public name of ``jax.nn``, as data.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.ops._core import cast, compute_dtype, materialise
from heddle.policy import _dtypes as D
from heddle.policy import _lattice, _rules, _scalars
from heddle.policy._policy import Policy, current
from heddle.policy._rules import OpClass

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _positions(fn: Callable[..., Any]) -> dict[str, int]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: i for i, p in enumerate(params) if p.kind in _POSITIONAL}


def complex_of(d: np.dtype) -> np.dtype:
    """The narrowest complex dtype whose real part holds every value of the real dtype ``d``."""
    if D.kind(d) == "c":
        return d
    out = _lattice.least_upper_bound([d], _lattice.COMPLEXES)
    return np.dtype("complex64") if out is None else out


def round_outputs(out: Any, result: np.dtype, p: Policy) -> Any:
    """Rounds every array leaf of ``out`` once to the dtype the policy gives it.

    A real float leaf takes the real part of ``result``; a complex leaf takes ``result`` if it is
    complex, else the narrowest complex holding it; an integer leaf takes ``result`` when ``result``
    is an integer (an integrality-preserving op), else the policy's index dtype (counts and ranks);
    bool leaves are left alone.
    """

    def leaf(o: Any) -> Any:
        d = getattr(o, "dtype", None)
        if d is None:
            return o
        k = D.kind(np.dtype(d))
        if k == "f":
            want = D.real_dtype(result) if D.is_inexact(result) else p.int_float_dtype
        elif k == "c":
            want = complex_of(result) if D.is_inexact(result) else p.default_complex
        elif k in "iu":
            want = result if D.is_integer(result) else p.index_dtype
        else:
            return o
        return o if o.dtype == want else cast(o, want)

    return jax.tree.map(leaf, out)


def precision_scope(comp: np.dtype, p: Policy) -> contextlib.AbstractContextManager[Any]:
    """``jax.default_matmul_precision`` for contractions inside JAX code computing in ``comp``.

    float32 and complex64 contractions run at ``Precision.HIGHEST`` unless the policy's
    ``float32_matmul_precision`` says otherwise; other dtypes need no scope.
    """
    if D.real_dtype(comp) == np.float32 and p.float32_matmul_precision != "default":
        return jax.default_matmul_precision(p.float32_matmul_precision)
    return contextlib.nullcontext()


_DYNAMIC = object()  # marks an array argument in a kernel's template


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def _template(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple, list[Any]]:
    """(hashable template of the non-array arguments, the array arguments in order)."""
    arrays: list[Any] = []

    def mark(v: Any) -> Any:
        if _is_array(v):
            arrays.append(v)
            return _DYNAMIC
        return v

    targs = tuple(mark(a) for a in args)
    tkw = tuple((k, mark(kwargs[k])) for k in sorted(kwargs))
    return (targs, tkw), arrays


def _fill(template: tuple, arrays: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    it = iter(arrays)
    targs, tkw = template
    args = [next(it) if a is _DYNAMIC else a for a in targs]
    kwargs = {k: next(it) if v is _DYNAMIC else v for k, v in tkw}
    return args, kwargs


def host_data(x: Any) -> Any:
    """Nested lists and tuples as arrays at the policy's defaults (as ``heddle.numpy.asarray``)."""
    if isinstance(x, (list, tuple)):
        from heddle.ops._creation import asarray

        return asarray(x)
    return x


def float_op(
    fn: Callable[..., Any],
    qualname: str,
    *,
    op_class: OpClass = OpClass.FLOAT_ONLY,
    values: Sequence[str] = ("x",),
    params: Sequence[str] = (),
    matmul: bool = False,
) -> Callable[..., Any]:
    """Wraps a JAX function so that it computes in the accumulation dtype and rounds once.

    Eagerly, the conversions, the call and the rounding run as one jitted kernel per (dtypes,
    non-array arguments); under an outer ``jax.jit`` they are traced inline.

    Args:
      fn: the JAX function.
      qualname: its public name (``"nn.softmax"``), for messages and docs.
      op_class: fixes the result dtype from the value operands (POLICY.md 4).
      values: names of the parameters that are value operands: they take part in promotion and are
        converted, with heddle's cast, to the result dtype and then exactly to the compute dtype.
      params: names of numeric hyper-parameters (``alpha``, ``epsilon``, ``rcond``): they do not take
        part in promotion; an array is converted to the compute dtype's real part, a Python scalar is
        passed on unrounded.
      matmul: whether ``fn`` contracts internally (run under ``precision_scope``).

    Returns:
      The wrapped function; ``inspect.signature`` of it is that of ``fn``.

    Raises:
      TypeError: at import, when a name in ``values`` or ``params`` is not a parameter of ``fn``.
    """
    known = inspect.signature(fn).parameters
    missing = [n for n in (*values, *params) if n not in known]
    if missing:  # a table entry that no longer matches JAX's signature: fail at import, loudly
        raise TypeError(f"heddle.{qualname}: JAX's signature has no parameter {missing}")
    pos = _positions(fn)
    slots = [(n, pos.get(n)) for n in values]
    pslots = [(n, pos.get(n)) for n in params]
    kernels: dict[tuple, Callable[..., Any]] = {}

    def present(args: Sequence[Any], kwargs: dict[str, Any], which: list) -> list:
        out = []
        for n, i in which:
            v = kwargs[n] if n in kwargs else args[i] if i is not None and i < len(args) else None
            if v is not None:
                out.append((n, i, v))
        return out

    def put(args: list[Any], kwargs: dict[str, Any], n: str, i: int | None, v: Any) -> None:
        if n in kwargs:
            kwargs[n] = v
        else:
            args[i] = v

    def compute(args: list[Any], kwargs: dict[str, Any], result: np.dtype, p: Policy) -> Any:
        comp = compute_dtype(result, p)
        for n, i, v in present(args, kwargs, slots):
            put(args, kwargs, n, i, cast(cast(v, result), comp))
        for n, i, v in present(args, kwargs, pslots):
            if hasattr(v, "dtype"):
                put(args, kwargs, n, i, cast(v, D.real_dtype(comp)))
        scope = precision_scope(comp, p) if matmul else contextlib.nullcontext()
        with scope:
            out = fn(*args, **kwargs)
        return round_outputs(out, result, p)

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        found = [(n, i, host_data(v)) for n, i, v in present(args, kwargs, slots)]
        if not found:
            return fn(*args, **kwargs)
        p = current()
        common = _scalars.resolve(tuple(v for _, _, v in found), p)
        result = _rules.result_dtype(op_class, common, policy=p)
        for d in {result, compute_dtype(result, p)}:
            D.require_available(d, f"heddle.{qualname}")
        new_args, new_kwargs = list(args), dict(kwargs)
        for n, i, v in found:
            put(new_args, new_kwargs, n, i, materialise(v, result))
        template, arrays = _template(new_args, new_kwargs)
        if any(isinstance(a, jax.core.Tracer) for a in arrays):
            return compute(new_args, new_kwargs, result, p)
        key = (template, result, p, D.x64_enabled())
        try:
            kernel = kernels.get(key)
        except TypeError:  # an unhashable non-array argument: run op by op
            return compute(new_args, new_kwargs, result, p)
        if kernel is None:

            def run(*arrays: Any, template: tuple = template) -> Any:
                a, k = _fill(template, arrays)
                return compute(a, k, result, p)

            kernel = kernels[key] = jax.jit(run)
        return kernel(*arrays)

    return op


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
    d = current().default_float if dtype is None else D.dtype(dtype)
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
    p = current()
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
        op = float_op(jfn, f"nn.{name}", op_class=op_class, values=values, params=params)
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
        p = current()
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
            kernel = kernels[k] = jax.jit(
                functools.partial(sample, shape=tuple(shape), d=d, p=p, kwargs=kwargs)
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
