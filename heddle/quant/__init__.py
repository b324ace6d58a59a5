"""Quantisation formats that really save memory, and precision emulation.

``quantize(x, fmt)`` stores codes and scales (4- and 6-bit codes packed into bytes) in a ``QArray``
pytree; ``dequantize`` and ``qmatmul`` read them back; ``emulate(fn, dtype)`` runs a function as if
every intermediate were stored in ``dtype``; ``load_safetensors`` / ``save_safetensors`` read and
write checkpoints with heddle's correctly rounded casts. See docs/quantisation.md.
"""

from heddle.quant._emulate import emulate as emulate
from heddle.quant._formats import FORMATS as FORMATS
from heddle.quant._formats import NF4_LEVELS as NF4_LEVELS
from heddle.quant._formats import FormatError as FormatError
from heddle.quant._qarray import QArray as QArray
from heddle.quant._qmatmul import qmatmul as qmatmul
from heddle.quant._quantize import dequantize as dequantize
from heddle.quant._quantize import quantize as quantize
from heddle.quant._safetensors import CheckpointError as CheckpointError
from heddle.quant._safetensors import load_safetensors as load_safetensors
from heddle.quant._safetensors import save_safetensors as save_safetensors

__all__ = [
    "FORMATS",
    "NF4_LEVELS",
    "CheckpointError",
    "FormatError",
    "QArray",
    "dequantize",
    "emulate",
    "load_safetensors",
    "qmatmul",
    "quantize",
    "save_safetensors",
]
