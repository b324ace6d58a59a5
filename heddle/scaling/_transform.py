"""dynamic_loss_scale: loss scaling as an optax transformation, decided on device."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from heddle.policy._errors import message
from heddle.scaling._finite import grads_finite
from heddle.scaling._states import (
    F32_MAX,
    F32_RANGE,
    F32_TINY,
    LOSS_SCALE_TYPES,
    DynamicLossScale,
    LossScale,
)

_I32_MAX = int(jnp.iinfo(jnp.int32).max)


class DynamicLossScaleState(NamedTuple):
    """State of ``dynamic_loss_scale``: the wrapped optimiser's state and the loss scale.

    Attributes:
      inner_state: the wrapped transformation's state; bit-identical after a skipped step.
      loss_scale: the ``DynamicLossScale`` (scale, counters, diagnostics).
    """

    inner_state: Any
    loss_scale: DynamicLossScale


def _concrete(x: Any) -> float | None:
    """``x`` as a Python float, or None when it is traced (``optax.inject_hyperparams`` under jit)."""
    try:
        return float(x)
    except jax.errors.ConcretizationTypeError:
        return None


def _number(x: Any, what: str, low: Any, high: Any, lo_ok: bool, hi_ok: bool, fix: str) -> Any:
    """Checks one real hyperparameter; returns it as a float, or as it is when traced.

    The value must also be a normal float32 (the dtype the scale is computed in), so that no bound,
    scale or factor becomes inf or 0 once it is applied.
    """
    asked = f"dynamic_loss_scale({what}={x!r})"
    if isinstance(x, str | bytes | bool) or np.shape(x) != ():
        raise TypeError(message(asked, f"{what} must be a real number", fix))
    try:
        d = x.dtype if hasattr(x, "dtype") else type(x)
        if not (jnp.issubdtype(d, jnp.floating) or jnp.issubdtype(d, jnp.integer)):
            raise TypeError
        v = _concrete(x)
    except (TypeError, ValueError):
        raise TypeError(message(asked, f"{what} must be a real number", fix)) from None
    if v is None:
        return x  # traced (inject_hyperparams): its concrete value was checked by init
    if jnp.issubdtype(d, jnp.floating) and np.dtype(d).itemsize < 4:
        fix = (
            f"{what} arrived as {np.dtype(d).name}, as optax.inject_hyperparams makes it with "
            "parameters of that dtype: pass the hyperparameters as float32, "
            "optax.inject_hyperparams(dynamic_loss_scale, hyperparam_dtype=jnp.float32)."
        )
    lo, hi = _concrete(low), _concrete(high)
    ok = (
        math.isfinite(v)
        and (lo is None or (v >= lo if lo_ok else v > lo))
        and (hi is None or (v <= hi if hi_ok else v < hi))
    )
    if not ok:
        lo_s = "[" if lo_ok else "("
        hi_s = "]" if hi_ok else ")"
        raise ValueError(message(asked, f"{what} must be a number in {lo_s}{lo}, {hi}{hi_s}", fix))
    if not F32_TINY <= v <= F32_MAX:
        raise ValueError(
            message(
                asked,
                f"{what} must be a number that float32 holds, in {F32_RANGE} (the loss scale is "
                "kept and computed in float32, where it would become inf or 0)",
                fix,
            )
        )
    return v


def _count(x: Any, what: str, fix: str) -> Any:
    asked = f"dynamic_loss_scale({what}={x!r})"
    try:
        if isinstance(x, bool) or np.shape(x) != ():
            raise TypeError
        if hasattr(x, "dtype") and not jnp.issubdtype(x.dtype, jnp.integer):
            raise TypeError
        v = operator.index(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
        return x  # traced (inject_hyperparams): its concrete value was checked by init
    except TypeError:
        raise TypeError(message(asked, f"{what} must be an int", fix)) from None
    if not 1 <= v <= _I32_MAX:
        raise ValueError(
            message(
                asked, f"{what} must be at least 1 and at most {_I32_MAX} (an int32 count)", fix
            )
        )
    return v


def _limit(n: Any, like: jax.Array) -> jax.Array:
    """The count ``n`` (an int or a traced int) in the dtype of the counter ``like``, saturated."""
    top = int(jnp.iinfo(like.dtype).max)
    if isinstance(n, int):
        return jnp.asarray(min(n, top), like.dtype)
    return jax.lax.convert_element_type(jnp.minimum(n, top), like.dtype)


def _inc(x: jax.Array) -> jax.Array:
    top = int(jnp.iinfo(x.dtype).max)
    return jnp.where(x < top, x + 1, x)  # saturating: a counter never wraps negative


def _scale_range(d: np.dtype, min_scale: Any, max_scale: Any) -> tuple[jax.Array, jax.Array]:
    """The float32 bounds of a scale kept in dtype ``d``: within [min_scale, max_scale] and within
    the powers of two that ``d`` holds (a float16 scale stops at 2**15, never at inf).
    """
    fi = jnp.finfo(d)
    top = 2.0 ** math.floor(math.log2(float(fi.max)))
    bottom = float(fi.smallest_normal)
    f32 = lambda v: jax.lax.convert_element_type(v, jnp.float32)
    return jnp.maximum(f32(min_scale), bottom), jnp.minimum(f32(max_scale), top)


def _varying(x: Any) -> frozenset:
    """The manual mesh axes (``shard_map``) over which ``x`` varies; empty outside shard_map."""
    try:
        t = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    except TypeError:
        return frozenset()
    mat = getattr(t, "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(t, "vma", ()))


def _to_varying(x: Any, axes: frozenset) -> Any:
    """``x`` unchanged bit for bit, its type made varying over ``axes`` (``jax.lax.pcast``)."""
    if not hasattr(x, "dtype"):
        return x
    missing = tuple(sorted(axes - _varying(x), key=str))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _types_of_step(finite: jax.Array, step: Any, old: Any) -> tuple[Any, frozenset]:
    """The shapes of the step's (updates, inner state) and the axes both paths' results vary over.

    Under ``shard_map`` the new inner state varies over the axes of the gradients while the old one
    may not (a replicated state): both results are made to vary over the union of the flag's, the
    step's and the old state's axes, so the two sides of the skip have one type.
    """
    shapes = jax.eval_shape(step)
    axes = _varying(finite).union(*map(_varying, jax.tree.leaves((shapes, old))))
    return shapes, axes


def _select(finite: jax.Array, *, step: Any, old: Any) -> tuple[Any, Any]:
    """Skips by computing the step and selecting: no host round trip (GPU, TPU)."""
    _, axes = _types_of_step(finite, step, old)
    new_updates, new_inner = step()
    new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)
    new_inner = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_inner, old)
    return jax.tree.map(lambda x: _to_varying(x, axes), (new_updates, new_inner))


def _branch(finite: jax.Array, *, step: Any, old: Any) -> tuple[Any, Any]:
    """Skips by branching (CPU, where the flag is in host memory already): no wasted work."""
    (shapes, _), axes = _types_of_step(finite, step, old)
    match = lambda tree: jax.tree.map(lambda x: _to_varying(x, axes), tree)
    zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return jax.lax.cond(finite, lambda: match(step()), lambda: match((zeros(), old)))


# How a skipped step is taken, per platform (jax.lax.platform_dependent): both give zero updates
# and the old inner state, bit for bit.
_PATHS = {"cpu": _branch, "default": _select}


def dynamic_loss_scale(
    inner: optax.GradientTransformation,
    *,
    init_scale: float = 2.0**15,
    growth_interval: int = 2000,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    min_scale: float = 1.0,
    max_scale: float = 2.0**24,
    hysteresis: int = 1,
    axis_name: Hashable | Sequence[Hashable] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Wraps an optimiser with dynamic loss scaling; every decision is made on device.

    ``update(grads, state, params=None, **extra_args)`` takes the *unscaled* gradients (as
    ``backward_scaled`` returns them, computed with the scale ``loss_scale(state)``) and checks
    them itself with ``grads_finite``:

    - finite: the inner update runs as usual; after ``growth_interval`` consecutive finite steps the
      scale is multiplied by ``growth_factor`` (never above ``max_scale``) and the count restarts.
    - not finite: the step is skipped. The updates are zeros and the inner state is bit-identical
      to before, so nothing in it moves: Adam's moments and count, and every optax schedule driven
      by the inner count, do not advance. The good-step count restarts; after ``hysteresis``
      consecutive non-finite steps the scale is multiplied by ``backoff_factor`` (never below
      ``min_scale``). A non-finite step is never applied, however many come in a row.

    The skip is decided on device inside ``jax.jit``: on CPU, where the flag is in host memory, as a
    conditional that does not run the inner update; elsewhere (GPU, TPU) by computing the update and
    selecting, so the flag never travels to the host (``jax.lax.platform_dependent``).

    The optional extra argument ``value`` (the unscaled loss, as ``backward_scaled`` returns it) feeds
    the ``nonfinite_losses`` diagnostic, so a model producing a genuine NaN is told apart from an
    overflow; all extra arguments are also forwarded to the inner transformation. With the
    defaults the scale is always a power of two, so unscaling is exact. The state is a
    ``DynamicLossScaleState`` of device arrays: it jits, shards and checkpoints as plain arrays.

    Wrap ``optax.MultiSteps`` (``dynamic_loss_scale(optax.MultiSteps(opt, k))``) rather than the
    reverse: a non-finite micro-batch is then skipped before it reaches the accumulator.

    Every field of the loss-scale state keeps its dtype through ``update`` (a float16 scale stays
    float16 and stops at the largest power of two float16 holds), so the state is a valid
    ``lax.scan`` carry. Inside ``jax.shard_map`` (with its default ``check_vma=True``) the skipped
    and the taken step have the same type. ``optax.inject_hyperparams(dynamic_loss_scale)(inner,
    ...)`` works: the numbers are checked when the state is built and the traced values inside
    ``update`` are used as they are (pass ``hyperparam_dtype=jnp.float32`` with float16
    parameters, or ``max_scale=2**24`` is rounded to float16's inf and refused).

    Args:
      inner: the optimiser (any ``optax.GradientTransformation``, a chain, ``optax.MultiSteps``).
      init_scale: the first scale; positive, within ``[min_scale, max_scale]``.
      growth_interval: consecutive finite steps before the scale grows; an int >= 1.
      growth_factor: the growth multiplier, >= 1.
      backoff_factor: the backoff multiplier, in (0, 1].
      min_scale: the smallest scale, > 0.
      max_scale: the largest scale, >= ``min_scale``.
      hysteresis: consecutive non-finite steps before the scale backs off; an int >= 1.
      axis_name: inside ``shard_map``/``pmap``, the data-parallel axis: the finite flag is agreed
        across it, so every replica skips together and the scales never diverge.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a ``DynamicLossScaleState``.

    Raises:
      TypeError: ``inner`` is not a gradient transformation; a scale or factor is not a real number;
        ``growth_interval`` or ``hysteresis`` is not an int.
      ValueError: a scale is not positive and finite or not held by float32 (``1e39`` would be
        inf, ``1e-50`` zero), the bounds are inverted, ``init_scale`` lies outside them, a factor
        is on the wrong side of 1, or an interval is below 1.

    Examples:
      A complete float16 training loop (mixed precision: float32 master weights):

      >>> import jax, jax.numpy as jnp, optax
      >>> from heddle import scaling
      >>> def loss_fn(params, x, y):
      ...     w16 = params["w"].astype(jnp.float16)
      ...     err = (x @ w16).astype(jnp.float32) - y
      ...     return (err * err).mean()
      >>> opt = scaling.dynamic_loss_scale(optax.adam(1e-2), growth_interval=100)
      >>> @jax.jit
      ... def step(params, opt_state, x, y):
      ...     scale = scaling.loss_scale(opt_state)
      ...     value, grads, finite = scaling.backward_scaled(loss_fn, scale)(params, x, y)
      ...     updates, opt_state = opt.update(grads, opt_state, params, value=value)
      ...     return optax.apply_updates(params, updates), opt_state, value
      >>> params = {"w": jnp.zeros((3, 1), jnp.float32)}
      >>> opt_state = opt.init(params)
      >>> x = jnp.eye(3, dtype=jnp.float16)
      >>> y = jnp.ones((3, 1), jnp.float32)
      >>> for _ in range(200):
      ...     params, opt_state, value = step(params, opt_state, x, y)
      >>> bool(value < 1e-3), scaling.loss_scale(opt_state).item()
      (True, 131072.0)
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(
            message(
                f"dynamic_loss_scale({type(inner).__name__})",
                "the first argument must be an optax gradient transformation",
                "Wrap the optimiser: dynamic_loss_scale(optax.adam(1e-3)).",
            )
        )
    min_scale = _number(min_scale, "min_scale", 0.0, math.inf, False, False, "Use min_scale=1.0.")
    max_scale = _number(
        max_scale, "max_scale", min_scale, math.inf, True, False,
        f"Use a max_scale >= min_scale={min_scale}, e.g. 2.0**24.",
    )  # fmt: skip
    init_scale = _number(
        init_scale, "init_scale", min_scale, max_scale, True, True,
        f"Use an init_scale in [min_scale, max_scale] = [{min_scale}, {max_scale}], e.g. 2.0**15.",
    )  # fmt: skip
    growth_factor = _number(
        growth_factor, "growth_factor", 1.0, math.inf, True, False, "Use growth_factor=2.0."
    )
    backoff_factor = _number(
        backoff_factor, "backoff_factor", 0.0, 1.0, False, True, "Use backoff_factor=0.5."
    )
    growth_interval = _count(growth_interval, "growth_interval", "Use growth_interval=2000.")
    hysteresis = _count(hysteresis, "hysteresis", "Use hysteresis=1.")
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> DynamicLossScaleState:
        return DynamicLossScaleState(inner.init(params), DynamicLossScale.create(init_scale))

    def update_fn(
        updates: Any, state: DynamicLossScaleState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, DynamicLossScaleState]:
        finite = grads_finite(updates, axis_name=axis_name)

        def step() -> tuple[Any, Any]:
            return inner.update(updates, state.inner_state, params, **extra_args)

        paths = {
            k: functools.partial(f, step=step, old=state.inner_state) for k, f in _PATHS.items()
        }
        new_updates, new_inner = jax.lax.platform_dependent(finite, **paths)
        ls = _next_scale(state.loss_scale, finite, extra_args.get("value"))
        return new_updates, DynamicLossScaleState(new_inner, ls)

    def _next_scale(s: DynamicLossScale, finite: jax.Array, value: Any) -> DynamicLossScale:
        # Every field keeps its dtype (a lax.scan carry, a float16 scale in a restored state): the
        # scale is computed in float32 and rounded back once; the counters count in their own dtype.
        f32 = jnp.float32
        scale = jax.lax.convert_element_type(s.scale, f32)
        lo, hi = _scale_range(np.dtype(s.scale.dtype), min_scale, max_scale)
        good = _inc(s.good_steps)
        grow = finite & (good >= _limit(growth_interval, good))
        bad = _inc(s.bad_steps)
        back = ~finite & (bad >= _limit(hysteresis, bad))
        grown = jnp.minimum(scale * jax.lax.convert_element_type(growth_factor, f32), hi)
        shrunk = jnp.maximum(scale * jax.lax.convert_element_type(backoff_factor, f32), lo)
        new_scale = jnp.where(grow, grown, jnp.where(back, shrunk, scale))
        nonfinite_losses = s.nonfinite_losses
        if value is not None:
            nonfinite_losses = jnp.where(
                grads_finite(value, axis_name=axis_name), nonfinite_losses, _inc(nonfinite_losses)
            )
        return DynamicLossScale(
            scale=jax.lax.convert_element_type(new_scale, s.scale.dtype),
            good_steps=jnp.where(finite & ~grow, good, jnp.zeros_like(good)),
            bad_steps=jnp.where(finite | back, jnp.zeros_like(bad), bad),
            skipped=jnp.where(finite, s.skipped, _inc(s.skipped)),
            since_skip=jnp.where(finite, _inc(s.since_skip), jnp.zeros_like(s.since_skip)),
            nonfinite_losses=nonfinite_losses,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def loss_scale_state(opt_state: Any) -> LossScale:
    """The loss-scale state inside an optimiser state (through chains, MultiSteps, wrappers).

    Args:
      opt_state: the state of an optimiser built with ``dynamic_loss_scale`` (possibly inside
        ``optax.chain``, ``optax.MultiSteps`` or other wrappers), or a loss-scale state itself.

    Returns:
      The ``DynamicLossScale`` (or ``StaticLossScale``/``NoLossScale``) found, with its counters.

    Raises:
      ValueError: the state holds no loss scale, or more than one, or only the fields of one as a
        plain dict (a checkpoint restored without a target; the message says how to restore it).

    Examples:
      >>> import optax
      >>> from heddle import scaling
      >>> opt = optax.MultiSteps(scaling.dynamic_loss_scale(optax.sgd(0.1)), every_k_schedule=2)
      >>> scaling.loss_scale_state(opt.init({"w": 0.0})).skipped.item()
      0
    """
    found = [
        x
        for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, LOSS_SCALE_TYPES))
        if isinstance(x, LOSS_SCALE_TYPES)
    ]
    if len(found) == 1:
        return found[0]
    asked = f"loss_scale({type(opt_state).__name__})"
    if not found and _untyped_scales(opt_state):
        raise ValueError(
            message(
                asked,
                "it holds the fields of a loss-scale state as a plain dict: the state was restored "
                "from a checkpoint without a target, which loses the types of every NamedTuple in "
                "it (DynamicLossScaleState, DynamicLossScale, optax's states)",
                "Restore with the optimiser's own state as the target: "
                "orbax.checkpoint.StandardCheckpointer().restore(path, opt.init(params)), or "
                "flax.serialization.from_state_dict(opt.init(params), restored) after "
                "msgpack_restore.",
            )
        )
    why = "it holds no loss-scale state" if not found else f"it holds {len(found)} of them"
    raise ValueError(
        message(
            asked,
            why,
            "Build the optimiser with heddle.scaling.dynamic_loss_scale(optimiser) once, or "
            "pass the scale itself to backward_scaled (1.0 without loss scaling).",
        )
    )


def _untyped_scales(tree: Any) -> bool:
    """Whether ``tree`` holds a mapping with the fields of a loss-scale state (a typeless restore)."""
    names = (set(DynamicLossScale._fields), set(DynamicLossScaleState._fields))
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if {str(k) for k in node} in names:
                return True
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False


def loss_scale(opt_state: Any) -> jax.Array:
    """The current loss scale (``float32[]``, on device) of an optimiser state.

    Reads through ``optax.chain``, ``optax.MultiSteps`` and other wrappers; see
    ``loss_scale_state``.

    Args:
      opt_state: the optimiser state, or a loss-scale state.

    Returns:
      The scale to pass to ``backward_scaled``.

    Raises:
      ValueError: the state holds no loss scale, or more than one.

    Examples:
      >>> import optax
      >>> from heddle import scaling
      >>> opt = optax.chain(optax.clip_by_global_norm(1.0), scaling.dynamic_loss_scale(optax.sgd(0.1)))
      >>> scaling.loss_scale(opt.init({"w": 0.0})).item()
      32768.0
    """
    return jnp.asarray(loss_scale_state(opt_state).scale, jnp.float32)
