"""heddle: a JAX-backed tensor frontend with an enforced mixed-precision dtype policy.

``import heddle.numpy as jnp`` for jax.numpy with heddle's promotion lattice, float32 accumulation and
correctly rounded casts; ``heddle.policy`` for the rules themselves; ``heddle.autocast(fn)`` for the
same policy in any JAX function.

The subpackages and the top-level functions load on first use, so ``import heddle`` (and
``heddle --help``) does not import JAX until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle import autodiff as autodiff
    from heddle import lax as lax
    from heddle import nn as nn
    from heddle import numpy as numpy
    from heddle import policy as policy
    from heddle import programs as programs
    from heddle import quant as quant
    from heddle import scaling as scaling
    from heddle import scipy as scipy
    from heddle.numpy import astype as astype
    from heddle.programs import audit as audit
    from heddle.programs import autocast as autocast
    from heddle.quant import dequantize as dequantize
    from heddle.quant import quantize as quantize

__version__ = "0.1.0"

_SUBPACKAGES = frozenset(
    {"autodiff", "lax", "nn", "numpy", "policy", "programs", "quant", "scaling", "scipy"}
)
_FUNCTIONS = {
    "astype": "heddle.numpy",
    "audit": "heddle.programs",
    "autocast": "heddle.programs",
    "dequantize": "heddle.quant",
    "quantize": "heddle.quant",
}

__all__ = sorted({*_SUBPACKAGES, *_FUNCTIONS})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        value = importlib.import_module(f"heddle.{name}")
    elif name in _FUNCTIONS:
        value = getattr(importlib.import_module(_FUNCTIONS[name]), name)
    else:
        raise AttributeError(f"module 'heddle' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
