"""heddle: a JAX-backed tensor frontend with an enforced mixed-precision dtype policy.

``import heddle.numpy as jnp`` for jax.numpy with heddle's promotion lattice, float32 accumulation and
correctly rounded casts; ``heddle.policy`` for the rules themselves.
"""

from heddle import policy as policy

__version__ = "0.1.0"

__all__ = ["policy"]
