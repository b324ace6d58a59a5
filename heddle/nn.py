"""Drop-in replacement for ``jax.nn`` under heddle's dtype policy.

Every public name of the installed ``jax.nn`` exists here. Activations, the softmax family
(softmax, log_softmax, logsumexp, logmeanexp), standardize and dot_product_attention run JAX's own
implementation in float32 for narrow inputs and round once at the end, so no intermediate is ever
rounded to the narrow dtype (POLICY.md 5). ``relu``, ``relu6`` and ``hard_tanh`` keep the input
dtype, integers included. ``one_hot`` and the initializers default to the policy's default float.
The classification of every name is data in ``heddle/ops/_nn.py``.

Examples:
  >>> import jax.numpy as jnp
  >>> import heddle.nn
  >>> x = jnp.zeros(100_000, jnp.float16)
  >>> float(heddle.nn.softmax(x)[0])  # jax.nn.softmax gives 0.0
  1.0013580322265625e-05
  >>> float(heddle.nn.logsumexp(x))  # jax.nn.logsumexp gives inf
  11.515625
"""

from __future__ import annotations

import sys as _sys
import types as _types

import jax.nn as _jnn

from heddle.ops import _nn

globals().update(_nn.build())
globals().update({name: getattr(_jnn, name) for name in _nn.PASS if hasattr(_jnn, name)})

initializers = _types.ModuleType(
    "heddle.nn.initializers",
    "``jax.nn.initializers`` under heddle's policy: samples in float32 for narrow dtypes, rounds "
    "once, and defaults ``dtype`` to the policy's default float.",
)
initializers.__dict__.update(_nn.build_initializers())
initializers.__all__ = sorted(_nn.build_initializers())
_sys.modules.setdefault("heddle.nn.initializers", initializers)  # import heddle.nn.initializers

__all__ = sorted(
    [*_nn.FLOAT_OPS, *_nn.CLIP_OPS, *_nn.SPECIAL, *(n for n in _nn.PASS if hasattr(_jnn, n))]
)
