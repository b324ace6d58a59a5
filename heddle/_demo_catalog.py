"""What ``python -m heddle demo --help`` says about each model, without importing JAX.

``heddle._demo`` builds its models from these entries (the description is read from here) and a test
checks that the regimes and default steps listed here are the models' own.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    """One model as ``--help`` lists it.

    Attributes:
      description: one line for ``--help`` and the output.
      regimes: the model's regime names, in order.
      steps: the model's default training steps per run.
    """

    description: str
    regimes: tuple[str, ...]
    steps: int


CATALOG: dict[str, Entry] = {
    "char": Entry(
        "next-character model of Python's own source: 32 characters in, embedding 96x8, "
        "256-64 ReLU, 64-96 softmax",
        ("float32", "bf16", "f16", "f16-scaled"),
        150,
    ),
    "mlp": Entry(
        "64-128-10 MLP on scikit-learn's digits",
        ("float32", "bf16-params", "bf16-mixed", "f16-mixed", "f16-scaled"),
        2000,
    ),
}
"""The demo's models by ``--model`` name; ``char`` is the default."""
