"""backward_scaled: the backward pass of a loss multiplied by a loss scale, unscaled and checked."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle import autodiff
from heddle.policy._errors import message
from heddle.scaling._finite import grads_finite
from heddle.scaling._states import LOSS_SCALE_TYPES, check_scale

_F32 = np.dtype("float32")


def _scale_value(scale: Any) -> jax.Array:
    if isinstance(scale, LOSS_SCALE_TYPES):
        check_scale(scale.scale, f"backward_scaled(scale={type(scale).__name__}.scale)")
        return jnp.asarray(scale.scale, _F32)
    if isinstance(scale, tuple | list | dict) or not (
        isinstance(scale, int | float) or hasattr(scale, "dtype")
    ):
        raise TypeError(
            message(
                f"backward_scaled(scale={type(scale).__name__})",
                "the scale must be a number, a scalar array or a loss-scale state",
                "Pass heddle.scaling.loss_scale(opt_state) when the optimiser is wrapped by "
                "dynamic_loss_scale, or a number such as 2.0**15.",
            )
        )
    check_scale(scale, "backward_scaled(scale)")
    return jnp.asarray(scale, _F32)


def _unscale(g: Any, s: jax.Array) -> Any:
    d = getattr(g, "dtype", None)
    if d is None or not jnp.issubdtype(d, jnp.inexact):
        return g
    real = np.dtype(d) if jnp.issubdtype(d, jnp.floating) else np.finfo(d).dtype
    if real.itemsize < 4:  # a narrow gradient from a plain-JAX leaf: unscale in float32
        return lax.convert_element_type(g, _F32) / s
    return g / lax.convert_element_type(s, real)


def backward_scaled(
    fun: Callable[..., Any],
    scale: Any,
    *,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    contractions: str = "float32",
) -> Callable[..., tuple[Any, Any, jax.Array]]:
    """The gradient of ``scale * fun``, unscaled, with a flag saying whether it is finite.

    The loss is multiplied by ``scale`` in float32 before the backward pass (``heddle.autodiff``,
    so gradients have ``grad_dtype`` of their leaf: float32 for float16 parameters), each gradient
    is divided by ``scale`` (exact when the scale is a power of two and the result is a normal
    number), and ``grads_finite`` checks the result. Nothing leaves the device.

    Args:
      fun: the loss function; its (first) output a real scalar of any float dtype.
      scale: the loss scale: ``loss_scale(opt_state)``, a ``DynamicLossScale``/``StaticLossScale``/
        ``NoLossScale``, a positive number or a scalar array.
      argnums: the arguments to differentiate, as ``jax.grad``.
      has_aux: ``fun`` returns ``(loss, aux)``.
      contractions: ``"float32"`` (default) or ``"scaled"``, the backward contractions of
        ``heddle.autodiff.value_and_grad``.

    Returns:
      A function with ``fun``'s arguments returning ``(value, grads, finite)``, or
      ``((value, aux), grads, finite)`` with ``has_aux``: ``value`` is ``fun``'s own (unscaled) loss,
      bit for bit; ``grads`` the unscaled gradients; ``finite`` a ``bool[]``.

    Raises:
      TypeError: ``scale`` is not a number, scalar array or loss-scale state (an array of several
        scales included).
      ValueError: a concrete ``scale`` is not a positive finite number that float32 holds, or
        ``contractions`` is not one of heddle.autodiff's.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import scaling
      >>> w = jnp.full(4, 1e-4, jnp.float16)
      >>> value, g, finite = scaling.backward_scaled(lambda w: (w * w).sum(), 2.0**15)(w)
      >>> g.dtype, bool(finite)
      (dtype('float32'), True)
    """
    _scale_value(scale)  # refuse a bad scale at construction
    vg = autodiff.value_and_grad  # refuses a bad ``contractions`` at construction too
    grad_of = lambda f: vg(f, argnums=argnums, has_aux=True, contractions=contractions)
    grad_of(fun)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> tuple[Any, Any, jax.Array]:
        s = _scale_value(scale)

        def scaled(*a: Any, **k: Any) -> Any:
            out = fun(*a, **k)
            loss, aux = out if has_aux else (out, None)
            loss = jnp.asarray(loss)
            wide = np.dtype(loss.dtype) if np.dtype(loss.dtype).itemsize > 4 else _F32
            scaled_loss = lax.convert_element_type(loss, wide) * lax.convert_element_type(s, wide)
            return scaled_loss, (loss, aux)

        (_, (value, aux)), grads = grad_of(scaled)(*args, **kwargs)
        grads = jax.tree.map(lambda g: _unscale(g, s), grads)
        finite = grads_finite(grads)
        return ((value, aux) if has_aux else value), grads, finite

    return wrapped
