"""The Python array API metadata of heddle.numpy: ``__array_api_version__`` and
``__array_namespace_info__``, reporting heddle's defaults (the active policy's) instead of JAX's."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from heddle.policy._policy import active

ARRAY_API_VERSION: str = jnp.__array_api_version__
"""The array API standard version heddle.numpy follows: the installed jax.numpy's."""

_JaxInfo = type(jnp.__array_namespace_info__())


class ArrayNamespaceInfo(_JaxInfo):
    """Array API metadata for heddle.numpy: JAX's, with the default dtypes of the active policy.

    ``default_dtypes()`` gives the policy's ``default_float`` (float32), ``default_complex``
    (complex64), ``default_int`` (int32) and ``index_dtype`` (int32), with or without
    ``jax_enable_x64`` (JAX gives the 64-bit types under x64); ``dtypes``, ``devices`` and
    ``capabilities`` are JAX's.

    Examples:
      >>> import heddle.numpy as hnp
      >>> hnp.__array_namespace_info__().default_dtypes()["indexing"]
      dtype('int32')
    """

    def default_dtypes(self, *, device: Any = None) -> dict[str, np.dtype]:
        """The default dtypes of the active policy (device-independent).

        Args:
          device: accepted for the array API; the defaults do not depend on it.

        Returns:
          ``{"real floating", "complex floating", "integral", "indexing"}`` -> dtype.
        """
        del device
        p = active()
        return {
            "real floating": p.default_float,
            "complex floating": p.default_complex,
            "integral": p.default_int,
            "indexing": p.index_dtype,
        }


def array_namespace_info() -> ArrayNamespaceInfo:
    """The array API namespace information of heddle.numpy.

    Returns:
      An ``ArrayNamespaceInfo`` whose ``default_dtypes()`` are the active policy's.

    Examples:
      >>> import heddle.numpy as hnp
      >>> hnp.__array_namespace_info__().default_dtypes()["real floating"]
      dtype('float32')
    """
    return ArrayNamespaceInfo()
