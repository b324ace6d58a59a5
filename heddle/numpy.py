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
from typing import TYPE_CHECKING as _TYPE_CHECKING

import jax as _jax
import jax.numpy as _jnp

from heddle.ops import (
    _array_api,
    _core,
    _counting,
    _creation,
    _formulas,
    _nanprop,
    _printing,
    _table,
    _ufunc,
)
from heddle.policy import promote_types as promote_types
from heddle.policy import result_type as result_type
from heddle.policy._rules import OpClass as _OpClass

if _TYPE_CHECKING:
    from typing import Any

    import jax
    from jax.typing import ArrayLike, DTypeLike


def astype(
    x: ArrayLike,
    dtype: DTypeLike | None,
    /,
    *,
    copy: bool = False,
    device: Any = None,
    saturate: bool = False,
) -> jax.Array:
    """Casts ``x`` to ``dtype`` with one correct rounding (POLICY.md 6).

    Args:
      x: an array or scalar.
      dtype: the target dtype-like (None: the policy's default float).
      copy: always return a new array, even when ``x`` already has ``dtype`` (as jax.numpy).
      device: a device or sharding to put the result on (as jax.numpy).
      saturate: clamp finite overflow to the largest finite value instead of inf/NaN.

    Returns:
      The array in exactly ``dtype``.

    Raises:
      PrecisionError: a 64-bit ``dtype`` while ``jax_enable_x64`` is off.

    Examples:
      >>> import heddle.numpy as hnp
      >>> hnp.astype(hnp.asarray([1.0, 2.5]), "bfloat16").dtype
      dtype(bfloat16)
    """
    from heddle.policy import _casts, _dtypes
    from heddle.policy._policy import active

    d = active().default_float if dtype is None else _dtypes.dtype(dtype)
    d = _dtypes.require_available(d, "astype")
    out = _casts.astype(x, d, saturate=saturate)
    if copy and out is x:
        out = _jnp.array(out, copy=True)
    return out if device is None else _jax.device_put(out, device)


def _build() -> dict:
    names: dict = {}
    for name, (op_class, plan, values) in _table.OPS.items():
        jfn = getattr(_jnp, name, None)
        if jfn is None:
            continue
        spec = _core.OpSpec(
            fn=_nanprop.NUMPY.get(name, _formulas.NUMPY.get(name, jfn)),
            op_class=op_class,
            plan=plan,
            values=values,
            value_kwargs=_table.VALUE_KWARGS.get(name, ()),
            sequence=_table.SEQUENCES.get(name),
            params=tuple((n, None) for n in _table.HYPER_PARAMS.get(name, ())),
        )
        names[name] = _core.make_op(name, spec)
        names[name].__doc__ = _core._doc(name, spec, jfn)
    for name in _table.PASS:
        if hasattr(_jnp, name):
            names[name] = getattr(_jnp, name)
    for name in dir(_jnp):
        obj = getattr(_jnp, name)
        if not name.startswith("_") and _inspect.isclass(obj):
            names.setdefault(name, obj)  # dtype scalar types, finfo, iinfo, ndarray, ...
    for name in _ufunc.ufunc_names():
        if name in names:
            _ufunc.attach(name, names[name], getattr(_jnp, name), names)
    names.update(_creation.CREATION)
    names.update(_counting.COUNTING)
    names.update(_printing.PRINTING)
    return names


_NAMES = _build()
globals().update(_NAMES)

from heddle.ops._linalg import fft as fft  # noqa: E402
from heddle.ops._linalg import linalg as linalg  # noqa: E402

del _OpClass

__array_api_version__ = _array_api.ARRAY_API_VERSION
__array_namespace_info__ = _array_api.array_namespace_info

__all__ = sorted({*_NAMES, "astype", "fft", "linalg", "promote_types", "result_type"})
