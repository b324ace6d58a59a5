"""Drop-in replacement for ``jax.scipy.cluster`` under heddle's dtype policy: ``vq``.

Examples:
  >>> import heddle.scipy.cluster
  >>> heddle.scipy.cluster.vq.vq  # doctest: +ELLIPSIS
  <function ...>
"""

from heddle.scipy.cluster import vq as vq

__all__ = ["vq"]
