"""heddle: a JAX-backed tensor frontend with an enforced mixed-precision dtype policy.

``import heddle.numpy as jnp`` for jax.numpy with heddle's promotion lattice, float32 accumulation and
correctly rounded casts; ``heddle.policy`` for the rules themselves.
"""

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

__all__ = [
    "astype",
    "audit",
    "autocast",
    "autodiff",
    "dequantize",
    "lax",
    "nn",
    "numpy",
    "policy",
    "programs",
    "quant",
    "quantize",
    "scaling",
    "scipy",
]
