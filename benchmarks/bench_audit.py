"""The cost of ``heddle.policy.audit`` against the ``jax.make_jaxpr`` a user would run instead.

Both sides trace the same program: the forward and backward pass (``jax.vjp`` with unit cotangents)
of the bfloat16 models in tests/policy/_models.py. ``jax.make_jaxpr`` caches its trace per function
object, and ``audit`` traces a fresh closure on every call, so the baseline also traces a fresh
closure each time: both columns are one full trace (plus, for the audit, the walk over the jaxpr).
Medians of ``--repeat`` runs after ``--warmup`` runs, the two sides alternating, in one process;
the result is the ratio.

Run: ``python benchmarks/bench_audit.py`` (``--repeat 30`` for steadier numbers).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "policy")
)

import _models as M

from heddle.programs._audit import audit


def _fresh_forward_backward(loss: Callable[..., Any]) -> Callable[..., Any]:
    def forward_backward(*args: Any) -> Any:
        out, pullback = jax.vjp(loss, *args)
        return out, pullback(jax.tree.map(lambda o: jnp.ones(o.shape, o.dtype), out))

    return forward_backward


def _stack_loss(blocks: list[dict[str, Any]], x: Any) -> Any:
    for p in blocks:
        x = M.block(p, x)
    return jnp.mean(jnp.square(x))


def _medians(
    a: Callable[[], Any], b: Callable[[], Any], warmup: int, repeat: int
) -> tuple[float, float]:
    """Median times of ``a`` and ``b``, run alternately so that load drift hits both alike."""
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for _ in range(repeat):
        for fn, ts in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    opts = parser.parse_args()

    params, x, labels = M.mlp_specs()
    bparams, bx = M.block_specs()
    cases = {
        "transformer block": (M.block_loss, (bparams, bx)),
        "MLP (2 layers)": (M.mlp_loss, (params, x, labels)),
        "4-block stack": (_stack_loss, ([bparams] * 4, bx)),
    }
    print(f"jax {jax.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, backend {jax.default_backend()}")  # fmt: skip
    print(f"medians of {opts.repeat} runs after {opts.warmup} warm-up runs, forward + backward\n")
    print("| model | equations | make_jaxpr (ms) | audit (ms) | audit / make_jaxpr |")
    print("|---|---|---|---|---|")
    for name, (loss, args) in cases.items():
        n_eqns = _count(jax.make_jaxpr(_fresh_forward_backward(loss))(*args).jaxpr)
        base, aud = _medians(
            lambda loss=loss, args=args: jax.make_jaxpr(_fresh_forward_backward(loss))(*args),
            lambda loss=loss, args=args: audit(loss, *args, include_backward=True),
            opts.warmup,
            opts.repeat,
        )
        print(f"| {name} | {n_eqns} | {base * 1e3:.1f} | {aud * 1e3:.1f} | {aud / base:.2f} |")


def _count(jaxpr: Any) -> int:
    from jax.extend import core as jcore

    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(sub, (jcore.Jaxpr, jcore.ClosedJaxpr)):
                    n += _count(getattr(sub, "jaxpr", sub))
    return n


if __name__ == "__main__":
    main()
