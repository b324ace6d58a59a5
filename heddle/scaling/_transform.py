"""dynamic_loss_scale: loss scaling as an optax transformation, decided on device."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from heddle.policy._errors import message
from heddle.scaling._finite import grads_finite
from heddle.scaling._states import LOSS_SCALE_TYPES, DynamicLossScale, LossScale

_I32_MAX = int(jnp.iinfo(jnp.int32).max)


class DynamicLossScaleState(NamedTuple):
    """State of ``dynamic_loss_scale``: the wrapped optimiser's state and the loss scale.

    Attributes:
      inner_state: the wrapped transformation's state; bit-identical after a skipped step.
      loss_scale: the ``DynamicLossScale`` (scale, counters, diagnostics).
    """

    inner_state: Any
    loss_scale: DynamicLossScale


def _number(x: Any, what: str, low: float, high: float, lo_ok: bool, hi_ok: bool, fix: str):
    asked = f"dynamic_loss_scale({what}={x!r})"
    try:
        if isinstance(x, str | bytes | bool):
            raise TypeError
        v = float(x)
    except (TypeError, ValueError):
        raise TypeError(message(asked, f"{what} must be a real number", fix)) from None
    ok = (
        math.isfinite(v) and (v >= low if lo_ok else v > low) and (v <= high if hi_ok else v < high)
    )
    if not ok:
        lo = "[" if lo_ok else "("
        hi = "]" if hi_ok else ")"
        raise ValueError(message(asked, f"{what} must be a number in {lo}{low}, {high}{hi}", fix))
    return v


def _count(x: Any, what: str, fix: str) -> int:
    try:
        if isinstance(x, bool):
            raise TypeError
        v = operator.index(x)
    except TypeError:
        raise TypeError(
            message(f"dynamic_loss_scale({what}={x!r})", f"{what} must be an int", fix)
        ) from None
    if not 1 <= v <= _I32_MAX:
        raise ValueError(
            message(f"dynamic_loss_scale({what}={x!r})", f"{what} must be at least 1", fix)
        )
    return v


def _inc(x: jax.Array) -> jax.Array:
    return jnp.where(x < _I32_MAX, x + 1, x)  # saturating: a counter never wraps negative


def _select(finite: jax.Array, *, step: Any, old: Any) -> tuple[Any, Any]:
    """Skips by computing the step and selecting: no host round trip (GPU, TPU)."""
    new_updates, new_inner = step()
    new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)
    return new_updates, jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_inner, old)


def _branch(finite: jax.Array, *, step: Any, old: Any) -> tuple[Any, Any]:
    """Skips by branching (CPU, where the flag is in host memory already): no wasted work."""
    shapes = jax.eval_shape(lambda: step()[0])
    zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return jax.lax.cond(finite, step, lambda: (zeros(), old))


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
      ValueError: a scale is not positive and finite, the bounds are inverted, ``init_scale`` lies
        outside them, a factor is on the wrong side of 1, or an interval is below 1.

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
        good = _inc(s.good_steps)
        grow = finite & (good >= growth_interval)
        bad = _inc(s.bad_steps)
        back = ~finite & (bad >= hysteresis)
        grown = jnp.minimum(s.scale * jnp.float32(growth_factor), jnp.float32(max_scale))
        shrunk = jnp.maximum(s.scale * jnp.float32(backoff_factor), jnp.float32(min_scale))
        zero = jnp.zeros_like(s.good_steps)
        nonfinite_losses = s.nonfinite_losses
        if value is not None:
            nonfinite_losses = jnp.where(
                grads_finite(value, axis_name=axis_name), nonfinite_losses, _inc(nonfinite_losses)
            )
        return DynamicLossScale(
            scale=jnp.where(grow, grown, jnp.where(back, shrunk, s.scale)),
            good_steps=jnp.where(finite & ~grow, good, zero),
            bad_steps=jnp.where(finite | back, zero, bad),
            skipped=jnp.where(finite, s.skipped, _inc(s.skipped)),
            since_skip=jnp.where(finite, _inc(s.since_skip), zero),
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
      ValueError: the state holds no loss scale, or more than one.

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
    if len(found) != 1:
        why = "it holds no loss-scale state" if not found else f"it holds {len(found)} of them"
        raise ValueError(
            message(
                f"loss_scale({type(opt_state).__name__})",
                why,
                "Build the optimiser with heddle.scaling.dynamic_loss_scale(optimiser) once, or "
                "pass the scale itself to backward_scaled (1.0 without loss scaling).",
            )
        )
    return found[0]


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
