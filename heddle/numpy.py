"""Drop-in replacement for ``jax.numpy`` under heddle's dtype policy.

Every public name of the installed ``jax.numpy`` exists here. Ops classified in
``heddle/ops/_table.py`` apply heddle's promotion, scalar rules, float32 accumulation and correctly
rounded casts; the rest pass through unchanged for the reason recorded there.

Examples:
  >>> import heddle.numpy as hnp
  >>> x = hnp.full((100_000,), 0.1, dtype="float16")
  >>> float(hnp.sum(x))  # accumulated in float32, rounded once
  9996.0
"""

from __future__ import annotations

import inspect as _inspect

import jax.numpy as _jnp

from heddle.ops import _core, _counting, _creation, _printing, _table
from heddle.policy import promote_types as promote_types
from heddle.policy import result_type as result_type
from heddle.policy._rules import OpClass as _OpClass


def astype(x, dtype, *, saturate: bool = False, **kwargs):
    """Casts ``x`` to ``dtype`` with one correct rounding (POLICY.md 6).

    Args:
      x: an array or scalar.
      dtype: the target dtype-like.
      saturate: clamp finite overflow to the largest finite value instead of inf/NaN.
      **kwargs: ``copy``/``device`` as in jax.numpy.astype (accepted, not needed).

    Returns:
      The array in exactly ``dtype``.

    Examples:
      >>> import heddle.numpy as hnp
      >>> hnp.astype(hnp.asarray([1.0, 2.5]), "bfloat16").dtype
      dtype(bfloat16)
    """
    from heddle.policy import _dtypes

    d = _dtypes.require_available(_dtypes.dtype(dtype), "astype")
    if _core._astype is not None:
        return _core._astype(x, d, saturate=saturate)
    return _core.cast(x, d)


def _build() -> dict:
    names: dict = {}
    for name, (op_class, plan, values) in _table.OPS.items():
        fn = getattr(_jnp, name, None)
        if fn is None:
            continue
        names[name] = _core.make_op(
            name, _core.OpSpec(fn=fn, op_class=op_class, plan=plan, values=values)
        )
    for name in _table.PASS:
        if hasattr(_jnp, name):
            names[name] = getattr(_jnp, name)
    for name in dir(_jnp):
        obj = getattr(_jnp, name)
        if not name.startswith("_") and _inspect.isclass(obj):
            names.setdefault(name, obj)  # dtype scalar types, finfo, iinfo, ndarray, ...
    names.update(_creation.CREATION)
    names.update(_counting.COUNTING)
    names.update(_printing.PRINTING)
    return names


_NAMES = _build()
globals().update(_NAMES)

from heddle.ops._linalg import fft as fft  # noqa: E402
from heddle.ops._linalg import linalg as linalg  # noqa: E402

del _OpClass

__all__ = sorted({*_NAMES, "astype", "fft", "linalg", "promote_types", "result_type"})
