"""float32 cost of heddle's gamma-family formulas (heddle/ops/_formulas.py) against JAX's own.

Usage: ``python benchmarks/gamma_formulas.py``. 2**21 float32 inputs uniform on [-20, 30), both
jitted; the median of per-round time ratios of 5 interleaved rounds (7 timed runs each) in one
process (the machine is shared and noisy; absolute times are not results).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as js
import numpy as np
from _harness import interleaved_ratio, machine

import heddle.numpy as hnp
import heddle.scipy.special as hs


def main() -> None:
    x = jnp.asarray(np.random.default_rng(0).uniform(-20, 30, 2**21), jnp.float32)
    y = x[::-1]
    cases = [
        ("gammaln", hs.gammaln, js.gammaln, (x,)),
        ("digamma", hs.digamma, js.digamma, (x,)),
        ("gamma", hs.gamma, js.gamma, (x,)),
        ("logaddexp", hnp.logaddexp, jnp.logaddexp, (x, y)),
    ]
    print(machine())
    print("| function | heddle / jax (float32, jitted) |")
    print("|---|---|")
    for name, h, j, args in cases:
        fh, fj = jax.jit(h), jax.jit(j)
        _, _, r = interleaved_ratio(lambda: fh(*args), lambda: fj(*args), rounds=5, runs=7)
        print(f"| {name} | {r:.2f} |")


if __name__ == "__main__":
    main()
