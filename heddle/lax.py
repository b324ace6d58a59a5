"""Drop-in replacement for ``jax.lax`` under heddle's dtype policy.

Every public name of the installed ``jax.lax`` exists here. The entry points that accumulate have
policy versions (classified in ``heddle/ops/_lax.py``): contractions (``dot_general``, ``dot``,
``conv_general_dilated``, ``conv``, ``conv_with_general_padding``, ``conv_transpose``,
``batch_matmul``, ``ragged_dot``) accumulate through ``preferred_element_type=acc_dtype`` (float32
ones at ``Precision.HIGHEST`` unless the policy says otherwise); ``reduce_sum``, ``reduce_prod``,
``cumsum``, ``cumprod`` and ``cumlogsumexp`` accumulate in float32 for narrow floats and give
integers their accumulation dtype; ``reduce`` and ``reduce_window`` do the same when their
computation is an add or a multiply, and run a max or min (max-pooling) of a narrow float on its exact
float32 copy, as ``reduce_max``/``reduce_min`` do, so their backward passes sum in float32;
``scatter_add``, ``scatter_sub``, ``scatter_mul`` combine their updates in the accumulation dtype;
``conv_general_dilated_local`` and ``conv_general_dilated_patches`` run on exactly widened operands;
``reduce_max``/``reduce_min`` give NaN wherever the reduced slice holds one, on any sharding; the
collective sums ``psum``, ``pmean`` and ``psum_scatter`` add each leaf in its accumulation dtype and
round once, and so do their backward passes (under ``jax.vmap`` with an ``axis_name`` as well).
The transcendental functions (``exp``, ``log``, ``sin``, ``asinh``, ``erf``, ``lgamma``, ... 33 of
them; ``jax.lax``'s own evaluate them in the narrow dtype) compute a narrow float in float32 and
round once, with heddle.numpy's formulas for ``exp2``, ``asin``, ``sinh``, ``cosh``, ``erf_inv``,
``lgamma`` and ``digamma``. Everything else is ``jax.lax``'s own object (see ``LAX_PASS`` in
heddle/ops/_lax.py).

Examples:
  >>> import numpy as np, ml_dtypes
  >>> import heddle.lax
  >>> x = np.full(100_000, 0.1, ml_dtypes.bfloat16)
  >>> float(heddle.lax.cumsum(x)[-1])  # bfloat16(10009.765625); jax.lax.cumsum drifts
  9984.0
"""

from __future__ import annotations

import jax.lax as _jlax

from heddle.ops import _lax

globals().update({name: getattr(_jlax, name) for name in dir(_jlax) if not name.startswith("_")})
globals().update(_lax.build())

__all__ = sorted(name for name in dir(_jlax) if not name.startswith("_"))
