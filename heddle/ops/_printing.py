"""Array printing with the shortest round-trip decimals of POLICY.md 9.

``heddle.numpy.array_repr`` and ``array_str`` print narrow floats (bfloat16, float16, float8, float4) as
``heddle.policy.format`` does: ``bfloat16(0.1)`` prints ``0.1``, where NumPy's printing of an ml_dtypes
array shows ``0.100098``. Other dtypes print exactly as a JAX array's own ``repr``/``str`` does.
Importing heddle changes no global printing: a JAX array's own ``repr`` is JAX's.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy._format import format as _format


def _body(
    a: np.ndarray, max_line_width: Any, precision: Any, suppress_small: Any, **kw: Any
) -> str:
    narrow = D.kind(D.dtype(a.dtype)) == "f" and a.dtype.itemsize < 4 and precision is None
    formatter = {"all": _format} if narrow else None
    return np.array2string(
        a,
        max_line_width=max_line_width,
        precision=precision,
        suppress_small=suppress_small,
        formatter=formatter,
        **kw,
    )


def array_repr(
    arr: jax.typing.ArrayLike,
    max_line_width: int | None = None,
    precision: int | None = None,
    suppress_small: bool | None = None,
) -> str:
    """The ``repr`` of an array, narrow floats as their shortest round-trip decimals.

    Args:
      arr: an array or array-like.
      max_line_width: as for ``numpy.array_repr``.
      precision: as for ``numpy.array_repr``; given, it replaces the shortest decimals.
      suppress_small: as for ``numpy.array_repr``.

    Returns:
      ``Array([...], dtype=...)``, with ``weak_type=True`` for a weakly typed JAX array.

    Examples:
      >>> import heddle.numpy as hnp
      >>> hnp.array_repr(hnp.asarray([0.1, 1 / 3], dtype="bfloat16"))
      'Array([0.1, 0.334], dtype=bfloat16)'
    """
    a = np.asarray(arr)
    prefix = "Array("
    body = _body(a, max_line_width, precision, suppress_small, separator=", ", prefix=prefix)
    weak = ", weak_type=True" if getattr(arr, "weak_type", False) else ""
    return f"{prefix}{body}, dtype={a.dtype.name}{weak})"


def array_str(
    a: jax.typing.ArrayLike,
    max_line_width: int | None = None,
    precision: int | None = None,
    suppress_small: bool | None = None,
) -> str:
    """The ``str`` of an array, narrow floats as their shortest round-trip decimals.

    Args:
      a: an array or array-like.
      max_line_width: as for ``numpy.array_str``.
      precision: as for ``numpy.array_str``; given, it replaces the shortest decimals.
      suppress_small: as for ``numpy.array_str``.

    Returns:
      The values laid out as NumPy lays them out (``[0.1 0.334]``).

    Examples:
      >>> import heddle.numpy as hnp
      >>> hnp.array_str(hnp.asarray([65504, 0.1], dtype="float16"))
      '[65500.0 0.1]'
    """
    return _body(np.asarray(a), max_line_width, precision, suppress_small)


PRINTING = {"array_repr": array_repr, "array_str": array_str}
