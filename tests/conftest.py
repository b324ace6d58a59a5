"""Test-wide setup: JAX's own implicit promotion is strict, so heddle cannot lean on it."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def _strict_jax_promotion():
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture(params=["eager", "jit"])
def transform(request):
    """Runs a function eagerly and under ``jax.jit`` (weak types differ between the two)."""
    return (lambda f: f) if request.param == "eager" else jax.jit
