"""heddle.autodiff's forward value is the plain function's, bit for bit, on every bit pattern of
the narrow formats, subnormals included (the float32 twin that carries a narrow output out of the
differentiated function must hold it exactly: XLA's reduce_precision flushes float16 subnormals)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from heddle import autodiff

FORMATS = [jnp.bfloat16, jnp.float16, jnp.float8_e5m2, jnp.float8_e4m3fn]


def _every_pattern(dtype) -> np.ndarray:
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    return np.arange(np.iinfo(bits).max + 1, dtype=np.uint64).astype(bits).view(dtype)


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


@pytest.mark.parametrize("dtype", FORMATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_the_forward_value_is_the_plain_functions_on_every_pattern(dtype, jit):
    x = jnp.asarray(_every_pattern(dtype))

    def f(x):  # halves (rounding into and inside the subnormals) and keeps the sign
        return x * jnp.asarray(0.5, dtype) - jnp.zeros_like(x)

    run = jax.jit(lambda x: autodiff.vjp(f, x)[0]) if jit else (lambda x: autodiff.vjp(f, x)[0])
    out, plain = np.asarray(run(x)), np.asarray(jax.jit(f)(x))
    assert out.dtype == np.dtype(dtype)
    differ = (_bits(out) != _bits(plain)) & ~np.isnan(plain.astype(np.float32))
    assert not differ.any(), (int(differ.sum()), np.asarray(x)[differ][:8], out[differ][:8])


@pytest.mark.parametrize("dtype", FORMATS, ids=lambda d: np.dtype(d).name)
def test_a_twin_holds_its_value_exactly_and_passes_the_cotangent_through(dtype):
    """The twin's pinned rounding (reduce_precision, and a rounding to the subnormal grid where
    reduce_precision flushes) changes no bit of a narrow value and has derivative 1."""
    from heddle.autodiff._rules import widen_exactly as _exactly

    x = _every_pattern(dtype)
    finite = np.isfinite(x.astype(np.float32))
    twin = jax.jit(_exactly)(jnp.asarray(x))
    assert twin.dtype == jnp.float32
    np.testing.assert_array_equal(
        _bits(np.asarray(twin)[finite]), _bits(x[finite].astype(np.float32))
    )
    wide = jnp.asarray(x[finite].astype(np.float32))
    grad = jax.jit(jax.grad(lambda w: jnp.sum(_exactly(w.astype(dtype)))))(wide)
    assert (np.asarray(grad) == 1).all()
