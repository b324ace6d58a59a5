"""The demo's training code, re-exported from ``heddle._demo`` (where it lives).

Kept so that ``from heddle import demo`` (``notebooks/04-mixed-precision.py``) keeps working; the
command line and the tests import ``heddle._demo``. Nothing in ``import heddle`` loads this module.

Examples:
  >>> from heddle import _demo, demo
  >>> demo.train is _demo.train and demo.MODELS is _demo.MODELS
  True
"""

from __future__ import annotations

from typing import Any

from heddle import _demo
from heddle._demo import (
    BACKENDS,
    CHAR_REGIMES,
    MODELS,
    REGIMES,
    TEXT_CHARS,
    VOCAB,
    Config,
    Model,
    Regime,
    Result,
    char_model,
    gradient_error,
    load_digits_split,
    load_text,
    mlp_model,
    run,
    train,
)

__all__ = [
    "BACKENDS", "CHAR_REGIMES", "MODELS", "REGIMES", "TEXT_CHARS", "VOCAB", "Config", "Model",
    "Regime", "Result", "char_model", "gradient_error", "load_digits_split", "load_text",
    "mlp_model", "run", "train",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """Any other name of ``heddle._demo`` (its private helpers included)."""
    return getattr(_demo, name)
