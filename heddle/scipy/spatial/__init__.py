"""Drop-in replacement for ``jax.scipy.spatial`` under heddle's dtype policy: ``transform``.

Examples:
  >>> import heddle.scipy.spatial
  >>> heddle.scipy.spatial.transform.Rotation  # doctest: +ELLIPSIS
  <class ...>
"""

from heddle.scipy.spatial import transform as transform

__all__ = ["transform"]
