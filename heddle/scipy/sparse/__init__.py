"""Drop-in replacement for ``jax.scipy.sparse`` under heddle's dtype policy: ``linalg``.

Examples:
  >>> import heddle.scipy.sparse
  >>> heddle.scipy.sparse.linalg.cg  # doctest: +ELLIPSIS
  <function ...>
"""

from heddle.scipy.sparse import linalg as linalg

__all__ = ["linalg"]
