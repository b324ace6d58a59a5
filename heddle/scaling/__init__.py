"""Loss scaling for float16 training (POLICY.md 8), decided on device inside ``jax.jit``.

bfloat16 has float32's exponent range and trains without it; float16 does not. The pieces:

- ``backward_scaled(fun, scale)``: multiplies the loss by ``scale`` before the backward pass and
  returns ``(value, grads, finite)`` with the unscaled loss, the unscaled gradients at ``grad_dtype``
  (``heddle.autodiff``) and one on-device finiteness flag.
- ``dynamic_loss_scale(inner, ...)``: an optax transformation that skips non-finite steps (zero
  updates, inner state bit-identical), halves the scale on overflow and doubles it after
  ``growth_interval`` finite steps; ``loss_scale(opt_state)`` reads the scale through chains and
  ``optax.MultiSteps``.
- ``grads_finite(tree, axis_name=None)``: one ``bool[]`` for a pytree, agreed across devices.
- States: ``DynamicLossScale``, ``StaticLossScale``, ``NoLossScale`` (NamedTuples of device arrays).

See ``dynamic_loss_scale`` for a complete training loop and docs/loss-scaling.md for migration from
jmp and ``optax.apply_if_finite``.
"""

from heddle.scaling._backward import backward_scaled as backward_scaled
from heddle.scaling._finite import grads_finite as grads_finite
from heddle.scaling._states import DynamicLossScale as DynamicLossScale
from heddle.scaling._states import NoLossScale as NoLossScale
from heddle.scaling._states import StaticLossScale as StaticLossScale
from heddle.scaling._transform import DynamicLossScaleState as DynamicLossScaleState
from heddle.scaling._transform import dynamic_loss_scale as dynamic_loss_scale
from heddle.scaling._transform import loss_scale as loss_scale
from heddle.scaling._transform import loss_scale_state as loss_scale_state

__all__ = [
    "DynamicLossScale",
    "DynamicLossScaleState",
    "NoLossScale",
    "StaticLossScale",
    "backward_scaled",
    "dynamic_loss_scale",
    "grads_finite",
    "loss_scale",
    "loss_scale_state",
]
