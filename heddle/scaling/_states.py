"""Loss-scale states: plain NamedTuples of device arrays, so they jit, shard and checkpoint as-is.

No configuration lives in a state (the growth interval, factors and bounds are arguments of
``dynamic_loss_scale`` and close over its functions), so every field is a leaf and a
``jax.jit(lambda s: s)`` round trip, a checkpoint or a ``device_put`` keeps all of them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from heddle.policy._errors import message

_F32 = jnp.float32
_I32 = jnp.int32


F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
F32_MAX = float(np.finfo(np.float32).max)
F32_RANGE = f"[{F32_TINY:.8g}, {F32_MAX:.8g}]"
SCALE_FIX = "Use a power of two such as 2.0**15 (unscaling by a power of two is exact)."


def check_scale(scale: Any, what: str) -> None:
    """Refuses a scale that is not one number (TypeError) or, when concrete, not a positive normal
    float32 (ValueError): the scale is kept and applied in float32, so 1e39 would be inf and 1e-50
    zero.
    """
    if np.shape(scale) != ():
        raise TypeError(
            message(
                f"{what}=<array of shape {np.shape(scale)}>",
                "a loss scale is one number, not an array of them",
                "Pass a scalar, e.g. 2.0**15, or heddle.scaling.loss_scale(opt_state).",
            )
        )
    try:
        d = scale.dtype if hasattr(scale, "dtype") else type(scale)
        if isinstance(scale, bool) or not (
            jnp.issubdtype(d, jnp.floating) or jnp.issubdtype(d, jnp.integer)
        ):
            raise TypeError
        s = float(scale)
    except jax.errors.ConcretizationTypeError:
        return  # a traced value: checked by nobody, as for any array argument under jit
    except (TypeError, ValueError):
        raise TypeError(
            message(f"{what}={scale!r}", "a loss scale must be a real number", SCALE_FIX)
        ) from None
    if not (math.isfinite(s) and s > 0):
        raise ValueError(
            message(f"{what}={scale!r}", "a loss scale must be a positive finite number", SCALE_FIX)
        )
    if not F32_TINY <= s <= F32_MAX:
        raise ValueError(
            message(
                f"{what}={scale!r}",
                f"a loss scale must be a positive finite number that float32 holds, in {F32_RANGE} "
                "(the scale is kept and applied in float32)",
                SCALE_FIX,
            )
        )


class DynamicLossScale(NamedTuple):
    """State of dynamic loss scaling: the current scale, its counters and on-device diagnostics.

    Every field is a device array and a pytree leaf. Built by ``DynamicLossScale.create`` or by
    ``dynamic_loss_scale(...).init``; read from an optimiser state with ``loss_scale_state``.
    ``update`` keeps every field's dtype (the dtypes below are those ``create`` gives), and
    ``heddle.policy.Precision`` casts leave the state as it is.

    Attributes:
      scale: float32[], the factor the loss is multiplied by (a power of two with the defaults).
      good_steps: int32[], consecutive finite steps since the scale last grew or a step was skipped.
      bad_steps: int32[], consecutive non-finite steps not yet answered by a backoff (hysteresis).
      skipped: int32[], steps skipped so far (non-finite gradients).
      since_skip: int32[], steps since the last skipped step (all steps if none was skipped).
      nonfinite_losses: int32[], steps whose unscaled loss (the ``value`` extra argument) was not
        finite: a genuine NaN or overflow of the model, which no loss scale can fix.

    Examples:
      >>> from heddle import scaling
      >>> s = scaling.DynamicLossScale.create(2.0**15)
      >>> s.scale.item(), s.scale.dtype, s.skipped.dtype
      (32768.0, dtype('float32'), dtype('int32'))
    """

    __heddle_keep_dtypes__ = True  # heddle.policy's Precision casts leave the state as it is

    scale: jax.Array  # float32[]
    good_steps: jax.Array  # int32[]
    bad_steps: jax.Array  # int32[]
    skipped: jax.Array  # int32[]
    since_skip: jax.Array  # int32[]
    nonfinite_losses: jax.Array  # int32[]

    @classmethod
    def create(cls, init_scale: float = 2.0**15) -> DynamicLossScale:
        """A fresh state with scale ``init_scale`` and zero counters.

        Args:
          init_scale: the initial scale, a positive finite number.

        Returns:
          The state, as device arrays.

        Raises:
          TypeError: ``init_scale`` is not one real number (an array of several, a string).
          ValueError: ``init_scale`` is not a positive finite number that float32 holds.

        Examples:
          >>> from heddle import scaling
          >>> scaling.DynamicLossScale.create(1024.0).good_steps.item()
          0
        """
        check_scale(init_scale, "init_scale")
        zero = jnp.zeros((), _I32)
        return cls(jnp.asarray(init_scale, _F32), zero, zero, zero, zero, zero)


class StaticLossScale(NamedTuple):
    """A fixed loss scale (float16 training whose gradient range is known), as a pytree.

    Pass it (or its ``scale``) to ``backward_scaled``; nothing adjusts it.

    Attributes:
      scale: float32[], the factor the loss is multiplied by.

    Examples:
      >>> from heddle import scaling
      >>> scaling.StaticLossScale.create(128.0).scale.item()
      128.0
    """

    __heddle_keep_dtypes__ = True  # heddle.policy's Precision casts leave the state as it is

    scale: jax.Array  # float32[]

    @classmethod
    def create(cls, scale: float) -> StaticLossScale:
        """The state for a fixed ``scale``.

        Args:
          scale: a positive finite number.

        Returns:
          The state, as a device array.

        Raises:
          TypeError: ``scale`` is not one real number (an array of several, a string).
          ValueError: ``scale`` is not a positive finite number that float32 holds.

        Examples:
          >>> from heddle import scaling
          >>> scaling.StaticLossScale.create(2.0**10).scale.dtype
          dtype('float32')
        """
        check_scale(scale, "scale")
        return cls(jnp.asarray(scale, _F32))


class NoLossScale(NamedTuple):
    """No loss scaling (float32 and bfloat16 training): ``scale`` is 1.

    Examples:
      >>> from heddle import scaling
      >>> scaling.NoLossScale().scale.item()
      1.0
    """

    @property
    def scale(self) -> jax.Array:
        """float32[] one."""
        return jnp.ones((), _F32)


LossScale = DynamicLossScale | StaticLossScale | NoLossScale
LOSS_SCALE_TYPES = (DynamicLossScale, StaticLossScale, NoLossScale)
